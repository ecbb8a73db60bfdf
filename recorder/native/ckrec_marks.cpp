// Marks of the training state, one call each: the gradients of every known parameter, and every
// tensor of the optimizers' state (NOTE [ Marks in one call ]).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "ckrec_internal.h"

#include <unordered_set>
#include <utility>
#include <vector>

namespace ckrec {
namespace internal {

// NOTE [ Marks in one call ]
// A step marks its gradients twice (at backward's end and at the optimizer's step) and the
// optimizers' state once: some 400 tensors of a small-op step, each looked up in Python (its
// `.grad`, its owner, a set of those seen) at 0.3 ms a step. Here the same walks run in C++,
// in the same order, and note() each tensor as note_all() would (NOTE [ Notes ] in
// ckrec_hooks.cpp). The owners are ModuleRegistry's RowsByIdentity table, read as it is stored
// ({id: (weak reference, row)}: recorder/modules.py). What only Python reads the same way is
// left to it: the gradient of a tensor subclass (its `.grad` may be overridden), and a state
// value that is not a tensor, or a flat tuple, list or dict of them (L-BFGS's history is).
// Neither walk runs Python code while it iterates a dict (a collection in between could drop a
// dead owner's entry): the tensors it could not note are wrapped for Python afterwards.
namespace {
constexpr long long kNoModule = -1;

// The object weak reference `ref` refers to, None once it died.
py::object referent(PyObject* ref) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* obj = nullptr;
  if (PyWeakref_GetRef(ref, &obj) <= 0) {
    PyErr_Clear();  // not a weak reference: as a dead one
    return py::none();
  }
  return py::reinterpret_steal<py::object>(obj);
#else
  return py::reinterpret_borrow<py::object>(PyWeakref_GetObject(ref));
#endif
}

// The row `owners` gives `obj` (-1 if none); -2 with a Python error set.
long long owner_row(PyObject* owners, PyObject* obj) {
  PyObject* key = PyLong_FromVoidPtr(obj);
  if (!key) return -2;
  PyObject* entry = PyDict_GetItemWithError(owners, key);  // borrowed
  Py_DECREF(key);
  if (!entry) return PyErr_Occurred() ? -2 : kNoModule;
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) return kNoModule;
  if (referent(PyTuple_GET_ITEM(entry, 0)).ptr() != obj) return kNoModule;  // an id reused
  long long row = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
  return row == -1 && PyErr_Occurred() ? -2 : row;
}

// The tensors left to Python, as a list of (tensor, module) pairs.
PyObject* pairs(const std::vector<std::pair<PyObject*, long long>>& left) {
  PyObject* out = PyList_New(Py_ssize_t(left.size()));
  if (!out) return nullptr;
  for (size_t i = 0; i < left.size(); ++i) {
    PyObject* pair = Py_BuildValue("(OL)", left[i].first, left[i].second);
    if (!pair) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, Py_ssize_t(i), pair);
  }
  return out;
}

// The arguments both walks take: (owners: dict, optimizers: list, value: int); false with a
// Python error set.
bool walk_args(PyObject* const* args, Py_ssize_t nargs, const char* name, long long& value) {
  if (nargs != 3 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
    PyErr_Format(PyExc_TypeError, "%s(owners: dict, optimizers: list, value)", name);
    return false;
  }
  value = PyLong_AsLongLong(args[2]);
  return !(value == -1 && PyErr_Occurred());
}

// Every parameter of the optimizers' param_groups, in order (new references).
bool optimizer_parameters(PyObject* optimizers, std::vector<py::object>& out) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(optimizers); ++i) {
    py::object groups = py::reinterpret_steal<py::object>(
        PyObject_GetAttrString(PyList_GET_ITEM(optimizers, i), "param_groups"));
    if (!groups) return false;
    py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(groups.ptr(), "groups"));
    if (!fast) return false;
    for (Py_ssize_t g = 0; g < PySequence_Fast_GET_SIZE(fast.ptr()); ++g) {
      PyObject* group = PySequence_Fast_GET_ITEM(fast.ptr(), g);
      PyObject* params = PyDict_Check(group) ? PyDict_GetItemString(group, "params") : nullptr;
      if (!params) continue;
      py::object items = py::reinterpret_steal<py::object>(PySequence_Fast(params, "params"));
      if (!items) return false;
      for (Py_ssize_t p = 0; p < PySequence_Fast_GET_SIZE(items.ptr()); ++p)
        out.push_back(py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(items.ptr(), p)));
    }
  }
  return true;
}

