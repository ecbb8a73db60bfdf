// Per-step attribution of drained rows (NOTE [ Attribution in the extension ] in
// recorder/native/attribute.py, which documents what each column means). It includes no torch
// header: it reads the rows ckrec.cpp wrote, and compiles in about a third of ckrec.cpp's time.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckattr.h"
#include "ckrec.h"

namespace py = pybind11;

namespace ckattr {
namespace {

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
Rows<T> rows_of(const py::buffer& buffer) {
  py::buffer_info info = buffer.request();
  size_t bytes = size_t(info.size) * size_t(info.itemsize);
  if (bytes % sizeof(T)) throw std::invalid_argument("a row buffer is not whole rows");
  return {static_cast<const T*>(info.ptr), bytes / sizeof(T)};
}

template <class T>
py::array_t<T> out(const std::vector<T>& v) {
  return py::array_t<T>(py::ssize_t(v.size()), v.data());
}
py::array bools(const U8& v) {
  return py::array(py::dtype::of<bool>(), {py::ssize_t(v.size())}, {}, v.data());
}
py::array_t<int64_t> dims_out(const I64& dims) {
  py::ssize_t n = py::ssize_t(dims.size() / kDims);
  return py::array_t<int64_t>({n, py::ssize_t(kDims)}, dims.data());
}

// Indices 0..n-1 in stable order of key(i). Rows mostly come in order already (ids and times
// count up on the recording thread): one pass finds that, and no sort runs.
template <class F>
std::vector<size_t> stable_order(size_t n, F key) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; ++i) sorted = !(key(i) < key(i - 1));
  if (!sorted)
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
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

Intervals sorted_intervals(const Int64Array& a) {
  Intervals v;
  const int64_t* p = a.data();
  for (size_t i = 0; i + 1 < size_t(a.size()); i += 2) v.emplace_back(p[i], p[i + 1]);
  std::stable_sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.first < y.first; });
  return v;
}

// Whether `t` lies in the interval with the latest start at or before it.
inline bool inside(const Intervals& v, int64_t t) {
  auto it = std::upper_bound(
      v.begin(), v.end(), t,
      [](int64_t x, const std::pair<int64_t, int64_t>& s) { return x < s.first; });
  return it != v.begin() && t <= std::prev(it)->second;
}

py::array_t<int64_t> table(size_t rows, size_t width) {
  return py::array_t<int64_t>({py::ssize_t(rows), py::ssize_t(width)});
}

// A row of the run's op table from an offset from the step's first (NOTE [ Op rows of a step ])
int64_t row_of(int64_t offset, int64_t first) { return offset >= 0 ? offset + first : -1; }

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

py::dict ops_columns(const Ops& o);
py::dict blocks_columns(const Blocks& b);
py::dict saved_columns(const Saved& s);

// NOTE [ Columns on demand ]
// A drain's ops, blocks and saved rows become numpy columns only when Python asks for a table:
// some 60 arrays a step, of which the native ledger's step boundary reads a few, and only in
// the steps that need them (an input between steps, a recompute region, an op that raised).
class StepTables {
 public:
  explicit StepTables(std::shared_ptr<const StepData> data) : data_(std::move(data)) {}
  py::dict ops() const { return ops_columns(data_->ops); }
  py::dict blocks() const { return blocks_columns(data_->blocks); }
  py::dict saved() const { return saved_columns(data_->saved); }
  // The phase of each op id, OTHER for an id not of this drain.
  py::array_t<uint8_t> phases(const Int64Array& ids) const {
    const Ops& o = data_->ops;
    Index index(o.id);
    py::array_t<uint8_t> found(ids.size());
    for (py::ssize_t i = 0; i < ids.size(); ++i) {
      auto [here, row] = index.find(ids.data()[i]);
      found.mutable_data()[i] = here ? o.phase[row] : uint8_t(OTHER);
    }
    return found;
  }

