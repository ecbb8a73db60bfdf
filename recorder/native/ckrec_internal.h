// What the native sources' translation units share (ckrec.cpp, ckrec_ops.cpp and
// ckrec_hooks.cpp; private to them): the per-thread state and the helpers that read its open op
// and module call, the globals that more than one of them touches, and the functions one of them
// calls in another. Each group says which file defines it; everything else stays in an
// anonymous namespace of its file. The namespace is hidden, as an anonymous one is in effect:
// nothing in it is exported from the binary, so the hot path reaches its globals directly, not
// through the global offset table an exported symbol of a shared object costs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include "ckrec.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckrec {
namespace __attribute__((visibility("hidden"))) internal {
namespace prof = torch::profiler::impl;

// ---------------------------------------------------------------------------------------------
// Thread state, names, blocks, op callbacks and the memory reporter (ckrec_ops.cpp)
// ---------------------------------------------------------------------------------------------
extern std::atomic<Buffers*> drainer;  // NOTE [ The recording thread writes without a lock ]
extern std::mutex registry_mu;  // guards `registry`, names and module ids
extern std::vector<std::shared_ptr<Buffers>> registry;
extern std::atomic<uint64_t> generation;  // bumped by start(): stacks of an earlier recording go

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

ThreadState& state();

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

void describe(const at::Tensor& t, TensorInfo& info);
void mark_ops(const std::vector<std::string>& op_names);
std::vector<std::string> names_from(size_t first);
void listen_for_deregistrations();

extern SpinLock blocks_mu;  // NOTE [ Blocks by address ]
extern BlockTable live_blocks;  // guarded by blocks_mu
// Addresses fit in 48 bits (x86-64 and aarch64 user space, CUDA's unified addresses); the
// device goes above them. Never 0 for a real block (ptr is never null).
inline int64_t block_key(int64_t ptr, c10::Device d) {
  return ptr ^ (int64_t(uint8_t(d.type())) << 56) ^ (int64_t(uint8_t(d.index())) << 48);
}
int64_t block_of(const at::Tensor& t);
void forget_blocks();

extern std::atomic<bool> want_outputs;
extern std::atomic<bool> inert;  // NOTE [ Forked children ] in ckrec.cpp, which defines it
inline bool off() { return inert.load(std::memory_order_relaxed); }
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
void on_end(const at::RecordFunction& fn, at::ObserverContext*);

// The allocator's blocks: reported in ckrec_ops.cpp, pushed and popped in ckrec.cpp.
struct Reporter final : prof::ProfilerStateBase {
  Reporter()
      : prof::ProfilerStateBase(prof::ProfilerConfig(prof::ProfilerState::Disabled,
                                                     /*report_input_shapes=*/false,
                                                     /*profile_memory=*/true)) {}

  void reportMemoryUsage(void* ptr, int64_t bytes, size_t allocated, size_t reserved,
                         c10::Device d) override;
  void reportOutOfMemory(int64_t bytes, size_t allocated, size_t reserved,
                         c10::Device d) override;

  bool memoryProfilingEnabled() const override { return true; }
  prof::ActiveProfilerType profilerType() override { return prof::ActiveProfilerType::NONE; }
};

// ---------------------------------------------------------------------------------------------
// Op inputs outside modules, module and saved-tensor hooks, notes (ckrec_hooks.cpp)
// ---------------------------------------------------------------------------------------------
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
extern at::CallbackHandle inputs_callback;
extern bool inputs_on;                         // recording thread only
extern bool inputs_paused;                     // recording thread only
extern std::vector<WeakTensor> input_tensors;  // recording thread only; drain() empties it
std::unique_ptr<at::ObserverContext> on_inputs(const at::RecordFunction& fn);
void pause_inputs(bool pause);

extern BlockTable seen_storages;  // NOTE [ Notes ]: storages Python registered; blocks_mu
struct Mark {  // NOTE [ Marks already noted ]
  int64_t block, sid, value;
  int32_t module;
  bool operator==(const Mark& o) const {
    return block == o.block && sid == o.sid && value == o.value && module == o.module;
  }
};
extern std::unordered_map<int64_t, Mark> last_marks;  // by storage key; guarded by blocks_mu
int64_t see(const at::Tensor& t, int64_t sid);
// Notes a tensor Python saw (NOTE [ Notes ] in ckrec_hooks.cpp): false where no block of the
// run and no storage Python registered holds it (Python registers it then).
bool note(PyObject* tensor, uint8_t what, int64_t value, int32_t module);
bool note(const at::Tensor& t, uint8_t what, int64_t value, int32_t module);
// The tensors of a module's argument group, or of a value of an optimizer's state, in
// tensors_in()'s order (recorder/_torch.py); false where only Python's walk finds them.
bool flat_tensors(PyObject* v, std::vector<PyObject*>& out);
void unsee(int64_t key);

std::vector<at::Tensor> graph_leaves(const std::vector<at::Tensor>& roots, int64_t limit);
void add_hooks(pybind11::module_& m);  // the CPython hooks, as functions of the module
void add_marks(pybind11::module_& m);  // note_gradients, note_optimizer_state (ckrec_marks.cpp)

}  // namespace internal
}  // namespace ckrec
