// Per-step attribution of drained rows (NOTE [ Attribution in the extension ] in
// recorder/native/attribute.py, which documents what each column means): Attributor::step
// turns one drain's rows into the step's facts, and its columns on demand (StepTables); the
// rows of the run's tables that write() makes from them are ckattr_write.cpp's, and what both
// share is in ckattr_internal.h. It includes no torch header: it reads the rows the native
// sources wrote (ckrec.h), and compiles in a fraction of their time.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckattr.h"
#include "ckattr_internal.h"
#include "ckrec.h"

namespace ckattr {
namespace internal {
namespace {

template <class T>
Rows<T> rows_of(const py::buffer& buffer) {
  py::buffer_info info = buffer.request();
  size_t bytes = size_t(info.size) * size_t(info.itemsize);
  if (bytes % sizeof(T)) throw std::invalid_argument("a row buffer is not whole rows");
  return {static_cast<const T*>(info.ptr), bytes / sizeof(T)};
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

}  // namespace

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

namespace {
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
}  // namespace

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

}  // namespace internal

void bind(py::module_& m) {
  using namespace internal;  // NOLINT: StepTables and Attributor
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