 private:
  std::shared_ptr<const StepData> data_;
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

// Module calls begun in this drain; builds the backward lookup (forward calls, recomputes out).
py::dict Attributor::calls(Rows<ModRow> mods, const std::vector<Span>& spans) {
  int64_t top = -1;
  for (size_t i = 0; i < mods.n; ++i) top = std::max<int64_t>(top, mods[i].call);
  if (top + 1 > int64_t(call_module_.size()))
    call_module_.resize(size_t(std::max<int64_t>(top + 1, 2 * int64_t(call_module_.size()))), -1);
  std::unordered_map<int64_t, size_t> exit_of;  // the first exit row of each call
  for (size_t i = 0; i < mods.n; ++i)
    if (mods[i].enter == 0) exit_of.emplace(mods[i].call, i);
  I32 call, module, parent;
  I64 address, start, end, seq_begin, seq_end;
  for (size_t i = 0; i < mods.n; ++i) {
    const ModRow& m = mods[i];
    if (m.enter != 1) continue;
    call_module_[size_t(m.call)] = m.module;
    call.push_back(m.call);
    module.push_back(m.module);
    parent.push_back(m.parent);
    address.push_back(m.address);
    start.push_back(m.t);
    seq_begin.push_back(m.seq);
    auto it = exit_of.find(m.call);
    end.push_back(it == exit_of.end() ? -1 : mods[it->second].t);
    seq_end.push_back(it == exit_of.end() ? -1 : mods[it->second].seq);
  }
  ForwardCalls now;
  for (size_t i = 0; i < call.size(); ++i) {
    bool recompute = false;
    for (const Span& s : spans) recompute |= s.phase == RECOMPUTE && inside(s.intervals, start[i]);
    if (recompute) continue;
    now.call.push_back(call[i]);
    now.parent.push_back(parent[i]);
    now.seq_begin.push_back(seq_begin[i]);
    now.seq_end.push_back(seq_end[i]);
  }
  ForwardCalls both = previous_;
  for (size_t i = 0; i < now.call.size(); ++i) {
    both.call.push_back(now.call[i]);
    both.parent.push_back(now.parent[i]);
    both.seq_begin.push_back(now.seq_begin[i]);
    both.seq_end.push_back(now.seq_end[i]);
  }
  previous_ = std::move(now);
  step_calls_.assign(call.begin(), call.end());
  step_call_starts_ = start;
  size_t n = both.call.size();
  auto by_begin = stable_order(n, [&](size_t i) { return both.seq_begin[i]; });
  auto by_id = stable_order(n, [&](size_t i) { return both.call[i]; });
  by_begin_.assign(n, 0);
  call_by_begin_.assign(n, 0);
  ids_.assign(n, 0);
  ends_by_id_.assign(n, 0);
  parents_by_id_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    by_begin_[i] = both.seq_begin[by_begin[i]];
    call_by_begin_[i] = both.call[by_begin[i]];
    ids_[i] = both.call[by_id[i]];
    ends_by_id_[i] = both.seq_end[by_id[i]];
    parents_by_id_[i] = both.parent[by_id[i]];
  }
  id_index_ = std::make_unique<Index>(ids_);
  py::dict d;
  d["call"] = out(call);
  d["module"] = out(module);
  d["address"] = out(address);
  d["parent"] = out(parent);
  d["start_ns"] = out(start);
  d["end_ns"] = out(end);
  d["seq_begin"] = out(seq_begin);
  d["seq_end"] = out(seq_end);
  return d;
}

// The innermost forward call whose [begin, end) holds autograd number `seq`, or -1.
int64_t Attributor::call_of_seq(int64_t seq) const {
  if (by_begin_.empty() || seq < 0) return -1;
  size_t at = size_t(std::upper_bound(by_begin_.begin(), by_begin_.end(), seq) - by_begin_.begin());
  if (at == 0) return -1;
  int64_t found = call_by_begin_[at - 1];
  for (size_t hops = 0; found >= 0 && hops <= ids_.size(); ++hops) {
    auto [here, row] = id_index_->find(found);
    if (!(here && ends_by_id_[row] >= 0 && seq >= ends_by_id_[row])) break;
    found = parents_by_id_[row];  // out of a call that ended before the number: its parent
  }
  return found;
}

std::vector<Span> spans_of(const py::list& spans) {
  std::vector<Span> out;
  for (const py::handle& item : spans) {
    auto pair = item.cast<py::tuple>();
    out.push_back(Span{pair[0].cast<int>(), sorted_intervals(pair[1].cast<Int64Array>())});
  }
  return out;
}

// The drain's op rows in id order, with the ends that came for them.
Ops read_ops(Rows<OpRow> rows, Rows<EndRow> ends, bool nested) {
  Ops o;
  o.reserve(rows.n);
  for (size_t i : stable_order(rows.n, [&](size_t i) { return rows[i].id; })) {
    const OpRow& r = rows[i];
    o.id.push_back(r.id), o.t0.push_back(r.t0), o.t1.push_back(r.t1), o.seq.push_back(r.seq);
    o.parent.push_back(r.parent), o.top.push_back(r.top), o.node_seq.push_back(r.node_seq);
    o.outer.push_back(nested ? r.outer : r.id), o.name.push_back(r.name);
    o.call.push_back(r.call), o.graph_task.push_back(r.graph_task);
    o.scope.push_back(r.scope), o.raised.push_back(r.raised);
    o.seq_nr.push_back(r.node_seq >= 0 ? r.node_seq : -1);
  }
  Index index(o.id);
  for (size_t i = 0; i < ends.n; ++i) {
    auto [here, row] = index.find(ends[i].id);
    if (here) {
      o.t1[row] = ends[i].t1;
    } else {
      o.late_id.push_back(ends[i].id);
      o.late_end.push_back(ends[i].t1);
    }
  }
  return o;
}

