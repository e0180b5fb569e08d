// Tiled matmul through the k31emu cube path: GM -> L1 (ND->NZ), L1 -> L0A/L0B (LoadData),
// Mmad into L0C accumulating over K tiles, Fixpipe L0C -> GM (ND).  C[M,N] = A[M,K] @ B,
// where B is given as [K,N] (2-byte types: transposing LoadData) or as B^T [N,K] (any type);
// the output is float, or half / bfloat16_t converted by Fixpipe (quantPre), optionally ReLU'd.
#include "kernel_operator.h"
using namespace AscendC;

template <class T, class O = float>
class Matmul {
  using Acc = typename std::conditional<std::is_same<T, int8_t>::value, int32_t, float>::type;
  TPipe pipe;
  TQue<TPosition::A1, 1> qa1;
  TQue<TPosition::B1, 1> qb1;
  TQue<TPosition::A2, 1> qa2;
  TQue<TPosition::B2, 1> qb2;
  TQue<TPosition::CO1, 1> qc;
  GlobalTensor<T> a, b;
  GlobalTensor<O> c;
  uint32_t M, N, K, tm, tn, tk;
  int32_t bT;  // 0: B [K,N] + transposing LoadData, 1: B^T [N,K], 2: B [K,N] + LoadDataWithTranspose
  static constexpr uint32_t C0 = 32 / sizeof(T);
  static uint32_t up(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }

 public:
  bool relu = false;
  __aicore__ void Init(GM_ADDR pa, GM_ADDR pb, GM_ADDR pc, uint32_t m, uint32_t n, uint32_t k,
                       uint32_t tm_, uint32_t tn_, uint32_t tk_, int32_t bTransposed) {
    M = m; N = n; K = k; tm = tm_; tn = tn_; tk = tk_; bT = bTransposed;
    a.SetGlobalBuffer((__gm__ T*)pa, uint64_t(M) * K);
    b.SetGlobalBuffer((__gm__ T*)pb, uint64_t(K) * N);
    c.SetGlobalBuffer((__gm__ O*)pc, uint64_t(M) * N);
    pipe.InitBuffer(qa1, 1, tm * tk * sizeof(T));
    pipe.InitBuffer(qb1, 1, tk * tn * sizeof(T));
    pipe.InitBuffer(qa2, 1, tm * tk * sizeof(T));
    pipe.InitBuffer(qb2, 1, tk * tn * sizeof(T));
    pipe.InitBuffer(qc, 1, tm * tn * sizeof(float));
  }
  __aicore__ void Process() {
    uint32_t mt = (M + tm - 1) / tm, nt = (N + tn - 1) / tn;
    for (uint32_t t = GetBlockIdx(); t < mt * nt; t += GetBlockNum()) Tile((t / nt) * tm, (t % nt) * tn);
  }
  __aicore__ void Tile(uint32_t m0, uint32_t n0) {
    uint32_t mm = M - m0 < tm ? M - m0 : tm, nn = N - n0 < tn ? N - n0 : tn;
    uint32_t M1 = up(mm, 16) / 16, N1 = up(nn, 16) / 16;
    LocalTensor<Acc> acc = qc.AllocTensor<Acc>();
    for (uint32_t k0 = 0; k0 < K; k0 += tk) {
      uint32_t kk = K - k0 < tk ? K - k0 : tk, K1 = up(kk, C0) / C0;
      // A tile [mm, kk] -> L1 Nz (fractal columns of ceil16(mm) rows)
      LocalTensor<T> a1 = qa1.AllocTensor<T>();
      DataCopy(a1, a[uint64_t(m0) * K + k0], Nd2NzParams(1, mm, kk, 0, K, up(mm, 16), 1, 0));
      qa1.EnQue(a1);
      LocalTensor<T> b1 = qb1.AllocTensor<T>();
      if (bT == 1)  // B^T tile [nn, kk]: its Nz fractals are already the Zn fractals of B
        DataCopy(b1, b[uint64_t(n0) * K + k0], Nd2NzParams(1, nn, kk, 0, K, up(nn, 16), 1, 0));
      else if (bT == 2)  // per 16 k-rows, the C0-chunks of a row group are consecutive fractals
        for (uint32_t g = 0; g * 16 < kk; ++g)
          DataCopy(b1[g * 16 * up(nn, 16)], b[uint64_t(k0 + g * 16) * N + n0],
                   Nd2NzParams(1, kk - g * 16 < 16 ? kk - g * 16 : 16, nn, 0, N, 16, 1, 0));
      else  // B tile [kk, nn]
        DataCopy(b1, b[uint64_t(k0) * N + n0], Nd2NzParams(1, kk, nn, 0, N, up(kk, 16), 1, 0));
      qb1.EnQue(b1);
      a1 = qa1.DeQue<T>();
      LocalTensor<T> a2 = qa2.AllocTensor<T>();
      for (uint32_t i = 0; i < M1; ++i)  // Nz -> Zz: one fractal row per LoadData
        LoadData(a2[i * K1 * 16 * C0], a1, LoadData2DParams(i, K1, M1, 0, 0, false));
      qa1.FreeTensor(a1);
      qa2.EnQue(a2);
      b1 = qb1.DeQue<T>();
      LocalTensor<T> b2 = qb2.AllocTensor<T>();
      if (bT == 1) {
        LoadData(b2, b1, LoadData2DParams(0, K1 * N1, 1, 0, 0, false));
      } else if (bT == 2) {  // square (g, n1) -> Zn fractals (2g, n1) and (2g+1, n1)
        for (uint32_t g = 0; g * 16 < kk; ++g)
          LoadDataWithTranspose(b2[2 * g * N1 * 16 * C0], b1, LoadData2dTransposeParams(g * N1, N1, 1, 0, N1 - 1));
      } else {
        uint32_t Kp = up(kk, 16) / 16;
        for (uint32_t i = 0; i < Kp; ++i)  // Nz of B -> Zn: transpose each 16x16 fractal
          LoadData(b2[i * N1 * 256], b1, LoadData2DParams(i, N1, Kp, 0, 0, true));
      }
      qb1.FreeTensor(b1);
      qb2.EnQue(b2);
      a2 = qa2.DeQue<T>();
      b2 = qb2.DeQue<T>();
      MmadParams mp;
      mp.m = mm; mp.n = nn; mp.k = kk; mp.cmatrixInitVal = (k0 == 0);
      Mmad(acc, a2, b2, mp);
      qa2.FreeTensor(a2);
      qb2.FreeTensor(b2);
    }
    qc.EnQue(acc);
    acc = qc.DeQue<Acc>();
    FixpipeParamsV220 fp(nn, mm, up(mm, 16), N, relu);
    if (std::is_same<O, half>::value) fp.quantPre = QuantMode_t::F322F16;
    if (std::is_same<O, bfloat16_t>::value) fp.quantPre = QuantMode_t::F322BF16;
    Fixpipe(c[uint64_t(m0) * N + n0], acc, fp);
    qc.FreeTensor(acc);
  }
};

