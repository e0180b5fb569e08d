"""The text dump of a graph program (what `k31dsl explain` prints after each pass):

    program norm_twice {
      input  %x : f32[6, 48]
      weight %w : f32[48]
      temp   %h : f32[6, 48]                           buffer b0
      %h.1 = rmsnorm_rows(x=%x, w=%w, y=%h, eps=1e-06) {BD=64, BM=2, ...}  stream 0
      output %y.1
    }

Calls and host ops print in execution order with what passes decided (stream, events, group,
what a fused kernel replaced); `# ` lines after the body are the passes' reports.
"""
from __future__ import annotations

from k31dsl.dsl.text import fmt_attr, print_kernel


def _val(v) -> str:
    return v if isinstance(v, str) else fmt_attr(v)


def _attrs(a: dict) -> str:
    parts = []
    if "stream" in a:
        parts.append(f"stream {a['stream']}")
    if a.get("wait"):
        parts.append("wait " + ",".join(a["wait"]))
    if a.get("record"):
        parts.append("record " + ",".join(a["record"]))
    if "group" in a:
        parts.append(f"group {a['group']}")
    if a.get("fused"):
        parts.append("fuses " + "+".join(a["fused"]))
    return ("  " + "  ".join(parts)) if parts else ""


def dump(program, kernels: bool = False) -> str:
    p = program
    lines = [f"program {p.name} {{"]
    offsets = p.meta.get("memory_plan", {}).get("offsets", {})
    for st, t in sorted(p.storages().items(), key=lambda kv: ("input weight temp".split().index(kv[1].kind), kv[0])):
        ty = f"{t.dtype.name}[{', '.join(map(str, t.shape))}]"
        extra = f"  layout {t.layout}" if t.layout != "ND" else ""
        if st in offsets:
            extra += f"  arena @{offsets[st]}"
        lines.append(f"  {t.kind:<6} %{st} : {ty}{extra}")
    fused_kernels = []
    for nid in p.ops():
        n = p.node(nid)
        outs = ", ".join(p.writes_of(nid))
        lhs = f"{outs} = " if outs else ""
        if n.kind == "call":
            args = ", ".join(f"{k}={_val(v)}" for k, v in n.args.items())
            cx = ", ".join(f"{k}={fmt_attr(v)}" for k, v in sorted(n.constexprs.items())
                           if isinstance(v, (int, float, bool, str)) or hasattr(v, "bits"))
            cx = f" {{{cx}}}" if cx else ""
            lines.append(f"  {lhs}{nid}({args}){cx}{_attrs(n.attrs)}")
            if n.kdef is None:
                fused_kernels.append(n.kernel)
        else:
            params = "".join(f", {k}={fmt_attr(v)}" for k, v in sorted(n.params.items()))
            lines.append(f"  {lhs}{n.op}({', '.join(n.inputs)}{params}){_attrs(n.attrs)}")
    for st in p.outputs:
        lines.append(f"  output {p.final(st)}")
    lines.append("}")
    lines.extend(f"# {r}" for r in p.report)
    if kernels:
        for k in fused_kernels:
            lines.append("")
            lines.append(print_kernel(k).rstrip("\n"))
    return "\n".join(lines) + "\n"
