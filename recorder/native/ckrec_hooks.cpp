// What Python tells ckview's native event sources, through functions it calls directly: module
// calls (global forward hooks), saved tensors (saved_tensors_hooks), the tensors it sees
// (note(), note_all(), note_io(); NOTE [ Notes ]), the inputs of ops outside module calls (a
// second RecordFunction callback that the module hooks turn on and off), and the leaves of a
// graph whose backward begins. Each writes rows into the calling thread's buffer as the op
// callbacks do (ckrec_ops.cpp); the hooks are plain CPython functions.
#include <ATen/SequenceNumber.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "ckrec.h"
#include "ckrec_internal.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ckrec {
namespace internal {

// NOTE [ Op inputs outside modules ]
// Two rules of the Python path need what an op reads, outside module calls: an op of the
// forward outside any module (the loss) that reads a storage made between steps makes it an
// input, and an op between steps (`x = data[idx]`) links its new blocks to what it read, so
// that the dataset becomes an input when x does (NOTE [ Inputs and their sources ] in
// recorder/ledger.py). Boxing every op's inputs would cost every op, so a second callback,
// with inputs, is enabled only while the recording thread is outside module calls, backward
// and the optimizer's step (Python says when it is in either: pause_inputs()). For each top-level
// op it writes an InRow per tensor input naming its block of the run, or the storage row
// Python registered, or else (a storage from before the run that Python never saw) a weak
// reference to the tensor, which drain() hands to Python while the tensor lives.
at::CallbackHandle inputs_callback = 0;
bool inputs_on = false;               // recording thread only
bool inputs_paused = false;           // recording thread only
std::vector<WeakTensor> input_tensors;  // recording thread only; drain() empties it

namespace {
std::unordered_map<int64_t, int32_t> module_ids;  // guarded by registry_mu
std::atomic<int32_t> next_call{0};

int64_t storage_key(const at::Tensor& t);

void input_row(ThreadState& ts, int64_t op, int64_t t, const at::Tensor& x) {
  if (!x.defined() || !x.has_storage() || x.storage().nbytes() == 0) return;
  int64_t key = storage_key(x), block, sid = -1, tensor = -1;
  {
    std::lock_guard<SpinLock> lock(blocks_mu);
    block = live_blocks.get(key);
    if (block < 0) sid = seen_storages.get(key);
  }
  if (block < 0 && sid < 0) {
    tensor = int64_t(input_tensors.size());
    input_tensors.emplace_back(x.getIntrusivePtr());
  }
  BufferLock lock(*ts.buf, drainer);
  ts.buf->inputs.push_back(InRow{t, op, block, sid, tensor});
}
}  // namespace

std::unique_ptr<at::ObserverContext> on_inputs(const at::RecordFunction& fn) {
  if (off()) return nullptr;
  ThreadState& ts = state();
  if (ts.buf.get() != drainer.load(std::memory_order_relaxed) || ts.ops.size() != 1 ||
      !ts.calls.empty() || torch::autograd::get_current_graph_task_id() >= 0)
    return nullptr;
  int64_t op = ts.ops.back().id, t = now_ns();
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      input_row(ts, op, t, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& x : v.toTensorVector()) input_row(ts, op, t, x);
    }
  }
  return nullptr;
}

namespace {
// Enables the inputs callback outside module calls unless Python paused it; on the recording
// thread only (a thread-local callback is enabled per thread).
void update_inputs(ThreadState& ts) {
  if (!inputs_callback || ts.buf.get() != drainer.load(std::memory_order_relaxed)) return;
  bool want = !inputs_paused && ts.calls.empty();
  if (want == inputs_on) return;
  if (want)
    at::reenableCallback(inputs_callback);
  else
    at::disableCallback(inputs_callback);
  inputs_on = want;
}
}  // namespace

void pause_inputs(bool pause) {
  inputs_paused = pause;
  update_inputs(state());
}

