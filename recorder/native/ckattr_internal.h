// What the attribution's two translation units share (ckattr.cpp, the per-step attribution,
// and ckattr_write.cpp, the rows of the run's tables; private to them): the trace's enums, a
// drain's facts as columns (Ops, Blocks, Saved) and the Attributor class, which holds them from
// step() to write(). Everything else stays in an anonymous namespace of its file. The namespace
// is hidden, as an anonymous one is in effect (and as pybind11's own is): nothing in it is
// exported from the binary. Like both files, it includes no torch header.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckrec.h"

namespace py = pybind11;

namespace ckattr {
namespace __attribute__((visibility("hidden"))) internal {

using ckrec::EndRow;
using ckrec::kDims;
using ckrec::MemRow;
using ckrec::ModRow;
using ckrec::NoteRow;
using ckrec::OomRow;
using ckrec::OpRow;
using ckrec::OutRow;
using ckrec::SavedRow;
using I64 = std::vector<int64_t>;
using I32 = std::vector<int32_t>;
using U8 = std::vector<uint8_t>;

// The trace's enums (ckview/trace/schema.py; tests/test_native_attribute.py checks them)
enum Phase : uint8_t { FORWARD = 0, BACKWARD = 1, RECOMPUTE = 2, OPTIMIZER = 3, OTHER = 4 };
constexpr int64_t kTemporary = 4, kOtherCategory = 6;  // Category
constexpr int64_t kAlloc = 0, kFree = 1;               // MemoryEventKind
constexpr int64_t kCudaBlock = 512;  // NOTE [ Block sizes on CUDA ] in attribute.py
constexpr int16_t kCuda = 1;         // c10::DeviceType::CUDA

template <class T>
struct Rows {
  const T* p = nullptr;
  size_t n = 0;
  const T& operator[](size_t i) const { return p[i]; }
};

template <class T>
py::array_t<T> out(const std::vector<T>& v) {
  return py::array_t<T>(py::ssize_t(v.size()), v.data());
}

// The row of each key of a sorted array (the first of equal keys): a table over the keys'
// range where they are dense (op, block and call ids of a drain count up), else binary search.
class Index {
 public:
  explicit Index(const I64& keys) : keys_(keys) {
    if (keys.empty() || keys.back() - keys.front() > int64_t(4 * keys.size() + 64)) return;
    first_ = keys.front();
    rows_.assign(size_t(keys.back() - first_ + 1), -1);
    for (size_t i = keys.size(); i-- > 0;) rows_[size_t(keys[i] - first_)] = int32_t(i);
  }
  // (found, row); the row only means something when found
  std::pair<bool, size_t> find(int64_t q) const {
    if (!rows_.empty()) {
      if (q < first_ || q - first_ >= int64_t(rows_.size())) return {false, 0};
      int32_t row = rows_[size_t(q - first_)];
      return {row >= 0, size_t(std::max(row, 0))};
    }
    auto it = std::lower_bound(keys_.begin(), keys_.end(), q);
    if (it == keys_.end() || *it != q) return {false, 0};
    return {true, size_t(it - keys_.begin())};
  }

 private:
  const I64& keys_;
  int64_t first_ = 0;
  std::vector<int32_t> rows_;
};

using Intervals = std::vector<std::pair<int64_t, int64_t>>;  // (start, end), sorted by start

using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

struct Layout {  // a tensor's dtype and shape (NOTE [ Layout strings ])
  int8_t dtype, ndim;
  int64_t dims[kDims];
  bool operator==(const Layout& o) const {
    return dtype == o.dtype && ndim == o.ndim && std::memcmp(dims, o.dims, sizeof dims) == 0;
  }
};
struct LayoutHash {
  size_t operator()(const Layout& k) const {
    uint64_t h = uint64_t(k.dtype) * 0x9E3779B97F4A7C15ULL ^ uint64_t(k.ndim);
    for (int64_t d : k.dims) h = (h ^ uint64_t(d)) * 0x100000001B3ULL;
    return size_t(h);
  }
};

struct Span {
  int phase;
  Intervals intervals;
};

struct ForwardCalls {  // NOTE [ Backward blocks and modules ] in attribute.py
  I64 call, parent, seq_begin, seq_end;
};

struct Ops {  // this drain's op rows in id order, as columns
  I64 id, t0, t1, seq, parent, top, node_seq, outer, seq_nr;
  I32 name, call, graph_task, module_call, module;
  U8 scope, raised, phase;
  I64 late_id, late_end;  // ends of ops of earlier drains
  void reserve(size_t n) {
    for (I64* c : {&id, &t0, &t1, &seq, &parent, &top, &node_seq, &outer, &seq_nr}) c->reserve(n);
    for (I32* c : {&name, &call, &graph_task, &module_call, &module}) c->reserve(n);
    for (U8* c : {&scope, &raised, &phase}) c->reserve(n);
  }
};

struct Blocks {  // blocks allocated in the drain, in block order, as columns
  Blocks() = default;
  explicit Blocks(size_t n)
      : block(n), ptr(n), nbytes(n), alloc_ns(n), free_ns(n, -1), free_op(n, -1), op(n), top(n),
        node_seq(n), dims(n * kDims, 0), device_type(n), device_index(n), call(n),
        module_call(n), module(n), phase(n, OTHER), saved(n, 0), dtype(n, -1), ndim(n, -1),
        op_row(n, -1), free_op_row(n, -1) {}
  I64 block, ptr, nbytes, alloc_ns, free_ns, free_op, op, top, node_seq, dims;
  std::vector<int16_t> device_type, device_index;
  I32 call, module_call, module;
  U8 phase, saved;
  std::vector<int8_t> dtype, ndim;
  I64 op_row, free_op_row;  // NOTE [ Op rows of a step ]
  I64 late_block, late_free_ns, late_free_op_row;  // frees of blocks of earlier drains
};

struct Saved {  // the drain's saved-tensor rows, as columns
  explicit Saved(size_t n = 0)
      : t(n), ptr(n), block(n), storage(n), nbytes(n), op(n), top(n), dims(n * kDims),
        op_row(n), call(n), module_call(n), kind(n), dtype(n), ndim(n) {}
  I64 t, ptr, block, storage, nbytes, op, top, dims, op_row, late;
  I32 call, module_call;
  U8 kind;
  std::vector<int8_t> dtype, ndim;
};

struct StepData {  // what one drain's rows say, whole
  Ops ops;
  Blocks blocks;
  Saved saved;
};

class Attributor {
 public:
  py::dict step(const py::buffer& ops_b, const py::buffer& ends_b, const py::buffer& mem_b,
                const py::buffer& saved_b, const py::buffer& outs_b, const py::buffer& mods_b,
                const py::buffer& ooms_b, const py::buffer& notes_b, const py::list& spans_in,
                bool nested);

