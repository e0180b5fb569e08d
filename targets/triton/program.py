"""Triton target: how a scheduled graph program runs.

On a GPU, the `streams` pass's assignment becomes torch.cuda streams: stream 0 is the caller's
current stream, side streams first wait for it (fork), each op waits for the events named in its
`wait` attr and records those in `record`, and at the end the current stream waits for every side
stream (join). A `group` from the `superkernel` pass (calls that could not be fused into one
kernel) runs as one CUDA graph ("graph mode"): launched eagerly the first time it sees a set of
buffer addresses, captured then, and replayed whenever the same addresses come back (on a GPU
the intermediates are allocated once per executable, so only inputs and outputs can move). Under
the interpreter (CPU) everything runs in schedule order, which the events already respect.
"""
from __future__ import annotations

from k31dsl.lowering.graph.execute import ProgramExecutor
from k31dsl.lowering.graph.ir import launch_units
from k31dsl.targets.triton.emit import detect_mode

MAX_GRAPHS_PER_GROUP = 8


class TritonProgram(ProgramExecutor):
    target = "triton"

    def __init__(self, program, **options):
        super().__init__(program, **options)
        self.mode = options.get("mode") or detect_mode()
        self._graphs: dict = {}          # (group, buffer addresses) -> CUDAGraph
        self.graph_replays = 0
        self._side: dict = {}            # stream id -> torch.cuda.Stream
        self.persistent_temps = self.mode == "gpu"
        self._capture_stream = None

    def build_options(self) -> dict:
        return {"mode": self.mode}

    def units(self) -> list[list[str]]:
        """The schedule cut into launch units: a group's calls together, other ops alone."""
        return launch_units(self.p, self.schedule)

    def run_schedule(self, env: dict) -> None:
        if self.mode != "gpu":
            return super().run_schedule(env)
        import torch
        main = torch.cuda.current_stream()
        ids = sorted({self.p.node(n).attrs.get("stream", 0) for n in self.schedule})
        for s in ids:                                # side streams live as long as the executable
            if s and s not in self._side:
                self._side[s] = torch.cuda.Stream()
        streams = {s: (main if s == 0 else self._side[s]) for s in ids}
        for s in streams.values():
            if s is not main:
                s.wait_stream(main)
        events: dict[str, torch.cuda.Event] = {}
        for unit in self.units():
            first = self.p.node(unit[0]).attrs
            stream = streams[first.get("stream", 0)]
            with torch.cuda.stream(stream):
                for nid in unit:
                    for ev in self.p.node(nid).attrs.get("wait", []):
                        stream.wait_event(events[ev])
                if len(unit) > 1:
                    self._run_group(first["group"], unit, env)
                else:
                    self.run_op(unit[0], env)
                for nid in unit:
                    for ev in self.p.node(nid).attrs.get("record", []):
                        events[ev] = torch.cuda.Event()
                        events[ev].record(stream)
        for s in streams.values():
            if s is not main:
                main.wait_stream(s)

    def _run_group(self, group, unit: list[str], env: dict) -> None:
        import torch
        args = {nid: self.args(nid, env) for nid in unit}
        key = (group, tuple(a.data_ptr() for nid in unit for a in args[nid] if isinstance(a, torch.Tensor)))
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            self.graph_replays += 1
            self.launches += 1
            return
        for nid in unit:                            # eager: the result now, and the warm-up
            self.launcher(nid)(*args[nid])
        self.launches += len(unit)
        if sum(1 for k in self._graphs if k[0] == group) >= MAX_GRAPHS_PER_GROUP:
            return
        graph = torch.cuda.CUDAGraph()
        side = self._capture_stream or torch.cuda.Stream()
        self._capture_stream = side
        side.wait_stream(torch.cuda.current_stream())
        # capture_begin/end rather than `with torch.cuda.graph(...)`: that one also synchronises,
        # collects garbage and empties the allocator cache, which moves the very buffers the
        # graph is keyed on.
        with torch.cuda.stream(side):
            graph.capture_begin()
            try:
                for nid in unit:
                    self.launcher(nid)(*args[nid])
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        self._graphs[key] = graph


def executor(program, **options) -> TritonProgram:
    return TritonProgram(program, **options)
