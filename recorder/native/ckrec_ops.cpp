// The hot path of ckview's native event sources: every op range (a RecordFunction callback,
// on_start/on_end) and every allocator block (the memory reporter in torch's profiler slot), each
// written as a row into its thread's buffer with the op, top-level op, backward node and module
// call open at that moment. With them, what they alone call per event: the thread's state, op
// names interned through per-thread caches, and the table of live blocks by address. They share
// one translation unit so that those helpers inline into the callbacks; how they are started and
// drained is ckrec.cpp's, the hooks Python calls are ckrec_hooks.cpp's. Like ckrec_hooks.cpp, it
// includes only the torch headers it uses (torch/extension.h alone takes 25 s to compile).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/graph_task.h>

#include "ckrec.h"
#include "ckrec_internal.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ckrec {
namespace internal {

std::atomic<Buffers*> drainer{nullptr};  // NOTE [ The recording thread writes without a lock ]
std::mutex registry_mu;  // guards `registry`, names and module ids
std::vector<std::shared_ptr<Buffers>> registry;
std::atomic<uint64_t> generation{1};  // bumped by start(): stacks of an earlier recording go

namespace {
std::vector<std::string> names;
std::vector<uint8_t> name_is_op;  // 1 where the name is a dispatcher op's (NOTE [ Interning op names ])
std::unordered_map<std::string, int32_t> name_ids;
std::atomic<int64_t> next_op{0};
std::atomic<uint64_t> op_deregistrations{0};  // NOTE [ Interning op names ]

thread_local ThreadState tls;
// A plain pointer to `tls`: reading it needs no call to the thread_local's initialisation
// wrapper, which every access to `tls` itself makes (a callback reads its state several times).
thread_local ThreadState* tls_ptr = nullptr;
}  // namespace

ThreadState& state() {
  ThreadState* ts = tls_ptr;
  if (!ts) ts = tls_ptr = &tls;
  uint64_t g = generation.load(std::memory_order_relaxed);
  if (ts->generation != g) {
    ts->ops.clear();
    ts->calls.clear();
    ts->last_node_seq = -1;
    ts->by_ptr.clear();  // names mark_ops() made ops since
    ts->recent.assign(kRecentNames, RecentName{});
    ts->deregistrations = op_deregistrations.load(std::memory_order_acquire);
    ts->by_text.assign(kTextNames, TextName{});
    ts->generation = g;
  }
  if (!ts->buf) {
    ts->buf = std::make_shared<Buffers>();
    std::lock_guard<std::mutex> lock(registry_mu);
    registry.push_back(ts->buf);
  }
  return *ts;
}

namespace {
// The id of `text`, interned on first sight; `is_op` says whether it names an op (the
// dispatcher's, or one mark_ops() named).
int32_t intern_text(const char* text, bool& is_op) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = name_ids.find(text);
  if (it != name_ids.end()) {
    is_op = name_is_op[size_t(it->second)] != 0;
    return it->second;
  }
  int32_t id = int32_t(names.size());
  names.emplace_back(text);
  name_is_op.push_back(is_op ? 1 : 0);
  name_ids.emplace(names.back(), id);
  return id;
}
}  // namespace

// Ranges named `op_names` count as ops from the next start() on (the compiled regions of NOTE
// [ Compiled code on the native path ] in recorder/compiled.py).
void mark_ops(const std::vector<std::string>& op_names) {
  for (const std::string& text : op_names) {
    bool is_op = true;
    int32_t id = intern_text(text.c_str(), is_op);
    std::lock_guard<std::mutex> lock(registry_mu);
    name_is_op[size_t(id)] = 1;
  }
}

// The interned names from index `first` on (Python's `names()`: the texts of new name ids).
std::vector<std::string> names_from(size_t first) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (first >= names.size()) return {};
  return std::vector<std::string>(names.begin() + int64_t(first), names.end());
}

