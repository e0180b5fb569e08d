// k31emu data movement: DataCopy (count and DataCopyParams forms) and DataCopyPad, with the
// documented units: DataCopyParams counts 32-byte blocks everywhere; DataCopyExtParams counts
// blockLen in bytes and strides in bytes on the GM side, 32-byte blocks on the UB side.
#pragma once
#include "k31emu_tensor.h"

namespace AscendC {

struct DataCopyParams {
  uint16_t blockCount = 1, blockLen = 0, srcStride = 0, dstStride = 0;
  DataCopyParams() = default;
  DataCopyParams(uint16_t count, uint16_t len, uint16_t src, uint16_t dst)
      : blockCount(count), blockLen(len), srcStride(src), dstStride(dst) {}
};
struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0, srcStride = 0, dstStride = 0, rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t src, uint32_t dst, uint32_t r = 0)
      : blockCount(count), blockLen(len), srcStride(src), dstStride(dst), rsv(r) {}
};
template <class T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0, rightPadding = 0;
  T paddingValue = T(0);
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(bool pad, uint8_t left, uint8_t right, T value)
      : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};
struct DataCopyPadParams {
  bool isPad = false;
  uint8_t leftPadding = 0, rightPadding = 0;
  uint64_t paddingValue = 0;
  DataCopyPadParams() = default;
  DataCopyPadParams(bool pad, uint8_t left, uint8_t right, uint64_t value)
      : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

}  // namespace AscendC

namespace k31emu {

constexpr uint32_t kBlock = 32;
inline uint64_t ceil32(uint64_t b) { return (b + 31) / 32 * 32; }

template <class T>
void copy_len_ok(uint64_t count, const char* op) {
  if ((count * sizeof(T)) % kBlock)
    fail(op, ": ", count, " elements x ", sizeof(T), " B = ", count * sizeof(T),
         " B is not a multiple of 32 B; DataCopy moves whole 32-byte blocks, use DataCopyPad "
         "for unaligned lengths");
}
template <class T>
void local_side(const LocalTensor<T>& t, const char* op, const char* arg) {
  need_live(t, op, arg);
  if (t.slot_->mem != UB && t.slot_->mem != L1)
    fail(op, ": ", arg, " is in ", pos_name(t.slot_->pos), "; DataCopy moves GM/UB/L1 data only");
  if (t.off_ % kBlock)
    fail(op, ": ", arg, " starts at ", kMemName[t.slot_->mem], " byte ", t.off_,
         ", not 32-byte aligned; use DataCopyPad or align the tile");
}

// Strided block copy shared by the DataCopyParams forms; sizes in bytes.
inline void block_copy(uint8_t* dst, const uint8_t* src, uint32_t n, uint64_t len, uint64_t sstep, uint64_t dstep) {
  for (uint32_t i = 0; i < n; ++i) std::memmove(dst + i * dstep, src + i * sstep, len);
}

}  // namespace k31emu

namespace AscendC {

// ---- count form ----
template <class T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count) {
  const char* op = "DataCopy(GM->local)";
  k31emu::local_side(dst, op, "dst");
  k31emu::copy_len_ok<T>(count, op);
  k31emu::need_count(dst, count, op, "dst");
  k31emu::gm_range(src, count, op, "src");
  std::memcpy(dst.ptr(), src.ptr_, count * sizeof(T));
  k31emu::mark(dst, count);
}
template <class T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  const char* op = "DataCopy(local->GM)";
  k31emu::local_side(src, op, "src");
  k31emu::copy_len_ok<T>(count, op);
  k31emu::need_count(src, count, op, "src");
  k31emu::need_written(src, count, op, "src");
  k31emu::gm_range(dst, count, op, "dst");
  std::memcpy(dst.ptr_, src.ptr(), count * sizeof(T));
}
template <class T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  const char* op = "DataCopy(local->local)";
  k31emu::local_side(dst, op, "dst");
  k31emu::local_side(src, op, "src");
  k31emu::copy_len_ok<T>(count, op);
  k31emu::need_count(dst, count, op, "dst");
  k31emu::need_count(src, count, op, "src");
  k31emu::need_written(src, count, op, "src");
  std::memmove(dst.ptr(), src.ptr(), count * sizeof(T));
  k31emu::mark(dst, count);
}