template <class T, class O = float>
static int run(uint32_t blockDim, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
               uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT, bool relu = false) {
  return k31emu::Launch(blockDim, [&] {
    Matmul<T, O> op;
    op.Init(a, b, c, m, n, k, tm, tn, tk, bT);
    op.relu = relu;
    op.Process();
  });
}
// int8 x int8 -> int32 (B given as B^T)
extern "C" int run_mm_i8(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                         uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<int8_t, int32_t>(bd, a, b, c, m, n, k, tm, tn, tk, bT);
}
// bf16 x bf16 -> Fixpipe ReLU + F322BF16 / half x half -> F322F16
extern "C" int run_mm_bf16_out(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                               uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<bfloat16_t, bfloat16_t>(bd, a, b, c, m, n, k, tm, tn, tk, bT, true);
}
extern "C" int run_mm_half_out(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                               uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<half, half>(bd, a, b, c, m, n, k, tm, tn, tk, bT, false);
}
extern "C" int run_mm_half(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                           uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<half>(bd, a, b, c, m, n, k, tm, tn, tk, bT);
}
extern "C" int run_mm_bf16(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                           uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<bfloat16_t>(bd, a, b, c, m, n, k, tm, tn, tk, bT);
}
extern "C" int run_mm_f32(uint32_t bd, GM_ADDR a, GM_ADDR b, GM_ADDR c, uint32_t m, uint32_t n, uint32_t k,
                          uint32_t tm, uint32_t tn, uint32_t tk, int32_t bT) {
  return run<float>(bd, a, b, c, m, n, k, tm, tn, tk, bT);
}