namespace {
// NOTE [ Interning op names ]
// An op the dispatcher runs is named as the Python recorder names it, after its overload
// (``aten.mm.default``, ``aten.add.Tensor``): the names plans, patterns and the projection
// use. Other ranges keep RecordFunction's name (a backward node's ``AddmmBackward0``, a
// script's ``record_function`` label). A dispatcher op's name points into its schema and
// lives as long as it, so a thread caches those by pointer. Only a deregistered op's schema
// frees its name, and another name may then reuse the address: a listener on the dispatcher
// counts deregistrations, and a thread that sees the count change empties its caches by
// pointer (comparing each hit's text instead cost more than the rest of the lookup). A
// direct-mapped slot per pointer sits in front of the cache: a hit costs one compare, no
// hashing and no pointer to follow (the map's lookup was most of a range's cost). Names that
// are no dispatcher op's are looked up by text, in a direct-mapped cache of their own: a
// backward node's name, and the engine's ``autograd::engine::evaluate_function: X``, whose
// string is built anew for every node (a cache by pointer missed on each, and interning took a
// lock and allocated strings).
std::string dispatch_name(const at::RecordFunction& fn) {
  auto op = fn.operator_name();
  if (!op) return "";
  std::string name = op->name;
  auto sep = name.find("::");
  if (sep != std::string::npos) name.replace(sep, 2, ".");
  return name + "." + (op->overload_name.empty() ? std::string("default") : op->overload_name);
}

// NOTE [ Ops as a dispatch mode sees them ]
// A TorchDispatchMode (the Python recorder's, and torch's selective checkpoint policy, which
// op-level plans name ops for) sees the ops that reach the dispatcher's Python key, below
// autograd. An op whose kernel for autograd is its CompositeImplicitAutograd decomposition
// (aten.linear, aten.matmul, aten.dropout) never gets there: the ops it calls do (aten.t,
// aten.addmm). So an op range counts as an op of the trace when no op encloses it, or when its
// parent is such an op and decomposes; a decomposing op that called ops is then not an op of the
// trace itself (on_end takes its `outer` back). The rule is the dispatcher's for a dense
// tensor: a CompositeImplicitAutograd kernel is used unless the op has its own kernel for the
// backend, for autograd or a CompositeExplicitAutograd one (CPU and CUDA are checked, so an op
// with a CUDA kernel only counts as not decomposing on the CPU too). What the mode itself
// changes is not reproduced: under a mode, aten.reshape calls aten.view where it otherwise calls
// aten._reshape_alias, and autograd sums gradients with aten.add where it otherwise uses add_.
bool decomposes(const c10::OperatorName& op) {
  auto handle = c10::Dispatcher::singleton().findOp(op);
  if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
    return false;
  for (c10::DispatchKey key :
       {c10::DispatchKey::CPU, c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCPU,
        c10::DispatchKey::AutogradCUDA, c10::DispatchKey::CompositeExplicitAutograd,
        c10::DispatchKey::CompositeExplicitAutogradNonFunctional})
    if (handle->hasKernelForDispatchKey(key)) return false;
  return true;
}

// The name of a range that is no dispatcher op's, by its text.
Name intern_by_text(ThreadState& ts, const char* p) {
  std::string_view text(p);
  TextName& slot = ts.by_text[std::hash<std::string_view>{}(text) & (kTextNames - 1)];
  if (slot.name.id >= 0 && slot.text == text) return slot.name;
  bool is_op = false;  // unless mark_ops() named it
  int32_t id = intern_text(p, is_op);
  slot.text.assign(text);
  slot.name = Name{id, is_op};
  return slot.name;
}

Name intern(ThreadState& ts, const at::RecordFunction& fn) {
  const char* p = fn.name();
  if (fn.scope() != at::RecordScope::FUNCTION) return intern_by_text(ts, p);
  uint64_t deregistrations = op_deregistrations.load(std::memory_order_acquire);
  if (ts.deregistrations != deregistrations) {  // an address may now name another op
    ts.by_ptr.clear();
    ts.recent.assign(kRecentNames, RecentName{});
    ts.deregistrations = deregistrations;
  }
  RecentName& slot = ts.recent[(reinterpret_cast<uintptr_t>(p) >> 3) & (kRecentNames - 1)];
  if (slot.ptr == p) return slot.name;
  auto it = ts.by_ptr.find(p);
  if (it == ts.by_ptr.end()) {
    std::string op = dispatch_name(fn);
    if (op.empty()) return intern_by_text(ts, p);
    bool is_op = true;
    int32_t id = intern_text(op.c_str(), is_op);
    bool decomposing = decomposes(*fn.operator_name());  // not mark_ops' names
    it = ts.by_ptr.emplace(p, Name{id, is_op, decomposing}).first;
  }
  slot = RecentName{p, it->second};
  return it->second;
}

// Counts op deregistrations for the caches by pointer (NOTE [ Interning op names ]).
struct Deregistrations final : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    op_deregistrations.fetch_add(1, std::memory_order_release);
  }
};
}  // namespace

// Registers the listener once per process; its handle is never destroyed, so that nothing
// touches the dispatcher while statics are torn down at exit.
void listen_for_deregistrations() {
  static auto* handle = new c10::RegistrationHandleRAII(
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<Deregistrations>()));
  (void)handle;
}

void describe(const at::Tensor& t, TensorInfo& info) {
  info.dtype = int8_t(t.scalar_type());
  int64_t nd = t.dim();
  info.ndim = int8_t(nd);
  std::memset(info.pad, 0, sizeof info.pad);
  auto sizes = t.sizes();
  for (int i = 0; i < kDims; ++i) info.dims[i] = i < nd ? sizes[i] : 0;
}