// ---------------------------------------------------------------------------------------------
// Module and saved-tensor hooks (Python calls these directly)
// ---------------------------------------------------------------------------------------------
namespace {
int32_t module_id(int64_t address) {
  std::lock_guard<std::mutex> lock(registry_mu);
  return module_ids.try_emplace(address, int32_t(module_ids.size())).first->second;
}

void pre_hook(PyObject* module) {
  if (off()) return;
  ThreadState& ts = state();
  int64_t a = addr(module);
  int32_t m = module_id(a);
  int32_t call = next_call.fetch_add(1, std::memory_order_relaxed);
  ModRow row{now_ns(), a, int64_t(at::sequence_number::peek()), call, cur_call(ts), m, 1,
             {0, 0, 0}};
  ts.calls.push_back(Call{call, m});
  update_inputs(ts);
  BufferLock lock(*ts.buf, drainer);
  ts.buf->mods.push_back(row);
}

// Closes the innermost open call of this module (calls left open above it by an exception
// are closed with it).
void post_hook(PyObject* module) {
  if (off()) return;
  ThreadState& ts = state();
  int64_t a = addr(module);
  int32_t m = module_id(a);
  int64_t t = now_ns();
  int64_t seq = int64_t(at::sequence_number::peek());
  size_t i = ts.calls.size();
  while (i > 0 && ts.calls[i - 1].module != m) --i;
  if (i == 0) return;  // its pre-hook ran before recording started
  {
    BufferLock lock(*ts.buf, drainer);
    while (ts.calls.size() >= i) {
      Call c = ts.calls.back();
      ts.calls.pop_back();
      int32_t parent = ts.calls.empty() ? -1 : ts.calls.back().call;
      ts.buf->mods.push_back(ModRow{t, a, seq, c.call, parent, c.module, 0, {0, 0, 0}});
    }
  }
  update_inputs(ts);
}

void saved_row(PyObject* obj, uint8_t kind) {
  if (off()) return;
  if (!THPVariable_Check(obj)) return;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || !t.has_storage()) return;
  ThreadState& ts = state();
  const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  SavedRow row{now_ns(), addr(s->data_ptr().get()), block_of(t), int64_t(s->nbytes()),
               int64_t(t.numel()) * int64_t(t.element_size()), named_outer(ts), cur_top(ts),
               cur_call(ts), kind, {0, 0, 0}, {}};
  describe(t, row.tensor);
  BufferLock lock(*ts.buf, drainer);
  ts.buf->saved.push_back(row);
}

}  // namespace

// NOTE [ Notes ]
// Python sees tensors the extension does not: a step's gradients and optimizer state at the
// optimizer's hooks, a module's inputs and outputs, what checkpoint's own saved-tensor hooks
// keep. note(tensor, what, value, module) looks the tensor's storage up at that moment: on a
// block of the run (allocated since start() or forget_blocks()) it writes a NoteRow naming the
// block; on a storage Python registered itself (one from before the run, see()) a NoteRow
// naming its storage row. Either way True, and nothing is left to match by pointer and time.
// Otherwise (a storage Python has not registered yet, an empty or meta tensor, a subclass
// without storage) it writes nothing and returns False: Python registers the storage, calls
// see(), and applies the note itself. unsee() forgets a registered storage when Python's weak
// reference to it dies, before its memory can be reused.
BlockTable seen_storages;  // NOTE [ Notes ]: storages Python registered; guarded by blocks_mu

// NOTE [ Marks already noted ]
// A step marks every tensor of Adam's state (three a parameter) and its gradients twice (at
// backward's end and at the optimizer's step), nearly all marked the same way the step before.
// A mark (what 0) that repeats the last mark of the same block, or of the same storage Python
// registered, with the same category and module, is not written again: applying it again
// changes nothing (categories only strengthen, a mark's module fills an empty one; _apply_notes
// in native_steps.py). The last mark is kept by address with the block id or storage row it
// named: a new block or registration at that address never matches it. Kept per run.
// Only a saving: past kMaxMarks addresses (a long run whose blocks keep moving) it starts over.
std::unordered_map<int64_t, Mark> last_marks;  // by storage key; guarded by blocks_mu

namespace {
constexpr uint8_t kMark = 0;
constexpr size_t kMaxMarks = size_t(1) << 16;

// Whether the mark `m` on the storage at `key` repeats its last one; it is the last one now.
bool marked_already(int64_t key, const Mark& m) {
  if (last_marks.size() >= kMaxMarks) last_marks.clear();
  auto [it, fresh] = last_marks.try_emplace(key, m);
  if (fresh) return false;
  if (it->second == m) return true;
  it->second = m;
  return false;
}

int64_t storage_key(const at::Tensor& t) {
  return block_key(addr(t.storage().unsafeGetStorageImpl()->data_ptr().get()), t.device());
}

}  // namespace

bool note(PyObject* obj, uint8_t what, int64_t value, int32_t module) {
  return !off() && THPVariable_Check(obj) && note(THPVariable_Unpack(obj), what, value, module);
}

