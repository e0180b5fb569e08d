// k31emu tensors and memory management: GlobalTensor, LocalTensor, TPipe, TQue (a checked
// alloc -> enque -> deque -> free state machine), TBuf, and the operand checks every API uses.
#pragma once
#include <deque>
#include <type_traits>

#include "k31emu_core.h"

namespace k31emu {

enum SlotState : uint8_t { FREE, ALLOCATED, ENQUEUED, DEQUEUED, SCRATCH };

// One buffer carved out of a core memory by TPipe::InitBuffer.
struct Slot {
  Mem mem = NO_MEM;
  AscendC::TPosition pos = AscendC::TPosition::GM;
  uint32_t offset = 0, bytes = 0;
  SlotState state = FREE;
  uint32_t gen = 0;        // bumped by FreeTensor: stale LocalTensor handles are detected
  std::string owner;       // "TQue<VECIN, depth 2> #0" / "TBuf<VECCALC> #3"
  int index = 0;
  std::string desc() const {
    return state == SCRATCH ? owner : cat(owner, " buffer ", index);
  }
};

}  // namespace k31emu

namespace AscendC {

template <class T>
class LocalTensor {
 public:
  k31emu::Slot* slot_ = nullptr;
  uint32_t gen_ = 0;
  uint32_t off_ = 0;   // byte offset inside the core memory
  uint32_t size_ = 0;  // elements
  uint8_t* base_ = nullptr;
  uint8_t* shadow_ = nullptr;

  LocalTensor() = default;
  T* ptr() const { return reinterpret_cast<T*>(base_ + off_); }
  uint8_t* written() const { return shadow_ + off_; }
  uint32_t GetSize() const { return size_; }
  uint32_t GetLength() const { return size_ * sizeof(T); }
  void SetSize(uint32_t n) {
    if (slot_ && off_ + n * sizeof(T) > slot_->offset + slot_->bytes)
      k31emu::fail("LocalTensor::SetSize(", n, "): beyond the end of ", slot_->desc());
    size_ = n;
  }
  uint64_t GetPhyAddr() const { return off_; }
  uint64_t GetPhyAddr(uint32_t i) const { return off_ + i * sizeof(T); }
  TPosition GetPosition() const { return slot_ ? slot_->pos : TPosition::GM; }
  LocalTensor operator[](uint32_t i) const {
    if (i > size_) k31emu::fail("LocalTensor[", i, "]: offset beyond its ", size_, " elements");
    LocalTensor t = *this;
    t.off_ += i * sizeof(T);
    t.size_ -= i;
    return t;
  }
  template <class U>
  LocalTensor<U> ReinterpretCast() const {
    LocalTensor<U> t;
    t.slot_ = slot_; t.gen_ = gen_; t.off_ = off_; t.base_ = base_; t.shadow_ = shadow_;
    t.size_ = static_cast<uint32_t>(static_cast<uint64_t>(size_) * sizeof(T) / sizeof(U));
    return t;
  }
  T GetValue(uint32_t i) const;
  void SetValue(uint32_t i, T v) const;
};

template <class T>
class GlobalTensor {
 public:
  T* ptr_ = nullptr;
  uint64_t size_ = 0;  // 0: unknown (no bounds check)
  void SetGlobalBuffer(T* p, uint64_t n) { ptr_ = p; size_ = n; }
  void SetGlobalBuffer(T* p) { ptr_ = p; size_ = 0; }
  T* GetPhyAddr() const { return ptr_; }
  T* GetPhyAddr(uint64_t i) const { return ptr_ + i; }
  uint64_t GetSize() const { return size_; }
  template <class... A> void SetL2CacheHint(A...) {}
  GlobalTensor operator[](uint64_t i) const {
    if (size_ && i > size_) k31emu::fail("GlobalTensor[", i, "]: offset beyond its ", size_, " elements");
    GlobalTensor g = *this;
    g.ptr_ += i;
    if (size_) g.size_ -= i;
    return g;
  }
  T GetValue(uint64_t i) const {
    if (!ptr_) k31emu::fail("GlobalTensor::GetValue on a tensor without SetGlobalBuffer");
    if (size_ && i >= size_) k31emu::fail("GlobalTensor::GetValue(", i, "): beyond ", size_, " elements");
    return ptr_[i];
  }
  void SetValue(uint64_t i, T v) const {
    if (!ptr_) k31emu::fail("GlobalTensor::SetValue on a tensor without SetGlobalBuffer");
    if (size_ && i >= size_) k31emu::fail("GlobalTensor::SetValue(", i, "): beyond ", size_, " elements");
    ptr_[i] = v;
  }
};

}  // namespace AscendC