// ---- DataCopyParams form: blockLen, srcStride, dstStride all in 32-byte blocks ----
template <class T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p) {
  const char* op = "DataCopy(GM->local, DataCopyParams)";
  k31emu::local_side(dst, op, "dst");
  if (!p.blockCount) return;
  uint64_t len = uint64_t(p.blockLen) * 32, ds = len + uint64_t(p.dstStride) * 32,
           ss = len + uint64_t(p.srcStride) * 32;
  uint64_t dend = (p.blockCount - 1) * ds + len, send = (p.blockCount - 1) * ss + len;
  k31emu::need_count(dst, (dend + sizeof(T) - 1) / sizeof(T), op, "dst");
  k31emu::gm_range(src, (send + sizeof(T) - 1) / sizeof(T), op, "src");
  k31emu::block_copy(reinterpret_cast<uint8_t*>(dst.ptr()), reinterpret_cast<const uint8_t*>(src.ptr_),
                     p.blockCount, len, ss, ds);
  for (uint32_t i = 0; i < p.blockCount; ++i) k31emu::mark_bytes(dst, i * ds, len);
}
template <class T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  const char* op = "DataCopy(local->GM, DataCopyParams)";
  k31emu::local_side(src, op, "src");
  if (!p.blockCount) return;
  uint64_t len = uint64_t(p.blockLen) * 32, ds = len + uint64_t(p.dstStride) * 32,
           ss = len + uint64_t(p.srcStride) * 32;
  uint64_t dend = (p.blockCount - 1) * ds + len, send = (p.blockCount - 1) * ss + len;
  k31emu::need_count(src, (send + sizeof(T) - 1) / sizeof(T), op, "src");
  for (uint32_t i = 0; i < p.blockCount; ++i) k31emu::need_written_bytes(src, i * ss, len, op, "src");
  k31emu::gm_range(dst, (dend + sizeof(T) - 1) / sizeof(T), op, "dst");
  k31emu::block_copy(reinterpret_cast<uint8_t*>(dst.ptr_), reinterpret_cast<const uint8_t*>(src.ptr()),
                     p.blockCount, len, ss, ds);
}
template <class T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  const char* op = "DataCopy(local->local, DataCopyParams)";
  k31emu::local_side(dst, op, "dst");
  k31emu::local_side(src, op, "src");
  if (!p.blockCount) return;
  uint64_t len = uint64_t(p.blockLen) * 32, ds = len + uint64_t(p.dstStride) * 32,
           ss = len + uint64_t(p.srcStride) * 32;
  uint64_t dend = (p.blockCount - 1) * ds + len, send = (p.blockCount - 1) * ss + len;
  k31emu::need_count(dst, (dend + sizeof(T) - 1) / sizeof(T), op, "dst");
  k31emu::need_count(src, (send + sizeof(T) - 1) / sizeof(T), op, "src");
  for (uint32_t i = 0; i < p.blockCount; ++i) k31emu::need_written_bytes(src, i * ss, len, op, "src");
  k31emu::block_copy(reinterpret_cast<uint8_t*>(dst.ptr()), reinterpret_cast<const uint8_t*>(src.ptr()),
                     p.blockCount, len, ss, ds);
  for (uint32_t i = 0; i < p.blockCount; ++i) k31emu::mark_bytes(dst, i * ds, len);
}

