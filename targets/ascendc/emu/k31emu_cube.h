// k31emu cube path: DataCopy GM->L1 with ND->NZ (Nd2NzParams), LoadData L1->L0A/L0B
// (LoadData2DParams, whole 512-byte fractals), Mmad into L0C (fp32/int32 accumulate) and
// Fixpipe L0C->GM/UB (NZ->ND).  Layouts (C0 = 32 B / sizeof(T) elements):
//   L1  (after Nd2Nz): Nz  - fractals 16 rows x C0 cols, row-major inside, fractal columns outer
//   L0A (Mmad A, m x k): Zz - fractals 16 x C0 row-major inside, fractals row-major
//   L0B (Mmad B, k x n): Zn - fractals C0(k) x 16(n) column-major inside, fractals row-major
//   L0C (Mmad C, m x n): Nz - fractals 16 x 16 row-major inside, fractal columns outer
#pragma once
#include "k31emu_copy.h"

namespace AscendC {

struct Nd2NzParams {
  uint16_t ndNum = 1, nValue = 0, dValue = 0, srcNdMatrixStride = 0, srcDValue = 0,
           dstNzC0Stride = 0, dstNzNStride = 0, dstNzMatrixStride = 0;
  Nd2NzParams() = default;
  Nd2NzParams(uint16_t nd, uint16_t n, uint16_t d, uint16_t srcNdStride, uint16_t srcD,
              uint16_t c0Stride, uint16_t nStride, uint16_t nzMatrixStride)
      : ndNum(nd), nValue(n), dValue(d), srcNdMatrixStride(srcNdStride), srcDValue(srcD),
        dstNzC0Stride(c0Stride), dstNzNStride(nStride), dstNzMatrixStride(nzMatrixStride) {}
};
struct LoadData2DParams {
  uint16_t startIndex = 0;
  uint8_t repeatTimes = 0;
  uint16_t srcStride = 0;
  uint8_t sid = 0;
  uint16_t dstGap = 0;
  bool ifTranspose = false;
  uint8_t addrMode = 0;
  LoadData2DParams() = default;
  LoadData2DParams(uint16_t start, uint8_t repeat, uint16_t sStride, uint8_t sidIn, uint16_t gap,
                   bool transpose, uint8_t mode = 0)
      : startIndex(start), repeatTimes(repeat), srcStride(sStride), sid(sidIn), dstGap(gap),
        ifTranspose(transpose), addrMode(mode) {}
};
using LoadData2dParams = LoadData2DParams;
struct MmadParams {
  uint16_t m = 0, n = 0, k = 0;
  bool isBias = false;
  int32_t fmOffset = 0;
  bool enSsparse = false, enWinogradA = false, enWinogradB = false;
  uint8_t unitFlag = 0;
  bool kDirectionAlign = false;
  bool cmatrixInitVal = true, cmatrixSource = false;
  MmadParams() = default;
  MmadParams(uint16_t mIn, uint16_t nIn, uint16_t kIn, bool isBiasIn, int32_t fmOffsetIn,
             bool sparse, bool winoA, bool winoB)
      : m(mIn), n(nIn), k(kIn), isBias(isBiasIn), fmOffset(fmOffsetIn), enSsparse(sparse),
        enWinogradA(winoA), enWinogradB(winoB) {}
  MmadParams(uint16_t mIn, uint16_t nIn, uint16_t kIn, uint8_t unit, bool kAlign, bool initVal)
      : m(mIn), n(nIn), k(kIn), unitFlag(unit), kDirectionAlign(kAlign), cmatrixInitVal(initVal) {}
};
enum class QuantMode_t : uint8_t { NoQuant = 0, F322F16, F322BF16, DEQF16, VDEQF16, QF322B8_PRE, VQF322B8_PRE, REQ8, VREQ8 };
enum class CO2Layout : uint8_t { NZ = 0, ROW_MAJOR, COLUMN_MAJOR };
struct FixpipeConfig { CO2Layout format; };
inline constexpr FixpipeConfig CFG_NZ{CO2Layout::NZ};
inline constexpr FixpipeConfig CFG_ROW_MAJOR{CO2Layout::ROW_MAJOR};
struct FixpipeParamsV220 {
  uint16_t nSize = 0, mSize = 0, srcStride = 0;
  uint32_t dstStride = 0;
  QuantMode_t quantPre = QuantMode_t::NoQuant;
  uint64_t deqScalar = 0;
  uint16_t ndNum = 1, srcNdStride = 0, dstNdStride = 0;
  bool reluEn = false;
  uint8_t unitFlag = 0;
  bool isChannelSplit = false;
  FixpipeParamsV220() = default;
  FixpipeParamsV220(uint16_t n, uint16_t m, uint16_t sStride, uint32_t dStride, bool relu)
      : nSize(n), mSize(m), srcStride(sStride), dstStride(dStride), reluEn(relu) {}
};

// ---- GM -> L1 with ND -> NZ: row r, 32-byte chunk c of ND matrix i goes to
// dst + i*dstNzMatrixStride + (c*dstNzC0Stride + r*dstNzNStride)*C0 elements; a partial last
// chunk is zero-filled to C0 elements.  Rows beyond nValue are left untouched. ----
template <class T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p) {
  const char* op = "DataCopy(GM->L1, Nd2NzParams)";
  k31emu::need_live(dst, op, "dst");
  k31emu::need_mem(dst, k31emu::L1, op, "dst");
  k31emu::need_align(dst, 32, op, "dst");
  constexpr uint32_t C0 = 32 / sizeof(T);
  uint32_t chunks = (p.dValue + C0 - 1) / C0;
  if (p.nValue && p.dValue && p.srcDValue < p.dValue)
    k31emu::fail(op, ": srcDValue ", p.srcDValue, " < dValue ", p.dValue, " (rows would overlap)");
  uint64_t send = 0, dend = 0;
  for (uint32_t i = 0; i < p.ndNum && p.nValue && p.dValue; ++i) {
    send = std::max<uint64_t>(send, uint64_t(i) * p.srcNdMatrixStride + uint64_t(p.nValue - 1) * p.srcDValue + p.dValue);
    dend = std::max<uint64_t>(dend, uint64_t(i) * p.dstNzMatrixStride +
                                        (uint64_t(chunks - 1) * p.dstNzC0Stride + uint64_t(p.nValue - 1) * p.dstNzNStride) * C0 + C0);
  }
  k31emu::need_count(dst, dend, op, "dst");
  k31emu::gm_range(src, send, op, "src");
  for (uint32_t i = 0; i < p.ndNum; ++i)
    for (uint32_t r = 0; r < p.nValue; ++r)
      for (uint32_t c = 0; c < chunks; ++c) {
        const T* s = src.ptr_ + uint64_t(i) * p.srcNdMatrixStride + uint64_t(r) * p.srcDValue + c * C0;
        uint64_t o = uint64_t(i) * p.dstNzMatrixStride + (uint64_t(c) * p.dstNzC0Stride + uint64_t(r) * p.dstNzNStride) * C0;
        uint32_t take = std::min<uint32_t>(C0, p.dValue - c * C0);
        T* d = dst.ptr() + o;
        for (uint32_t e = 0; e < C0; ++e) d[e] = e < take ? s[e] : T(0);
        k31emu::mark_bytes(dst, o * sizeof(T), 32);
      }
}