namespace k31emu {
using AscendC::GlobalTensor;
using AscendC::LocalTensor;

// ---- operand checks shared by every API ----
template <class T>
void need_live(const LocalTensor<T>& t, const char* op, const char* arg) {
  if (!t.slot_) fail(op, ": ", arg, " is an uninitialised LocalTensor (not from AllocTensor/DeQue/Get)");
  const Slot& s = *t.slot_;
  if (t.gen_ != s.gen || s.state == FREE)
    fail(op, ": ", arg, " uses ", s.desc(), " after FreeTensor");
  if (s.state == ENQUEUED)
    fail(op, ": ", arg, " (", s.desc(), ") is still enqueued; DeQue it before using it");
}
template <class T>
void need_mem(const LocalTensor<T>& t, Mem m, const char* op, const char* arg) {
  if (t.slot_->mem != m)
    fail(op, ": ", arg, " is in ", pos_name(t.slot_->pos), " (", kMemName[t.slot_->mem],
         ") but this operand must be in ", kMemName[m]);
}
template <class T>
void need_align(const LocalTensor<T>& t, uint32_t align, const char* op, const char* arg) {
  if (t.off_ % align)
    fail(op, ": ", arg, " starts at ", kMemName[t.slot_->mem], " byte ", t.off_,
         ", which is not ", align, "-byte aligned");
}
template <class T>
void need_count(const LocalTensor<T>& t, uint64_t count, const char* op, const char* arg) {
  if (count > t.size_)
    fail(op, ": count ", count, " exceeds ", arg, "'s size of ", t.size_, " elements");
}
// Bytes [b0, b0+nb) of t must have been written since allocation.
template <class T>
void need_written_bytes(const LocalTensor<T>& t, uint64_t b0, uint64_t nb, const char* op, const char* arg) {
  if (!nb) return;
  const uint8_t* w = t.written() + b0;
  const void* z = std::memchr(w, 0, nb);
  if (z) {
    uint64_t byte = b0 + (static_cast<const uint8_t*>(z) - w);
    fail(op, ": ", arg, " reads element ", byte / sizeof(T), " of ", t.slot_->desc(),
         " (", pos_name(t.slot_->pos), ") that was never written since it was allocated");
  }
}
template <class T>
void need_written(const LocalTensor<T>& t, uint64_t count, const char* op, const char* arg) {
  need_written_bytes(t, 0, count * sizeof(T), op, arg);
}
template <class T>
void mark_bytes(const LocalTensor<T>& t, uint64_t b0, uint64_t nb) { std::memset(t.written() + b0, 1, nb); }
template <class T>
void mark(const LocalTensor<T>& t, uint64_t count) { mark_bytes(t, 0, count * sizeof(T)); }

// A vector-unit operand: live, in UB, 32-byte aligned, `count` elements inside it.
template <class T>
void vec_in(const LocalTensor<T>& t, uint64_t count, const char* op, const char* arg) {
  need_live(t, op, arg); need_mem(t, UB, op, arg); need_align(t, 32, op, arg);
  need_count(t, count, op, arg); need_written(t, count, op, arg);
}
template <class T>
void vec_out(const LocalTensor<T>& t, uint64_t count, const char* op, const char* arg) {
  need_live(t, op, arg); need_mem(t, UB, op, arg); need_align(t, 32, op, arg);
  need_count(t, count, op, arg);
}
template <class T>
void gm_range(const GlobalTensor<T>& g, uint64_t elems, const char* op, const char* arg) {
  if (!g.ptr_) fail(op, ": ", arg, " is a GlobalTensor without SetGlobalBuffer");
  if (g.size_ && elems > g.size_)
    fail(op, ": touches ", elems, " elements of ", arg, " but its global buffer holds ", g.size_);
}

// ---- queues ----
struct QueBase {
  AscendC::TPosition pos;
  int32_t depth;
  int id = -1;
  std::vector<Slot> slots;
  std::deque<int> fifo;
  QueBase(AscendC::TPosition p, int32_t d) : pos(p), depth(d) {}
  QueBase(const QueBase&) = delete;
  QueBase& operator=(const QueBase&) = delete;