uint8_t phase_of(const Ops& o, size_t i, const std::vector<Span>& spans) {
  bool backward = o.graph_task[i] >= 0 || o.node_seq[i] >= 0;
  uint8_t phase = backward ? BACKWARD : (o.call[i] >= 0 ? FORWARD : OTHER);
  for (const Span& s : spans)
    if (inside(s.intervals, o.t0[i])) phase = uint8_t(s.phase);
  return phase;
}

// NOTE [ Op rows of a step ]
// The trace's op rows of a step are its outermost ops (outer == id, NOTE [ Outermost ops ] in
// attribute.py), in id order, appended after the run's earlier rows: the k-th of them is row
// first + k. Every range maps to the row of its outermost op (none: a range no op holds, or held
// by an op of an earlier step). A row that names a range without a row (a block allocated
// outside any op) takes the next row to start after it; a free, the last row that started
// before it (the op after which the memory went, as the Python recorder has it). Rows come
// back as offsets from the step's first row, -1 where none.
class OpRows {
 public:
  explicit OpRows(const Ops& o) : index_(o.id) {
    size_t n = o.id.size();
    I64 kept_at(n, -1);
    int64_t next = 0;
    for (size_t i = 0; i < n; ++i)
      if (o.outer[i] == o.id[i]) kept_at[i] = next++;
    outer_row_.assign(n, -1);
    for (size_t i = 0; i < n; ++i) {
      auto [here, row] = index_.find(o.outer[i]);
      if (o.outer[i] >= 0 && here) outer_row_[i] = kept_at[row];
    }
    auto by_start = stable_order(n, [&](size_t i) { return o.t0[i]; });
    for (size_t i : by_start)
      if (outer_row_[i] >= 0) starts_.push_back(o.t0[i]), rows_.push_back(outer_row_[i]);
  }
  enum class Else { kNext, kLast };
  // The row of range `op`, else the next (or last) row to start around time `t`.
  int64_t row(int64_t op, int64_t t, Else otherwise) const {
    auto [here, at] = index_.find(op);
    int64_t row = here ? outer_row_[at] : -1;
    if (row >= 0 || rows_.empty()) return row;
    size_t after = size_t(std::upper_bound(starts_.begin(), starts_.end(), t) - starts_.begin());
    if (otherwise == Else::kLast) return after == 0 ? -1 : rows_[after - 1];
    return rows_[std::min(after, rows_.size() - 1)];
  }

 private:
  Index index_;
  I64 outer_row_, starts_, rows_;
};

py::dict ops_columns(const Ops& o) {
  py::dict d;
  for (const auto& [key, col] :
       {std::pair<const char*, const I64*>{"id", &o.id}, {"t0", &o.t0}, {"seq", &o.seq},
        {"parent", &o.parent}, {"top", &o.top}, {"node_seq", &o.node_seq},
        {"outer", &o.outer}, {"seq_nr", &o.seq_nr}})
    d[key] = out(*col);
  py::array t1 = out(o.t1);
  d["t1"] = t1, d["start_ns"] = d["t0"], d["end_ns"] = t1;
  d["name"] = out(o.name), d["call"] = out(o.call), d["graph_task"] = out(o.graph_task);
  d["scope"] = out(o.scope), d["raised"] = out(o.raised), d["phase"] = out(o.phase);
  d["module_call"] = out(o.module_call), d["module"] = out(o.module);
  return d;
}

// The allocations of `mem` in block order; frees of these set their free, the others are
// late (a block of an earlier drain) or unknown (allocated before recording).
Blocks read_blocks(Rows<MemRow> mem, const OpRows& op_rows, py::dict& facts) {
  std::vector<size_t> allocs, frees;
  for (size_t i = 0; i < mem.n; ++i) (mem[i].bytes > 0 ? allocs : frees).push_back(i);
  auto by_block = [&](size_t a, size_t b) { return mem[a].block < mem[b].block; };
  if (!std::is_sorted(allocs.begin(), allocs.end(), by_block))
    std::stable_sort(allocs.begin(), allocs.end(), by_block);
  Blocks b(allocs.size());
  for (size_t k = 0; k < allocs.size(); ++k) {
    const MemRow& r = mem[allocs[k]];
    b.block[k] = r.block, b.ptr[k] = r.ptr, b.nbytes[k] = r.bytes, b.alloc_ns[k] = r.t;
    b.op[k] = r.op, b.top[k] = r.top, b.node_seq[k] = r.node_seq, b.call[k] = r.call;
    b.device_type[k] = r.device_type, b.device_index[k] = r.device_index;
  }
  Index index(b.block);
  I64 late_op, unknown_ptr, unknown_bytes, unknown_t, unknown_op;
  std::vector<int16_t> unknown_type, unknown_index;
  for (size_t i : frees) {
    const MemRow& r = mem[i];
    auto [here, row] = index.find(r.block);
    if (here) {
      b.free_ns[row] = r.t, b.free_op[row] = r.op;
    } else if (r.block >= 0) {
      b.late_block.push_back(r.block), b.late_free_ns.push_back(r.t), late_op.push_back(r.op);
      b.late_free_op_row.push_back(op_rows.row(r.op, r.t, OpRows::Else::kLast));
    } else {
      unknown_ptr.push_back(r.ptr), unknown_bytes.push_back(-r.bytes), unknown_t.push_back(r.t);
      unknown_op.push_back(r.op), unknown_type.push_back(r.device_type);
      unknown_index.push_back(r.device_index);
    }
  }
  py::dict late, unknown;
  late["block"] = out(b.late_block), late["free_ns"] = out(b.late_free_ns);
  late["free_op"] = out(late_op), late["free_op_row"] = out(b.late_free_op_row);
  unknown["ptr"] = out(unknown_ptr), unknown["nbytes"] = out(unknown_bytes);
  unknown["t"] = out(unknown_t), unknown["op"] = out(unknown_op);
  unknown["device_type"] = out(unknown_type), unknown["device_index"] = out(unknown_index);
  facts["late_frees"] = late, facts["unknown_frees"] = unknown;
  return b;
}

