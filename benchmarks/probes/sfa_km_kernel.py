"""Scratch: SFA score pass with keys on the MMA rows, each code tile dequantized (code x tile scale,
rounded to bf16) as the register operand, one chained accumulator [BK, BH]."""
from __future__ import annotations

import k31dsl as k
from k31dsl.ops.dsa.attention import live_blocks

@k.kernel
def sfa_scores_km(q: k.Tensor["QT", "T", "H", "DQK"], codes: k.Tensor[k.f8e4m3, "S", "R"],
                  scales: k.Tensor[k.f32, "S", "R // 4"], rope: k.Tensor[k.bf16, "S", "R // 2"],
                  indices: k.Tensor[k.i32, "T", "K"], s: k.Tensor[k.f32, "T", "H", "K"],
                  part_m: k.Tensor[k.f32, "NS", "T", "H"], part_l: k.Tensor[k.f32, "NS", "T", "H"], sm_scale: k.f32,
                  QT: k.constexpr[k.bf16, k.f32] = k.bf16, BH: k.constexpr = 64, BK: k.constexpr = 64):
    for t, hb, sg in k.grid(q.shape[0], k.cdiv(q.shape[1], BH), part_m.shape[0]):
        h0 = hb * BH
        q0 = q[t, k.span(h0, BH), k.span(0, 128, other=0.0)].to(k.bf16)
        q1 = q[t, k.span(h0, BH), k.span(128, 128, other=0.0)].to(k.bf16)
        q2 = q[t, k.span(h0, BH), k.span(256, 128, other=0.0)].to(k.bf16)
        q3 = q[t, k.span(h0, BH), k.span(384, 128, other=0.0)].to(k.bf16)
        qr = q[t, k.span(h0, BH), k.span(512, 64, other=0.0)].to(k.bf16)
        n_slots = codes.shape[0]
        live = live_blocks(indices, t, n_slots, BK)
        per = k.cdiv(live, part_m.shape[0])
        m = k.full((BK, BH), float("-inf"), k.f32)
        l = k.zeros((BK, BH), k.f32)
        for j in range(k.maximum(k.minimum(per, live - sg * per), 0)):
            j0 = (sg * per + j) * BK
            idx = indices[t, k.span(j0, BK, other=-1)]
            valid = (idx >= 0) & (idx < n_slots)
            a = k.dot(rope[idx, k.span(264, 64, other=0.0)], qr.T)
            a += k.dot((codes[idx, k.span(0, 128, other=0.0)].to(k.f32) * k.load(scales, (idx, 128), other=0.0)[:, None]).to(k.bf16), q0.T)
            a += k.dot((codes[idx, k.span(128, 128, other=0.0)].to(k.f32) * k.load(scales, (idx, 129), other=0.0)[:, None]).to(k.bf16), q1.T)
            a += k.dot((codes[idx, k.span(256, 128, other=0.0)].to(k.f32) * k.load(scales, (idx, 130), other=0.0)[:, None]).to(k.bf16), q2.T)
            a += k.dot((codes[idx, k.span(384, 128, other=0.0)].to(k.f32) * k.load(scales, (idx, 131), other=0.0)[:, None]).to(k.bf16), q3.T)
            sc = k.where(valid[:, None], a * sm_scale, float("-inf"))
            s[t, k.span(h0, BH), k.span(j0, BK)] = sc.T
            m_new = k.maximum(m, sc)
            m_safe = k.where(m_new == float("-inf"), 0.0, m_new)
            l = l * k.exp(m - m_safe) + k.exp(sc - m_safe)
            m = m_new
        mx = k.max(m, axis=0)
        ms = k.where(mx == float("-inf"), 0.0, mx)
        part_m[sg, t, k.span(h0, BH)] = mx
        part_l[sg, t, k.span(h0, BH)] = k.sum(l * k.exp(m - ms[None, :]), axis=0)