  std::string name() const {
    return id < 0 ? cat("TQue<", pos_name(pos), ", depth ", depth, "> (no InitBuffer yet)")
                  : cat("TQue<", pos_name(pos), ", depth ", depth, "> #", id);
  }
  void need_init(const char* op) const {
    if (slots.empty()) fail(op, " on ", name(), " before TPipe::InitBuffer gave it buffers");
  }
  Slot& alloc() {
    need_init("AllocTensor");
    int a = 0, e = 0, d = 0;
    for (Slot& s : slots) {
      if (s.state == FREE) {
        s.state = ALLOCATED;
        std::memset(core().shadow(s.mem) + s.offset, 0, s.bytes);
        return s;
      }
      a += s.state == ALLOCATED; e += s.state == ENQUEUED; d += s.state == DEQUEUED;
    }
    fail("AllocTensor on ", name(), ": all ", slots.size(), " buffers are in use (", a,
         " allocated, ", e, " enqueued, ", d, " dequeued); FreeTensor one first or give the "
         "queue more buffers in InitBuffer");
  }
  Slot& own(k31emu::Slot* s, uint32_t gen, const char* op) {
    need_init(op);
    if (!s) fail(op, " on ", name(), ": the tensor is uninitialised");
    if (s < slots.data() || s >= slots.data() + slots.size())
      fail(op, " on ", name(), ": the tensor belongs to ", s->desc(), ", not to this queue");
    if (gen != s->gen || s->state == FREE)
      fail(op, " on ", name(), ": ", s->desc(), " was already freed (double FreeTensor or a stale tensor)");
    return *s;
  }
  void enque(k31emu::Slot* sp, uint32_t gen) {
    Slot& s = own(sp, gen, "EnQue");
    if (s.state == ENQUEUED) fail("EnQue on ", name(), ": ", s.desc(), " is already enqueued");
    if (s.state == DEQUEUED)
      fail("EnQue on ", name(), ": ", s.desc(), " was dequeued; FreeTensor it and AllocTensor again");
    if (static_cast<int32_t>(fifo.size()) >= depth)
      fail("EnQue on ", name(), ": the queue already holds ", fifo.size(),
           " tensor(s), its depth; DeQue before enqueuing more (or raise the depth)");
    s.state = ENQUEUED;
    fifo.push_back(s.index);
  }
  Slot& deque() {
    need_init("DeQue");
    if (fifo.empty()) fail("DeQue on ", name(), ": nothing is enqueued (DeQue without EnQue)");
    Slot& s = slots[fifo.front()];
    fifo.pop_front();
    s.state = DEQUEUED;
    return s;
  }
  void free(k31emu::Slot* sp, uint32_t gen) {
    Slot& s = own(sp, gen, "FreeTensor");
    if (s.state == ENQUEUED)
      fail("FreeTensor on ", name(), ": ", s.desc(), " is still enqueued; DeQue it first");
    s.state = FREE;
    ++s.gen;
  }
};

template <class T>
LocalTensor<T> view(Slot& s, uint32_t byte_off, uint32_t count) {
  LocalTensor<T> t;
  t.slot_ = &s; t.gen_ = s.gen; t.off_ = s.offset + byte_off; t.size_ = count;
  t.base_ = core().base(s.mem); t.shadow_ = core().shadow(s.mem);
  return t;
}

}  // namespace k31emu

