"""Summarise an Nsight Compute source-page CSV (`ncu -i X.ncu-rep --page source --print-source sass
--csv`): per kernel, the share of PC samples by stall reason and by opcode, then the SASS
instructions where most samples fell with their two main reasons.

    python benchmarks/probes/ncu_summary.py OUT/sfa_sass.csv [TOP]
"""
from __future__ import annotations

import collections
import csv
import sys


def kernels(path: str) -> dict[str, list[dict]]:
    data, kern, hdr = collections.defaultdict(list), None, None
    for row in csv.reader(open(path)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kern = row[1]
        elif row[0] == "Address":
            hdr = row
        elif hdr:
            data[kern].append(dict(zip(hdr, row)))
    return data


def samples(ins: dict, col: str = "Warp Stall Sampling (All Samples)") -> int:
    return int(ins.get(col) or 0)


def opcode(sass: str) -> str:
    words = sass.split()
    op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
    return op.split(".")[0]


def summary(path: str, top: int = 25) -> str:
    out = []
    for kern, ins in kernels(path).items():
        total = sum(samples(i) for i in ins) or 1
        reasons = [h for h in ins[0] if h.startswith("stall_") and "Not Issued" not in h]
        by_reason = collections.Counter({h[6:]: sum(samples(i, h) for i in ins) for h in reasons})
        by_op = collections.Counter()
        for i in ins:
            by_op[opcode(i["Source"])] += samples(i)
        out.append(f"== {kern}: {len(ins)} SASS instructions, {total} samples")
        out.append("   reasons: " + ", ".join(f"{r} {100 * v / total:.1f}%" for r, v in by_reason.most_common(10)))
        out.append("   opcodes: " + ", ".join(f"{o} {100 * v / total:.1f}%" for o, v in by_op.most_common(14)))
        for i in sorted(ins, key=lambda i: -samples(i))[:top]:
            main = sorted(((samples(i, h), h[6:]) for h in reasons), reverse=True)[:2]
            out.append(f"   {100 * samples(i) / total:5.1f}% {i['Address'][-5:]} {i['Source'].strip()[:64]:64s} "
                       + ", ".join(f"{r} {n}" for n, r in main))
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25))
