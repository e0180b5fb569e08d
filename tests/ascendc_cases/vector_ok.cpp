// Well-formed kernels for the k31emu vector path (tests/test_ascendc_emu.py).
#include "kernel_operator.h"
using namespace AscendC;

// z = x + y over n floats, ragged tail through DataCopyPad, tiles double-buffered, blocks
// striding over tiles.
class VecAdd {
  TPipe pipe;
  TQue<TPosition::VECIN, 2> qx, qy;
  TQue<TPosition::VECOUT, 2> qz;
  GlobalTensor<float> x, y, z;
  uint32_t n = 0, tile = 0;

 public:
  __aicore__ void Init(GM_ADDR px, GM_ADDR py, GM_ADDR pz, uint32_t total, uint32_t t) {
    n = total; tile = t;
    x.SetGlobalBuffer((__gm__ float*)px, n);
    y.SetGlobalBuffer((__gm__ float*)py, n);
    z.SetGlobalBuffer((__gm__ float*)pz, n);
    pipe.InitBuffer(qx, 2, tile * sizeof(float));
    pipe.InitBuffer(qy, 2, tile * sizeof(float));
    pipe.InitBuffer(qz, 2, tile * sizeof(float));
  }
  __aicore__ void Process() {
    for (uint32_t off = GetBlockIdx() * tile; off < n; off += GetBlockNum() * tile) {
      uint32_t len = n - off < tile ? n - off : tile;
      DataCopyExtParams cp{1, uint32_t(len * sizeof(float)), 0, 0, 0};
      LocalTensor<float> a = qx.AllocTensor<float>(), b = qy.AllocTensor<float>();
      if (len % 8 == 0) {
        DataCopy(a, x[off], len);
        DataCopy(b, y[off], len);
      } else {
        DataCopyPad(a, x[off], cp, DataCopyPadExtParams<float>{false, 0, 0, 0.f});
        DataCopyPad(b, y[off], cp, DataCopyPadExtParams<float>{false, 0, 0, 0.f});
      }
      qx.EnQue(a); qy.EnQue(b);
      a = qx.DeQue<float>(); b = qy.DeQue<float>();
      LocalTensor<float> c = qz.AllocTensor<float>();
      Add(c, a, b, (len + 7) / 8 * 8);
      qz.EnQue(c);
      qx.FreeTensor(a); qy.FreeTensor(b);
      c = qz.DeQue<float>();
      if (len % 8 == 0) DataCopy(z[off], c, len); else DataCopyPad(z[off], c, cp);
      qz.FreeTensor(c);
    }
  }
};

extern "C" __global__ __aicore__ void vec_add(GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t n, uint32_t tile) {
  VecAdd op;
  op.Init(x, y, z, n, tile);
  op.Process();
}
extern "C" int run_vec_add(uint32_t blockDim, GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t n, uint32_t tile) {
  return k31emu::Launch(blockDim, [&] { vec_add(x, y, z, n, tile); });
}

// Intra-core sync primitives and constants type-check and do nothing; events from the pipe.
extern "C" int run_sync_noops(GM_ADDR out) {
  return k31emu::RunBlocks(2, [&] {
    TPipe pipe;
    TQue<TPosition::VECOUT, 1> q;
    pipe.InitBuffer(q, 1, ONE_BLK_SIZE * 8);
    LocalTensor<float> t = q.AllocTensor<float>();
    Duplicate(t, float(GetBlockIdx() + 1), 64);
    event_t e = static_cast<event_t>(pipe.FetchEventID(HardEvent::V_MTE3));
    SetFlag<HardEvent::V_MTE3>(e);
    WaitFlag<HardEvent::V_MTE3>(e);
    PipeBarrier<PIPE_V>();
    GlobalTensor<float> g;
    g.SetGlobalBuffer((__gm__ float*)out + 64 * GetBlockIdx(), 64);
    DataCopy(g, t, 64);
    q.FreeTensor(t);
  });
}