  // NOTE [ Rows of the run's tables ]
  void use_strings(py::function intern, py::dict dtype_names, py::function device_id,
                   int64_t cpu_id);
  py::dict write(int64_t step, int64_t now, int64_t first_op, int64_t first_sid,
                 int64_t first_call, const Int64Array& call_starts,
                 const Int64Array& call_modules, const Int64Array& name_ids,
                 const std::optional<Int64Array>& stacks);
  py::array_t<int64_t> sids(const Int64Array& blocks) const;
  py::array_t<int64_t> call_rows(const Int64Array& native) const;
  void forget_calls(int64_t base, const Int64Array& kept);
  size_t live_blocks() const { return sid_of_block_.size(); }
  size_t known_calls() const { return call_rows_.size() + row_modules_.size(); }

 private:
  int32_t module_of(int64_t call) const {
    return call >= 0 && call < int64_t(call_module_.size()) ? call_module_[size_t(call)] : -1;
  }
  py::dict calls(Rows<ModRow> mods, const std::vector<Span>& spans);
  int64_t call_of_seq(int64_t seq) const;

  I32 call_module_;        // module of every call id seen (call ids count over the process)
  ForwardCalls previous_;  // the previous drain's forward calls
  // the lookup call_of_seq uses, built by calls(): forward calls of this drain and the last
  I64 by_begin_, call_by_begin_, ids_, ends_by_id_, parents_by_id_;
  std::unique_ptr<Index> id_index_;  // over ids_
  I64 step_calls_, step_call_starts_;  // this drain's calls (native ids) and their starts

  std::shared_ptr<const StepData> last_;  // what write() turns into rows: the last drain's
  // ids of the run's tables and strings
  std::pair<int64_t, int64_t> layout(int8_t dtype, int8_t ndim, const int64_t* dims);
  int64_t device(int16_t type, int16_t index);
  int64_t call_row(int64_t native) const;
  int64_t row_module(int64_t row) const;
  void add_python_calls(int64_t first, const Int64Array& starts, const Int64Array& modules);
  py::array_t<int64_t> ops_table(int64_t step, int64_t now, const Int64Array& names);
  py::array_t<int64_t> storages_table(int64_t first_op, int64_t first_sid,
                                      const std::optional<Int64Array>& stacks);
  py::array_t<int64_t> memory_table(int64_t first_op, int64_t first_sid, py::dict& d);
  py::array_t<int64_t> saved_storages(int64_t first_sid) const;
  py::array_t<int64_t> saved_table(int64_t first_op);
  std::unordered_map<int64_t, int64_t> sid_of_block_;  // the run's live blocks' storage rows
  I64 forget_;  // blocks freed in the last write (NOTE [ Freed blocks leave the map ])
  std::unordered_map<int64_t, int64_t> call_rows_;      // native call id -> Python call row
  mutable std::pair<int64_t, int64_t> last_call_{-1, -1};  // the last call_row lookup
  std::unordered_map<int64_t, int64_t> row_modules_;    // Python call row -> module
  py::function intern_, device_id_;
  int64_t cpu_id_ = -1, unknown_ = -1;
  std::unordered_map<int, std::string> dtype_names_;
  std::unordered_map<Layout, std::pair<int64_t, int64_t>, LayoutHash> layouts_;
  const std::pair<const Layout, std::pair<int64_t, int64_t>>* last_layout_ = nullptr;
  std::unordered_map<int32_t, int64_t> devices_;
};

}  // namespace internal
}  // namespace ckattr