namespace AscendC {

// Scalar accessors are hot in generated code: the common path is a few compares, the
// diagnostics live in the out-of-line checks.
template <class T>
T LocalTensor<T>::GetValue(uint32_t i) const {
  const uint8_t* w = shadow_ ? written() + uint64_t(i) * sizeof(T) : nullptr;
  bool ok = slot_ && gen_ == slot_->gen && slot_->state != k31emu::FREE && slot_->state != k31emu::ENQUEUED &&
            i < size_;
  if (ok) for (size_t b = 0; b < sizeof(T); ++b) ok &= w[b] != 0;
  if (__builtin_expect(!ok, 0)) {
    k31emu::need_live(*this, "GetValue", "the tensor");
    if (i >= size_) k31emu::fail("GetValue(", i, "): beyond the tensor's ", size_, " elements");
    k31emu::need_written_bytes(*this, uint64_t(i) * sizeof(T), sizeof(T), "GetValue", "the tensor");
  }
  return ptr()[i];
}
template <class T>
void LocalTensor<T>::SetValue(uint32_t i, T v) const {
  if (__builtin_expect(!(slot_ && gen_ == slot_->gen && slot_->state != k31emu::FREE &&
                         slot_->state != k31emu::ENQUEUED && i < size_), 0)) {
    k31emu::need_live(*this, "SetValue", "the tensor");
    k31emu::fail("SetValue(", i, "): beyond the tensor's ", size_, " elements");
  }
  ptr()[i] = v;
  uint8_t* w = written() + uint64_t(i) * sizeof(T);
  for (size_t b = 0; b < sizeof(T); ++b) w[b] = 1;
}

template <TPosition kPos, int32_t kDepth = 1, int32_t kMask = 0>
class TQue : public k31emu::QueBase {
 public:
  TQue() : QueBase(kPos, kDepth) {}
  template <class T> LocalTensor<T> AllocTensor() {
    k31emu::Slot& s = alloc();
    return k31emu::view<T>(s, 0, s.bytes / sizeof(T));
  }
  template <class T> bool EnQue(const LocalTensor<T>& t) { enque(t.slot_, t.gen_); return true; }
  template <class T> LocalTensor<T> DeQue() {
    k31emu::Slot& s = deque();
    return k31emu::view<T>(s, 0, s.bytes / sizeof(T));
  }
  template <class T> void FreeTensor(const LocalTensor<T>& t) { free(t.slot_, t.gen_); }
  bool HasTensorInQue() const { return !fifo.empty(); }
  int32_t GetTensorCountInQue() const { return static_cast<int32_t>(fifo.size()); }
  bool VacantInQue() const { return static_cast<int32_t>(fifo.size()) < depth; }
  bool HasIdleBuffer() const {
    for (auto& s : slots) if (s.state == k31emu::FREE) return true;
    return false;
  }
};
template <TPosition src, TPosition dst, int32_t depth = 1, int32_t mask = 0>
class TQueBind : public TQue<src, depth, mask> {};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
 public:
  k31emu::Slot slot_;
  bool init_ = false;
  TBuf() = default;
  TBuf(const TBuf&) = delete;
  void need_init(const char* op) const {
    if (!init_) k31emu::fail("TBuf<", k31emu::pos_name(pos), ">::", op, " before TPipe::InitBuffer");
  }
  template <class T> LocalTensor<T> Get() { need_init("Get"); return k31emu::view<T>(slot_, 0, slot_.bytes / sizeof(T)); }
  template <class T> LocalTensor<T> Get(uint32_t len) {
    need_init("Get");
    if (uint64_t(len) * sizeof(T) > slot_.bytes)
      k31emu::fail("TBuf::Get<", sizeof(T), "-byte>(", len, "): ", slot_.desc(), " holds only ", slot_.bytes, " B");
    return k31emu::view<T>(slot_, 0, len);
  }
  template <class T> LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) {
    need_init("GetWithOffset");
    if (bufOffset + uint64_t(size) * sizeof(T) > slot_.bytes)
      k31emu::fail("TBuf::GetWithOffset(", size, ", ", bufOffset, "): beyond the ", slot_.bytes, " B of ", slot_.desc());
    return k31emu::view<T>(slot_, bufOffset, size);
  }
};

