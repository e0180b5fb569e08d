// k31emu core: positions and capacities, errors, per-block memory, blocks as threads, SyncAll.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "k31emu_types.h"

namespace AscendC {
enum class TPosition : uint8_t {
  GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM, TSCM,
  MAX
};
using QuePosition = TPosition;
enum class HardEvent : uint8_t {
  MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V,
  MTE3_MTE1, MTE1_MTE3, MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3,
  S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S, MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MAX
};
enum pipe_t : uint8_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };
enum event_t : int32_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
using TEventID = int8_t;
constexpr uint32_t ONE_BLK_SIZE = 32;           // bytes per data block
constexpr uint32_t ONE_REPEAT_BYTE_SIZE = 256;  // bytes per vector repeat
constexpr uint32_t BLOCK_CUBE = 16;             // cube fractal edge
constexpr uint32_t TOTAL_UB_SIZE = 192 * 1024;
constexpr uint32_t TOTAL_L1_SIZE = 512 * 1024;
constexpr uint32_t TOTAL_L0A_SIZE = 64 * 1024;
constexpr uint32_t TOTAL_L0B_SIZE = 64 * 1024;
constexpr uint32_t TOTAL_L0C_SIZE = 128 * 1024;
}  // namespace AscendC

namespace k31emu {

// Physical buffers of one AI core, A2/A3 (910B/910C) class sizes.
enum Mem : int { UB = 0, L1, L0A, L0B, L0C, NUM_MEM, NO_MEM = NUM_MEM };
constexpr uint32_t kCapacity[NUM_MEM] = {192 * 1024, 512 * 1024, 64 * 1024, 64 * 1024, 128 * 1024};
// Start alignment InitBuffer gives each buffer: 32 B blocks in UB, 512 B fractals in L1/L0A/L0B,
// 256 fp32 elements (1 KB) in L0C, matching what LoadData/Mmad/Fixpipe require of their operands.
constexpr uint32_t kAlign[NUM_MEM] = {32, 512, 512, 512, 1024};
constexpr const char* kMemName[NUM_MEM] = {"UB", "L1", "L0A", "L0B", "L0C"};

inline const char* pos_name(AscendC::TPosition p) {
  using P = AscendC::TPosition;
  switch (p) {
    case P::GM: return "GM"; case P::A1: return "A1"; case P::A2: return "A2";
    case P::B1: return "B1"; case P::B2: return "B2"; case P::C1: return "C1";
    case P::C2: return "C2"; case P::CO1: return "CO1"; case P::CO2: return "CO2";
    case P::VECIN: return "VECIN"; case P::VECOUT: return "VECOUT";
    case P::VECCALC: return "VECCALC"; case P::TSCM: return "TSCM";
    default: return "?";
  }
}
inline Mem mem_of(AscendC::TPosition p) {
  using P = AscendC::TPosition;
  switch (p) {
    case P::VECIN: case P::VECOUT: case P::VECCALC: case P::CO2: return UB;
    case P::A1: case P::B1: case P::C1: case P::TSCM: return L1;
    case P::A2: return L0A;
    case P::B2: return L0B;
    case P::CO1: return L0C;
    default: return NO_MEM;
  }
}

struct Error : std::runtime_error { using std::runtime_error::runtime_error; };
struct Aborted {};  // thrown in a block when another block failed; never reported itself

// Message building without <sstream> (keeps the header quick to compile).
inline void put(std::string& s, const std::string& v) { s += v; }
inline void put(std::string& s, const char* v) { s += v; }
inline void put(std::string& s, char v) { s += v; }
template <class V>
void put(std::string& s, const V& v) {
  if constexpr (std::is_floating_point<V>::value) s += std::to_string(v);
  else if constexpr (std::is_signed<V>::value) s += std::to_string(static_cast<long long>(v));
  else s += std::to_string(static_cast<unsigned long long>(v));
}
template <class... A>
std::string cat(const A&... a) {
  std::string s;
  (put(s, a), ...);
  return s;
}

// Per-thread block context and the memory of the core the block runs on.
struct CoreMem {
  std::vector<uint8_t> data[NUM_MEM];
  std::vector<uint8_t> written[NUM_MEM];  // 1 where a byte was written since its allocation
  uint8_t* base(Mem m) {
    if (data[m].empty()) { data[m].assign(kCapacity[m], 0); written[m].assign(kCapacity[m], 0); }
    return data[m].data();
  }
  uint8_t* shadow(Mem m) { base(m); return written[m].data(); }
};
struct Shared;
struct BlockCtx {
  int32_t idx = 0, num = 1;
  Shared* shared = nullptr;
  CoreMem* mem = nullptr;
};
inline BlockCtx& ctx() { static thread_local BlockCtx c; return c; }

template <class... A>
[[noreturn]] void fail(const A&... a) {
  throw Error(cat("[block ", ctx().idx, "/", ctx().num, "] ", a...));
}

// State shared by the blocks of one launch: first error, abort flag, SyncAll barrier.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::string first_error;
  bool aborted = false;
  int32_t num = 0, arrived = 0, exited = 0;
  uint64_t generation = 0;
  bool resident = true;  // all blocks run at once (needed for SyncAll)