// note_gradients(owners, optimizers, value): marks the gradient of each parameter `owners`
// knows, with its owner, then of each optimizer parameter no module owns, with none (as
// NativeLedger.mark_gradients did in Python). Returns what Python notes itself: (gradient,
// module) pairs this could not note, and (parameter, module) pairs whose `.grad` only Python
// reads, in a pair of lists.
PyObject* py_note_gradients(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long long value;
  if (!walk_args(args, nargs, "note_gradients", value)) return nullptr;
  py::object entries = py::reinterpret_steal<py::object>(PyDict_Values(args[0]));  // a snapshot
  if (!entries) return nullptr;
  std::vector<py::object> params;
  std::vector<long long> modules;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries.ptr()); ++i) {
    PyObject* entry = PyList_GET_ITEM(entries.ptr(), i);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) continue;
    py::object p = referent(PyTuple_GET_ITEM(entry, 0));
    if (p.is_none()) continue;  // died
    long long row = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
    if (row == -1 && PyErr_Occurred()) return nullptr;
    params.push_back(std::move(p));
    modules.push_back(row);
  }
  std::unordered_set<PyObject*> seen;
  for (const py::object& p : params) seen.insert(p.ptr());
  std::vector<py::object> more;
  if (!optimizer_parameters(args[1], more)) return nullptr;
  for (py::object& p : more) {
    if (!seen.insert(p.ptr()).second) continue;
    params.push_back(std::move(p));
    modules.push_back(kNoModule);
  }
  std::vector<std::pair<at::Tensor, long long>> missed;
  std::vector<std::pair<PyObject*, long long>> python;
  for (size_t i = 0; i < params.size(); ++i) {
    PyObject* p = params[i].ptr();
    if (!THPVariable_CheckExact(p)) {
      if (THPVariable_Check(p)) python.emplace_back(p, modules[i]);
      continue;
    }
    const at::Tensor& grad = THPVariable_Unpack(p).grad();
    if (grad.defined() && !note(grad, 0, value, int32_t(modules[i])))
      missed.emplace_back(grad, modules[i]);
  }
  std::vector<py::object> wrapped;  // Python objects only now, after every walk
  std::vector<std::pair<PyObject*, long long>> left;
  for (auto& [grad, module] : missed) {
    wrapped.push_back(py::reinterpret_steal<py::object>(THPVariable_Wrap(grad)));
    if (!wrapped.back()) return nullptr;
    left.emplace_back(wrapped.back().ptr(), module);
  }
  py::object a = py::reinterpret_steal<py::object>(pairs(left));
  py::object b = py::reinterpret_steal<py::object>(pairs(python));
  if (!a || !b) return nullptr;
  return PyTuple_Pack(2, a.ptr(), b.ptr());
}

// note_optimizer_state(owners, optimizers, value): marks every tensor of the optimizers'
// state, each with its parameter's owner (as NativeLedger.mark_optimizer_tensors did in
// Python). Returns the (tensor, module) pairs it could not note, or None, having noted
// nothing, where a state value is one only Python's walk reads (NOTE [ Marks in one call ]).
PyObject* py_note_optimizer_state(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long long value;
  if (!walk_args(args, nargs, "note_optimizer_state", value)) return nullptr;
  std::vector<py::object> states;  // keep each state dict alive while its tensors are noted
  std::vector<std::pair<PyObject*, long long>> found;
  std::vector<PyObject*> tensors;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[1]); ++i) {
    py::object state = py::reinterpret_steal<py::object>(
        PyObject_GetAttrString(PyList_GET_ITEM(args[1], i), "state"));
    if (!state) return nullptr;
    if (!PyDict_Check(state.ptr())) Py_RETURN_NONE;
    Py_ssize_t pos = 0;
    PyObject *param, *values;
    while (PyDict_Next(state.ptr(), &pos, &param, &values)) {
      long long module = owner_row(args[0], param);
      if (module == -2) return nullptr;
      if (!PyDict_Check(values)) Py_RETURN_NONE;
      Py_ssize_t at = 0;
      PyObject *key, *v;
      while (PyDict_Next(values, &at, &key, &v)) {
        tensors.clear();
        if (!flat_tensors(v, tensors)) Py_RETURN_NONE;
        for (PyObject* t : tensors) found.emplace_back(t, module);
      }
    }
    states.push_back(std::move(state));
  }
  std::vector<std::pair<PyObject*, long long>> left;
  for (auto& [t, module] : found)
    if (!note(t, 0, value, int32_t(module))) left.emplace_back(t, module);
  return pairs(left);
}

PyMethodDef mark_defs[] = {
    {"note_gradients",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_note_gradients)),
     METH_FASTCALL, "note_gradients(owners, optimizers, value): NOTE [ Marks in one call ]"},
    {"note_optimizer_state",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_note_optimizer_state)),
     METH_FASTCALL, "note_optimizer_state(owners, optimizers, value): NOTE [ Marks in one call ]"},
};
}  // namespace

void add_marks(py::module_& m) {
  for (PyMethodDef& def : mark_defs)
    m.attr(def.ml_name) = py::reinterpret_steal<py::object>(PyCFunction_New(&def, nullptr));
}

}  // namespace internal
}  // namespace ckrec