// ---------------------------------------------------------------------------------------------
// Blocks
// ---------------------------------------------------------------------------------------------
// NOTE [ Blocks by address ]
// Every allocation gets a block id (counting up over the process), and a table keyed by device
// and address holds the id of the block that lives there now: an allocation enters it, a free
// takes it out. So a free, a saved tensor and an op output name their block when they happen,
// and no pairing by address and time is left for later. A free the table does not know (a block
// allocated before start(), which CUDA reports and the CPU allocator does not) gets -1.
// blocks_mu is never held together with a buffer's lock.
SpinLock blocks_mu;  // NOTE [ The block table's lock ] in ckrec.h
BlockTable live_blocks;  // guarded by blocks_mu

namespace {
int64_t next_block = 0;  // guarded by blocks_mu

int64_t on_block(int64_t ptr, int64_t bytes, c10::Device d) {
  std::lock_guard<SpinLock> lock(blocks_mu);
  int64_t key = block_key(ptr, d);
  if (bytes > 0) {
    live_blocks.put(key, next_block);
    return next_block++;
  }
  return live_blocks.take(key);
}
}  // namespace

void forget_blocks() {
  std::lock_guard<SpinLock> lock(blocks_mu);
  live_blocks.clear();
}

int64_t block_of(const at::Tensor& t) {
  int64_t key = block_key(addr(t.storage().unsafeGetStorageImpl()->data_ptr().get()), t.device());
  std::lock_guard<SpinLock> lock(blocks_mu);
  return live_blocks.get(key);
}

// ---------------------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------------------
std::atomic<bool> want_outputs{false};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (off()) return nullptr;
  ThreadState& ts = state();
  int64_t t = now_ns();
  int64_t id = next_op.fetch_add(1, std::memory_order_relaxed);
  bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  int64_t parent = cur_op(ts);
  int64_t top = parent < 0 ? id : ts.ops.back().top;
  int32_t graph_task = int32_t(torch::autograd::get_current_graph_task_id());
  bool in_node = node || (parent >= 0 && ts.ops.back().in_node);
  int64_t node_seq = node ? fn.seqNr() : cur_node(ts);
  if (!in_node && graph_task >= 0) node_seq = ts.last_node_seq;
  Name name = intern(ts, fn);
  int64_t outer = parent >= 0 ? ts.ops.back().outer : -1;  // NOTE [ Outermost ops ]
  if (parent >= 0 && name.is_op && ts.ops.back().decomposes && outer == parent) {
    outer = id;  // NOTE [ Ops as a dispatch mode sees them ]
    ts.ops.back().descended = true;
  }
  if (outer < 0 && name.is_op) outer = id;
  OpRow row{id,    t,       -1,         fn.seqNr(),   parent,           top, node_seq,
            outer, name.id, cur_call(ts), graph_task, uint8_t(fn.scope()), 0, {0, 0}};
  Buffers& b = *ts.buf;
  BufferLock lock(b, drainer);
  if (node && fn.seqNr() >= 0 && ts.ops.size() == 1 && ts.ops.back().node_seq < 0) {
    Frame& engine = ts.ops.back();  // NOTE [ Engine work between nodes ]: the first node's
    engine.node_seq = fn.seqNr();
    int64_t i = engine.local - b.drained_ops;
    if (i >= 0 && i < int64_t(b.ops.size())) b.ops[size_t(i)].node_seq = fn.seqNr();
  }
  ts.ops.push_back(
      Frame{id, b.drained_ops + int64_t(b.ops.size()), top, node_seq, outer, 0, in_node,
            name.decomposes && outer == id, false, false});
  b.ops.push_back(row);
  return nullptr;
}

// NOTE [ Engine work between nodes ]
// Between two backward node ranges the autograd engine runs ops of its own on the node's
// outputs: validate_outputs reduces a broadcast gradient to its input's shape (a Linear bias's
// `sum`) or views it back (`view`), and input buffers accumulate gradients (`add`). They
// belong to the node that just ran, so an op inside a graph task and outside every node range
// takes the sequence number of the last node range that ended on the thread, as the Python
// recorder's _last_seq_call does, also inside the engine's own evaluate_function range
// ("autograd::engine::evaluate_function: X", top-level), which begins before its node's range.
// Around the first node of the recording no node ran before: that range takes its node's
// number when the node's range begins.