// Each block's op (an allocation outside any op, a Python scalar wrapped before dispatch, takes
// the next op to start) and that op's phase.
void place_blocks(Blocks& b, const Ops& o) {
  size_t n_ops = o.id.size();
  if (!n_ops) return;
  Index index(o.id);
  auto by_start = stable_order(n_ops, [&](size_t i) { return o.t0[i]; });
  I64 starts(n_ops);
  for (size_t i = 0; i < n_ops; ++i) starts[i] = o.t0[by_start[i]];
  for (size_t k = 0; k < b.block.size(); ++k) {
    if (b.op[k] < 0) {
      size_t at = size_t(std::upper_bound(starts.begin(), starts.end(), b.alloc_ns[k]) -
                         starts.begin());
      size_t next = by_start[std::min(at, n_ops - 1)];
      b.op[k] = o.id[next], b.top[k] = o.top[next], b.node_seq[k] = o.node_seq[next];
    }
    auto [here, row] = index.find(b.op[k]);
    if (here) b.phase[k] = o.phase[row];
  }
}

// Dtype and shape of each new block: the first op output on it (and its size on CUDA).
void place_layouts(Blocks& b, Rows<OutRow> outs) {
  Index index(b.block);
  std::unordered_map<int64_t, size_t> first;
  for (size_t i : stable_order(outs.n, [&](size_t i) { return outs[i].t; }))
    first.emplace(outs[i].block, i);
  for (const auto& [block, i] : first) {
    auto [here, row] = index.find(block);
    if (!here) continue;
    const OutRow& r = outs[i];
    b.dtype[row] = r.tensor.dtype, b.ndim[row] = r.tensor.ndim;
    std::memcpy(&b.dims[row * kDims], r.tensor.dims, sizeof r.tensor.dims);
    if (b.device_type[row] == kCuda && r.storage_nbytes > 0) {
      int64_t rounded =
          std::max((r.storage_nbytes + kCudaBlock - 1) / kCudaBlock * kCudaBlock, kCudaBlock);
      b.nbytes[row] = std::min(b.nbytes[row], rounded);
    }
  }
}

py::dict blocks_columns(const Blocks& b) {
  py::dict d;
  d["block"] = out(b.block), d["ptr"] = out(b.ptr), d["nbytes"] = out(b.nbytes);
  d["device_type"] = out(b.device_type), d["device_index"] = out(b.device_index);
  d["alloc_ns"] = out(b.alloc_ns), d["free_ns"] = out(b.free_ns), d["free_op"] = out(b.free_op);
  d["op"] = out(b.op), d["top_op"] = out(b.top), d["node_seq"] = out(b.node_seq);
  d["phase"] = out(b.phase), d["module_call"] = out(b.module_call), d["call"] = out(b.call);
  d["module"] = out(b.module), d["saved"] = bools(b.saved);
  d["dtype"] = out(b.dtype), d["ndim"] = out(b.ndim), d["dims"] = dims_out(b.dims);
  d["op_row"] = out(b.op_row), d["free_op_row"] = out(b.free_op_row);
  return d;
}

