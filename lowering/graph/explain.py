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
    """A PNG of the graph: calls coloured by stream, fused calls drawn as large boxes with a dark
    edge, launch groups outlined in one colour each, cross-stream events as red dashed arrows,
    tensors as small grey dots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    # Unwritten temps and "prev" edges only say where a buffer comes from: left out of the picture.
    g = nx.DiGraph()
    for n, d in program.g.nodes(data=True):
        t = d["node"]
        if not (isinstance(t, TensorNode) and t.kind == "temp" and t.version == 0):
            g.add_node(n)
    g.add_edges_from((u, v) for u, v, r in program.g.edges(data="role")
                     if r in ("read", "write") and u in g and v in g)
    pos = {}
    for layer, nodes in enumerate(nx.topological_generations(g)):
        for i, n in enumerate(sorted(nodes)):
            pos[n] = (i - (len(nodes) - 1) / 2, -layer)
    width = max((sum(1 for _ in layer) for layer in nx.topological_generations(g)), default=1)
    depth = 1 - min((y for _, y in pos.values()), default=0)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * width), max(4, 1.1 * depth)))
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
    events = [(prod, cons, name) for name, prod, cons in program.meta.get("streams", {}).get("events", [])
              if prod in g and cons in g]
    if events:
        eg = nx.DiGraph()
        eg.add_edges_from((a, b) for a, b, _ in events)
        nx.draw_networkx_edges(eg, pos, ax=ax, arrows=True, arrowsize=10, edge_color="#D62728", style="dashed",
                               connectionstyle="arc3,rad=0.2")
        nx.draw_networkx_edge_labels(eg, pos, {(a, b): n for a, b, n in events}, font_size=7,
                                     font_color="#D62728", ax=ax)
    nx.draw_networkx_labels(g, pos, {n: n for n in g}, font_size=7, ax=ax)
    streams = sorted({program.node(n).attrs.get("stream", 0) for n in program.order})
    handles = [plt.Line2D([], [], marker="s", ls="", color=PALETTE[s % len(PALETTE)], label=f"stream {s}")
               for s in streams]
    handles += [plt.Line2D([], [], marker="s", ls="", mfc="white", mec=PALETTE[(i + 3) % len(PALETTE)], mew=3,
                           label=f"launch group {gname}") for i, gname in enumerate(groups)]
    if any(isinstance(program.node(n), CallNode) and program.node(n).attrs.get("fused") for n in program.order):
        handles.append(plt.Line2D([], [], marker="s", ls="", mfc="white", mec="#222222", mew=3, ms=12,
                                  label="fused kernel"))
    if events:
        handles.append(plt.Line2D([], [], ls="--", color="#D62728", label="event (cross-stream)"))
    if any(isinstance(program.node(n), HostNode) for n in program.order):
        handles.append(plt.Line2D([], [], marker="D", ls="", color="#777777", label="host op"))
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    ax.set_title(f"program {program.name}")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_memory(program: Program, path: str) -> None:
    """A PNG of the memory plan: each planned intermediate a rectangle from its first to its last
    use (x: schedule position) over its bytes in the arena (y: offset), the largest ones labelled;
    the title gives the arena against the peak-live bound."""
    plan = program.meta.get("memory_plan")
    if not plan:
        raise K31Error(f"program `{program.name}` has no memory plan to draw",
                       hint="the memory_plan pass runs last: leave out --dump-after, or name memory_plan")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from k31dsl.lowering.passes.memory_plan import uses
    use = uses(program)
    for b, a in plan["alias"].items():
        use[a] = use.get(a, set()) | use.get(b, set())
    pos = {n: i for i, n in enumerate(program.ops())}
    storages = program.storages()
    placed = [s for s in plan["offsets"] if s not in plan["alias"] and use.get(s)]
    unit, scale = next(((u, f) for u, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if plan["arena_bytes"] >= f),
                       ("B", 1))
    fig, ax = plt.subplots(figsize=(11, 5))
    biggest = set(sorted(placed, key=lambda s: -storages[s].nbytes)[:12])
    for i, s in enumerate(sorted(placed)):
        lo, hi = min(pos[n] for n in use[s]), max(pos[n] for n in use[s])
        y, h = plan["offsets"][s] / scale, storages[s].nbytes / scale
        ax.add_patch(Rectangle((lo - 0.4, y), hi - lo + 0.8, h, facecolor=PALETTE[i % len(PALETTE)], alpha=0.75,
                               edgecolor="#333333", linewidth=0.4))
        if s in biggest:
            ax.text(lo - 0.3, y + h / 2, s, fontsize=6, va="center")
    ax.axhline(plan["arena_bytes"] / scale, color="#D62728", ls="--", lw=1)
    ax.axhline(plan["peak_live"] / scale, color="#2CA02C", ls=":", lw=1)
    ax.set_xlim(-1, max(len(pos), 1))
    ax.set_ylim(0, max(plan["arena_bytes"] / scale, 1e-9) * 1.05)
    ax.set_xlabel("schedule position (op)")
    ax.set_ylabel(f"arena offset ({unit})")
    ax.set_title(f"program {program.name}: {len(placed)} intermediates in an arena of "
                 f"{plan['arena_bytes'] / scale:.4g} {unit} (red); peak live {plan['peak_live'] / scale:.4g} {unit} "
                 f"(green); {plan['bytes_before'] / scale:.4g} {unit} unplanned", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
