// k31emu: CPU emulation of the AscendC kernel API (clean-room, written from the documented
// behaviour).  This part: keyword macros, the half / bfloat16_t storage types and exact
// float <-> narrow conversions with every AscendC RoundMode.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#ifndef __aicore__
#define __aicore__
#endif
#ifndef __global__
#define __global__
#endif
#ifndef __gm__
#define __gm__
#endif
#ifndef __inline__
#define __inline__ inline
#endif
#define GM_ADDR uint8_t*

namespace k31emu {

// Round an exactly-known value `d` to a binary format with `p` significand bits (incl. the
// implicit one), minimum normal exponent `emin` and maximum finite value `maxv`.  mode:
// 0 nearest-even, 1 floor, 2 ceil, 3 nearest-away, 4 trunc, 5 odd.  Subnormals handled by
// clamping the exponent at emin; overflow follows IEEE directed-rounding rules.
inline double round_to_format(double d, int p, int emin, double maxv, int mode) {
  if (std::isnan(d) || std::isinf(d) || d == 0.0) return d;
  int e;
  std::frexp(d, &e);       // d = f * 2^e, 0.5 <= |f| < 1 -> unbiased exponent is e-1
  int ex = e - 1;
  if (ex < emin) ex = emin;
  int shift = p - 1 - ex;  // scale so one ulp == 1
  double s = std::ldexp(d, shift);
  double r;
  switch (mode) {
    case 0: r = std::nearbyint(s); break;  // default FP env rounds to nearest even
    case 1: r = std::floor(s); break;
    case 2: r = std::ceil(s); break;
    case 3: r = std::round(s); break;
    case 4: r = std::trunc(s); break;
    default: {
      r = std::trunc(s);
      if (r != s && std::fmod(std::fabs(r), 2.0) == 0.0) r += (s > 0 ? 1.0 : -1.0);
    }
  }
  double out = std::ldexp(r, -shift);
  if (std::fabs(out) > maxv) {
    bool neg = out < 0;
    bool to_inf;
    switch (mode) {
      case 1: to_inf = neg; break;
      case 2: to_inf = !neg; break;
      case 4: case 5: to_inf = false; break;
      default: to_inf = true;
    }
    out = to_inf ? (neg ? -INFINITY : INFINITY) : (neg ? -maxv : maxv);
  }
  if (out == 0.0) out = std::copysign(0.0, d);
  return out;
}

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float -> bf16 bits, nearest-even (fast path used by the type's constructor).
inline uint16_t bf16_rne(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) { return f32_from(static_cast<uint32_t>(b) << 16); }

inline float half_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (ex == 0x1f) return f32_from(sign | 0x7f800000u | (man << 13));
  if (ex == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return f32_from(sign | ((ex + 112) << 23) | (man << 13));
}
// Exactly representable double -> half bits.
inline uint16_t half_encode(double v) {
  if (std::isnan(v)) return 0x7e00;
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a == 0) return sign;
  if (a < 6.103515625e-05) return sign | static_cast<uint16_t>(std::ldexp(a, 24));  // subnormal
  int e;
  double f = std::frexp(a, &e);  // a = f*2^e
  uint16_t man = static_cast<uint16_t>((f * 2 - 1) * 1024);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | man;
}
// float -> half bits, nearest-even, bit-level fast path.
inline uint16_t f32_to_half_rne(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) return sign | (u > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (u >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (u < 0x38800000u) {                       // below 2^-14: subnormal result, exact scaling
    return sign | static_cast<uint16_t>(std::nearbyint(f32_from(u) * 16777216.0f));
  }
  uint32_t r = u - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}
inline uint16_t half_from_double(double d, int mode) {
  return half_encode(round_to_format(d, 11, -14, 65504.0, mode));
}
inline uint16_t bf16_from_double(double d, int mode) {
  double r = round_to_format(d, 8, -126, 3.3895313892515355e38, mode);
  if (std::isnan(r)) return 0x7fc0;
  return static_cast<uint16_t>(f32_bits(static_cast<float>(r)) >> 16);
}
inline float f32_from_double(double d, int mode) {
  return static_cast<float>(round_to_format(d, 24, -126, 3.4028234663852886e38, mode));
}

}  // namespace k31emu

// Storage types with value semantics: arithmetic promotes to float (like the scalar unit),
// assignment from float rounds to nearest even.
struct half {
  uint16_t bits;  // no initializer: keeps the type trivial (memcpy-able) like a built-in float
  half() = default;
  half(float f) : bits(k31emu::f32_to_half_rne(f)) {}
  half(double d) : bits(k31emu::half_from_double(d, 0)) {}
  half(int i) : bits(k31emu::half_from_double(static_cast<double>(i), 0)) {}
  half(unsigned i) : bits(k31emu::half_from_double(static_cast<double>(i), 0)) {}
  operator float() const { return k31emu::half_to_f32(bits); }
  static half from_bits(uint16_t b) { half h; h.bits = b; return h; }
  half& operator+=(float v) { return *this = half(float(*this) + v); }
  half& operator-=(float v) { return *this = half(float(*this) - v); }
  half& operator*=(float v) { return *this = half(float(*this) * v); }
  half& operator/=(float v) { return *this = half(float(*this) / v); }
};
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) : bits(k31emu::bf16_rne(f)) {}
  bfloat16_t(double d) : bits(k31emu::bf16_from_double(d, 0)) {}
  bfloat16_t(int i) : bits(k31emu::bf16_from_double(i, 0)) {}
  bfloat16_t(unsigned i) : bits(k31emu::bf16_from_double(i, 0)) {}
  operator float() const { return k31emu::bf16_to_f32(bits); }
  static bfloat16_t from_bits(uint16_t b) { bfloat16_t h; h.bits = b; return h; }
  bfloat16_t& operator+=(float v) { return *this = bfloat16_t(float(*this) + v); }
  bfloat16_t& operator-=(float v) { return *this = bfloat16_t(float(*this) - v); }
  bfloat16_t& operator*=(float v) { return *this = bfloat16_t(float(*this) * v); }
  bfloat16_t& operator/=(float v) { return *this = bfloat16_t(float(*this) / v); }
};
static_assert(sizeof(half) == 2 && sizeof(bfloat16_t) == 2, "narrow float types are 2 bytes");