// ---- L1 -> L0A/L0B: repeatTimes fractals of 512 B; source fractal startIndex + i*srcStride,
// destination fractal i*(1 + dstGap).  ifTranspose transposes each 16x16 fractal (2-byte
// types).  Written-ness travels with the data; Mmad checks the elements it uses. ----
template <class T>
void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p) {
  const char* op = "LoadData";
  k31emu::need_live(dst, op, "dst");
  k31emu::need_live(src, op, "src");
  k31emu::need_mem(src, k31emu::L1, op, "src");
  if (dst.slot_->mem != k31emu::L0A && dst.slot_->mem != k31emu::L0B)
    k31emu::fail(op, ": dst is in ", k31emu::pos_name(dst.slot_->pos), "; LoadData fills A2 (L0A) or B2 (L0B)");
  k31emu::need_align(dst, 512, op, "dst");
  k31emu::need_align(src, 32, op, "src");
  if (p.ifTranspose && sizeof(T) != 2)
    k31emu::fail(op, ": ifTranspose is emulated for 2-byte types (16x16 fractals) only; use LoadDataWithTranspose");
  constexpr uint32_t F = 512;
  if (!p.repeatTimes) return;
  uint64_t send = (uint64_t(p.startIndex) + uint64_t(p.repeatTimes - 1) * p.srcStride + 1) * F;
  uint64_t dend = (uint64_t(p.repeatTimes - 1) * (1 + p.dstGap) + 1) * F;
  if (send > src.GetLength())
    k31emu::fail(op, ": reads fractals up to byte ", send, " but src holds ", src.GetLength(), " B");
  if (dend > dst.GetLength())
    k31emu::fail(op, ": writes fractals up to byte ", dend, " but dst holds ", dst.GetLength(), " B");
  const uint8_t* sb = reinterpret_cast<const uint8_t*>(src.ptr());
  uint8_t* db = reinterpret_cast<uint8_t*>(dst.ptr());
  for (uint32_t i = 0; i < p.repeatTimes; ++i) {
    uint64_t so = (uint64_t(p.startIndex) + uint64_t(i) * p.srcStride) * F, d0 = uint64_t(i) * (1 + p.dstGap) * F;
    if (!p.ifTranspose) {
      std::memcpy(db + d0, sb + so, F);
      std::memcpy(dst.written() + d0, src.written() + so, F);
    } else {
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          std::memcpy(db + d0 + (c * 16 + r) * 2, sb + so + (r * 16 + c) * 2, 2);
          std::memcpy(dst.written() + d0 + (c * 16 + r) * 2, src.written() + so + (r * 16 + c) * 2, 2);
        }
    }
  }
}