// Saved-tensor packs and unpacks (an unpack's call: the forward call of the node unpacking);
// a pack marks its block saved, or names a block of an earlier drain (`late`).
Saved read_saved(Rows<SavedRow> rows, const Ops& o, const OpRows& op_rows, Blocks& b) {
  Saved s(rows.n);
  Index ops(o.id), blocks(b.block);
  for (size_t i = 0; i < rows.n; ++i) {
    const SavedRow& r = rows[i];
    s.t[i] = r.t, s.ptr[i] = r.ptr, s.block[i] = r.block, s.storage[i] = r.storage_nbytes;
    s.nbytes[i] = r.nbytes, s.op[i] = r.op, s.top[i] = r.top, s.call[i] = r.call;
    s.kind[i] = r.kind, s.dtype[i] = r.tensor.dtype, s.ndim[i] = r.tensor.ndim;
    std::memcpy(&s.dims[i * kDims], r.tensor.dims, sizeof r.tensor.dims);
    auto [known, row] = ops.find(r.op);
    s.module_call[i] = r.kind == 0 ? r.call : (known ? o.module_call[row] : -1);
    s.op_row[i] = op_rows.row(r.op, r.t, OpRows::Else::kNext);
    if (r.kind != 0) continue;
    auto [here, at] = blocks.find(r.block);
    if (here)
      b.saved[at] = 1;
    else if (r.block >= 0)
      s.late.push_back(r.block);
  }
  std::sort(s.late.begin(), s.late.end());
  s.late.erase(std::unique(s.late.begin(), s.late.end()), s.late.end());
  return s;
}

py::dict saved_columns(const Saved& s) {
  py::dict d;
  d["t"] = out(s.t), d["ptr"] = out(s.ptr), d["block"] = out(s.block);
  d["storage_nbytes"] = out(s.storage), d["nbytes"] = out(s.nbytes), d["op"] = out(s.op);
  d["top"] = out(s.top), d["call"] = out(s.call), d["kind"] = out(s.kind);
  d["dtype"] = out(s.dtype), d["ndim"] = out(s.ndim), d["dims"] = dims_out(s.dims);
  d["module_call"] = out(s.module_call), d["op_row"] = out(s.op_row);
  return d;
}

py::dict ooms_columns(Rows<OomRow> rows) {
  I64 t, bytes, allocated, reserved, op, top;
  I32 call;
  std::vector<int16_t> type, index;
  for (size_t i = 0; i < rows.n; ++i) {
    const OomRow& r = rows[i];
    t.push_back(r.t), bytes.push_back(r.bytes), allocated.push_back(r.allocated);
    reserved.push_back(r.reserved), op.push_back(r.op), top.push_back(r.top);
    call.push_back(r.call), type.push_back(r.device_type), index.push_back(r.device_index);
  }
  py::dict d;
  d["t"] = out(t), d["bytes"] = out(bytes), d["allocated"] = out(allocated);
  d["reserved"] = out(reserved), d["op"] = out(op), d["top"] = out(top), d["call"] = out(call);
  d["device_type"] = out(type), d["device_index"] = out(index);
  return d;
}

py::dict notes_columns(Rows<NoteRow> rows) {
  I64 t, block, sid, value;
  I32 module;
  U8 what;
  for (size_t i = 0; i < rows.n; ++i) {
    const NoteRow& r = rows[i];
    t.push_back(r.t), block.push_back(r.block), sid.push_back(r.sid), value.push_back(r.value);
    module.push_back(r.module), what.push_back(r.what);
  }
  py::dict d;
  d["t"] = out(t), d["block"] = out(block), d["sid"] = out(sid), d["value"] = out(value);
  d["module"] = out(module), d["what"] = out(what);
  return d;
}

py::dict Attributor::step(const py::buffer& ops_b, const py::buffer& ends_b,
                          const py::buffer& mem_b, const py::buffer& saved_b,
                          const py::buffer& outs_b, const py::buffer& mods_b,
                          const py::buffer& ooms_b, const py::buffer& notes_b,
                          const py::list& spans_in, bool nested) {
  std::vector<Span> spans = spans_of(spans_in);
  py::dict facts;
  facts["calls"] = calls(rows_of<ModRow>(mods_b), spans);
  Ops o = read_ops(rows_of<OpRow>(ops_b), rows_of<EndRow>(ends_b), nested);
  for (size_t i = 0; i < o.id.size(); ++i) {  // in backward, the forward call of the node
    o.phase.push_back(phase_of(o, i, spans));
    int64_t call = o.seq_nr[i] >= 0 ? call_of_seq(o.seq_nr[i]) : o.call[i];
    o.module_call.push_back(int32_t(call));
    o.module.push_back(module_of(call));
  }
  uint64_t raised = 0;
  for (uint8_t r : o.raised) raised += r;
  facts["raised"] = raised;
  py::dict late_ends;
  late_ends["id"] = out(o.late_id), late_ends["end_ns"] = out(o.late_end);
  facts["late_op_ends"] = late_ends;
  OpRows op_rows(o);
  Blocks b = read_blocks(rows_of<MemRow>(mem_b), op_rows, facts);
  place_blocks(b, o);
  for (size_t k = 0; k < b.block.size(); ++k) {
    int64_t call = b.node_seq[k] >= 0 ? call_of_seq(b.node_seq[k]) : b.call[k];
    b.module_call[k] = int32_t(call);
    b.module[k] = module_of(call);
    b.op_row[k] = op_rows.row(b.op[k], b.alloc_ns[k], OpRows::Else::kNext);
    if (b.free_ns[k] >= 0)
      b.free_op_row[k] = op_rows.row(b.free_op[k], b.free_ns[k], OpRows::Else::kLast);
  }
  Saved saved = read_saved(rows_of<SavedRow>(saved_b), o, op_rows, b);
  facts["late_saved"] = out(saved.late);
  place_layouts(b, rows_of<OutRow>(outs_b));
  facts["ooms"] = ooms_columns(rows_of<OomRow>(ooms_b));
  facts["notes"] = notes_columns(rows_of<NoteRow>(notes_b));
  last_ = std::make_shared<const StepData>(StepData{std::move(o), std::move(b), std::move(saved)});
  facts["tables"] = StepTables(last_);  // NOTE [ Columns on demand ]
  return facts;
}

