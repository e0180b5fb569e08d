// Well-formed kernels for Cast, reductions, Compare/Select, SyncAll and the DataCopyPad /
// DataCopyParams unit rules (tests/test_ascendc_emu.py).
#include "kernel_operator.h"
using namespace AscendC;

// ---- Cast: n elements, tiles of 1024, ragged tail through DataCopyPad, TBuf scratch ----
template <class S, class D>
static void cast_kernel(GM_ADDR src, GM_ADDR dst, uint32_t n, RoundMode mode) {
  constexpr uint32_t TILE = 1024;
  TPipe pipe;
  TBuf<TPosition::VECCALC> bin, bout;
  pipe.InitBuffer(bin, TILE * sizeof(S));
  pipe.InitBuffer(bout, TILE * sizeof(D));
  GlobalTensor<S> s;
  GlobalTensor<D> d;
  s.SetGlobalBuffer((__gm__ S*)src, n);
  d.SetGlobalBuffer((__gm__ D*)dst, n);
  LocalTensor<S> a = bin.Get<S>();
  LocalTensor<D> b = bout.Get<D>();
  for (uint32_t off = GetBlockIdx() * TILE; off < n; off += GetBlockNum() * TILE) {
    uint32_t len = n - off < TILE ? n - off : TILE;
    DataCopyPad(a, s[off], DataCopyExtParams(1, len * sizeof(S), 0, 0, 0), DataCopyPadExtParams<S>(false, 0, 0, S(0)));
    Cast(b, a, mode, len);
    DataCopyPad(d[off], b, DataCopyExtParams(1, len * sizeof(D), 0, 0, 0));
  }
}
extern "C" int run_cast(int32_t pair, int32_t mode, uint32_t n, GM_ADDR src, GM_ADDR dst) {
  RoundMode m = static_cast<RoundMode>(mode);
  return k31emu::Launch(3, [&] {
    switch (pair) {
      case 0: cast_kernel<float, bfloat16_t>(src, dst, n, m); break;
      case 1: cast_kernel<float, half>(src, dst, n, m); break;
      case 2: cast_kernel<float, int32_t>(src, dst, n, m); break;
      case 3: cast_kernel<bfloat16_t, float>(src, dst, n, m); break;
      case 4: cast_kernel<half, float>(src, dst, n, m); break;
      case 5: cast_kernel<int32_t, float>(src, dst, n, m); break;
      case 6: cast_kernel<half, int8_t>(src, dst, n, m); break;
      case 7: cast_kernel<uint8_t, half>(src, dst, n, m); break;
      default: k31emu::fail("run_cast: unknown pair");
    }
  });
}

// ---- reductions over n <= 4096 elements: out = {sum, max, max index, min, min index} ----
template <class T>
static void reduce_kernel(GM_ADDR src, GM_ADDR out, uint32_t n) {
  TPipe pipe;
  TQue<TPosition::VECIN, 1> qin;
  TQue<TPosition::VECOUT, 1> qout;
  TBuf<TPosition::VECCALC> work;
  pipe.InitBuffer(qin, 1, 4096 * sizeof(T));
  pipe.InitBuffer(qout, 1, 3 * 32);
  pipe.InitBuffer(work, 4096 * sizeof(T));
  GlobalTensor<T> s;
  GlobalTensor<float> o;
  s.SetGlobalBuffer((__gm__ T*)src, n);
  o.SetGlobalBuffer((__gm__ float*)out, 5);
  LocalTensor<T> x = qin.AllocTensor<T>();
  DataCopyPad(x, s, DataCopyExtParams(1, n * sizeof(T), 0, 0, 0), DataCopyPadExtParams<T>(false, 0, 0, T(0)));
  qin.EnQue(x);
  x = qin.DeQue<T>();
  LocalTensor<T> r = qout.AllocTensor<T>();
  LocalTensor<T> w = work.Get<T>();
  uint32_t step = 32 / sizeof(T);
  ReduceSum(r, x, w, n);
  ReduceMax(r[step], x, w, n, true);
  ReduceMin(r[2 * step], x, w, n, true);
  qout.EnQue(r);
  r = qout.DeQue<T>();
  using I = typename std::conditional<sizeof(T) == 2, uint16_t, uint32_t>::type;
  auto idx = [&](uint32_t at) { T v = r.GetValue(at); I i; std::memcpy(&i, &v, sizeof(I)); return float(i); };
  o.SetValue(0, float(r.GetValue(0)));
  o.SetValue(1, float(r.GetValue(step)));
  o.SetValue(2, idx(step + 1));
  o.SetValue(3, float(r.GetValue(2 * step)));
  o.SetValue(4, idx(2 * step + 1));
  qout.FreeTensor(r);
  qin.FreeTensor(x);
}
extern "C" int run_reduce(int32_t is_half, uint32_t n, GM_ADDR src, GM_ADDR out) {
  return k31emu::Launch(1, [&] {
    if (is_half) reduce_kernel<half>(src, out, n); else reduce_kernel<float>(src, out, n);
  });
}