bool note(const at::Tensor& t, uint8_t what, int64_t value, int32_t module) {
  if (off()) return false;
  if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return false;
  int64_t key = storage_key(t), block, sid = -1;
  {
    std::lock_guard<SpinLock> lock(blocks_mu);
    block = live_blocks.get(key);
    if (block < 0) sid = seen_storages.get(key);
    if (block < 0 && sid < 0) return false;
    if (what == kMark && marked_already(key, Mark{block, sid, value, module})) return true;
  }
  ThreadState& ts = state();
  NoteRow row{now_ns(), block, sid, value, module, what, {0, 0, 0}};
  BufferLock lock(*ts.buf, drainer);
  ts.buf->notes.push_back(row);
  return true;
}

// The key under which a storage Python registered as row `sid` is found; 0 if none.
int64_t see(const at::Tensor& t, int64_t sid) {
  if (!t.has_storage() || t.storage().nbytes() == 0) return 0;
  int64_t key = storage_key(t);
  std::lock_guard<SpinLock> lock(blocks_mu);
  seen_storages.put(key, sid);
  return key;
}

void unsee(int64_t key) {
  if (key == 0) return;
  std::lock_guard<SpinLock> lock(blocks_mu);
  seen_storages.take(key);
}

namespace {
// Python calls the hooks below on every module call and saved tensor, so they are plain
// CPython functions: pybind11's argument handling would cost about 0.3 us a call. The pack hook
// returns the tensor itself: autograd saves exactly what it would without hooks.
PyObject* py_pre_hook(PyObject*, PyObject* const* args, Py_ssize_t nargs) {  // (module, args)
  if (nargs >= 1) pre_hook(args[0]);
  Py_RETURN_NONE;
}

PyObject* py_post_hook(PyObject*, PyObject* const* args, Py_ssize_t nargs) {  // + result
  if (nargs >= 1) post_hook(args[0]);
  Py_RETURN_NONE;
}

PyObject* py_pack(PyObject*, PyObject* obj) {
  saved_row(obj, 0);
  Py_INCREF(obj);
  return obj;
}

PyObject* py_unpack(PyObject*, PyObject* obj) {
  saved_row(obj, 1);
  Py_INCREF(obj);
  return obj;
}

PyObject* py_note(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  // (tensor, what, value, module)
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "note(tensor, what, value, module)");
    return nullptr;
  }
  long long what = PyLong_AsLongLong(args[1]);
  long long value = PyLong_AsLongLong(args[2]);
  long long module = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  if (note(args[0], uint8_t(what), int64_t(value), int32_t(module))) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// note_all(tensors, what, value, modules): note() for each tensor of a list, with one value
// and the module of the same index in `modules` (a list as long); returns the indices of the
// tensors it did not note, for Python to register.
PyObject* py_note_all(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[3]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[3])) {
    PyErr_SetString(PyExc_TypeError, "note_all(tensors: list, what, value, modules: list)");
    return nullptr;
  }
  long long what = PyLong_AsLongLong(args[1]);
  long long value = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) return nullptr;
  PyObject* missed = PyList_New(0);
  if (!missed) return nullptr;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); ++i) {
    long long module = PyLong_AsLongLong(PyList_GET_ITEM(args[3], i));
    if (PyErr_Occurred()) {
      Py_DECREF(missed);
      return nullptr;
    }
    if (note(PyList_GET_ITEM(args[0], i), uint8_t(what), int64_t(value), int32_t(module)))
      continue;
    PyObject* index = PyLong_FromSsize_t(i);
    if (!index || PyList_Append(missed, index) < 0) {
      Py_XDECREF(index);
      Py_DECREF(missed);
      return nullptr;
    }
    Py_DECREF(index);
  }
  return missed;
}

// NOTE [ Module I/O in one call ]
// A module call's return notes its positional inputs, keyword inputs and output (three groups)
// in one call, as a note_all() per group on the tensors that tensors_in() (recorder/_torch.py)
// finds would: a group that is a tensor, or a plain tuple, list or dict whose items are
// tensors or scalars (None, bool, int, float, str), is noted here in the same order. Any other
// group (nested, a namedtuple, a dataclass, HF's ModelOutput) is left to Python's walk. A
// group with tensors not noted ends the call too: Python registers those (NOTE [ Notes ])
// before the next group is noted, so that an output on the same storage finds it registered.

}  // namespace