struct LoadData2dTransposeParams {
  uint16_t startIndex = 0;
  uint8_t repeatTimes = 0;
  uint16_t srcStride = 0, dstGap = 0, dstFracGap = 0;
  uint8_t addrMode = 0;
  LoadData2dTransposeParams() = default;
  LoadData2dTransposeParams(uint16_t start, uint8_t repeat, uint16_t sStride, uint16_t gap, uint16_t fracGap,
                            uint8_t mode = 0)
      : startIndex(start), repeatTimes(repeat), srcStride(sStride), dstGap(gap), dstFracGap(fracGap), addrMode(mode) {}
};

// ---- LoadDataWithTranspose (our reading of the documented description): each iteration i takes
// the square S at src byte (startIndex + i*srcStride) * square_bytes and writes S^T split into
// fractals; the first lands at dst fractal i*(1 + dstGap), the second (4- and 1-byte types)
// 1 + dstFracGap fractals after it.
//   2-byte: S = one 16x16 fractal.
//   4-byte: S = [F0 | F1], two consecutive 16x8 fractals side by side (16x16); outputs S^T[:, 0:8]
//           and S^T[:, 8:16].  With src rows = 16 k-rows of B and F0/F1 = n columns 0-7 / 8-15,
//           the outputs are the Zn fractals of k-blocks 0 and 1.
//   1-byte: S = [F0; F1], two consecutive 16x32 fractals stacked (32x32); outputs S^T[0:16, :]
//           and S^T[16:32, :]. ----
template <class T>
void LoadDataWithTranspose(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2dTransposeParams& p) {
  const char* op = "LoadDataWithTranspose";
  k31emu::need_live(dst, op, "dst");
  k31emu::need_live(src, op, "src");
  k31emu::need_mem(src, k31emu::L1, op, "src");
  if (dst.slot_->mem != k31emu::L0A && dst.slot_->mem != k31emu::L0B)
    k31emu::fail(op, ": dst is in ", k31emu::pos_name(dst.slot_->pos), "; it fills A2 (L0A) or B2 (L0B)");
  k31emu::need_align(dst, 512, op, "dst");
  k31emu::need_align(src, 32, op, "src");
  constexpr uint32_t E = sizeof(T), F = 512;
  constexpr uint32_t SQ = E == 2 ? 16 : (E == 4 ? 16 : 32);  // square edge (elements)
  constexpr uint32_t NOUT = E == 2 ? 1 : 2;                   // fractals written per iteration
  static_assert(E == 1 || E == 2 || E == 4, "LoadDataWithTranspose: 1-, 2- or 4-byte types");
  if (!p.repeatTimes) return;
  uint64_t sq_bytes = uint64_t(SQ) * SQ * E;
  uint64_t send = (uint64_t(p.startIndex) + uint64_t(p.repeatTimes - 1) * p.srcStride) * sq_bytes + sq_bytes;
  uint64_t last0 = uint64_t(p.repeatTimes - 1) * (1 + p.dstGap);
  uint64_t dend = (last0 + (NOUT - 1) * (1 + uint64_t(p.dstFracGap)) + 1) * F;
  if (send > src.GetLength()) k31emu::fail(op, ": reads up to byte ", send, " but src holds ", src.GetLength(), " B");
  if (dend > dst.GetLength()) k31emu::fail(op, ": writes up to byte ", dend, " but dst holds ", dst.GetLength(), " B");
  const uint8_t* sb = reinterpret_cast<const uint8_t*>(src.ptr());
  const uint8_t* sw = src.written();
  uint8_t* db = reinterpret_cast<uint8_t*>(dst.ptr());
  uint8_t* dw = dst.written();
  // element (r, c) of the square S inside the source, as a byte offset from the square's start
  auto s_at = [&](uint32_t r, uint32_t c) -> uint64_t {
    if (E == 4) return (c < 8 ? 0 : F) + (r * 8 + c % 8) * E;      // [F0 | F1], 16x8 each
    return uint64_t(r) * SQ * E + c * E;                             // row-major 16x16 / 32x32
  };
  for (uint32_t i = 0; i < p.repeatTimes; ++i) {
    uint64_t s0 = (uint64_t(p.startIndex) + uint64_t(i) * p.srcStride) * sq_bytes;
    uint64_t g0 = uint64_t(i) * (1 + p.dstGap) * F;
    for (uint32_t g = 0; g < NOUT; ++g) {
      uint64_t d0 = g0 + uint64_t(g) * (1 + p.dstFracGap) * F;
      // output fractal g: rows x cols = 16 x (F / 16 / E)
      const uint32_t cols = F / 16 / E;
      for (uint32_t r = 0; r < 16; ++r)
        for (uint32_t c = 0; c < cols; ++c) {
          // S^T element (R, C) = S(C, R); fractal g covers S^T columns [g*cols, ...) for 4-byte,
          // rows [g*16, ...) for 1-byte, everything for 2-byte
          uint32_t R = E == 1 ? g * 16 + r : r, C = E == 4 ? g * cols + c : c;
          uint64_t so = s0 + s_at(C, R), dof = d0 + (uint64_t(r) * cols + c) * E;
          std::memcpy(db + dof, sb + so, E);
          std::memcpy(dw + dof, sw + so, E);
        }
    }
  }
}

}  // namespace AscendC

