// Deliberately wrong kernels: each must make k31emu report a specific misuse
// (tests/test_ascendc_emu.py::test_bad_kernel).  run_bad(case, gm) runs case `case` on 2 blocks;
// gm is a 4096-float scratch buffer.
#include "kernel_operator.h"
using namespace AscendC;

enum Case {
  MISALIGNED_LEN, MISALIGNED_ADDR, DOUBLE_FREE, DEQUE_WITHOUT_ENQUE, DEPTH_OVERFLOW, UB_OVERFLOW,
  UNWRITTEN_VECTOR, UNWRITTEN_COPYOUT, COUNT_BEYOND, FOREIGN_FREE, USE_AFTER_FREE, ALLOC_EXHAUSTED,
  SYNCALL_MISMATCH, L0A_OVERFLOW, VECTOR_ON_L1, COMPARE_COUNT, MMAD_UNWRITTEN, PAD_TOO_LONG,
  GM_OUT_OF_RANGE, USE_WHILE_ENQUEUED, GETVALUE_UNWRITTEN, PADDING_TOO_WIDE, FIXPIPE_BAD_STRIDE,
};

static void bad(int which, GM_ADDR gm) {
  TPipe pipe;
  TQue<TPosition::VECIN, 1> qin;
  TQue<TPosition::VECOUT, 1> qout;
  GlobalTensor<float> g;
  g.SetGlobalBuffer((__gm__ float*)gm, 4096);
  pipe.InitBuffer(qin, 2, 1024);
  pipe.InitBuffer(qout, 1, 1024);
  switch (which) {
    case MISALIGNED_LEN: {  // 20 floats = 80 B: not whole 32-byte blocks
      auto t = qin.AllocTensor<float>();
      DataCopy(t, g, 20);
      break;
    }
    case MISALIGNED_ADDR: {  // UB address 12 B into the buffer
      auto t = qin.AllocTensor<float>();
      DataCopy(t[3], g, 16);
      break;
    }
    case DOUBLE_FREE: {
      auto t = qin.AllocTensor<float>();
      DataCopy(t, g, 8);
      qin.EnQue(t);
      auto u = qin.DeQue<float>();
      qin.FreeTensor(u);
      qin.FreeTensor(u);
      break;
    }
    case DEQUE_WITHOUT_ENQUE: {
      auto t = qin.AllocTensor<float>();
      DataCopy(t, g, 8);
      auto u = qin.DeQue<float>();
      (void)u;
      break;
    }
    case DEPTH_OVERFLOW: {  // depth 1, two buffers: two EnQue without a DeQue
      auto a = qin.AllocTensor<float>(), b = qin.AllocTensor<float>();
      DataCopy(a, g, 8); DataCopy(b, g, 8);
      qin.EnQue(a);
      qin.EnQue(b);
      break;
    }
    case UB_OVERFLOW: {
      TQue<TPosition::VECCALC, 1> big;
      pipe.InitBuffer(big, 2, 100 * 1024);
      break;
    }
    case UNWRITTEN_VECTOR: {
      auto a = qin.AllocTensor<float>();
      auto c = qout.AllocTensor<float>();
      DataCopy(a, g, 64);
      Add(c, a, a, 128);  // elements 64..127 of a never written
      break;
    }
    case UNWRITTEN_COPYOUT: {
      auto c = qout.AllocTensor<float>();
      Duplicate(c, 1.0f, 8);
      DataCopy(g, c, 16);
      break;
    }
    case COUNT_BEYOND: {
      auto a = qin.AllocTensor<float>();
      auto c = qout.AllocTensor<float>();
      Duplicate(a, 1.0f, 256);
      Exp(c, a, 264);  // the buffers hold 256 floats
      break;
    }
    case FOREIGN_FREE: {
      auto a = qin.AllocTensor<float>();
      qout.FreeTensor(a);
      break;
    }
    case USE_AFTER_FREE: {
      auto a = qin.AllocTensor<float>();
      auto c = qout.AllocTensor<float>();
      Duplicate(a, 2.0f, 64);
      qin.FreeTensor(a);
      Muls(c, a, 3.0f, 64);
      break;
    }
    case ALLOC_EXHAUSTED: {
      auto a = qin.AllocTensor<float>(), b = qin.AllocTensor<float>(), c = qin.AllocTensor<float>();
      (void)a; (void)b; (void)c;
      break;
    }
    case SYNCALL_MISMATCH: {  // block 0 returns, block 1 waits in SyncAll (a hang on hardware)
      if (GetBlockIdx() == 1) SyncAll();
      break;
    }
    case L0A_OVERFLOW: {
      TQue<TPosition::A2, 1> qa;
      pipe.InitBuffer(qa, 2, 40 * 1024);
      break;
    }
    case VECTOR_ON_L1: {
      TQue<TPosition::A1, 1> q1;
      pipe.InitBuffer(q1, 1, 1024);
      auto t = q1.AllocTensor<float>();
      Duplicate(t, 0.0f, 64);
      break;
    }
    case COMPARE_COUNT: {
      auto a = qin.AllocTensor<float>();
      auto m = qout.AllocTensor<uint8_t>();
      Duplicate(a, 1.0f, 256);
      Compare(m, a, a, CMPMODE::LT, 40);  // 160 B: not a multiple of 256 B
      break;
    }
    case MMAD_UNWRITTEN: {
      TQue<TPosition::A2, 1> qa; TQue<TPosition::B2, 1> qb; TQue<TPosition::CO1, 1> qc;
      pipe.InitBuffer(qa, 1, 512); pipe.InitBuffer(qb, 1, 512); pipe.InitBuffer(qc, 1, 1024);
      auto a = qa.AllocTensor<half>(); auto b = qb.AllocTensor<half>(); auto c = qc.AllocTensor<float>();
      MmadParams p; p.m = 16; p.n = 16; p.k = 16;
      Mmad(c, a, b, p);
      break;
    }
    case PAD_TOO_LONG: {  // 9 blocks of 32 floats do not fit a 256-float buffer
      auto t = qin.AllocTensor<float>();
      DataCopyPad(t, g, DataCopyExtParams(9, 31 * 4, 4, 0, 0), DataCopyPadExtParams<float>(false, 0, 0, 0.f));
      break;
    }
    case GM_OUT_OF_RANGE: {
      auto t = qin.AllocTensor<float>();
      DataCopy(t, g[4096 - 16], 32);
      break;
    }
    case USE_WHILE_ENQUEUED: {  // data still in flight on the device: DeQue first
      auto a = qin.AllocTensor<float>();
      DataCopy(a, g, 64);
      qin.EnQue(a);
      auto c = qout.AllocTensor<float>();
      Abs(c, a, 64);
      break;
    }
    case GETVALUE_UNWRITTEN: {
      auto a = qin.AllocTensor<float>();
      a.SetValue(0, 1.0f);
      g.SetValue(0, a.GetValue(0) + a.GetValue(1));
      break;
    }
    case PADDING_TOO_WIDE: {  // 9 floats = 36 B of left padding
      auto t = qin.AllocTensor<float>();
      DataCopyPad(t, g, DataCopyExtParams(1, 16, 0, 0, 0), DataCopyPadExtParams<float>(true, 9, 0, 0.f));
      break;
    }
    case FIXPIPE_BAD_STRIDE: {
      TQue<TPosition::CO1, 1> qc;
      pipe.InitBuffer(qc, 1, 32 * 32 * 4);
      auto c = qc.AllocTensor<float>();
      Fixpipe(g, c, FixpipeParamsV220(32, 20, 20, 32, false));  // srcStride must be ceil16(m)-like
      break;
    }
  }
}

extern "C" int run_bad(int32_t which, GM_ADDR gm) {
  return k31emu::Launch(2, [&] { bad(which, gm); });
}
