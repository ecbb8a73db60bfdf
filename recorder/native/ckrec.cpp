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
#include <torch/extension.h>
#include <torch/version.h>

#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include "ckattr.h"
#include "ckrec.h"

#include <atomic>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {
namespace prof = torch::profiler::impl;
using namespace ckrec;  // NOLINT: rows, clock and block table (ckrec.h)


std::atomic<Buffers*> drainer{nullptr};  // NOTE [ The recording thread writes without a lock ]
std::mutex registry_mu;  // guards `registry`, names and module ids
std::vector<std::shared_ptr<Buffers>> registry;
std::vector<std::string> names;
std::vector<uint8_t> name_is_op;  // 1 where the name is a dispatcher op's (NOTE [ Interning op names ])
std::unordered_map<std::string, int32_t> name_ids;
std::unordered_map<int64_t, int32_t> module_ids;
std::atomic<int64_t> next_op{0};
std::atomic<int32_t> next_call{0};
std::atomic<uint64_t> generation{1};  // bumped by start(): stacks of an earlier recording go
std::atomic<uint64_t> op_deregistrations{0};  // NOTE [ Interning op names ]

struct Name {  // an interned name (NOTE [ Interning op names ])
  int32_t id;
  bool is_op;
  bool decomposes = false;  // NOTE [ Ops as a dispatch mode sees them ]
};
struct RecentName {  // a direct-mapped slot in front of the cache (NOTE [ Interning op names ])
  const char* ptr = nullptr;
  Name name{-1, false};
};
constexpr size_t kRecentNames = 1024;
struct TextName {  // a direct-mapped slot of the cache by text (NOTE [ Interning op names ])
  std::string text;
  Name name{-1, false};
};
constexpr size_t kTextNames = 256;

struct ThreadState {
  std::shared_ptr<Buffers> buf;
  std::vector<Frame> ops;
  std::vector<Call> calls;
  std::unordered_map<const char*, Name> by_ptr;  // dispatcher ops' names by schema pointer
  uint64_t deregistrations = 0;  // op_deregistrations when by_ptr and recent were last valid
  std::vector<RecentName> recent = std::vector<RecentName>(kRecentNames);
  std::vector<TextName> by_text = std::vector<TextName>(kTextNames);
  int64_t last_node_seq = -1;  // NOTE [ Engine work between nodes ]
  uint64_t generation = 0;
};
thread_local ThreadState tls;
// A plain pointer to `tls`: reading it needs no call to the thread_local's initialisation
// wrapper, which every access to `tls` itself makes (a callback reads its state several times).
thread_local ThreadState* tls_ptr = nullptr;

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

void check_drainer(const char* what) {
  Buffers* d = drainer.load(std::memory_order_relaxed);
  TORCH_CHECK(d == nullptr || d == state().buf.get(), what,
              " must run on the thread that started the native recorder");
}

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

// Registers the listener once per process; its handle is never destroyed, so that nothing
// touches the dispatcher while statics are torn down at exit.
void listen_for_deregistrations() {
  static auto* handle = new c10::RegistrationHandleRAII(
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<Deregistrations>()));
  (void)handle;
}