// ---- Compare + Select: sel[i] = cmp(a[i], b[i]) ? a[i] : b[i]; zer[i] = cmp ? a[i] : zero,
// mask bytes copied out too.  n <= 1024 floats, compare count padded to 64. ----
extern "C" int run_cmpsel(int32_t mode, uint32_t n, GM_ADDR pa, GM_ADDR pb, GM_ADDR psel, GM_ADDR pzer, GM_ADDR pmask) {
  return k31emu::Launch(1, [&] {
    TPipe pipe;
    TQue<TPosition::VECIN, 1> qa, qb;
    TBuf<TPosition::VECCALC> bm, bs, bz;
    pipe.InitBuffer(qa, 1, 4096); pipe.InitBuffer(qb, 1, 4096);
    pipe.InitBuffer(bm, 128); pipe.InitBuffer(bs, 4096); pipe.InitBuffer(bz, 4096);
    GlobalTensor<float> ga, gb, gs, gz;
    GlobalTensor<uint8_t> gm;
    ga.SetGlobalBuffer((__gm__ float*)pa, n); gb.SetGlobalBuffer((__gm__ float*)pb, n);
    gs.SetGlobalBuffer((__gm__ float*)psel, n); gz.SetGlobalBuffer((__gm__ float*)pzer, n);
    gm.SetGlobalBuffer((__gm__ uint8_t*)pmask, 128);
    uint32_t cnt = (n + 63) / 64 * 64;
    LocalTensor<float> a = qa.AllocTensor<float>(), b = qb.AllocTensor<float>();
    Duplicate(a, 0.0f, cnt); Duplicate(b, 0.0f, cnt);  // defined values in the padded tail
    DataCopyExtParams cp(1, n * 4, 0, 0, 0);
    DataCopyPad(a, ga, cp, DataCopyPadExtParams<float>(false, 0, 0, 0.f));
    DataCopyPad(b, gb, cp, DataCopyPadExtParams<float>(false, 0, 0, 0.f));
    qa.EnQue(a); qb.EnQue(b);
    a = qa.DeQue<float>(); b = qb.DeQue<float>();
    LocalTensor<uint8_t> m = bm.Get<uint8_t>();
    Compare(m, a, b, static_cast<CMPMODE>(mode), cnt);
    LocalTensor<float> s = bs.Get<float>(), z = bz.Get<float>();
    Select(s, m, a, b, SELMODE::VSEL_TENSOR_TENSOR_MODE, cnt);
    Select(z, m, a, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, cnt);
    DataCopyPad(gs, s, cp);
    DataCopyPad(gz, z, cp);
    DataCopyPad(gm, m, DataCopyExtParams(1, cnt / 8, 0, 0, 0));
    qa.FreeTensor(a); qb.FreeTensor(b);
  });
}

// ---- SyncAll: per round r, block b publishes (b+1)*(r+1), all blocks sum what all published ----
extern "C" int run_syncall(uint32_t blockDim, uint32_t rounds, GM_ADDR pws, GM_ADDR pout) {
  return k31emu::Launch(blockDim, [&] {
    GlobalTensor<int32_t> ws, out;
    uint32_t nb = GetBlockNum(), b = GetBlockIdx();
    ws.SetGlobalBuffer((__gm__ int32_t*)pws, nb);
    out.SetGlobalBuffer((__gm__ int32_t*)pout, nb * rounds);
    for (uint32_t r = 0; r < rounds; ++r) {
      ws.SetValue(b, int32_t((b + 1) * (r + 1)));
      SyncAll();
      int32_t sum = 0;
      for (uint32_t i = 0; i < nb; ++i) sum += ws.GetValue(i);
      out.SetValue(r * nb + b, sum);
      SyncAll();
    }
  });
}

// ---- DataCopyPad GM->UB layout probe: fill a 1024-float UB buffer with a sentinel, DataCopyPad
// into it, copy the whole buffer out raw ----
extern "C" int run_pad_in(uint32_t count, uint32_t lenBytes, uint32_t srcStride, uint32_t dstStride,
                          uint32_t left, uint32_t right, int32_t isPad, float padValue, GM_ADDR src, GM_ADDR ub) {
  return k31emu::Launch(1, [&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 4096);
    GlobalTensor<float> g, o;
    g.SetGlobalBuffer((__gm__ float*)src); o.SetGlobalBuffer((__gm__ float*)ub, 1024);
    LocalTensor<float> t = buf.Get<float>();
    Duplicate(t, 12345.0f, 1024);
    DataCopyPad(t, g, DataCopyExtParams(count, lenBytes, srcStride, dstStride, 0),
                DataCopyPadExtParams<float>(isPad != 0, left, right, padValue));
    DataCopy(o, t, 1024);
  });
}
// ---- DataCopyPad UB->GM and DataCopy with DataCopyParams: UB <- src[0:1024] raw, then the
// strided copy out to gm (pre-filled by the caller) ----
extern "C" int run_pad_out(int32_t ext, uint32_t count, uint32_t len, uint32_t srcStride, uint32_t dstStride,
                           GM_ADDR src, GM_ADDR gm) {
  return k31emu::Launch(1, [&] {
    TPipe pipe;
    TQue<TPosition::VECOUT, 1> q;
    pipe.InitBuffer(q, 1, 4096);
    GlobalTensor<float> g, o;
    g.SetGlobalBuffer((__gm__ float*)src, 1024); o.SetGlobalBuffer((__gm__ float*)gm);
    LocalTensor<float> t = q.AllocTensor<float>();
    DataCopy(t, g, 1024);
    q.EnQue(t);
    t = q.DeQue<float>();
    if (ext) DataCopyPad(o, t, DataCopyExtParams(count, len, srcStride, dstStride, 0));
    else DataCopy(o, t, DataCopyParams(count, len, srcStride, dstStride));
    q.FreeTensor(t);
  });
}
