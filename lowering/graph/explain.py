"""`k31dsl explain`: where programs come from, the graph after each pass, and a drawing.

A Python file defines programs in either of two ways (both found by `explain FILE`):

    p = Program("step")                  # a module-level Program object
    ...

    @program                             # from k31dsl.lowering.graph import program
    def decode_step():                   # a function without parameters returning a Program
        p = Program("decode_step")
        ...
        return p

`FILE::NAME` picks one by its Program name (or the variable/function name).
"""
from __future__ import annotations

from pathlib import Path

from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.graph.ir import CallNode, HostNode, Program, TensorNode
from k31dsl.lowering.graph.pipeline import graph_pass_names, run_graph_pipeline
from k31dsl.lowering.graph.text import dump


def load_programs(spec: str) -> list[Program]:
    from k31dsl.sources import import_path
    path, _, pick = spec.partition("::")
    module = import_path(Path(path))
    found: list[tuple[str, Program]] = []
    for attr, obj in vars(module).items():
        if isinstance(obj, Program):
            found.append((attr, obj))
        elif callable(obj) and getattr(obj, "__k31_program__", False):
            if pick and pick not in (attr, getattr(obj, "__name__", "")):
                continue
            try:
                prog = obj()
            except K31Error:
                raise
            except Exception as e:  # noqa: BLE001 - the user's program builder failed
                raise K31Error(f"{path}: building program `{attr}` raised {type(e).__name__}: {e}",
                               hint=f"run `python {path}` to see the full traceback") from None
            if not isinstance(prog, Program):
                raise K31Error(f"{path}: @program function `{attr}` returned {type(prog).__name__}, not a Program")
            found.append((attr, prog))
    if pick:
        found = [(a, p) for a, p in found if pick in (a, p.name)]
    if not found:
        what = f"no program named `{pick}`" if pick else "no programs"
        raise K31Error(f"{path}: {what}",
                       hint="define a module-level Program, or a function decorated with "
                            "@k31dsl.lowering.graph.program that returns one")
    seen, out = set(), []
    for _, p in found:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def explain(program: Program, target: str, dump_after: str | None = None, kernels: bool = False):
    """[(title, text)] of the graph after each pass (or only `dump_after`), and the final graph."""
    names = graph_pass_names(target)
    if dump_after is not None and dump_after not in names:
        raise K31Error(f"--dump-after {dump_after}: no such graph pass for target {target}; "
                       f"the passes are: {', '.join(names)}")
    out = []
    shown = {}

    def after(name, p):
        shown[name] = p
        if dump_after in (None, name):
            out.append((f"program `{p.name}` after pass `{name}` ({target})", dump(p, kernels)))
    final = run_graph_pipeline(program, target, after_pass=after)
    return out, shown.get(dump_after, final)


PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#FF9DA6", "#9D755D"]


def draw(program: Program, path: str) -> None:
    """A PNG of the graph: calls coloured by stream, fused calls drawn as wide boxes with a dark
    edge, launch groups outlined in one colour each, tensors as small grey dots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    g = program.g
    pos = {}
    for layer, nodes in enumerate(nx.topological_generations(g)):
        for i, n in enumerate(sorted(nodes)):
            pos[n] = (i - (len(nodes) - 1) / 2, -layer)
    fig, ax = plt.subplots(figsize=(max(6, len(g) * 0.5), max(4, len(pos) and -min(y for _, y in pos.values()) + 2)))
    groups = sorted({program.node(n).attrs.get("group") for n in program.order} - {None})
    tensors = [n for n in g if isinstance(program.node(n), TensorNode)]
    nx.draw_networkx_nodes(g, pos, nodelist=tensors, node_color="#BBBBBB", node_size=80, ax=ax)
    for n in program.order:
        node = program.node(n)
        stream = node.attrs.get("stream", 0)
        fused = isinstance(node, CallNode) and node.attrs.get("fused")
        group = node.attrs.get("group")
        edge = PALETTE[(groups.index(group) + 3) % len(PALETTE)] if group else ("#222222" if fused else "white")
        nx.draw_networkx_nodes(g, pos, nodelist=[n], node_color=PALETTE[stream % len(PALETTE)],
                               node_shape="s" if isinstance(node, CallNode) else "D",
                               node_size=1400 if fused else 700, edgecolors=edge,
                               linewidths=3 if (fused or group) else 1, ax=ax)
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=True, arrowsize=8, edge_color="#888888")
    labels = {n: n if not isinstance(program.node(n), TensorNode) else n for n in g}
    nx.draw_networkx_labels(g, pos, labels, font_size=7, ax=ax)
    streams = sorted({program.node(n).attrs.get("stream", 0) for n in program.order})
    handles = [plt.Line2D([], [], marker="s", ls="", color=PALETTE[s % len(PALETTE)], label=f"stream {s}")
               for s in streams]
    handles += [plt.Line2D([], [], marker="s", ls="", mfc="white", mec=PALETTE[(i + 3) % len(PALETTE)], mew=3,
                           label=f"launch group {gname}") for i, gname in enumerate(groups)]
    if any(isinstance(program.node(n), CallNode) and program.node(n).attrs.get("fused") for n in program.order):
        handles.append(plt.Line2D([], [], marker="s", ls="", mfc="white", mec="#222222", mew=3, ms=12,
                                  label="fused kernel"))
    if any(isinstance(program.node(n), HostNode) for n in program.order):
        handles.append(plt.Line2D([], [], marker="D", ls="", color="#777777", label="host op"))
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    ax.set_title(f"program {program.name}")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