// ---- DataCopyPad GM -> UB ----
// Each block lands 32-byte aligned in UB as [leftPadding elems][blockLen bytes][rightPadding
// elems][dummy up to the next 32 B]; the next block starts dstStride 32-byte blocks later.
// Pads get paddingValue when isPad, else unspecified values; the dummy gets the block's first
// element when both paddings are 0.  The emulator writes 0xFF bytes (NaN / -1) wherever the
// hardware leaves unspecified values, and counts them as written.
template <class T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad) {
  const char* op = "DataCopyPad(GM->UB)";
  k31emu::need_live(dst, op, "dst");
  k31emu::need_mem(dst, k31emu::UB, op, "dst");
  k31emu::need_align(dst, 32, op, "dst");
  if (pad.leftPadding * sizeof(T) > 32 || pad.rightPadding * sizeof(T) > 32)
    k31emu::fail(op, ": leftPadding/rightPadding may cover at most 32 bytes each");
  if (!p.blockCount) return;
  uint64_t lp = pad.leftPadding * sizeof(T), rp = pad.rightPadding * sizeof(T);
  uint64_t row = k31emu::ceil32(lp + p.blockLen + rp), ds = row + uint64_t(p.dstStride) * 32,
           ss = uint64_t(p.blockLen) + p.srcStride;
  uint64_t dend = (p.blockCount - 1) * ds + row, send = (p.blockCount - 1) * ss + p.blockLen;
  if (dend > dst.GetLength())
    k31emu::fail(op, ": the copy fills ", dend, " B of dst (", p.blockCount, " blocks of ", row,
                 " B, dstStride ", p.dstStride, " x 32 B) but dst holds ", dst.GetLength(), " B");
  k31emu::gm_range(src, (send + sizeof(T) - 1) / sizeof(T), op, "src");
  uint8_t* d = reinterpret_cast<uint8_t*>(dst.ptr());
  const uint8_t* s = reinterpret_cast<const uint8_t*>(src.ptr_);
  for (uint32_t i = 0; i < p.blockCount; ++i) {
    uint8_t* r = d + i * ds;
    const uint8_t* g = s + i * ss;
    std::memset(r, 0xff, row);
    std::memcpy(r + lp, g, p.blockLen);
    bool aligned = (lp + p.blockLen + rp) % 32 == 0;
    if (pad.isPad) {
      uint64_t tail_end = (lp || rp || aligned) ? row : lp + p.blockLen + rp;
      for (uint64_t b = 0; b + sizeof(T) <= lp; b += sizeof(T)) std::memcpy(r + b, &pad.paddingValue, sizeof(T));
      for (uint64_t b = lp + p.blockLen; b + sizeof(T) <= tail_end; b += sizeof(T))
        std::memcpy(r + b, &pad.paddingValue, sizeof(T));
    }
    if (!lp && !rp && !aligned && p.blockLen >= sizeof(T)) {
      for (uint64_t b = p.blockLen; b + sizeof(T) <= row; b += sizeof(T)) std::memcpy(r + b, g, sizeof(T));
    }
    k31emu::mark_bytes(dst, i * ds, row);
  }
}
template <class T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p,
                 const DataCopyPadParams& pad) {
  DataCopyPad(dst, src, DataCopyExtParams(p.blockCount, p.blockLen, p.srcStride, p.dstStride),
              DataCopyPadExtParams<T>(pad.isPad, pad.leftPadding, pad.rightPadding, T(0)));
}

// ---- DataCopyPad UB -> GM: source blocks start every ceil32(blockLen) + srcStride*32 bytes,
// destination blocks every blockLen + dstStride bytes; only blockLen bytes per block move. ----
template <class T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  const char* op = "DataCopyPad(UB->GM)";
  k31emu::need_live(src, op, "src");
  k31emu::need_mem(src, k31emu::UB, op, "src");
  k31emu::need_align(src, 32, op, "src");
  if (!p.blockCount) return;
  uint64_t ss = k31emu::ceil32(p.blockLen) + uint64_t(p.srcStride) * 32, ds = uint64_t(p.blockLen) + p.dstStride;
  uint64_t send = (p.blockCount - 1) * ss + p.blockLen, dend = (p.blockCount - 1) * ds + p.blockLen;
  if (send > src.GetLength())
    k31emu::fail(op, ": the copy reads ", send, " B of src but src holds ", src.GetLength(), " B");
  k31emu::gm_range(dst, (dend + sizeof(T) - 1) / sizeof(T), op, "dst");
  for (uint32_t i = 0; i < p.blockCount; ++i) k31emu::need_written_bytes(src, i * ss, p.blockLen, op, "src");
  uint8_t* d = reinterpret_cast<uint8_t*>(dst.ptr_);
  const uint8_t* s = reinterpret_cast<const uint8_t*>(src.ptr());
  for (uint32_t i = 0; i < p.blockCount; ++i) std::memcpy(d + i * ds, s + i * ss, p.blockLen);
}
template <class T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  DataCopyPad(dst, src, DataCopyExtParams(p.blockCount, p.blockLen, p.srcStride, p.dstStride));
}

}  // namespace AscendC