// ------------------------------------------------------------------ the run's rows

// NOTE [ Freed blocks leave the map ]
// A freed block's id is never named again (NOTE [ Blocks by address ] in ckrec.cpp: every
// allocation gets a new id), so once its step's rows are written nothing asks for its storage
// row: the map keeps only the blocks alive, and stays as small as they are however long the
// recording (issue 21, defect 6: it grew by 16 bytes per block, about 20 KiB per small-op
// step). The blocks a write frees leave it at the next write, so that the caller can still
// look up the step's blocks (`sids`) until then.

void Attributor::use_strings(py::function intern, py::dict dtype_names, py::function device_id,
                             int64_t cpu_id) {
  intern_ = std::move(intern), device_id_ = std::move(device_id), cpu_id_ = cpu_id;
  for (const auto& [code, name] : dtype_names)
    dtype_names_[code.cast<int>()] = name.cast<std::string>();
  unknown_ = intern_("").cast<int64_t>();  // a block no op output names
}

// NOTE [ Layout strings ]
// A storage's and a saved tensor's dtype and shape are string ids ('float32', '64x128',
// 'scalar', '2x3x4x5x6x7x8x9x...' past kDims sizes), the empty string's where no op output names
// the block. Each distinct layout is formatted and interned once per run, when first seen.
std::pair<int64_t, int64_t> Attributor::layout(int8_t dtype, int8_t ndim, const int64_t* dims) {
  if (ndim < 0) return {unknown_, unknown_};
  Layout key{dtype, ndim, {}};
  std::memcpy(key.dims, dims, sizeof key.dims);
  if (last_layout_ && last_layout_->first == key) return last_layout_->second;
  auto it = layouts_.find(key);
  if (it != layouts_.end()) return (last_layout_ = &*it)->second;
  auto name = dtype_names_.find(dtype);
  std::string dtype_text =
      name != dtype_names_.end() ? name->second : "dtype" + std::to_string(dtype);
  std::string shape = ndim == 0 ? "scalar" : "";
  for (int i = 0; i < std::min<int>(ndim, kDims); ++i)
    shape += (i ? "x" : "") + std::to_string(dims[i]);
  if (ndim > kDims) shape += "x...";
  std::pair<int64_t, int64_t> ids{intern_(dtype_text).cast<int64_t>(),
                                  intern_(shape).cast<int64_t>()};
  last_layout_ = &*layouts_.emplace(key, ids).first;
  return ids;
}

int64_t Attributor::device(int16_t type, int16_t index) {
  if (type == 0) return cpu_id_;  // c10::DeviceType::CPU
  int32_t key = int32_t(type) << 16 | uint16_t(index);
  auto it = devices_.find(key);
  if (it == devices_.end())
    it = devices_.emplace(key, device_id_(type, index).cast<int64_t>()).first;
  return it->second;
}

int64_t Attributor::call_row(int64_t native) const {
  if (native < 0) return -1;
  if (native == last_call_.first) return last_call_.second;  // runs of rows share a call
  auto it = call_rows_.find(native);
  last_call_ = {native, it == call_rows_.end() ? -1 : it->second};
  return last_call_.second;
}

int64_t Attributor::row_module(int64_t row) const {
  auto it = row_modules_.find(row);
  return row < 0 || it == row_modules_.end() ? -1 : it->second;
}

// Each native call of the drain takes the Python call row that began last before it (rows
// `first`.. begin at `starts`, owned by `modules`).
void Attributor::add_python_calls(int64_t first, const Int64Array& starts,
                                  const Int64Array& modules) {
  const int64_t* s = starts.data();
  size_t n = size_t(starts.size());
  last_call_ = {-1, -1};
  for (size_t i = 0; i < n; ++i) row_modules_[first + int64_t(i)] = modules.data()[i];
  for (size_t i = 0; i < step_calls_.size(); ++i) {
    size_t at = size_t(std::upper_bound(s, s + n, step_call_starts_[i]) - s);
    call_rows_.emplace(step_calls_[i], at == 0 ? -1 : first + int64_t(at) - 1);
  }
}

