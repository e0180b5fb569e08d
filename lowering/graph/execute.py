"""Running a graph program: the executor every target's `program.py` builds on, and `run`.

`compile_program(program, target)` runs the target's graph pipeline (lowering/graph/pipeline.py)
and returns an Executable; calling it with {name: tensor} runs the program and returns its outputs.
Host ops whose inputs are all static (weight conversions such as `to_nz`) run once and are reused
while the same weight tensors (same object, unmodified) are passed. Buffers follow the memory
plan when the `memory_plan` pass ran (one arena, each planned tensor a view at its offset), else
one allocation per tensor.
Targets override `run_schedule` (streams, graph capture) and may add `host_source`.
"""
from __future__ import annotations

import importlib

from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.graph.hostops import HOST_OPS


class ProgramExecutor:
    target = "numpy"

    def __init__(self, program, **options):
        self.p = program
        self.options = options
        self.schedule = program.ops()
        self.storages = program.storages()
        self.produced_statically = {s for s, t in self.storages.items()
                                    if t.kind == "weight" and program.final(s) != t.id}
        self.argplan = {}                          # call -> [(is tensor, storage or scalar)]
        for nid in self.schedule:
            n = program.node(nid)
            if n.kind == "call":
                self.argplan[nid] = [(True, program.tensor_node(v).storage) if isinstance(v, str) else (False, v)
                                     for v in (n.args[prm.name] for prm in n.kernel.params)]
        self.static_ops = [n for n in self.schedule if self.is_static(n)]
        # reshapes whose result the memory plan placed in its source's buffer: nothing to copy
        alias = (program.meta.get("memory_plan") or {}).get("alias", {})
        self.elided = {n for n in self.schedule if program.node(n).kind == "host" and program.node(n).op == "reshape"
                       and program.tensor_node(program.node(n).outputs[0]).storage in alias}
        self._launchers: dict = {}
        self._static: dict = {}                    # storage -> tensor, with the weights' identity
        self._static_key = None
        self.launches = 0                          # kernel launches issued (tests count them)
        # Intermediates (not outputs) allocated once and reused by every call: stable addresses
        # for captured CUDA graphs. Off by default (a fresh allocation per call).
        self.persistent_temps = False
        self._kept: dict = {}
        self._copy_back: list = []

    # ------------------------------------------------------------ building
    def build(self, kernel):
        from k31dsl.lowering.pipeline import run_pipeline
        rt = importlib.import_module(f"k31dsl.targets.{self.target}.runtime")
        return rt.build(run_pipeline(kernel, self.target), **self.build_options())

    def build_options(self) -> dict:
        return {}

    def launcher(self, nid: str):
        if nid not in self._launchers:
            self._launchers[nid] = self.build(self.p.node(nid).kernel)
        return self._launchers[nid]

    # ------------------------------------------------------------ memory
    def keep_temps(self, keep: bool) -> None:
        """Keep the intermediates (the arena) from call to call, at fixed addresses as a captured
        CUDA graph needs, or allocate them per call and let them go after it."""
        self.persistent_temps = keep
        if not keep:
            self._kept.clear()

    def device(self, inputs: dict):
        for v in inputs.values():
            return v.device
        import torch
        return torch.device("cpu")

    def allocate(self, inputs: dict) -> dict:
        import torch
        p = self.p
        storages = self.storages
        missing = [s for s, t in storages.items() if t.kind in ("input", "weight") and s not in inputs
                   and not self._produced_statically(s)]
        if missing:
            raise K31Error(f"run({p.name}): missing input(s) {', '.join(missing)}",
                           hint="pass {name: tensor} for every p.input/p.weight")
        unknown = set(inputs) - set(storages)
        if unknown:
            raise K31Error(f"run({p.name}): no input named {', '.join(sorted(unknown))}")
        env = {}
        self._copy_back = []
        for s, t in storages.items():
            if s not in inputs:
                continue
            v = inputs[s]
            if tuple(v.shape) != t.shape or D.from_torch(v.dtype) is not t.dtype:
                raise K31Error(f"run({p.name}): `{s}` must be {t.dtype.name}{list(t.shape)}, got "
                               f"{v.dtype} {list(v.shape)}")
            # a one-element broadcast (every stride 0) stands for a parameter the kernels never
            # touch (ops/dsa/topk.py passes its unused parameters so): passed as is, since a
            # contiguous copy would allocate its full shape for nothing
            placeholder = v.dim() > 0 and all(st == 0 for st in v.stride())
            env[s] = v if v.is_contiguous() or placeholder else v.contiguous()
            if env[s] is not v and p.final(s) != t.id:      # written in place: copy back at the end
                self._copy_back.append((v, s))
        dev = self.device(inputs)
        plan = p.meta.get("memory_plan") or {"offsets": {}, "arena_bytes": 0}
        keep = self._kept if self.persistent_temps else {}
        if keep.get("device") != dev:
            keep.clear()
            keep["device"] = dev
        if "arena" not in keep:
            keep["arena"] = torch.empty(plan["arena_bytes"], dtype=torch.uint8, device=dev)
        arena = keep["arena"]
        for s, t in storages.items():
            if s in env or self._produced_statically(s):
                continue
            tdt = D.torch_dtype(t.dtype)
            if s in plan["offsets"]:
                at = plan["offsets"][s]
                env[s] = arena[at: at + t.nbytes].view(tdt).view(t.shape)
            elif self.persistent_temps and s not in p.outputs:
                if ("t", s) not in keep:
                    keep[("t", s)] = torch.empty(t.shape, dtype=tdt, device=dev)
                env[s] = keep[("t", s)]
            else:
                env[s] = torch.empty(t.shape, dtype=tdt, device=dev)
        return env

    def _produced_statically(self, storage: str) -> bool:
        return storage in self.produced_statically

    def prepare_static(self, env: dict) -> None:
        """Run the host ops over weights once; reuse while the weights are the same tensors."""
        import torch
        static_ops = self.static_ops
        if not static_ops:
            return
        key = tuple((s, id(env[s]), env[s]._version) for s, t in self.storages.items()
                    if t.kind == "weight" and s in env)
        if key != self._static_key:
            self._static = {}
            for nid in static_ops:
                n = self.p.node(nid)
                outs = []
                for tid in n.outputs:
                    t = self.p.tensor_node(tid)
                    self._static[t.storage] = torch.zeros(t.shape, dtype=D.torch_dtype(t.dtype), device=self.device(env))
                    outs.append(self._static[t.storage])
                ins = [self._static.get(self.p.tensor_node(i).storage, env.get(self.p.tensor_node(i).storage))
                       for i in n.inputs]
                HOST_OPS[n.op](ins, outs, **n.params)
            self._static_key = key
        env.update(self._static)

    def is_static(self, nid: str) -> bool:
        return self.p.is_static(nid)

    # ------------------------------------------------------------ running
    def args(self, nid: str, env: dict) -> list:
        return [env[v] if is_tensor else v for is_tensor, v in self.argplan[nid]]

    def run_op(self, nid: str, env: dict) -> None:
        n = self.p.node(nid)
        if n.kind == "host":
            if nid in self.static_ops or nid in self.elided:
                return
            ins = [env[self.p.tensor_node(i).storage] for i in n.inputs]
            outs = [env[self.p.tensor_node(o).storage] for o in n.outputs]
            HOST_OPS[n.op](ins, outs, **n.params)
            return
        self.launcher(nid)(*self.args(nid, env))
        self.launches += 1

    def run_schedule(self, env: dict) -> None:
        for nid in self.schedule:
            self.run_op(nid, env)

    def __call__(self, inputs: dict) -> dict:
        env = self.allocate(dict(inputs))
        self.prepare_static(env)
        for nid in self.schedule:          # build everything first (no compile inside a capture)
            if self.p.node(nid).kind == "call":
                self.launcher(nid)
        self.run_schedule(env)
        for v, s in self._copy_back:
            v.copy_(env[s])
        return {s: env[s] for s in self.p.outputs}


def compile_program(program, target: str = "numpy", passes=None, after_pass=None, **options):
    """The target's graph pipeline (or `passes`, a list of names or (name, fn)) then its executor."""
    from k31dsl.lowering.graph.pipeline import run_graph_pipeline
    from k31dsl.targets import TARGETS
    if target not in TARGETS:
        raise K31Error(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    program = run_graph_pipeline(program, target, passes=passes, after_pass=after_pass)
    mod = importlib.import_module(f"k31dsl.targets.{target}.program")
    return mod.executor(program, **options)


def run(program, inputs: dict, target: str = "numpy", passes=None, **options) -> dict:
    """Run `program` on `target` with {name: torch tensor}; returns {output name: tensor}."""
    return compile_program(program, target, passes=passes, **options)(inputs)