class TPipe {
 public:
  uint32_t used_[k31emu::NUM_MEM] = {};
  int nque_ = 0, nbuf_ = 0;

  TPipe() = default;
  TPipe(const TPipe&) = delete;
  uint32_t carve(k31emu::Mem m, uint32_t total, const std::string& who, uint32_t num, uint32_t len) {
    uint32_t start = (used_[m] + k31emu::kAlign[m] - 1) / k31emu::kAlign[m] * k31emu::kAlign[m];
    if (uint64_t(start) + total > k31emu::kCapacity[m])
      k31emu::fail("TPipe::InitBuffer: ", k31emu::kMemName[m], " overflow: ", who, " requests ",
                   num, " x ", len, " B = ", total, " B, but ", start, " of the ",
                   k31emu::kCapacity[m], " B of ", k31emu::kMemName[m],
                   " are already taken (", k31emu::kCapacity[m] - start, " B left)");
    used_[m] = start + total;
    return start;
  }
  bool InitBuffer(k31emu::QueBase& que, uint8_t num, uint32_t len) {
    k31emu::Mem m = k31emu::mem_of(que.pos);
    if (que.id >= 0) k31emu::fail("TPipe::InitBuffer: ", que.name(), " already has buffers");
    que.id = nque_++;
    if (m == k31emu::NO_MEM) k31emu::fail("TPipe::InitBuffer: ", que.name(), " has no on-chip memory");
    if (num == 0 || len == 0) k31emu::fail("TPipe::InitBuffer: ", que.name(), " with ", int(num), " buffers of ", len, " B");
    uint32_t a = k31emu::kAlign[m], stride = (len + a - 1) / a * a;
    uint32_t start = carve(m, stride * num, que.name(), num, len);
    que.slots.resize(num);
    for (int i = 0; i < num; ++i) {
      k31emu::Slot& s = que.slots[i];
      s.mem = m; s.pos = que.pos; s.offset = start + i * stride; s.bytes = len;
      s.owner = que.name(); s.index = i; s.state = k31emu::FREE;
    }
    return true;
  }
  template <TPosition pos>
  bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    k31emu::Mem m = k31emu::mem_of(pos);
    std::string who = k31emu::cat("TBuf<", k31emu::pos_name(pos), "> #", nbuf_++);
    if (buf.init_) k31emu::fail("TPipe::InitBuffer: ", buf.slot_.owner, " already has a buffer");
    if (m == k31emu::NO_MEM || len == 0) k31emu::fail("TPipe::InitBuffer: ", who, " with ", len, " B");
    uint32_t start = carve(m, len, who, 1, len);
    k31emu::Slot& s = buf.slot_;
    s.mem = m; s.pos = pos; s.offset = start; s.bytes = len; s.owner = who; s.state = k31emu::SCRATCH;
    std::memset(k31emu::core().shadow(m) + start, 0, len);
    buf.init_ = true;
    return true;
  }
  void Reset() { for (auto& u : used_) u = 0; }
  void Destroy() { Reset(); }
  template <HardEvent ev> int32_t FetchEventID() { return 0; }
  int32_t FetchEventID(HardEvent) { return 0; }
  template <HardEvent ev> int32_t AllocEventID() { return 0; }
  template <HardEvent ev> void ReleaseEventID(int32_t) {}
};

}  // namespace AscendC
