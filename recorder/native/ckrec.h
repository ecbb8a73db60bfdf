// Rows, clock, block table and per-thread buffers of ckview's native event sources
// (recorder/native/ckrec*.cpp write the rows, ckattr*.cpp read them). The row structs are
// mirrored by numpy dtypes in recorder/native/rows.py.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

namespace ckrec {

// NOTE [ The block table's lock ]
// The live-block table (NOTE [ Blocks by address ] in ckrec_ops.cpp) is locked at every
// allocator event, saved tensor and note: thousands of times a small-op step, almost always by
// the recording thread alone (autograd's device threads on CUDA are the others). Its critical
// sections are a hash lookup or insert, so a spin lock on one atomic serves: uncontended, one
// exchange and one store, where std::mutex is two calls into libpthread (pthread_mutex_lock and
// unlock were 0.2 ms of a 7 ms small-op step in perf, torch's CPU allocator's own lock included).
// A waiter yields the core: a holder preempted mid-section is not spun against for long.
class SpinLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

constexpr int kDims = 8;  // sizes kept per tensor row; ndim says how many were real

// ---------------------------------------------------------------------------------------------
// Rows (packed; rows.py holds the matching numpy dtypes)
// ---------------------------------------------------------------------------------------------
#pragma pack(push, 1)
struct OpRow {  // one RecordFunction range
  int64_t id, t0, t1, seq, parent, top, node_seq;
  int64_t outer;  // NOTE [ Outermost ops ] in attribute.py: its outermost op, or -1
  int32_t name, call, graph_task;
  uint8_t scope, raised, pad[2];  // raised: an exception left the op (NOTE [ Op ends ])
};
struct MemRow {  // one allocator event: bytes > 0 allocates, < 0 frees
  int64_t t, ptr, bytes, block, op, top, node_seq, allocated, reserved;
  int32_t call;
  int16_t device_type, device_index;
};
struct OomRow {  // an allocation the allocator could not satisfy
  int64_t t, bytes, allocated, reserved, op, top;
  int32_t call;
  int16_t device_type, device_index;
};
struct TensorInfo {
  int8_t dtype, ndim;
  uint8_t pad[6];
  int64_t dims[kDims];
};
struct SavedRow {  // a saved_tensors_hooks pack (kind 0) or unpack (kind 1)
  int64_t t, ptr, block, storage_nbytes, nbytes, op, top;
  int32_t call;
  uint8_t kind, pad[3];
  TensorInfo tensor;
};
struct OutRow {  // one tensor an op returned (only when outputs are recorded)
  int64_t t, op, ptr, block, storage_nbytes;
  TensorInfo tensor;
};
struct ModRow {  // a module forward call begins (enter 1) or returns (enter 0)
  int64_t t, address, seq;
  int32_t call, parent, module;
  uint8_t enter, pad[3];
};
struct EndRow {  // an op that ended after its row was drained
  int64_t id, t1;
};
struct NoteRow {  // a tensor Python saw (NOTE [ Notes ] in ckrec_hooks.cpp)
  int64_t t, block, sid, value;  // block of the run, or -1 and the storage row Python gave it
  int32_t module;
  uint8_t what, pad[3];
};
struct InRow {  // a tensor a top-level op read (NOTE [ Op inputs outside modules ])
  int64_t t, op, block, sid, tensor;  // block, storage row Python gave it, or weak tensor index
};
#pragma pack(pop)

// CLOCK_MONOTONIC: the clock of Python's time.perf_counter_ns on Linux, which the recorder uses.
inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline int64_t addr(const void* p) { return int64_t(reinterpret_cast<intptr_t>(p)); }

// Open addressing with linear probing and backward-shift deletion: no allocation per event
// (std::unordered_map allocates a node per insert). Key 0 marks an empty slot. A key and its
// value share a slot, and the table starts small and doubles at half full: a step's live blocks
// (hundreds) then fit in the CPU's caches, where a 64k-slot table cost a cache miss per event.
class BlockTable {
 public:
  BlockTable() { clear(); }
  void clear() {
    slots_.assign(kInitialSlots, Slot{});
    size_ = 0;
  }
  void put(int64_t key, int64_t value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& s = slots_[find_slot(key)];
    if (s.key == 0) ++size_;
    s = Slot{key, value};
  }
  int64_t get(int64_t key) const {
    const Slot& s = slots_[find_slot(key)];
    return s.key == key ? s.value : -1;
  }
  int64_t take(int64_t key) {  // removes the key; its value, or -1
    size_t i = find_slot(key);
    if (slots_[i].key != key) return -1;
    int64_t value = slots_[i].value;
    size_t mask = slots_.size() - 1;
    for (size_t j = (i + 1) & mask; slots_[j].key != 0; j = (j + 1) & mask) {
      size_t home = slot(slots_[j].key);
      // move j back into the hole at i unless its home lies cyclically in (i, j]
      if (((j - home) & mask) >= ((j - i) & mask)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return value;
  }

 private:
  struct Slot {
    int64_t key = 0, value = -1;
  };
  static constexpr size_t kInitialSlots = 1 << 10;
  size_t slot(int64_t key) const {
    uint64_t h = uint64_t(key) * 0x9E3779B97F4A7C15ull;
    return size_t(h ^ (h >> 32)) & (slots_.size() - 1);
  }
  size_t find_slot(int64_t key) const {
    size_t mask = slots_.size() - 1, i = slot(key);
    while (slots_[i].key != 0 && slots_[i].key != key) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<Slot> old(2 * slots_.size());
    old.swap(slots_);
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != 0) put(s.key, s.value);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Buffers: one per thread, each with its own lock (uncontended except while drain() reads it)
// ---------------------------------------------------------------------------------------------
struct Buffers {
  std::mutex mu;
  std::vector<OpRow> ops;
  std::vector<MemRow> mems;
  std::vector<OomRow> ooms;
  std::vector<SavedRow> saved;
  std::vector<OutRow> outs;
  std::vector<ModRow> mods;
  std::vector<EndRow> ends;
  std::vector<NoteRow> notes;
  std::vector<InRow> inputs;
  int64_t drained_ops = 0;  // op rows of this thread handed out by drain() so far
};

struct Frame {  // an open op on this thread
  int64_t id, local, top, node_seq, outer;
  int64_t allocations;  // blocks allocated while it was the innermost op
  bool in_node;         // a backward node's range, or inside one
  bool decomposes;      // an op of the trace that decomposes (NOTE [ Ops as a dispatch mode
  bool descended;       // sees them ] in ckrec_ops.cpp), and whether ops it called took its place
  bool named;           // a row names it (NOTE [ Nested ranges that leave no row ] in
                        // ckrec_ops.cpp)
};
struct Call {  // an open module call on this thread
  int32_t call, module;
};

// NOTE [ The recording thread writes without a lock ]
// Only a buffer's own thread writes to it, and drain() runs on the thread that called start()
// (the recording thread), so that thread's buffer is never touched by two threads at once: its
// writes take no lock. Other threads (autograd's device threads on CUDA) lock their buffers,
// which drain() locks too. drain() and pending_rows() refuse to run on another thread.
struct BufferLock {  // locks a buffer unless it is the recording thread's (`drainer`)
  BufferLock(Buffers& b, const std::atomic<Buffers*>& drainer)
      : mu_(&b == drainer.load(std::memory_order_relaxed) ? nullptr : &b.mu) {
    if (mu_) mu_->lock();
  }
  ~BufferLock() {
    if (mu_) mu_->unlock();
  }
  BufferLock(const BufferLock&) = delete;
  BufferLock& operator=(const BufferLock&) = delete;

 private:
  std::mutex* mu_;
};

}  // namespace ckrec
