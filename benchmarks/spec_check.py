"""Why speculative output can differ from plain greedy on a GPU in bf16: the logits a verify step
(gamma + 1 tokens per sequence) gives for the same tokens as plain decode steps, compared row by
row — max difference, argmax agreement and the top-2 margin where the argmax differs.

    python benchmarks/spec_check.py [--config small] [--gamma 3] [--context 1024]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model import _prompt  # noqa: E402
from k31dsl.model.config import pages_for  # noqa: E402


def main(argv=None) -> int:
    import torch
    from k31dsl.model.assembler import ModelRunner
    from k31dsl.model.config import K31Config
    from k31dsl.model.step import Step
    from k31dsl.model.weights import cast_weights, init_weights

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="small")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    ap.add_argument("--graph-mode", default="auto", choices=["auto", "on", "off"])
    args = ap.parse_args(argv)
    cfg = K31Config.load(args.config)
    if args.layers:
        cfg = cfg.replace(n_layers=args.layers)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = {n: t.to(dev) for n, t in cast_weights(init_weights(cfg, 0), cfg.dtype).items()}
    per = pages_for(args.context + args.rounds * (args.gamma + 1) + 8)
    gm = None if args.graph_mode == "auto" else args.graph_mode == "on"
    r = ModelRunner(cfg, w, "triton", num_pages=2 * per, num_slots=2, graph_mode=gm)
    tables = [list(range(per)), list(range(per, 2 * per))]
    prompt = _prompt(args.context, 7)
    for s in (0, 1):
        r.reset_slot(s)
        lg = r.forward(Step("prefill", [prompt], [0], [s], [tables[s]]))
    last = int(torch.as_tensor(lg)[-1].argmax())
    ctx, n = args.context, args.rounds * (args.gamma + 1)
    toks, plain = [last], []
    for _ in range(n):                                   # plain greedy in slot 0
        lg = torch.as_tensor(r.forward(Step("decode", [[toks[-1]]], [ctx], [0], [tables[0]])))[0].float().cpu()
        plain.append(lg)
        toks.append(int(lg.argmax()))
        ctx += 1
    worst, flips = 0.0, []
    ctx = args.context
    for i in range(0, n, args.gamma + 1):               # the same tokens as verify steps in slot 1
        fed = toks[i:i + args.gamma + 1]
        st = Step("verify", [fed], [ctx], [1], [tables[1]])
        lg = torch.as_tensor(r.forward(st)).float().cpu()
        r.commit(st, [len(fed)])
        for j in range(len(fed)):
            a, b = lg[j], plain[i + j]
            worst = max(worst, float((a - b).abs().max() / b.abs().max()))
            if int(a.argmax()) != int(b.argmax()):
                top = torch.topk(b, 2).values
                flips.append((i + j, float((top[0] - top[1]) / b.abs().max())))
        ctx += len(fed)
    print(f"{cfg.name} {cfg.n_layers} layers {cfg.dtype} graph mode {r.graph_mode}: {n} positions, verify vs decode logits max rel diff {worst:.3e}; "
          f"argmax differs at {len(flips)} positions; plain top-2 margins there (rel): "
          f"{[round(m, 5) for _, m in flips]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