// The tensors of group `v` into `out`, in tensors_in()'s order; false where Python walks it.
bool flat_tensors(PyObject* v, std::vector<PyObject*>& out) {
  if (THPVariable_Check(v)) {
    out.push_back(v);
    return true;
  }
  auto item = [&out](PyObject* x) {
    if (THPVariable_Check(x)) {
      out.push_back(x);
      return true;
    }
    return x == Py_None || PyLong_Check(x) || PyFloat_Check(x) || PyUnicode_Check(x);
  };
  if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
    PyObject** items = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); ++i)
      if (!item(items[i])) return false;
    return true;
  }
  if (PyDict_CheckExact(v)) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(v, &pos, &key, &value))
      if (!item(value)) return false;
    return true;
  }
  return v == Py_None || PyLong_Check(v) || PyFloat_Check(v) || PyUnicode_Check(v);
}

namespace {

// note_io(call, first, in_what, out_what, args, kwargs, output): notes the groups from `first`
// on (0 args, 1 kwargs, 2 output; NOTE [ Module I/O in one call ]) with value `call`; None
// once all are noted, else (group, None) for a group Python walks, or (group, tensors) for
// the tensors of a group it did not note.
PyObject* py_note_io(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError,
                    "note_io(call, first, in_what, out_what, args, kwargs, output)");
    return nullptr;
  }
  long long call = PyLong_AsLongLong(args[0]);
  long long first = PyLong_AsLongLong(args[1]);
  long long in_what = PyLong_AsLongLong(args[2]);
  long long out_what = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  std::vector<PyObject*> found;
  for (long long group = first < 0 ? 0 : first; group < 3; ++group) {
    found.clear();
    if (!flat_tensors(args[4 + group], found)) return Py_BuildValue("(LO)", group, Py_None);
    uint8_t what = uint8_t(group == 2 ? out_what : in_what);
    PyObject* missed = nullptr;
    for (PyObject* t : found) {
      if (note(t, what, int64_t(call), -1)) continue;
      if (!missed && !(missed = PyList_New(0))) return nullptr;
      if (PyList_Append(missed, t) < 0) {
        Py_DECREF(missed);
        return nullptr;
      }
    }
    if (missed) return Py_BuildValue("(LN)", group, missed);
  }
  Py_RETURN_NONE;
}

PyMethodDef hook_defs[] = {
    {"pre_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_pre_hook)),
     METH_FASTCALL, "global module forward pre-hook: a module call begins"},
    {"post_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_post_hook)),
     METH_FASTCALL, "global module forward hook (always_call): a module call returns"},
    {"pack", py_pack, METH_O, "saved_tensors_hooks pack: records the tensor, returns it"},
    {"unpack", py_unpack, METH_O, "saved_tensors_hooks unpack: records the tensor, returns it"},
    {"note", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_note)),
     METH_FASTCALL, "note(tensor, what, value, module): NOTE [ Notes ]; True if noted"},
    {"note_all", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_note_all)),
     METH_FASTCALL, "note_all(tensors, what, value, modules): indices of those not noted"},
    {"note_io", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_note_io)),
     METH_FASTCALL, "note_io(call, first, in_what, out_what, args, kwargs, output): NOTE [ Module "
     "I/O in one call ]"},
};
}  // namespace

void add_hooks(py::module_& m) {
  for (PyMethodDef& def : hook_defs)
    m.attr(def.ml_name) = py::reinterpret_steal<py::object>(PyCFunction_New(&def, nullptr));
}

// NOTE [ Leaves of a graph ]
// A loop without nn.Module trains leaf tensors no module owns (NOTE [ A forward without
// modules ] in hooks.py), and on the native path no op hook sees them go into ops. When its
// backward begins, graph_leaves(roots) walks the graph from the roots and returns the tensors
// of its AccumulateGrad nodes: the leaves that will receive gradients. The walk runs in C++, so
// no node gets a Python object (NOTE [ Autograd nodes stay unwrapped ] in phases.py); it stops
// after `limit` nodes.
std::vector<at::Tensor> graph_leaves(const std::vector<at::Tensor>& roots, int64_t limit) {
  using torch::autograd::Node;
  std::vector<Node*> todo;
  std::unordered_set<Node*> seen;
  std::vector<at::Tensor> leaves;
  auto visit = [&](const auto& node) {  // shared_ptr, or intrusive_ptr from torch 2.13 on
    if (node && seen.insert(node.get()).second) todo.push_back(node.get());
  };
  for (const at::Tensor& root : roots)
    if (root.defined() && root.requires_grad())
      visit(torch::autograd::impl::gradient_edge(root).function);
  while (!todo.empty() && int64_t(seen.size()) <= limit) {
    Node* node = todo.back();
    todo.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (acc->variable.defined()) leaves.push_back(acc->variable);
      continue;
    }
    for (const torch::autograd::Edge& edge : node->next_edges()) visit(edge.function);
  }
  return leaves;
}

}  // namespace internal
}  // namespace ckrec
