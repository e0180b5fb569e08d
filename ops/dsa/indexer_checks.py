"""Registry entries of the DSA indexer ops (prolog, cache write, lightning indexer, top-k) with
their checks against the fp64 oracle tests/oracles/dsa_indexer.py. Shapes stay small: every check
runs on the Triton interpreter in CI."""
from __future__ import annotations

from k31dsl.ops.dsa import indexer as I
from k31dsl.ops.dsa import prolog as P
from k31dsl.ops.dsa.topk import topk, topk_segments
from k31dsl.ops.registry import CaseResult, OpSpec, register


def _gen(seed):
    import torch
    return torch.Generator().manual_seed(seed)


def random_keys(n: int, g, d: int = 128):
    """MXFP8 codes/scales of random keys with a spread of magnitudes (numpy-target quantizer)."""
    import torch
    from k31dsl.ops.quant import mxfp8_quantize
    v = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-3, 4, (n, 1), generator=g).float())
    return mxfp8_quantize(v, target="numpy")


def paged_setup(lens, n, h, g, spare_pages: int = 2):
    """A cache holding len(lens) sequences of the given lengths on shuffled pages, their block
    table (pages neither contiguous nor ordered; unused entries -1), n query tokens per sequence
    with per-token key ranges (decode with drafts: token i of n sees positions < len - n + 1 + i;
    a few tokens also get ks > 0), and MXFP8 queries + head weights."""
    import torch
    from k31dsl.ops.quant import mxfp8_quantize
    b = len(lens)
    max_pages = max(-(-ln // I.PAGE) for ln in lens)
    need = sum(-(-ln // I.PAGE) for ln in lens)
    num_pages = need + spare_pages
    perm = torch.randperm(num_pages, generator=g).tolist()
    table = torch.full((b, max_pages), -1, dtype=torch.int32)
    slots = []
    for i, ln in enumerate(lens):
        npg = -(-ln // I.PAGE)
        pages = [perm.pop() for _ in range(npg)]
        table[i, :npg] = torch.tensor(pages, dtype=torch.int32)
        slots += [pages[s // I.PAGE] * I.PAGE + s % I.PAGE for s in range(ln)]
    cache = torch.randint(0, 256, (num_pages, I.PAGE_BYTES), generator=g, dtype=torch.uint8)  # stale bytes
    kc, ksc = random_keys(len(slots), g)
    I.indexer_cache_write(cache, kc, ksc, torch.tensor(slots, dtype=torch.int32), target="numpy")
    t = b * n
    q = torch.randn(t, h, 128, generator=g) * torch.exp2(torch.randint(-2, 3, (t, h, 1), generator=g).float())
    qc, qs = mxfp8_quantize(q, target="numpy")
    w = torch.randn(t, h, generator=g)
    ke = torch.tensor([lens[i // n] - n + 1 + i % n for i in range(t)], dtype=torch.int32)
    ks = torch.zeros(t, dtype=torch.int32)
    ks[::3] = (ke[::3] // 3).to(torch.int32)
    return cache, table, qc, qs, w, ks, ke


# ---------------------------------------------------------------- checks

def _check_cache_write(target: str, seed: int = 0) -> list[CaseResult]:
    import torch
    from k31dsl.ops.testing import bytes_of, device_for, load_oracle, mismatches
    ref = load_oracle("dsa_indexer")
    g = _gen(seed)
    dev = device_for(target)
    out = []
    for pages, t in ((3, 37), (5, 64), (2, 1)):
        cache = torch.randint(0, 256, (pages, I.PAGE_BYTES), generator=g, dtype=torch.uint8)
        before = cache.numpy().copy()
        kc, ksc = random_keys(t, g)
        slots = torch.randperm(pages * I.PAGE, generator=g)[:t].to(torch.int32)
        slots[::5] = -1                                       # padding tokens write nothing
        cache = I.indexer_cache_write(cache.to(dev), kc.to(dev), ksc.to(dev), slots.to(dev), target=target).cpu()
        want = ref.cache_write(before, bytes_of(kc), bytes_of(ksc), slots.numpy())
        n_bad = mismatches(cache.numpy(), want)
        out.append(CaseResult(f"{pages} pages, {t} tokens", n_bad, 0, n_bad == 0, "cache bytes vs oracle"))
        codes, scales = I.indexer_cache_views(cache)        # read back through the views
        keep = slots >= 0
        sl = slots[keep].long()
        back_c = bytes_of(codes[sl // I.PAGE, sl % I.PAGE])
        back_s = bytes_of(scales[sl // I.PAGE, sl % I.PAGE])
        n_rt = mismatches(back_c, bytes_of(kc)[keep.numpy()]) + mismatches(back_s, bytes_of(ksc)[keep.numpy()])
        out.append(CaseResult(f"{pages} pages, {t} tokens: read back", n_rt, 0, n_rt == 0, "round trip bytes"))
    return out


LI_CASES = [  # (sequence lengths, query tokens per sequence, heads, mma variant)
    ((150, 70, 5), 1, 16, "fp8"), ((100, 64), 4, 16, "bf16"), ((70, 33), 1, 64, "bf16"),   # the GPU's decode config
    ((130,), 3, 32, "fp8"), ((40, 9), 2, 16, "bf16")]


def _check_lightning_indexer(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    from k31dsl.ops.testing import bytes_of, load_oracle
    from k31dsl.ops.testing import device_for
    ref = load_oracle("dsa_indexer")
    g = _gen(seed)
    dev = device_for(target)
    out = []
    for lens, n, h, mma in LI_CASES if target in ("numpy", "triton") else LI_CASES[:3]:   # ascendc: g++ builds
        cache, table, qc, qs, w, ks, ke = paged_setup(lens, n, h, g)
        got = I.lightning_indexer(*[a.to(dev) for a in (qc, qs, cache, table, w, ks, ke)], mma=mma,
                                  target=target).cpu().numpy().astype(np.float64)
        args = (bytes_of(qc), bytes_of(qs), w.double().numpy(), cache.numpy(), table.numpy(), ks.numpy(),
                ke.numpy(), got.shape[1])
        want = ref.indexer_scores(*args)
        mag = ref.indexer_scores_magnitude(*args)
        same_mask = bool((np.isneginf(got) == np.isneginf(want)).all())
        fin = np.isfinite(want)
        err = float((np.abs(got[fin] - want[fin]) / (mag[fin] + 1e-30)).max()) if fin.any() else 0.0
        # fp32 sums of exact products: a few ulps of the magnitude. On a GPU the fp8 MMA keeps
        # ~14 bits while accumulating (DeepSeek-V3 report §3.3.2): <= 32 truncated adds per group.
        tol = 1e-5 if dev == "cpu" else 32 * 2.0 ** -13
        out.append(CaseResult(f"lens={list(lens)}, n={n}, H={h}, mma={mma}", err if same_mask else float("inf"), tol,
                              same_mask and err <= tol, "error / sum_j |w| sum_g |group logit|; -inf outside [ks, ke)"))
    return out


TOPK_CASES = [  # (rows, length, k, chunks per segment or None); the first two run on every target
    (2, 100, 20, 1), (2, 64, 37, None), (3, 90, 20, None), (2, 100, 5, 2), (1, 50, 3, 1), (4, 700, 100, None)]
TOPK_INTERPRETED = 1      # interpreted sorting networks (Triton ~0.4 s per merge, AscendC emulator): one case


def _check_topk(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    import torch
    from k31dsl.ops.testing import device_for, load_oracle, mismatches
    ref = load_oracle("dsa_indexer")
    g = _gen(seed)
    dev = device_for(target)
    out = []
    for rows, length, kk, ch in TOPK_CASES if target == "numpy" else TOPK_CASES[:TOPK_INTERPRETED]:
        x = torch.randint(-12, 12, (rows, length), generator=g).float()       # many ties
        x += (torch.rand(rows, length, generator=g) < 0.5) * torch.randn(rows, length, generator=g)
        x[0, length // 3:] = float("-inf")                 # fewer valid scores than k in some rows
        x[-1, 1] = float("nan")
        x[-1, 2:] = x[-1, 1:-1].clone()                        # equal neighbours at the chunk edges
        if rows > 2:
            x[1] = float("-inf")                               # a row with nothing valid
        got = topk(x.to(dev), kk, chunks=ch, target=target).cpu().numpy()
        want = ref.topk(x.double().numpy(), kk)
        n_bad = mismatches(got.astype(np.int64), want)
        out.append(CaseResult(f"scores=[{rows}, {length}], k={kk}, chunks={ch}", n_bad, 0, n_bad == 0,
                              "positions vs oracle (order, ties to the lower position, -1 padding)"))
        # per-row ends (causal rows): what lies past a row's end must never be read, so it is
        # garbage here (huge, NaN) that would win if it were
        ends = torch.randint(0, length + 4, (rows,), generator=g, dtype=torch.int32)
        ends[0] = length
        lane = torch.arange(length)[None, :]
        y = torch.where(lane < ends[:, None].long(), x, torch.full_like(x, 1e30))
        y[:, -1:] = torch.where(ends[:, None] < length, float("nan"), y[:, -1:])
        got = topk(y.to(dev), kk, sorted=bool(rows % 2), ends=ends.to(dev), chunks=ch, target=target).cpu().numpy()
        want = ref.topk(np.where(lane.numpy() < ends[:, None].numpy(), x.double().numpy(), -np.inf), kk)
        if not rows % 2:                               # unsorted: the same set in position order
            want = np.where(want >= 0, np.sort(np.where(want >= 0, want, np.iinfo(np.int64).max), axis=1), -1)
        n_bad = mismatches(got.astype(np.int64), want)
        out.append(CaseResult(f"scores=[{rows}, {length}], k={kk}, chunks={ch}, per-row ends", n_bad, 0, n_bad == 0,
                              "positions vs oracle over each row's [0, end) (past it: never read)"))
    return out


PROLOG_CASES = [(19, 96, 80, 16), (26, 160, 64, 16)]     # (T, dim, q_lora, heads)


def prolog_inputs(t, dm, ql, h, g, pages: int = 3):
    import torch
    x = torch.randn(t, dm, generator=g).bfloat16()
    qr = torch.randn(t, ql, generator=g).bfloat16()
    wq = (torch.randn(h * 128, ql, generator=g) / ql ** 0.5).bfloat16()
    wk = (torch.randn(128, dm, generator=g) / dm ** 0.5).bfloat16()
    wp = (torch.randn(h, dm, generator=g) / dm ** 0.5).bfloat16()
    lw = 1 + 0.3 * torch.randn(128, generator=g)
    lb = 0.1 * torch.randn(128, generator=g)
    ang = torch.rand(t, 32, generator=g) * 6
    slots = torch.randperm(pages * I.PAGE, generator=g)[:t].to(torch.int32)
    slots[t // 2] = -1
    cache = torch.zeros((pages, I.PAGE_BYTES), dtype=torch.uint8)
    return (x, qr, wq, wk, lw, lb, wp, ang.cos(), ang.sin(), cache, slots)


def _check_prolog(target: str, seed: int = 0) -> list[CaseResult]:
    import numpy as np
    from k31dsl.ops.testing import bytes_of, device_for, load_oracle, max_rel_err, to_f64
    ref = load_oracle("dsa_indexer")
    g = _gen(seed)
    dev = device_for(target)
    out = []
    for t, dm, ql, h in PROLOG_CASES if target in ("numpy", "triton") else PROLOG_CASES[:1]:
        args = prolog_inputs(t, dm, ql, h, g)
        slots = args[10]
        on_dev = [a.to(dev) for a in args]
        qc, qs, w = P.indexer_prolog(*on_dev, target=target)
        cache = on_dev[9]
        q, kk, ww = ref.prolog_values(*[to_f64(a) for a in args[:9]])
        name = f"T={t}, dim={dm}, q_lora={ql}, H={h}"
        rq = ref.mx_roundtrip_ratio(ref.mx_values(bytes_of(qc), bytes_of(qs)), q, bytes_of(qs))
        out.append(CaseResult(f"{name}: q MXFP8 error / bound", rq, 1.0, rq <= 1.0, "RoPE + Hadamard + MXFP8"))
        keep = [i for i in range(t) if slots[i] >= 0]
        kc = np.stack([ref.cache_token(cache.cpu().numpy(), slots[i])[0] for i in keep])
        ksb = np.stack([ref.cache_token(cache.cpu().numpy(), slots[i])[1] for i in keep])
        rk = ref.mx_roundtrip_ratio(ref.mx_values(kc, ksb), kk[keep], ksb)
        out.append(CaseResult(f"{name}: cached k MXFP8 error / bound", rk, 1.0, rk <= 1.0,
                              "LayerNorm + RoPE + Hadamard + MXFP8, read from the cache"))
        ew = max_rel_err(to_f64(w), ww, floor=1e-3 * float(np.abs(ww).max()))
        out.append(CaseResult(f"{name}: head weights", ew, 1e-4, ew <= 1e-4, "fp32"))
    return out


register(OpSpec("indexer_cache_write", "dsa", I.indexer_cache_write, [I.indexer_cache_write_rows],
                "DSA indexer key cache write (MXFP8, block-split 64-token pages, slot mapping)",
                _check_cache_write, exact=True, tags=["dsa", "fp8", "cache"]))
register(OpSpec("lightning_indexer", "dsa", I.lightning_indexer, [I.lightning_indexer_paged],
                "DSA Lightning Indexer scores over the paged MXFP8 key cache (per-32 scales inside the ReLU)",
                _check_lightning_indexer, tags=["dsa", "fp8"]))
register(OpSpec("topk", "dsa", topk, [topk_segments],
                "exact row top-k (ties to the lower position, -1 padded), chunked merge",
                _check_topk, exact=True, tags=["dsa"]))
register(OpSpec("indexer_prolog", "dsa", P.indexer_prolog,
                [P.indexer_q_chain, P.indexer_k_chain, P.indexer_head_weights],
                "DSA indexer prolog: q / k (into the cache) / head-weight chains, RoPE + Hadamard + MXFP8",
                _check_prolog, tags=["dsa", "fp8"]))