inline int64_t cur_op(const ThreadState& ts) { return ts.ops.empty() ? -1 : ts.ops.back().id; }
// The innermost open op, for a row that names it: its own row stays (NOTE [ Nested ranges that
// leave no row ]).
inline int64_t named_op(ThreadState& ts) {
  if (ts.ops.empty()) return -1;
  ts.ops.back().named = true;
  return ts.ops.back().id;
}
// The op of the trace that holds range `f` (NOTE [ Outermost ops ] in attribute.py), or `f`
// where none holds it: what a row made in `f` names. Python maps a block to its outermost op
// anyway, and a range nested in an op then stays unnamed (NOTE [ Nested ranges that leave no
// row ]). An outermost op's row always stays: its `outer` is its own id when it ends, or it
// held ops of the trace (`descended`).
inline int64_t outer_or_self(const Frame& f) {
  return f.outer >= 0 && f.outer != f.id ? f.outer : f.id;
}
inline int64_t named_outer(ThreadState& ts) {
  if (ts.ops.empty()) return -1;
  Frame& f = ts.ops.back();
  int64_t op = outer_or_self(f);
  if (op == f.id) f.named = true;
  return op;
}
inline int64_t cur_top(const ThreadState& ts) { return ts.ops.empty() ? -1 : ts.ops.back().top; }
inline int64_t cur_node(const ThreadState& ts) {
  return ts.ops.empty() ? -1 : ts.ops.back().node_seq;
}
inline int32_t cur_call(const ThreadState& ts) {
  return ts.calls.empty() ? -1 : ts.calls.back().call;
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
std::mutex blocks_mu;
BlockTable live_blocks;  // guarded by blocks_mu
int64_t next_block = 0;  // guarded by blocks_mu

// Addresses fit in 48 bits (x86-64 and aarch64 user space, CUDA's unified addresses); the
// device goes above them. Never 0 for a real block (ptr is never null).
inline int64_t block_key(int64_t ptr, c10::Device d) {
  return ptr ^ (int64_t(uint8_t(d.type())) << 56) ^ (int64_t(uint8_t(d.index())) << 48);
}

int64_t on_block(int64_t ptr, int64_t bytes, c10::Device d) {
  std::lock_guard<std::mutex> lock(blocks_mu);
  int64_t key = block_key(ptr, d);
  if (bytes > 0) {
    live_blocks.put(key, next_block);
    return next_block++;
  }
  return live_blocks.take(key);
}

BlockTable seen_storages;  // NOTE [ Notes ]: storages Python registered; guarded by blocks_mu
struct Mark {  // NOTE [ Marks already noted ]
  int64_t block, sid, value;
  int32_t module;
  bool operator==(const Mark& o) const {
    return block == o.block && sid == o.sid && value == o.value && module == o.module;
  }
};
std::unordered_map<int64_t, Mark> last_marks;  // by storage key; guarded by blocks_mu

void forget_blocks() {
  std::lock_guard<std::mutex> lock(blocks_mu);
  live_blocks.clear();
}

int64_t block_of(const at::Tensor& t) {
  int64_t key = block_key(addr(t.storage().unsafeGetStorageImpl()->data_ptr().get()), t.device());
  std::lock_guard<std::mutex> lock(blocks_mu);
  return live_blocks.get(key);
}

// ---------------------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------------------
std::atomic<bool> want_outputs{false};

// NOTE [ Forked children ]
// A DataLoader worker forked while recording inherits the forking thread's callback and
// profiler slot, and the Python module hooks. Its rows would never be drained, so the child goes
// inert: every hook returns at once, and the reporter leaves the child's slot (so the CPU
// allocator stops tracking sizes there). Only thread-local state is touched: another thread may
// have held any lock at the fork. source.py calls forget_in_child() after every fork.
std::atomic<bool> inert{false};
inline bool off() { return inert.load(std::memory_order_relaxed); }
at::CallbackHandle callback = 0;

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
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
at::CallbackHandle inputs_callback = 0;
bool inputs_on = false;               // recording thread only
bool inputs_paused = false;           // recording thread only
std::vector<WeakTensor> input_tensors;  // recording thread only; drain() empties it

int64_t storage_key(const at::Tensor& t);

void input_row(ThreadState& ts, int64_t op, int64_t t, const at::Tensor& x) {
  if (!x.defined() || !x.has_storage() || x.storage().nbytes() == 0) return;
  int64_t key = storage_key(x), block, sid = -1, tensor = -1;
  {
    std::lock_guard<std::mutex> lock(blocks_mu);
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

void pause_inputs(bool pause) {
  inputs_paused = pause;
  update_inputs(state());
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
bool leaves_no_row(const Frame& f, const OpRow& row, size_t i, const Buffers& b) {
  return i + 1 == b.ops.size() && !f.named && !f.descended && row.parent >= 0 &&
         row.outer != row.id && row.seq < 0 && row.raised == 0 &&
         row.scope == uint8_t(at::RecordScope::FUNCTION);
}

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
struct Reporter final : prof::ProfilerStateBase {
  Reporter()
      : prof::ProfilerStateBase(prof::ProfilerConfig(prof::ProfilerState::Disabled,
                                                     /*report_input_shapes=*/false,
                                                     /*profile_memory=*/true)) {}

  void reportMemoryUsage(void* ptr, int64_t bytes, size_t allocated, size_t reserved,
                         c10::Device d) override {
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

  void reportOutOfMemory(int64_t bytes, size_t allocated, size_t reserved,
                         c10::Device d) override {
    if (off()) return;
    int64_t t = now_ns();
    ThreadState& ts = state();
    OomRow row{t, bytes, int64_t(allocated), int64_t(reserved), named_op(ts), cur_top(ts),
               cur_call(ts), int16_t(d.type()), int16_t(d.index())};
    BufferLock lock(*ts.buf, drainer);
    ts.buf->ooms.push_back(row);
  }

  bool memoryProfilingEnabled() const override { return true; }
  prof::ActiveProfilerType profilerType() override { return prof::ActiveProfilerType::NONE; }
};

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
    std::lock_guard<std::mutex> lock(blocks_mu);
    seen_storages.clear();  // storage rows are per run (NOTE [ Notes ])
    last_marks.clear();     // NOTE [ Marks already noted ]
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
  py::list tensors;  // NOTE [ Op inputs outside modules ]: those still alive
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

// Which names from index `first` on are dispatcher ops', one byte each.
std::vector<std::string> names_from(size_t first) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (first >= names.size()) return {};
  return std::vector<std::string>(names.begin() + int64_t(first), names.end());
}

// ---------------------------------------------------------------------------------------------
// Module and saved-tensor hooks (Python calls these directly)
// ---------------------------------------------------------------------------------------------
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

// NOTE [ Marks already noted ]
// A step marks every tensor of Adam's state (three a parameter) and its gradients twice (at
// backward's end and at the optimizer's step), nearly all marked the same way the step before.
// A mark (what 0) that repeats the last mark of the same block, or of the same storage Python
// registered, with the same category and module, is not written again: applying it again
// changes nothing (categories only strengthen, a mark's module fills an empty one; _apply_notes
// in native_steps.py). The last mark is kept by address with the block id or storage row it
// named: a new block or registration at that address never matches it. Kept per run.
// Only a saving: past kMaxMarks addresses (a long run whose blocks keep moving) it starts over.
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

bool note(PyObject* obj, uint8_t what, int64_t value, int32_t module) {
  if (off() || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return false;
  int64_t key = storage_key(t), block, sid = -1;
  {
    std::lock_guard<std::mutex> lock(blocks_mu);
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
  std::lock_guard<std::mutex> lock(blocks_mu);
  seen_storages.put(key, sid);
  return key;
}

void unsee(int64_t key) {
  if (key == 0) return;
  std::lock_guard<std::mutex> lock(blocks_mu);
  seen_storages.take(key);
}

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
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
  for (PyMethodDef& def : hook_defs)
    m.attr(def.ml_name) = py::reinterpret_steal<py::object>(PyCFunction_New(&def, nullptr));
  m.def("graph_leaves", &graph_leaves, py::arg("roots"), py::arg("limit") = 1 << 20);
  m.def("row_sizes", &row_sizes);
  m.def("built_for", &built_for);
  m.def("now_ns", &now_ns);
  m.def("dtype_code", [](const at::Tensor& t) { return int(t.scalar_type()); });
  m.attr("DIMS") = kDims;
  ckattr::bind(m);
}