namespace k31emu {
template <class T> using acc_t = typename std::conditional<std::is_integral<T>::value, int64_t, double>::type;
}

namespace AscendC {

// ---- Mmad: C[m x n] (=|+=) A[m x k] * B[k x n]; A Zz in L0A, B Zn in L0B, C Nz in L0C.
// Products accumulate in double (int64 for int8) per call and round once to C's type.
// C starts from 0 when cmatrixInitVal (and not isBias), else accumulates onto L0C. ----
template <class DstT, class Src0T, class Src1T>
void Mmad(const LocalTensor<DstT>& c, const LocalTensor<Src0T>& a, const LocalTensor<Src1T>& b, const MmadParams& p) {
  static_assert(std::is_same<Src0T, Src1T>::value, "Mmad: A and B must have the same type");
  static_assert((std::is_same<DstT, float>::value && !std::is_integral<Src0T>::value) ||
                    (std::is_same<DstT, int32_t>::value && std::is_same<Src0T, int8_t>::value),
                "Mmad: supports half/bfloat16_t/float -> float and int8_t -> int32_t");
  const char* op = "Mmad";
  k31emu::need_live(c, op, "dst (C)"); k31emu::need_live(a, op, "fm (A)"); k31emu::need_live(b, op, "filter (B)");
  k31emu::need_mem(c, k31emu::L0C, op, "dst (C)");
  k31emu::need_mem(a, k31emu::L0A, op, "fm (A)");
  k31emu::need_mem(b, k31emu::L0B, op, "filter (B)");
  k31emu::need_align(a, 512, op, "fm (A)");
  k31emu::need_align(b, 512, op, "filter (B)");
  k31emu::need_align(c, 1024, op, "dst (C)");
  constexpr uint32_t C0 = 32 / sizeof(Src0T);
  const uint32_t m = p.m, n = p.n, k = p.k;
  const uint32_t M1 = (m + 15) / 16, N1 = (n + 15) / 16, K1 = (k + C0 - 1) / C0;
  k31emu::need_count(a, uint64_t(M1) * K1 * 16 * C0, op, "fm (A) (Zz, m padded to 16, k to C0)");
  k31emu::need_count(b, uint64_t(K1) * N1 * 16 * C0, op, "filter (B) (Zn, k padded to C0, n to 16)");
  k31emu::need_count(c, uint64_t(M1) * N1 * 256, op, "dst (C) (Nz, m and n padded to 16)");
  bool accumulate = p.isBias || !p.cmatrixInitVal;
  auto aoff = [&](uint32_t i, uint32_t kk) { return (uint64_t(i / 16) * K1 + kk / C0) * 16 * C0 + (i % 16) * C0 + kk % C0; };
  auto boff = [&](uint32_t kk, uint32_t j) { return (uint64_t(kk / C0) * N1 + j / 16) * 16 * C0 + (j % 16) * C0 + kk % C0; };
  auto coff = [&](uint32_t i, uint32_t j) { return (uint64_t(j / 16) * M1 + i / 16) * 256 + (i % 16) * 16 + j % 16; };
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t kk = 0; kk < k; ++kk)
      if (!a.written()[aoff(i, kk) * sizeof(Src0T)])
        k31emu::fail(op, ": A element (", i, ", ", kk, ") at L0A element ", aoff(i, kk), " of ", a.slot_->desc(), " was never written");
  for (uint32_t kk = 0; kk < k; ++kk)
    for (uint32_t j = 0; j < n; ++j)
      if (!b.written()[boff(kk, j) * sizeof(Src1T)])
        k31emu::fail(op, ": B element (", kk, ", ", j, ") at L0B element ", boff(kk, j), " of ", b.slot_->desc(), " was never written");
  if (accumulate)
    for (uint32_t i = 0; i < m; ++i)
      for (uint32_t j = 0; j < n; ++j)
        if (!c.written()[coff(i, j) * sizeof(DstT)])
          k31emu::fail(op, ": accumulating onto C element (", i, ", ", j, ") that was never written (set cmatrixInitVal)");
  using A = k31emu::acc_t<Src0T>;
  std::vector<A> bt(uint64_t(n) * k);  // B transposed: contiguous inner loop
  for (uint32_t kk = 0; kk < k; ++kk)
    for (uint32_t j = 0; j < n; ++j) bt[uint64_t(j) * k + kk] = static_cast<A>(static_cast<typename std::conditional<std::is_integral<Src1T>::value, Src1T, float>::type>(b.ptr()[boff(kk, j)]));
  std::vector<A> arow(k);
  DstT* cp = c.ptr();
  for (uint32_t i = 0; i < M1 * 16; ++i) {
    if (i < m)
      for (uint32_t kk = 0; kk < k; ++kk)
        arow[kk] = static_cast<A>(static_cast<typename std::conditional<std::is_integral<Src0T>::value, Src0T, float>::type>(a.ptr()[aoff(i, kk)]));
    for (uint32_t j = 0; j < N1 * 16; ++j) {
      uint64_t o = coff(i, j);
      if (i >= m || j >= n) { if (!accumulate) cp[o] = DstT(0); continue; }
      A acc = accumulate ? static_cast<A>(cp[o]) : A(0);
      const A* bj = &bt[uint64_t(j) * k];
      for (uint32_t kk = 0; kk < k; ++kk) acc += arow[kk] * bj[kk];
      cp[o] = static_cast<DstT>(acc);
    }
  }
  k31emu::mark(c, uint64_t(M1) * N1 * 256);
}

}  // namespace AscendC

