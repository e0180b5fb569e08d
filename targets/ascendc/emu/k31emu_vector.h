// k31emu vector unit, count form: element-wise math, Duplicate, Cast with RoundMode,
// ReduceSum/Max/Min, Compare + Select.  Every operand is checked: live, in UB, 32-byte
// aligned, `count` inside it, inputs written.  half results are computed in float and rounded
// to nearest even (exact for + - * / and sqrt); sums accumulate in double.
#pragma once
#include "k31emu_tensor.h"

namespace AscendC {
enum class RoundMode : uint8_t { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
}  // namespace AscendC

namespace k31emu {
template <class T> constexpr bool is_f16 = std::is_same<T, half>::value;
template <class T> constexpr bool is_bf16 = std::is_same<T, bfloat16_t>::value;
template <class T> constexpr bool is_float = is_f16<T> || std::is_same<T, float>::value;
template <class T> constexpr bool is_int16_32 =
    std::is_same<T, int16_t>::value || std::is_same<T, int32_t>::value;
template <class T> constexpr bool is_arith = is_float<T> || is_int16_32<T>;

// The value the vector unit computes with: float for half/float, int64 for integers.
template <class T> using calc_t = typename std::conditional<std::is_integral<T>::value, int64_t, float>::type;
template <class T> calc_t<T> ld(T v) { return static_cast<calc_t<T>>(v); }
template <class T> T st(calc_t<T> v) { return static_cast<T>(v); }

// Max/Min family: a NaN operand gives NaN (the hardware's NaN rule is not documented; this is
// the rule k31dsl's IR asks for, so a kernel relying on it is flagged in README.md).
template <class C> C nan_or(C a, C b, C r) {
  if constexpr (std::is_floating_point<C>::value) { if (a != a) return a; if (b != b) return b; }
  return r;
}

// Abs clears a float's sign bit (|-0.0| = +0.0, as IEEE and the Abs documentation's |x| say).
template <class C> C magnitude(C a) {
  if constexpr (std::is_floating_point<C>::value) return std::fabs(a);
  else return a < 0 ? -a : a;
}

#define K31_NO_BF16(T, OP) \
  static_assert(!k31emu::is_bf16<T>, OP ": bfloat16_t has no vector arithmetic on A2/A3; Cast to float first")

template <class T, class F>
void binary(const char* op, const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b,
            uint32_t n, F f) {
  vec_in(a, n, op, "src0"); vec_in(b, n, op, "src1"); vec_out(d, n, op, "dst");
  T* dp = d.ptr(); const T* ap = a.ptr(); const T* bp = b.ptr();
  for (uint32_t i = 0; i < n; ++i) dp[i] = st<T>(f(ld(ap[i]), ld(bp[i])));
  mark(d, n);
}
template <class T, class F>
void unary(const char* op, const LocalTensor<T>& d, const LocalTensor<T>& a, uint32_t n, F f) {
  vec_in(a, n, op, "src"); vec_out(d, n, op, "dst");
  T* dp = d.ptr(); const T* ap = a.ptr();
  for (uint32_t i = 0; i < n; ++i) dp[i] = st<T>(f(ld(ap[i])));
  mark(d, n);
}
}  // namespace k31emu

namespace AscendC {

#define K31_BINARY(NAME, COND, MSG, EXPR)                                                         \
  template <class T>                                                                             \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,   \
            uint32_t count) {                                                                    \
    K31_NO_BF16(T, #NAME);                                                                       \
    static_assert(COND, #NAME ": " MSG);                                                         \
    using C = k31emu::calc_t<T>;                                                                 \
    k31emu::binary(#NAME, dst, src0, src1, count, [](C a, C b) -> C { return EXPR; });           \
  }
K31_BINARY(Add, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a + b)
K31_BINARY(Sub, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a - b)
K31_BINARY(Mul, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a * b)
K31_BINARY(Div, k31emu::is_float<T>, "supports half/float", a / b)
K31_BINARY(Max, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", k31emu::nan_or(a, b, a > b ? a : b))
K31_BINARY(Min, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", k31emu::nan_or(a, b, a < b ? a : b))
#undef K31_BINARY

#define K31_LOGIC(NAME, EXPR)                                                                    \
  template <class T>                                                                             \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,   \
            uint32_t count) {                                                                    \
    static_assert(std::is_same<T, int16_t>::value || std::is_same<T, uint16_t>::value,          \
                  #NAME ": supports int16_t/uint16_t (ReinterpretCast wider ints)");             \
    k31emu::vec_in(src0, count, #NAME, "src0"); k31emu::vec_in(src1, count, #NAME, "src1");      \
    k31emu::vec_out(dst, count, #NAME, "dst");                                                   \
    for (uint32_t i = 0; i < count; ++i) {                                                       \
      T a = src0.ptr()[i], b = src1.ptr()[i];                                                    \
      dst.ptr()[i] = static_cast<T>(EXPR);                                                       \
    }                                                                                            \
    k31emu::mark(dst, count);                                                                    \
  }
K31_LOGIC(And, a & b)
K31_LOGIC(Or, a | b)
#undef K31_LOGIC
template <class T>
void Not(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  static_assert(std::is_same<T, int16_t>::value || std::is_same<T, uint16_t>::value,
                "Not: supports int16_t/uint16_t");
  k31emu::vec_in(src, count, "Not", "src"); k31emu::vec_out(dst, count, "Not", "dst");
  for (uint32_t i = 0; i < count; ++i) dst.ptr()[i] = static_cast<T>(~src.ptr()[i]);
  k31emu::mark(dst, count);
}

#define K31_SCALAR(NAME, COND, MSG, EXPR)                                                         \
  template <class T, class U>                                                                    \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const U& scalarValue,          \
            uint32_t count) {                                                                    \
    K31_NO_BF16(T, #NAME);                                                                       \
    static_assert(COND, #NAME ": " MSG);                                                         \
    using C = k31emu::calc_t<T>;                                                                 \
    C s = k31emu::ld(static_cast<T>(scalarValue));                                               \
    k31emu::unary(#NAME, dst, src, count, [s](C a) -> C { return EXPR; });                       \
  }
K31_SCALAR(Adds, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a + s)
K31_SCALAR(Muls, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a * s)
K31_SCALAR(Maxs, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", k31emu::nan_or(a, s, a > s ? a : s))
K31_SCALAR(Mins, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", k31emu::nan_or(a, s, a < s ? a : s))
K31_SCALAR(ShiftLeft, std::is_integral<T>::value, "supports integer types", a << s)
K31_SCALAR(ShiftRight, std::is_integral<T>::value, "supports integer types", a >> s)
#undef K31_SCALAR

#define K31_UNARY(NAME, COND, MSG, EXPR)                                                          \
  template <class T>                                                                             \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {              \
    K31_NO_BF16(T, #NAME);                                                                       \
    static_assert(COND, #NAME ": " MSG);                                                         \
    using C = k31emu::calc_t<T>;                                                                 \
    k31emu::unary(#NAME, dst, src, count, [](C a) -> C { return EXPR; });                        \
  }
K31_UNARY(Exp, k31emu::is_float<T>, "supports half/float", std::exp(a))
K31_UNARY(Ln, k31emu::is_float<T>, "supports half/float", std::log(a))
K31_UNARY(Sqrt, k31emu::is_float<T>, "supports half/float", std::sqrt(a))
K31_UNARY(Rsqrt, k31emu::is_float<T>, "supports half/float", C(1) / std::sqrt(a))
K31_UNARY(Reciprocal, k31emu::is_float<T>, "supports half/float", C(1) / a)
K31_UNARY(Abs, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", k31emu::magnitude(a))
K31_UNARY(Relu, k31emu::is_arith<T>, "supports half/float/int16_t/int32_t", a > 0 ? a : C(0))
#undef K31_UNARY

template <class T, class U>
void Duplicate(const LocalTensor<T>& dst, const U& scalarValue, uint32_t count) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "Duplicate: supports 2- and 4-byte types");
  k31emu::vec_out(dst, count, "Duplicate", "dst");
  T v = static_cast<T>(scalarValue);
  for (uint32_t i = 0; i < count; ++i) dst.ptr()[i] = v;
  k31emu::mark(dst, count);
}

}  // namespace AscendC

namespace k31emu {
// Exact source value as double (every supported source type fits).
template <class S> double to_double(S v) { return static_cast<double>(static_cast<typename std::conditional<std::is_integral<S>::value, S, float>::type>(v)); }

inline int mode_index(AscendC::RoundMode m) {
  switch (m) {
    case AscendC::RoundMode::CAST_NONE: case AscendC::RoundMode::CAST_RINT: return 0;
    case AscendC::RoundMode::CAST_FLOOR: return 1;
    case AscendC::RoundMode::CAST_CEIL: return 2;
    case AscendC::RoundMode::CAST_ROUND: return 3;
    case AscendC::RoundMode::CAST_TRUNC: return 4;
    default: return 5;
  }
}
template <class D> D from_double(double d, int mode) {
  if constexpr (std::is_same<D, float>::value) return f32_from_double(d, mode);
  else if constexpr (is_f16<D>) return half::from_bits(half_from_double(d, mode));
  else if constexpr (is_bf16<D>) return bfloat16_t::from_bits(bf16_from_double(d, mode));
  else {
    static_assert(std::is_integral<D>::value, "Cast: unsupported destination type");
    if (std::isnan(d)) return D(0);
    double r;
    switch (mode) {
      case 0: r = std::nearbyint(d); break;
      case 1: r = std::floor(d); break;
      case 2: r = std::ceil(d); break;
      case 3: r = std::round(d); break;
      default: r = std::trunc(d);
    }
    // Saturate to the destination range (the documented default saturation mode).
    double lo = static_cast<double>(std::numeric_limits<D>::min()), hi = static_cast<double>(std::numeric_limits<D>::max());
    if (r < lo) return std::numeric_limits<D>::min();
    if (r > hi) return std::numeric_limits<D>::max();
    return static_cast<D>(r);
  }
}
}  // namespace k31emu

namespace AscendC {

// Cast: round modes CAST_RINT (nearest even), CAST_FLOOR, CAST_CEIL, CAST_ROUND (nearest, ties
// away from zero), CAST_TRUNC, CAST_ODD (round to odd; narrowing float casts only) and CAST_NONE
// (exact where no precision is lost, otherwise as CAST_RINT).  Float -> integer saturates, NaN -> 0.
template <class D, class S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode mode, uint32_t count) {
  k31emu::vec_in(src, count, "Cast", "src");
  k31emu::vec_out(dst, count, "Cast", "dst");
  if (mode == RoundMode::CAST_ODD && (std::is_integral<D>::value || sizeof(D) >= sizeof(S)))
    k31emu::fail("Cast: CAST_ODD applies to narrowing float casts only (e.g. float -> half)");
  int m = k31emu::mode_index(mode);
  D* d = dst.ptr();
  const S* s = src.ptr();
  if constexpr (std::is_same<S, float>::value && k31emu::is_bf16<D>) {
    if (m == 0) { for (uint32_t i = 0; i < count; ++i) d[i] = bfloat16_t::from_bits(k31emu::bf16_rne(s[i])); k31emu::mark(dst, count); return; }
  }
  if constexpr (std::is_same<S, float>::value && k31emu::is_f16<D>) {
    if (m == 0) { for (uint32_t i = 0; i < count; ++i) d[i] = half::from_bits(k31emu::f32_to_half_rne(s[i])); k31emu::mark(dst, count); return; }
  }
  if constexpr (std::is_same<D, float>::value && !std::is_integral<S>::value) {
    for (uint32_t i = 0; i < count; ++i) d[i] = static_cast<float>(s[i]);  // widening: exact
    k31emu::mark(dst, count);
    return;
  }
  for (uint32_t i = 0; i < count; ++i) d[i] = k31emu::from_double<D>(k31emu::to_double(s[i]), m);
  k31emu::mark(dst, count);
}

// ---- reductions: result in dst[0]; ReduceMax/Min with calIndex put the index, as the bits of
// an integer of T's width, in dst[1].  The work tensor is only checked (live, UB, aligned). ----
template <class T>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work, uint32_t count) {
  static_assert(k31emu::is_float<T>, "ReduceSum: supports half/float");
  k31emu::vec_in(src, count, "ReduceSum", "src");
  k31emu::vec_out(dst, 1, "ReduceSum", "dst");
  k31emu::vec_out(work, 0, "ReduceSum", "work");
  double acc = 0;
  for (uint32_t i = 0; i < count; ++i) acc += static_cast<float>(src.ptr()[i]);
  dst.ptr()[0] = static_cast<T>(static_cast<float>(acc));
  k31emu::mark(dst, 1);
}
namespace detail {
template <class T, class Better>
void reduce_best(const char* op, const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work,
                 uint32_t count, bool calIndex, Better better) {
  static_assert(k31emu::is_float<T>, "ReduceMax/ReduceMin: support half/float");
  k31emu::vec_in(src, count, op, "src");
  k31emu::vec_out(dst, calIndex ? 2 : 1, op, "dst");
  k31emu::vec_out(work, 0, op, "work");
  if (count == 0) k31emu::fail(op, ": count is 0");
  uint32_t best = 0;
  for (uint32_t i = 1; i < count; ++i) {
    float v = static_cast<float>(src.ptr()[i]), b = static_cast<float>(src.ptr()[best]);
    if (b != b) break;  // NaN propagates: the first NaN wins
    if (v != v || better(v, b)) best = i;
  }
  dst.ptr()[0] = src.ptr()[best];
  if (calIndex) {
    using I = typename std::conditional<sizeof(T) == 2, uint16_t, uint32_t>::type;
    I idx = static_cast<I>(best);
    std::memcpy(&dst.ptr()[1], &idx, sizeof(T));
  }
  k31emu::mark(dst, calIndex ? 2 : 1);
}
}  // namespace detail
template <class T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work, uint32_t count,
               bool calIndex = false) {
  detail::reduce_best("ReduceMax", dst, src, work, count, calIndex, [](float a, float b) { return a > b; });
}
template <class T>
void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work, uint32_t count,
               bool calIndex = false) {
  detail::reduce_best("ReduceMin", dst, src, work, count, calIndex, [](float a, float b) { return a < b; });
}

// ---- Compare: bit i of the uint8 mask (byte i/8, LSB first) = src0[i] <op> src1[i].
// count * sizeof(T) must be a multiple of 256 bytes (documented count-form constraint). ----
namespace detail {
template <class T>
bool cmp(CMPMODE m, T a, T b) {
  switch (m) {
    case CMPMODE::LT: return a < b; case CMPMODE::GT: return a > b; case CMPMODE::EQ: return a == b;
    case CMPMODE::LE: return a <= b; case CMPMODE::GE: return a >= b; default: return a != b;
  }
}
template <class U, class T, class GetB>
void compare(const char* op, const LocalTensor<U>& dst, const LocalTensor<T>& src0, CMPMODE mode, uint32_t count, GetB getb) {
  static_assert(std::is_same<U, uint8_t>::value || std::is_same<U, int8_t>::value, "Compare: dst mask is uint8_t/int8_t");
  static_assert(k31emu::is_float<T> || std::is_same<T, int32_t>::value, "Compare: supports half/float/int32_t");
  if (std::is_same<T, int32_t>::value && mode != CMPMODE::EQ) k31emu::fail(op, ": int32_t supports CMPMODE::EQ only");
  if ((uint64_t(count) * sizeof(T)) % 256)
    k31emu::fail(op, ": count ", count, " x ", sizeof(T), " B is not a multiple of 256 B (required in the count form)");
  k31emu::vec_in(src0, count, op, "src0");
  k31emu::vec_out(dst, count / 8, op, "dst");
  uint8_t* d = reinterpret_cast<uint8_t*>(dst.ptr());
  std::memset(d, 0, count / 8);
  for (uint32_t i = 0; i < count; ++i) {
    using C = k31emu::calc_t<T>;
    if (cmp<C>(mode, k31emu::ld(src0.ptr()[i]), getb(i))) d[i / 8] |= uint8_t(1u << (i % 8));
  }
  k31emu::mark(dst, count / 8);
}
}  // namespace detail
template <class T, class U>
void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, CMPMODE mode, uint32_t count) {
  k31emu::vec_in(src1, count, "Compare", "src1");
  detail::compare("Compare", dst, src0, mode, count, [&](uint32_t i) { return k31emu::ld(src1.ptr()[i]); });
}
template <class T, class U, class S>
void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const S& src1Scalar, CMPMODE mode, uint32_t count) {
  auto b = k31emu::ld(static_cast<T>(src1Scalar));
  detail::compare("CompareScalar", dst, src0, mode, count, [b](uint32_t) { return b; });
}

// ---- Select: dst[i] = mask bit i ? src0[i] : src1 (tensor or scalar). ----
template <class T, class U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
            const LocalTensor<T>& src1, SELMODE mode, uint32_t count) {
  static_assert(k31emu::is_float<T>, "Select: supports half/float");
  if (mode != SELMODE::VSEL_TENSOR_TENSOR_MODE)
    k31emu::fail("Select(tensor, tensor): use SELMODE::VSEL_TENSOR_TENSOR_MODE (the count form has no CMPMASK_SPR mode here)");
  k31emu::vec_in(src0, count, "Select", "src0");
  k31emu::vec_in(src1, count, "Select", "src1");
  k31emu::vec_out(dst, count, "Select", "dst");
  k31emu::need_live(selMask, "Select", "selMask");
  k31emu::need_mem(selMask, k31emu::UB, "Select", "selMask");
  k31emu::need_align(selMask, 32, "Select", "selMask");
  uint64_t mb = (count + 7) / 8;
  if (mb > selMask.GetLength()) k31emu::fail("Select: selMask holds ", selMask.GetLength(), " B, needs ", mb);
  k31emu::need_written_bytes(selMask, 0, mb, "Select", "selMask");
  const uint8_t* m = reinterpret_cast<const uint8_t*>(selMask.ptr());
  for (uint32_t i = 0; i < count; ++i) dst.ptr()[i] = (m[i / 8] >> (i % 8)) & 1 ? src0.ptr()[i] : src1.ptr()[i];
  k31emu::mark(dst, count);
}
template <class T, class U, class S>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
            S src1Scalar, SELMODE mode, uint32_t count) {
  static_assert(k31emu::is_float<T>, "Select: supports half/float");
  if (mode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
    k31emu::fail("Select(tensor, scalar): use SELMODE::VSEL_TENSOR_SCALAR_MODE");
  k31emu::vec_in(src0, count, "Select", "src0");
  k31emu::vec_out(dst, count, "Select", "dst");
  k31emu::need_live(selMask, "Select", "selMask");
  k31emu::need_mem(selMask, k31emu::UB, "Select", "selMask");
  uint64_t mb = (count + 7) / 8;
  if (mb > selMask.GetLength()) k31emu::fail("Select: selMask holds ", selMask.GetLength(), " B, needs ", mb);
  k31emu::need_written_bytes(selMask, 0, mb, "Select", "selMask");
  const uint8_t* m = reinterpret_cast<const uint8_t*>(selMask.ptr());
  T s = static_cast<T>(src1Scalar);
  for (uint32_t i = 0; i < count; ++i) dst.ptr()[i] = (m[i / 8] >> (i % 8)) & 1 ? src0.ptr()[i] : s;
  k31emu::mark(dst, count);
}

}  // namespace AscendC