void Attributor::forget_calls(int64_t base, const Int64Array& kept) {
  last_call_ = {-1, -1};
  std::unordered_set<int64_t> keep(kept.data(), kept.data() + kept.size());
  auto gone = [&](int64_t row) { return row < base && !keep.count(row); };
  for (auto it = call_rows_.begin(); it != call_rows_.end();)
    it = gone(it->second) ? call_rows_.erase(it) : std::next(it);
  for (auto it = row_modules_.begin(); it != row_modules_.end();)
    it = gone(it->first) ? row_modules_.erase(it) : std::next(it);
}

py::array_t<int64_t> Attributor::sids(const Int64Array& blocks) const {
  py::array_t<int64_t> found(blocks.size());
  int64_t* f = found.mutable_data();
  for (py::ssize_t i = 0; i < blocks.size(); ++i) {
    auto it = sid_of_block_.find(blocks.data()[i]);
    f[i] = it == sid_of_block_.end() ? -1 : it->second;
  }
  return found;
}

py::array_t<int64_t> Attributor::call_rows(const Int64Array& native) const {
  py::array_t<int64_t> found(native.size());
  for (py::ssize_t i = 0; i < native.size(); ++i)
    found.mutable_data()[i] = call_row(native.data()[i]);
  return found;
}

// The step's rows of the run's tables (NOTE [ Rows of the run's tables ]).
py::dict Attributor::write(int64_t step, int64_t now, int64_t first_op, int64_t first_sid,
                           int64_t first_call, const Int64Array& call_starts,
                           const Int64Array& call_modules, const Int64Array& name_ids,
                           const std::optional<Int64Array>& stacks) {
  if (!intern_) throw std::logic_error("Attributor.write before use_strings");
  if (!last_) throw std::logic_error("Attributor.write before step");
  for (int64_t block : forget_) sid_of_block_.erase(block);  // NOTE [ Freed blocks leave ...
  forget_.clear();
  add_python_calls(first_call, call_starts, call_modules);
  py::dict d;
  d["ops"] = ops_table(step, now, name_ids);
  d["storages"] = storages_table(first_op, first_sid, stacks);
  d["address"] = out(last_->blocks.ptr);
  d["memory"] = memory_table(first_op, first_sid, d);
  d["saved_sids"] = saved_storages(first_sid);
  d["saved"] = saved_table(first_op);
  d["saved_ptr"] = out(last_->saved.ptr);
  return d;
}

py::array_t<int64_t> Attributor::ops_table(int64_t step, int64_t now, const Int64Array& names) {
  const Ops& o = last_->ops;
  size_t kept = 0;
  for (size_t i = 0; i < o.id.size(); ++i) kept += o.outer[i] == o.id[i];
  auto t = table(kept, 7);
  int64_t* r = t.mutable_data();
  for (size_t i = 0; i < o.id.size(); ++i) {
    if (o.outer[i] != o.id[i]) continue;
    int64_t name = o.name[i] >= 0 && o.name[i] < names.size() ? names.data()[o.name[i]] : -1;
    int64_t call = call_row(o.phase[i] == RECOMPUTE ? o.call[i] : o.module_call[i]);
    int64_t end = o.t1[i] < 0 ? now : o.t1[i];
    for (int64_t v : {name, int64_t(o.phase[i]), call, step, o.t0[i], end, o.seq_nr[i]}) *r++ = v;
  }
  return t;
}

py::array_t<int64_t> Attributor::storages_table(int64_t first_op, int64_t first_sid,
                                                const std::optional<Int64Array>& stacks) {
  const Blocks& b = last_->blocks;
  size_t n = b.block.size();
  if (stacks && size_t(stacks->size()) != n) throw std::invalid_argument("one stack per block");
  auto t = table(n, 11);
  int64_t* r = t.mutable_data();
  sid_of_block_.reserve(sid_of_block_.size() + n);
  for (size_t k = 0; k < n; ++k) {
    auto [dtype, shape] = layout(b.dtype[k], b.ndim[k], &b.dims[k * kDims]);
    int64_t call = call_row(b.phase[k] == RECOMPUTE ? b.call[k] : b.module_call[k]);
    int64_t category = b.phase[k] == OTHER ? kOtherCategory : kTemporary;
    int64_t stack = stacks ? stacks->data()[k] : -1;
    for (int64_t v : {b.nbytes[k], device(b.device_type[k], b.device_index[k]), category, dtype,
                      shape, row_of(b.op_row[k], first_op), call, row_module(call),
                      b.alloc_ns[k], b.free_ns[k], stack})
      *r++ = v;
    sid_of_block_[b.block[k]] = first_sid + int64_t(k);
  }
  return t;
}