namespace k31emu {
// Fixpipe element conversion: quantPre picks the output type (NoQuant keeps float/int32).
template <class D, class S>
D fix_convert(S v, AscendC::QuantMode_t q, bool relu) {
  using AscendC::QuantMode_t;
  if (relu && v < S(0)) v = S(0);
  if constexpr (std::is_same<D, S>::value) {
    if (q != QuantMode_t::NoQuant) fail("Fixpipe: output type equals L0C type but quantPre is not NoQuant");
    return v;
  } else if constexpr (is_f16<D>) {
    if (q != QuantMode_t::F322F16) fail("Fixpipe: half output needs quantPre = QuantMode_t::F322F16");
    return D(static_cast<float>(v));
  } else if constexpr (is_bf16<D>) {
    if (q != QuantMode_t::F322BF16) fail("Fixpipe: bfloat16_t output needs quantPre = QuantMode_t::F322BF16");
    return D(static_cast<float>(v));
  } else {
    static_assert(std::is_same<D, S>::value, "Fixpipe: unsupported output type");
    return D();
  }
}
template <class S, class Put>
void fixpipe(const LocalTensor<S>& src, const AscendC::FixpipeParamsV220& p, const char* op, Put put) {
  static_assert(std::is_same<S, float>::value || std::is_same<S, int32_t>::value, "Fixpipe: src is float/int32_t in CO1");
  need_live(src, op, "src");
  need_mem(src, L0C, op, "src");
  if (p.ndNum != 1) fail(op, ": ndNum ", p.ndNum, " (only 1 is emulated)");
  if (p.srcStride < p.mSize || p.srcStride % 16)
    fail(op, ": srcStride ", p.srcStride, " must be a multiple of 16 rows and >= mSize ", p.mSize,
         " (it is the padded row count of the Nz source)");
  uint32_t N1 = (p.nSize + 15) / 16;
  if (p.nSize) need_count(src, uint64_t(N1 - 1) * p.srcStride * 16 + uint64_t(p.srcStride) * 16, op, "src");
  for (uint32_t i = 0; i < p.mSize; ++i)
    for (uint32_t j = 0; j < p.nSize; ++j) {
      uint64_t o = uint64_t(j / 16) * p.srcStride * 16 + uint64_t(i) * 16 + j % 16;
      if (!src.written()[o * sizeof(S)])
        fail(op, ": reads C element (", i, ", ", j, ") of ", src.slot_->desc(), " that no Mmad wrote");
      put(i, j, src.ptr()[o]);
    }
}
}  // namespace k31emu