  void record(const std::string& msg) {
    std::lock_guard<std::mutex> g(mu);
    if (first_error.empty()) first_error = msg;
    aborted = true;
    cv.notify_all();
  }
  void check_abort() {
    std::lock_guard<std::mutex> g(mu);
    if (aborted) throw Aborted{};
  }
  void sync_all() {
    std::unique_lock<std::mutex> g(mu);
    if (aborted) throw Aborted{};
    if (!resident)
      fail("SyncAll: blockDim ", num, " is larger than the emulator's resident-block limit; "
           "SyncAll needs every block running at once (keep blockDim <= the core count)");
    if (exited > 0)
      fail("SyncAll: ", exited, " block(s) already returned; every block must call SyncAll "
           "the same number of times (it would hang on the device)");
    uint64_t gen = generation;
    if (++arrived == num) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(g, [&] { return aborted || generation != gen; });
    if (generation == gen) throw Aborted{};
  }
  void block_exit() {
    std::lock_guard<std::mutex> g(mu);
    ++exited;
    if (arrived > 0 && !aborted) {
      if (first_error.empty())
        first_error = cat("[block ", ctx().idx, "/", num, "] returned while ", arrived,
                          " block(s) wait in SyncAll; every block must call SyncAll the same "
                          "number of times (it would hang on the device)");
      aborted = true;
      cv.notify_all();
    }
  }
};

inline std::string& last_error() { static thread_local std::string e; return e; }

constexpr int32_t kMaxResidentBlocks = 64;

// Run `fn` once per block.  Up to kMaxResidentBlocks blocks run as one thread each (SyncAll
// works); larger launches run on a small pool, block after block.  Returns 0, or 1 with the
// first block's error message in last_error().
using BlockFn = void (*)(void*);
inline int launch_impl(uint32_t blockDim, BlockFn fn, void* arg) {
  last_error().clear();
  if (blockDim == 0) { last_error() = "Launch: blockDim is 0"; return 1; }
  Shared sh;
  sh.num = static_cast<int32_t>(blockDim);
  sh.resident = sh.num <= kMaxResidentBlocks;
  std::atomic<int32_t> next{0};
  auto run_block = [&](int32_t b, CoreMem* mem) {
    BlockCtx& c = ctx();
    c.idx = b; c.num = sh.num; c.shared = &sh; c.mem = mem;
    try {
      fn(arg);
      sh.block_exit();
    } catch (const Aborted&) {
    } catch (const Error& e) {
      sh.record(e.what());
    } catch (const std::exception& e) {
      sh.record(cat("[block ", b, "/", sh.num, "] C++ exception: ", e.what()));
    } catch (...) {
      sh.record(cat("[block ", b, "/", sh.num, "] unknown C++ exception"));
    }
    c.shared = nullptr; c.mem = nullptr;
  };
  std::vector<std::thread> threads;
  try {
    if (sh.resident) {
      for (int32_t b = 0; b < sh.num; ++b)
        threads.emplace_back([&, b] { CoreMem mem; run_block(b, &mem); });
    } else {
      unsigned hw = std::thread::hardware_concurrency();
      int32_t workers = static_cast<int32_t>(hw ? (hw < 8 ? hw : 8) : 2);
      for (int32_t w = 0; w < workers; ++w)
        threads.emplace_back([&] {
          CoreMem mem;
          for (int32_t b; (b = next.fetch_add(1)) < sh.num;) {
            { std::lock_guard<std::mutex> g(sh.mu); if (sh.aborted) return; }
            run_block(b, &mem);
          }
        });
    }
  } catch (const std::exception& e) {  // e.g. no more threads: stop the started blocks cleanly
    sh.record(cat("Launch: could not start the block threads: ", e.what()));
  }
  for (auto& t : threads) t.join();
  if (!sh.first_error.empty()) { last_error() = sh.first_error; return 1; }
  return 0;
}

template <class F>
int Launch(uint32_t blockDim, F&& fn) {
  using Fn = typename std::remove_reference<F>::type;
  return launch_impl(blockDim, [](void* p) { (*static_cast<Fn*>(p))(); }, static_cast<void*>(&fn));
}
// Names the emitter asked for (targets/ascendc/emu/REQUESTS.md).
template <class F>
int RunBlocks(uint32_t blockDim, F&& fn) { return Launch(blockDim, static_cast<F&&>(fn)); }
inline const char* LastError() { return last_error().c_str(); }

inline CoreMem& core() {
  BlockCtx& c = ctx();
  if (!c.mem) throw Error("AscendC API used outside k31emu::Launch (no block is running)");
  return *c.mem;
}

}  // namespace k31emu

// The C entry the host side uses to read the message of a failed launch.
extern "C" __attribute__((weak, visibility("default"))) const char* k31emu_last_error() {
  return k31emu::last_error().c_str();
}

namespace AscendC {
inline int64_t GetBlockIdx() { return k31emu::ctx().idx; }
inline int64_t GetBlockNum() { return k31emu::ctx().num; }
inline int64_t GetSubBlockIdx() { return 0; }
inline int64_t GetTaskRation() { return 1; }
inline void SyncAll() {
  k31emu::BlockCtx& c = k31emu::ctx();
  if (!c.shared) throw k31emu::Error("SyncAll called outside k31emu::Launch");
  c.shared->sync_all();
}
template <bool isAIVOnly = true>
inline void SyncAll(...) { SyncAll(); }
// Intra-core pipeline synchronisation: the emulator runs each block's instructions in program
// order, so these only type-check.
template <pipe_t pipe> inline void PipeBarrier() {}
template <HardEvent ev> inline void SetFlag(int32_t) {}
template <HardEvent ev> inline void WaitFlag(int32_t) {}
inline void pipe_barrier(pipe_t) {}
// Kernel-side printf (the device's PRINTF/printf go to the host's stdout here).
template <class... A>
inline void PRINTF(const char* fmt, A... a) { std::printf(fmt, a...); }
using ::printf;
}  // namespace AscendC

#define ASCEND_IS_AIV (true)
#define ASCEND_IS_AIC (true)
#define ASCEND_IS_NOT_AIV (false)
#define ASCEND_IS_NOT_AIC (false)
#define KERNEL_TASK_TYPE_DEFAULT(x)
