// ckview's native event sources (recorder/native): ops, allocator blocks, module calls and
// saved tensors, written as fixed-width rows into per-thread buffers and handed to Python by
// drain() at step boundaries. Python turns them into per-step facts with numpy
// (recorder/native/attribute.py); nothing here runs Python per op.
//
// Row layouts are mirrored by numpy dtypes in recorder/native/rows.py; row_sizes() lets Python
// check that both agree before reading a byte.
//
// NOTE [ Native sources ]
// - Ops: a thread-local RecordFunction callback (FUNCTION and BACKWARD_FUNCTION scopes). The
//   callback and the PROFILER_STATE slot travel with torch's ThreadLocalState into autograd
//   engine threads and at::launch tasks, as torch's profiler does; threads the user starts are
//   not seen.
// - Allocator blocks: a ProfilerStateBase subclass pushed into the thread-local PROFILER_STATE
//   debug-info slot with memoryProfilingEnabled() true. The CPU allocator and the CUDA caching
//   allocator report every block there (c10::reportMemoryUsageToProfiler), on the thread that
//   allocates or frees. It must be a ProfilerStateBase: torch static_casts what sits in that
//   slot (profilerEnabled(), _profiler_type()). Torch's profiler refuses to start while the slot
//   is taken, so suspend_reporter()/resume_reporter() let a script's own profiler run.
// - At an allocation the thread's op stack is known, so a memory row carries its op of the
//   trace, its top-level op and the sequence number of the enclosing backward node: no parent
//   walk is needed afterwards.
// - Module calls and saved tensors: global module forward hooks and saved_tensors_hooks whose
//   callables are these C++ functions (no Python frame runs).
//
// This file starts, stops and drains them and defines the module; the op callbacks and the
// memory reporter are in ckrec_ops.cpp, the hooks Python calls in ckrec_hooks.cpp, and what they
// share in ckrec_internal.h.
#include <torch/extension.h>
#include <torch/version.h>

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include "ckattr.h"
#include "ckrec.h"
#include "ckrec_internal.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ckrec {
namespace internal {

// NOTE [ Forked children ]
// A DataLoader worker forked while recording inherits the forking thread's callback and
// profiler slot, and the Python module hooks. Its rows would never be drained, so the child goes
// inert: every hook returns at once, and the reporter leaves the child's slot (so the CPU
// allocator stops tracking sizes there). Only thread-local state is touched: another thread may
// have held any lock at the fork. source.py calls forget_in_child() after every fork.
std::atomic<bool> inert{false};

namespace {
at::CallbackHandle callback = 0;

void check_drainer(const char* what) {
  Buffers* d = drainer.load(std::memory_order_relaxed);
  TORCH_CHECK(d == nullptr || d == state().buf.get(), what,
              " must run on the thread that started the native recorder");
}

// NOTE [ Torch versions ]
// Everything used here exists with the same spelling from torch 2.4 to 2.13, so no code is
// guarded by TORCH_VERSION_MAJOR/MINOR today (built_for() reports them). The known changes:
// PROFILER_STATE is an enumerator of `enum class DebugInfoKind` in older releases and a static
// DebugInfoKind object in 2.13; `c10::DebugInfoKind::PROFILER_STATE` names both. It is read
// where it is used, never copied at static-initialisation time. Autograd's edges hold a node
// by shared_ptr in older releases and by intrusive_ptr in 2.13: graph_leaves() takes either.
// A difference found on another release goes here, guarded by those macros.
inline c10::DebugInfoKind slot() { return c10::DebugInfoKind::PROFILER_STATE; }

std::shared_ptr<Reporter> reporter;  // set while recording memory
bool reporter_pushed = false;        // on this (the recording) thread's slot now

bool reporter_on_top() {
  return reporter && c10::ThreadLocalDebugInfo::get(slot()) == reporter.get();
}

// Pops the reporter so that a script's torch.profiler can take the slot. False when it is not
// the slot's innermost entry (someone pushed above it): then nothing is popped.
bool suspend_reporter() {
  if (!reporter_pushed) return false;
  if (!reporter_on_top()) return false;
  try {
    c10::ThreadLocalDebugInfo::_pop(slot());
  } catch (const c10::Error&) {
    return false;  // another kind of debug info sits above ours
  }
  reporter_pushed = false;
  return true;
}

// Pushes the reporter back. False while the slot holds something else (a profiler still on).
bool resume_reporter() {
  if (!reporter || reporter_pushed) return false;
  if (c10::ThreadLocalDebugInfo::get(slot()) != nullptr) return false;
  c10::ThreadLocalDebugInfo::_push(slot(), reporter);
  reporter_pushed = true;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Start, stop, drain
// ---------------------------------------------------------------------------------------------
void start(bool ops, bool memory, bool outputs) {
  TORCH_CHECK(!off(), "the native recorder does not record in a forked child");
  TORCH_CHECK(!callback && !reporter, "the native recorder is already started; stop() it first");
  listen_for_deregistrations();
  generation.fetch_add(1, std::memory_order_relaxed);
  want_outputs = outputs;
  drainer.store(state().buf.get());  // NOTE [ The recording thread writes without a lock ]
  forget_blocks();  // frees of an earlier recording's blocks are unknown now
  {
    std::lock_guard<SpinLock> lock(blocks_mu);
    seen_storages.clear();  // storage rows are per run (NOTE [ Notes ] in ckrec_hooks.cpp)
    last_marks.clear();     // NOTE [ Marks already noted ] in ckrec_hooks.cpp
  }
  if (ops) {
    at::RecordFunctionCallback cb(on_start, on_end);
    cb.needsInputs(false).needsOutputs(outputs).needsIds(false).scopes(
        {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION});
    callback = at::addThreadLocalCallback(cb);
    at::RecordFunctionCallback in(on_inputs);  // after `cb`: it runs after on_start
    in.needsInputs(true).needsOutputs(false).needsIds(false).scopes({at::RecordScope::FUNCTION});
    inputs_callback = at::addThreadLocalCallback(in);
    inputs_on = true;
    inputs_paused = false;
  }
  if (memory) {
    reporter = std::make_shared<Reporter>();
    if (!resume_reporter()) {
      reporter.reset();
      if (callback) at::removeCallback(callback);
      if (inputs_callback) at::removeCallback(inputs_callback);
      callback = inputs_callback = 0;
      drainer.store(nullptr);
      TORCH_CHECK(false, "torch's profiler slot is taken on this thread (a profiler is running)");
    }
  }
}

void forget_in_child() {
  inert.store(true);
  if (reporter_pushed && reporter_on_top()) {
    try {
      c10::ThreadLocalDebugInfo::_pop(slot());
    } catch (const c10::Error&) {
    }
  }
  reporter_pushed = false;
}

void stop() {
  check_drainer("stop()");
  if (callback) at::removeCallback(callback);
  if (inputs_callback) at::removeCallback(inputs_callback);
  callback = inputs_callback = 0;
  input_tensors.clear();
  suspend_reporter();
  reporter.reset();
  reporter_pushed = false;
  drainer.store(nullptr);
}

// The rows of `field` in every buffer, as one bytes object: written in place, not gathered in a
// std::string first (a step's rows are several hundred KB, and each copy of them costs a large
// malloc). Called with registry_mu and every buffer's lock held; empties the buffers.
template <class T>
py::bytes take(std::vector<T> Buffers::*field) {
  size_t n = 0;
  for (const auto& b : registry) n += ((*b).*field).size() * sizeof(T);
  PyObject* bytes = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(n));
  if (!bytes) throw py::error_already_set();
  char* out = PyBytes_AS_STRING(bytes);
  for (const auto& b : registry) {
    std::vector<T>& rows = (*b).*field;
    std::memcpy(out, rows.data(), rows.size() * sizeof(T));
    out += rows.size() * sizeof(T);
    rows.clear();
  }
  return py::reinterpret_steal<py::bytes>(bytes);
}

// Every buffer is locked for the whole drain, so that each kind of row is taken from the same
// moment of each thread (a memory row never comes without the op row it names). Only drain()
// holds two buffer locks, so the order cannot deadlock.
py::dict drain() {
  check_drainer("drain()");
  py::dict d;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    std::vector<std::unique_ptr<BufferLock>> guards;
    for (const auto& b : registry) {
      guards.push_back(std::make_unique<BufferLock>(*b, drainer));
      b->drained_ops += int64_t(b->ops.size());
    }
    d["ops"] = take(&Buffers::ops);
    d["memory"] = take(&Buffers::mems);
    d["ooms"] = take(&Buffers::ooms);
    d["saved"] = take(&Buffers::saved);
    d["outputs"] = take(&Buffers::outs);
    d["modules"] = take(&Buffers::mods);
    d["op_ends"] = take(&Buffers::ends);
    d["notes"] = take(&Buffers::notes);
    d["inputs"] = take(&Buffers::inputs);
  }
  py::list tensors;  // NOTE [ Op inputs outside modules ] in ckrec_hooks.cpp: those still alive
  for (const WeakTensor& weak : input_tensors) {
    auto strong = weak.lock();
    if (strong)
      tensors.append(py::cast(at::Tensor(std::move(strong))));
    else
      tensors.append(py::none());
  }
  input_tensors.clear();
  d["input_tensors"] = tensors;
  return d;
}

// Rows waiting in the buffers: a recorder may drain mid-step when they grow large.
int64_t pending_rows() {
  check_drainer("pending_rows()");
  int64_t n = 0;
  std::lock_guard<std::mutex> lock(registry_mu);
  for (const auto& b : registry) {
    BufferLock guard(*b, drainer);
    n += int64_t(b->ops.size() + b->mems.size() + b->saved.size() + b->outs.size() +
                 b->mods.size() + b->notes.size() + b->inputs.size());
  }
  return n;
}


py::dict row_sizes() {
  py::dict d;
  d["ops"] = sizeof(OpRow);
  d["memory"] = sizeof(MemRow);
  d["ooms"] = sizeof(OomRow);
  d["saved"] = sizeof(SavedRow);
  d["outputs"] = sizeof(OutRow);
  d["modules"] = sizeof(ModRow);
  d["op_ends"] = sizeof(EndRow);
  d["notes"] = sizeof(NoteRow);
  d["inputs"] = sizeof(InRow);
  return d;
}

std::string built_for() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

}  // namespace
}  // namespace internal
}  // namespace ckrec

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace ckrec;            // NOLINT: rows and clock (ckrec.h)
  using namespace ckrec::internal;  // NOLINT: what the sources share (ckrec_internal.h)
  m.doc() = "ckview's native event sources (see recorder/native/__init__.py)";
  m.def("start", &start, py::arg("ops") = true, py::arg("memory") = true,
        py::arg("outputs") = false);
  m.def("stop", &stop);
  m.def("forget_in_child", &forget_in_child);
  m.def("drain", &drain);
  m.def("forget_blocks", &forget_blocks);
  m.def("pause_inputs", &pause_inputs, py::arg("pause"));
  m.def("see", &see, py::arg("tensor"), py::arg("sid"));
  m.def("unsee", &unsee, py::arg("key"));
  m.def("names", &names_from, py::arg("first") = 0);
  m.def("mark_ops", &mark_ops);
  m.def("pending_rows", &pending_rows);
  m.def("suspend_reporter", &suspend_reporter);
  m.def("resume_reporter", &resume_reporter);
  m.def("reporter_active", &reporter_on_top);
  add_hooks(m);  // pre_hook, post_hook, pack, unpack, note, note_all, note_io
  add_marks(m);  // note_gradients, note_optimizer_state
  m.def("graph_leaves", &graph_leaves, py::arg("roots"), py::arg("limit") = 1 << 20);
  m.def("row_sizes", &row_sizes);
  m.def("built_for", &built_for);
  m.def("now_ns", &now_ns);
  m.def("dtype_code", [](const at::Tensor& t) { return int(t.scalar_type()); });
  m.attr("DIMS") = kDims;
  ckattr::bind(m);
}