namespace AscendC {

// ---- Fixpipe L0C (Nz, srcStride = padded rows) -> ND rows of dstStride elements. ----
template <class T, class U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p) {
  static_assert(config.format == CO2Layout::ROW_MAJOR, "Fixpipe: only the ND (CFG_ROW_MAJOR) output is emulated");
  const char* op = "Fixpipe(L0C->GM)";
  if (p.nSize > p.dstStride) k31emu::fail(op, ": dstStride ", p.dstStride, " < nSize ", p.nSize);
  if (p.mSize && p.nSize) k31emu::gm_range(dst, uint64_t(p.mSize - 1) * p.dstStride + p.nSize, op, "dst");
  k31emu::fixpipe(src, p, op, [&](uint32_t i, uint32_t j, U v) {
    dst.ptr_[uint64_t(i) * p.dstStride + j] = k31emu::fix_convert<T>(v, p.quantPre, p.reluEn);
  });
}
template <class T, class U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const LocalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p) {
  static_assert(config.format == CO2Layout::ROW_MAJOR, "Fixpipe: only the ND (CFG_ROW_MAJOR) output is emulated");
  const char* op = "Fixpipe(L0C->UB)";
  k31emu::need_live(dst, op, "dst");
  k31emu::need_mem(dst, k31emu::UB, op, "dst");
  k31emu::need_align(dst, 32, op, "dst");
  if (p.nSize > p.dstStride) k31emu::fail(op, ": dstStride ", p.dstStride, " < nSize ", p.nSize);
  if (p.mSize && p.nSize) k31emu::need_count(dst, uint64_t(p.mSize - 1) * p.dstStride + p.nSize, op, "dst");
  k31emu::fixpipe(src, p, op, [&](uint32_t i, uint32_t j, U v) {
    uint64_t o = uint64_t(i) * p.dstStride + j;
    dst.ptr()[o] = k31emu::fix_convert<T>(v, p.quantPre, p.reluEn);
    k31emu::mark_bytes(dst, o * sizeof(T), sizeof(T));
  });
}

}  // namespace AscendC