// NOTE [ Op ends ]
// A range is closed on the thread that opened it, last opened first closed, so the thread's
// stack top is the range that ends. Its row is still in the buffer unless drain() ran while it
// was open (a step boundary inside an op): then the end goes to an EndRow that Python applies.
// A range also ends when an exception leaves its op (RecordFunction ends in its destructor):
// the row's `raised` says so (NOTE [ OOM capture on the native path ] in native_ledger.py);
// an EndRow does not carry it.
// NOTE [ Nested ranges that leave no row ]
// Most ranges of a step are nested in an op of the trace (the kernels aten.addmm or an
// optimizer's op call runs, the `aten.to` -> `aten._to_copy` -> `aten.empty_strided` of a
// scalar's type promotion): three of four on the small-op step. Python needs such a row only
// when another row names it (`named`), when it is an op of the trace or held one (`outer`,
// `descended`), or when it says something itself (a backward node's range, a sequence number,
// an exception leaving it). Blocks and saved tensors name the op of the trace that holds
// their range (named_outer()), so a nested range is named only by an out-of-memory row. Any
// other range closes as its buffer's last row (ranges close innermost first, so no row of a
// range it held is left behind it) and is taken back: the drain and the attribution, which
// cost per row, shrink by as much, and every row left names only rows that are there.
namespace {
bool leaves_no_row(const Frame& f, const OpRow& row, size_t i, const Buffers& b) {
  return i + 1 == b.ops.size() && !f.named && !f.descended && row.parent >= 0 &&
         row.outer != row.id && row.seq < 0 && row.raised == 0 &&
         row.scope == uint8_t(at::RecordScope::FUNCTION);
}
}  // namespace

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (off()) return;
  ThreadState& ts = state();
  if (ts.ops.empty()) return;  // opened before start() or before a restart
  Frame f = ts.ops.back();
  ts.ops.pop_back();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION && fn.seqNr() >= 0)
    ts.last_node_seq = fn.seqNr();
  Buffers& b = *ts.buf;
  int64_t t = -1;  // the clock is read only for a row that keeps it (most ranges leave none)
  {
    BufferLock lock(b, drainer);
    int64_t i = f.local - b.drained_ops;
    if (i >= 0 && i < int64_t(b.ops.size())) {
      OpRow& row = b.ops[size_t(i)];
      row.raised = uint8_t(std::uncaught_exceptions() > 0);
      if (f.descended) row.outer = -1;  // NOTE [ Ops as a dispatch mode sees them ]
      if (leaves_no_row(f, row, size_t(i), b))
        b.ops.pop_back();
      else
        row.t1 = t = now_ns();
    } else {
      b.ends.push_back(EndRow{f.id, t = now_ns()});
    }
  }
  // NOTE [ Outputs of allocating ops ]: a block's dtype and shape are those of the first tensor
  // returned on it, which the op that allocated it returns; ops that allocated nothing return
  // views of blocks that already have one, and are skipped (most ops of a step).
  if (!want_outputs.load(std::memory_order_relaxed) || f.allocations == 0) return;
  if (t < 0) t = now_ns();
  int64_t op = outer_or_self(f);
  for (const c10::IValue& v : fn.outputs()) {
    if (!v.isTensor()) continue;
    const at::Tensor& out = v.toTensor();
    if (!out.defined() || !out.has_storage()) continue;
    const c10::StorageImpl* s = out.storage().unsafeGetStorageImpl();
    OutRow row{t, op, addr(s->data_ptr().get()), block_of(out), int64_t(s->nbytes()), {}};
    describe(out, row.tensor);
    BufferLock lock(b, drainer);
    b.outs.push_back(row);
  }
}

// ---------------------------------------------------------------------------------------------
// Allocator blocks
// ---------------------------------------------------------------------------------------------
void Reporter::reportMemoryUsage(void* ptr, int64_t bytes, size_t allocated, size_t reserved,
                                 c10::Device d) {
  if (off()) return;
  int64_t t = now_ns();
  ThreadState& ts = state();
  int64_t block = on_block(addr(ptr), bytes, d);
  if (bytes > 0 && !ts.ops.empty()) ++ts.ops.back().allocations;
  MemRow row{t,           addr(ptr),  bytes,         block,
             named_outer(ts), cur_top(ts), cur_node(ts), int64_t(allocated),
             int64_t(reserved), cur_call(ts), int16_t(d.type()), int16_t(d.index())};
  BufferLock lock(*ts.buf, drainer);
  ts.buf->mems.push_back(row);
}

void Reporter::reportOutOfMemory(int64_t bytes, size_t allocated, size_t reserved,
                                 c10::Device d) {
  if (off()) return;
  int64_t t = now_ns();
  ThreadState& ts = state();
  OomRow row{t, bytes, int64_t(allocated), int64_t(reserved), named_op(ts), cur_top(ts),
             cur_call(ts), int16_t(d.type()), int16_t(d.index())};
  BufferLock lock(*ts.buf, drainer);
  ts.buf->ooms.push_back(row);
}

}  // namespace internal
}  // namespace ckrec