// ALLOC rows of the drain's blocks, FREE rows of those freed and of earlier blocks freed now
// (their storage rows' free_ns is for the caller to set: `late_sid`, `late_free_ns`), in time
// order; rows of one time in that order.
py::array_t<int64_t> Attributor::memory_table(int64_t first_op, int64_t first_sid, py::dict& d) {
  const Blocks& b = last_->blocks;
  size_t n = b.block.size();
  I64 late_sid, late_ns, late_row;
  for (size_t k = 0; k < b.late_block.size(); ++k) {
    auto it = sid_of_block_.find(b.late_block[k]);
    if (it == sid_of_block_.end()) continue;
    late_sid.push_back(it->second), late_ns.push_back(b.late_free_ns[k]);
    late_row.push_back(row_of(b.late_free_op_row[k], first_op));
  }
  std::vector<std::array<int64_t, 4>> events;  // kind, storage, op, time
  events.reserve(2 * n + late_sid.size());
  for (size_t k = 0; k < n; ++k)
    events.push_back({kAlloc, first_sid + int64_t(k), row_of(b.op_row[k], first_op),
                      b.alloc_ns[k]});
  for (size_t k = 0; k < n; ++k) {
    if (b.free_ns[k] < 0) continue;
    events.push_back({kFree, first_sid + int64_t(k), row_of(b.free_op_row[k], first_op),
                      b.free_ns[k]});
    forget_.push_back(b.block[k]);
  }
  for (size_t k = 0; k < late_sid.size(); ++k)
    events.push_back({kFree, late_sid[k], late_row[k], late_ns[k]});
  auto by_time = [](const auto& x, const auto& y) { return x[3] < y[3]; };
  std::stable_sort(events.begin(), events.end(), by_time);
  auto t = table(events.size(), 4);
  if (!events.empty())
    std::memcpy(t.mutable_data(), events.data(), events.size() * sizeof events[0]);
  forget_.insert(forget_.end(), b.late_block.begin(), b.late_block.end());
  d["late_sid"] = out(late_sid), d["late_free_ns"] = out(late_ns);
  return t;
}

// The storage rows autograd saved: this drain's blocks, then earlier ones.
py::array_t<int64_t> Attributor::saved_storages(int64_t first_sid) const {
  const Blocks& b = last_->blocks;
  I64 saved;
  for (size_t k = 0; k < b.block.size(); ++k)
    if (b.saved[k]) saved.push_back(first_sid + int64_t(k));
  for (int64_t block : last_->saved.late) {
    auto it = sid_of_block_.find(block);
    if (it != sid_of_block_.end()) saved.push_back(it->second);
  }
  return out(saved);
}

// saved_events rows; `storage` is -1 where the block is not the run's (a parameter's, from
// before the run: the caller finds its row by pointer, and drops the rows it cannot).
py::array_t<int64_t> Attributor::saved_table(int64_t first_op) {
  const Saved& s = last_->saved;
  size_t n = s.t.size();
  auto t = table(n, 8);
  int64_t* r = t.mutable_data();
  for (size_t i = 0; i < n; ++i) {
    auto it = sid_of_block_.find(s.block[i]);
    int64_t sid = it == sid_of_block_.end() ? -1 : it->second;
    auto [dtype, shape] = layout(s.dtype[i], s.ndim[i], &s.dims[i * kDims]);
    for (int64_t v : {int64_t(s.kind[i]), sid, row_of(s.op_row[i], first_op),
                      call_row(s.module_call[i]), shape, dtype, s.nbytes[i], s.t[i]})
      *r++ = v;
  }
  return t;
}

}  // namespace

void bind(py::module_& m) {
  py::class_<StepTables>(m, "StepTables", "A drain's columns, made when asked (attribute.py)")
      .def("ops", &StepTables::ops)
      .def("blocks", &StepTables::blocks)
      .def("saved", &StepTables::saved)
      .def("phases", &StepTables::phases, py::arg("ids"));
  py::class_<Attributor>(m, "Attributor", "Per-step attribution of drained rows (attribute.py)")
      .def(py::init<>())
      .def("step", &Attributor::step, py::arg("ops"), py::arg("op_ends"), py::arg("memory"),
           py::arg("saved"), py::arg("outputs"), py::arg("modules"), py::arg("ooms"),
           py::arg("notes"), py::arg("spans"), py::arg("nested"))
      .def("use_strings", &Attributor::use_strings, py::arg("intern"), py::arg("dtype_names"),
           py::arg("device_id"), py::arg("cpu_id"))
      .def("write", &Attributor::write, py::arg("step"), py::arg("now"), py::arg("first_op"),
           py::arg("first_sid"), py::arg("first_call"), py::arg("call_starts"),
           py::arg("call_modules"), py::arg("name_ids"), py::arg("stacks"))
      .def("sids", &Attributor::sids, py::arg("blocks"))
      .def("call_rows", &Attributor::call_rows, py::arg("native"))
      .def("forget_calls", &Attributor::forget_calls, py::arg("base"), py::arg("kept"))
      .def("live_blocks", &Attributor::live_blocks)
      .def("known_calls", &Attributor::known_calls);
}

}  // namespace ckattr
