// The step's rows of the run's tables (NOTE [ Rows of the run's tables ] in
// recorder/native/attribute.py): Attributor::write turns the facts the last step() kept
// (ckattr.cpp) into rows of the ops, storages, memory and saved-tensor tables, with the ids
// that stay across steps: each live block's storage row, each native module call's Python call
// row and that row's module, and the run's strings for layouts and devices. It includes no
// torch header (ckattr_internal.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckattr_internal.h"
#include "ckrec.h"

namespace ckattr {
namespace internal {
namespace {
py::array_t<int64_t> table(size_t rows, size_t width) {
  return py::array_t<int64_t>({py::ssize_t(rows), py::ssize_t(width)});
}

// A row of the run's op table from an offset from the step's first (NOTE [ Op rows of a step ]
// in ckattr.cpp)
int64_t row_of(int64_t offset, int64_t first) { return offset >= 0 ? offset + first : -1; }
}  // namespace

// ------------------------------------------------------------------ the run's rows

// NOTE [ Freed blocks leave the map ]
// A freed block's id is never named again (NOTE [ Blocks by address ] in ckrec_ops.cpp: every
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

}  // namespace internal
}  // namespace ckattr
