"""AscendC target: how a scheduled graph program runs, and the host code a CANN build would use.

On the emulator (this machine) the program runs in schedule order, and a launch group from the
superkernel pass is one launch of its SyncAll entry (below), built against the emulation header
with the program's static shapes baked in: the emulator runs the blocks as threads and
AscendC::SyncAll() is a real barrier between the sub-kernels.

`host_files(program)` writes what an Ascend device runs:
  <program>_groups.cpp  one `__global__ __aicore__` entry per launch group: each sub-kernel's
                        K31Kernel_<name> (from <name>_kernel.cpp) Init+Process in turn, with
                        AscendC::SyncAll() between them (the kernels loop over their programs
                        grid-stride, so the group launches max(block counts) blocks)
  <program>_host.cpp    k31_program_<program>(bufs, arena, cores, stream0): side streams created with
                        aclrtCreateStream and forked from stream0, each launch on its stream's
                        <<<blockDim, nullptr, stream>>>, aclrtRecordEvent/aclrtStreamWaitEvent for
                        the streams pass's events, a join, and one aclrtSynchronizeStream at the end.
Inputs, weights and outputs are passed as `bufs[i]` in the order listed in the header comment; the
intermediates the memory plan placed live at `arena + offset` in one allocation the caller passes.
"""
from __future__ import annotations

from k31dsl.lowering.graph.execute import ProgramExecutor
from k31dsl.lowering.graph.ir import launch_units
from k31dsl.version import __version__

C_TYPES = {"f32": "float", "bf16": "float", "f16": "float", "i32": "int32_t", "i64": "int64_t",
           "bool": "bool", "u8": "int32_t"}


class AscendcProgram(ProgramExecutor):
    target = "ascendc"

    def __init__(self, program, **options):
        super().__init__(program, **options)
        self._groups: dict = {}

    def build_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k in ("cores", "opt")}

    def host_files(self) -> dict[str, str]:
        return host_files(self.p)

    def run_schedule(self, env: dict) -> None:
        """Ops in order; a launch group is one emulator launch of its SyncAll entry."""
        for unit in _units(self.p):
            if len(unit) == 1:
                self.run_op(unit[0], env)
            else:
                self._run_group(unit, env)

    def _run_group(self, unit: list[str], env: dict) -> None:
        import ctypes
        gid = self.p.node(unit[0]).attrs["group"]
        if gid not in self._groups:
            self._groups[gid] = _build_group(self.p, unit, int(self.options.get("cores", _default_cores())),
                                             self.options.get("opt"))
        fn = self._groups[gid]
        ptrs = [a.data_ptr() for nid in unit for a in self.args(nid, env) if hasattr(a, "data_ptr")]
        arr = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        if fn(arr) != 0:
            from k31dsl.dsl.errors import K31Error
            raise K31Error(f"launch group {gid} ({' + '.join(unit)}) failed on the AscendC emulator: "
                           f"{fn.last_error()}")
        self.launches += 1


def executor(program, **options) -> AscendcProgram:
    return AscendcProgram(program, **options)


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _units(p) -> list[list[str]]:
    return launch_units(p, [nid for nid in p.ops() if not p.is_static(nid)])


def _buffer_index(p) -> tuple[dict[str, str], list[str]]:
    """storage -> the C expression of its device address, and the header lines describing them:
    `bufs[i]` for inputs, weights and outputs (in the order listed), `arena + offset` for an
    intermediate the memory plan placed in the arena (one allocation the caller passes)."""
    plan = p.meta.get("memory_plan", {})
    offsets = plan.get("offsets", {})
    addr, lines, passed = {}, [], 0
    if offsets:
        lines.append(f"//   arena: one device allocation of {plan['arena_bytes']} bytes for the intermediates")
    for st, t in sorted(p.storages().items()):
        what = f"{t.kind} {st}: {t.dtype.name}{list(t.shape)}{' ' + t.layout if t.layout != 'ND' else ''}"
        if st in offsets:
            addr[st] = f"(arena + {offsets[st]})"
            lines.append(f"//   arena + {offsets[st]} = {what}")
        else:
            addr[st] = f"bufs[{passed}]"
            passed += 1
            lines.append(f"//   {addr[st]} = {what}")
    return addr, lines


def _tiling(p, nid: str, var: str, bufs: dict, kernel=None) -> list[str]:
    """Host lines filling K31Tiling_<kernel> for one call with the program's static shapes."""
    n = p.node(nid)
    k = kernel or n.kernel
    lines = [f"  K31Tiling_{k.name} {var}{{}};"]
    for prm in k.params:
        v = n.args[prm.name]
        if isinstance(v, str):
            t = p.tensor_node(v)
            stride = 1
            strides = []
            for s in reversed(t.shape):
                strides.append(stride)
                stride *= s
            strides.reverse()
            for a, (size, st) in enumerate(zip(t.shape, strides)):
                lines.append(f"  {var}.{prm.name}_size[{a}] = {size}; {var}.{prm.name}_stride[{a}] = {st};")
            extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, strides))
            lines.append(f"  {var}.{prm.name}_extent = {extent};")
        else:
            lines.append(f"  {var}.{prm.name} = {v!r};".replace("True", "true").replace("False", "false"))
    lines.append(f"  k31_tiling_{k.name}(&{var}, cores);")
    return lines


def host_files(p) -> dict[str, str]:
    name = _ident(p.name)
    bufs, buf_lines = _buffer_index(p)
    units = _units(p)
    streams = sorted({p.node(n).attrs.get("stream", 0) for n in p.ops()})
    head = [f"// generated by k31dsl {__version__}: graph program `{p.name}` for target ascendc",
            "// (do not edit; `k31dsl explain FILE --target ascendc` shows the passes that made it)"]
    groups = ["\n".join(head), '#include "kernel_operator.h"']
    named = _group_kernels(p, [n for n in p.ops() if p.node(n).kind == "call"])
    kernels = sorted({k.name for k in named.values()})
    groups += [f'#include "{k}_kernel.cpp"' for k in kernels]
    host = ["\n".join(head), "// Buffers (device addresses: bufs[] from the caller, the arena for the intermediates):",
            *buf_lines]
    for nid in p.ops():
        if p.is_static(nid):
            n = p.node(nid)
            host.append(f"// at weight load time, once: {n.op}({', '.join(n.inputs)}) -> {', '.join(n.outputs)} "
                        "(aclnnNpuFormatCast to FRACTAL_NZ, or k31dsl's nd_to_nz)")
    host += ["#include <cstdint>", '#include "acl/acl.h"']
    host += [f'#include "{k}_tiling.h"' for k in kernels]
    renamed = {named[n].name: n for n in named if named[n].name != p.node(n).kernel.name}
    for kname, nid in sorted(renamed.items()):
        host.append(f"// {kname}: {p.node(nid).kernel.name} at other constexprs "
                    f"({', '.join(f'{c}={v}' for c, v in sorted(p.node(nid).constexprs.items()))}); "
                    "its kernel, tiling and files carry this name")
    decls, body = [], []
    body.append(f'extern "C" int k31_program_{name}(void* const* bufs, uint8_t* arena, int64_t cores, '
                f'aclrtStream stream0) {{')
    body.append("  aclrtStream s[%d] = {stream0};" % max(1, len(streams)))
    body.append("  void* tilings[%d] = {};" % sum(len(u) for u in units))
    body.append("  void* work[%d] = {};" % len(units))
    if len(streams) > 1:
        body.append("  aclrtEvent fork = nullptr;")
        body.append("  aclrtCreateEvent(&fork);")
        body.append("  aclrtRecordEvent(fork, stream0);")
        for sid in streams[1:]:
            body.append(f"  aclrtCreateStream(&s[{sid}]);")
            body.append(f"  aclrtStreamWaitEvent(s[{sid}], fork);        // side streams start after stream0's work")
    events = [e for n in p.ops() for e in p.node(n).attrs.get("record", [])]
    for e in events:
        body.append(f"  aclrtEvent {e} = nullptr;")
        body.append(f"  aclrtCreateEvent(&{e});")
    tcount = 0
    for ui, unit in enumerate(units):
        first = p.node(unit[0])
        sid = first.attrs.get("stream", 0)
        body.append(f"  // {' + '.join(unit)}" + (f" (launch group {first.attrs['group']})" if len(unit) > 1 else ""))
        for nid in unit:
            for e in p.node(nid).attrs.get("wait", []):
                body.append(f"  aclrtStreamWaitEvent(s[{sid}], {e});")
        if any(p.node(n).kind == "host" for n in unit):
            n = p.node(unit[0])
            ins = ", ".join(bufs[p.tensor_node(i).storage] for i in n.inputs)
            outs = ", ".join(bufs[p.tensor_node(o).storage] for o in n.outputs)
            body.append(f"  // host op {n.op}({ins}) -> {outs}: done by the runtime before this program "
                        "(weights are converted once at load time; collectives through HCCL)")
            continue
        tds = []
        for nid in unit:
            var = f"td{tcount}"
            body.extend(_tiling(p, nid, var, bufs, named[nid]))
            body.append(f"  aclrtMalloc(&tilings[{tcount}], sizeof({var}), ACL_MEM_MALLOC_HUGE_FIRST);")
            body.append(f"  aclrtMemcpy(tilings[{tcount}], sizeof({var}), &{var}, sizeof({var}), ACL_MEMCPY_HOST_TO_DEVICE);")
            tds.append((nid, var, tcount))
            tcount += 1
        block = tds[0][1] + ".blockDim" if len(tds) == 1 else \
            "std::max<int64_t>({" + ", ".join(v + ".blockDim" for _, v, _ in tds) + "})"
        ws = " + ".join(f"{v}.workspaceBytes * {v}.blockDim" for _, v, _ in tds)
        body.append(f"  if (({ws}) > 0) aclrtMalloc(&work[{ui}], {ws}, ACL_MEM_MALLOC_HUGE_FIRST);")
        args = []
        for nid, _, ti in tds:
            n = p.node(nid)
            args += [f"(GM_ADDR){bufs[p.tensor_node(n.args[q.name]).storage]}"
                     for q in n.kernel.params if q.is_tensor]
        if len(unit) == 1:
            entry = named[unit[0]].name
            call_args = args + [f"(GM_ADDR)work[{ui}]", f"(GM_ADDR)tilings[{tds[0][2]}]"]
        else:
            entry = f"k31_group_{name}_{_ident(first.attrs['group'])}"
            call_args = args + [f"(GM_ADDR)work[{ui}]"] + [f"(GM_ADDR)tilings[{ti}]" for _, _, ti in tds]
            groups.append(_group_entry(p, entry, unit, named))
        decls.append(_entry_decl(p, entry, unit))
        body.append(f"  {entry}<<<static_cast<uint32_t>({block}), nullptr, s[{sid}]>>>(")
        body.append("      " + ", ".join(call_args) + ");")
        for nid in unit:
            for e in p.node(nid).attrs.get("record", []):
                body.append(f"  aclrtRecordEvent({e}, s[{sid}]);")
    if len(streams) > 1:
        body.append("  // join: stream0 waits for every side stream")
        for sid in streams[1:]:
            body.append(f"  aclrtEvent join{sid} = nullptr;")
            body.append(f"  aclrtCreateEvent(&join{sid});")
            body.append(f"  aclrtRecordEvent(join{sid}, s[{sid}]);")
            body.append(f"  aclrtStreamWaitEvent(stream0, join{sid});")
    body.append("  aclError rc = aclrtSynchronizeStream(stream0);")
    body.append(f"  for (int i = 0; i < {tcount}; ++i) if (tilings[i]) aclrtFree(tilings[i]);")
    body.append(f"  for (int i = 0; i < {len(units)}; ++i) if (work[i]) aclrtFree(work[i]);")
    for e in events:
        body.append(f"  aclrtDestroyEvent({e});")
    if len(streams) > 1:
        body.append("  aclrtDestroyEvent(fork);")
        for sid in streams[1:]:
            body.append(f"  aclrtDestroyEvent(join{sid});")
            body.append(f"  aclrtDestroyStream(s[{sid}]);")
    body.append("  return rc == ACL_SUCCESS ? 0 : 1;")
    body.append("}")
    host.append("#include <algorithm>")
    host += sorted(set(decls))
    host += body
    return {f"{name}_host.cpp": "\n".join(host) + "\n", f"{name}_groups.cpp": "\n\n".join(groups) + "\n"}


def _entry_params(p, unit: list[str]) -> list[str]:
    out = []
    for i, nid in enumerate(unit):
        out += [f"GM_ADDR k{i}_{q.name}" for q in p.node(nid).kernel.params if q.is_tensor]
    return out


def _entry_decl(p, entry: str, unit: list[str]) -> str:
    tilings = ["GM_ADDR tiling"] if len(unit) == 1 else [f"GM_ADDR tiling{i}" for i in range(len(unit))]
    return (f'extern "C" __global__ __aicore__ void {entry}(' +
            ", ".join(_entry_params(p, unit) + ["GM_ADDR workspace"] + tilings) + ");")


def _group_kernels(p, unit: list[str]) -> dict:
    """nid -> the kernel the code runs under its emitted name. Two calls may be specialisations of
    one kernel (linear_rows at two tile sizes): the emitted class, tiling and files are named
    after the kernel, so every specialisation after a name's first (by its IR text) gets a suffix
    (`linear_rows_v1`), or the last one's code would run for all of them. Used for a launch
    group's entry and, over the whole program, for the host code of a CANN build."""
    import dataclasses

    from k31dsl.dsl.text import print_kernel
    out, seen = {}, {}
    for nid in unit:
        k = p.node(nid).kernel
        texts = seen.setdefault(k.name, [])
        text = print_kernel(k)
        if text not in texts:
            texts.append(text)
        i = texts.index(text)
        out[nid] = k if i == 0 else dataclasses.replace(k, name=f"{k.name}_v{i}")
    return out


def _group_entry(p, entry: str, unit: list[str], kernels: dict | None = None, ids: bool = True) -> str:
    """One kernel entry running the group's sub-kernels with a grid barrier between them
    (`kernels`: nid -> kernel to run, default the node's; `ids`: name the group and nodes in comments)."""
    kernels = kernels or {nid: p.node(nid).kernel for nid in unit}
    what = f"{p.node(unit[0]).attrs['group']}: {' then '.join(unit)}" if ids else \
        ": " + " then ".join(kernels[nid].name for nid in unit)
    lines = [f"// launch group {what}; every block reaches each",
             "// SyncAll(), so a sub-kernel starts only when the previous one has finished everywhere.",
             f'extern "C" __global__ __aicore__ void {entry}(' +
             ", ".join(_entry_params(p, unit) + ["GM_ADDR workspace"] + [f"GM_ADDR tiling{i}" for i in range(len(unit))]) + ") {"]
    for i, nid in enumerate(unit):
        k = kernels[nid]
        args = [f"k{i}_{q.name}" for q in k.params if q.is_tensor] + ["workspace", f"tiling{i}"]
        if i:
            lines.append("  AscendC::SyncAll();")
        lines.append(f"  {{ K31Kernel_{k.name} op{i}; op{i}.Init({', '.join(args)}); op{i}.Process(); }}" +
                     (f"   // {nid}" if ids else ""))
    lines.append("}")
    return "\n".join(lines)


def _default_cores() -> int:
    from k31dsl.targets.ascendc.runtime import DEFAULT_CORES
    return DEFAULT_CORES


def _build_group(p, unit: list[str], cores: int, opt: str | None = None):
    """The group's SyncAll entry built for the emulator with the program's static shapes and
    scalars baked into the tilings: a callable taking the tensors' data pointers (members' tensor
    parameters in order) that returns the launch status. Optimisation level as single kernels
    (runtime.build): `opt`, else K31_ASCENDC_OPT, else build.BASE_FLAGS' -O2. The entry is named
    by the source's content, which names no program, group or node: groups that are the same
    code (one per KDA layer of a model step) are one g++ build."""
    import ctypes
    import hashlib
    import os

    from k31dsl.lowering.pipeline import run_pipeline
    from k31dsl.targets.ascendc import build as emu_build
    from k31dsl.targets.ascendc.emit import emit_all
    from k31dsl.targets.ascendc.runtime import translation_unit
    entry = "k31_group_ENTRY"          # the content hash replaces it below
    files: dict[str, str] = {}
    kernels = _group_kernels(p, unit)
    for nid in unit:
        files.update(emit_all(run_pipeline(kernels[nid], "ascendc")))
    lines = ['#include "kernel_operator.h"']
    lines += [f'#include "{k}_kernel.cpp"' for k in dict.fromkeys(kernels[n].name for n in unit)]
    lines.append(_group_entry(p, entry, unit, kernels, ids=False))
    lines.append(f'extern "C" int k31_launch_{entry}(void** ptrs) {{')
    lines.append(f"  const int64_t cores = {cores};")
    for i, nid in enumerate(unit):
        lines += _tiling(p, nid, f"td{i}", {}, kernels[nid])
    tds = [f"td{i}" for i in range(len(unit))]
    lines.append("  int64_t blocks = 0, work = 0;")
    for t in tds:
        lines.append(f"  blocks = std::max<int64_t>(blocks, {t}.blockDim);")
        lines.append(f"  work = std::max<int64_t>(work, {t}.workspaceBytes * {t}.blockDim);")
    lines.append("  if (blocks <= 0) return 0;")
    lines.append("  std::vector<uint8_t> workspace(static_cast<size_t>(work) + 32);")
    n = sum(1 for nid in unit for q in p.node(nid).kernel.params if q.is_tensor)
    args = [f"reinterpret_cast<GM_ADDR>(ptrs[{i}])" for i in range(n)] + ["workspace.data()"]
    args += [f"reinterpret_cast<GM_ADDR>(&{t})" for t in tds]
    lines.append(f"  return k31emu::Launch(static_cast<uint32_t>(blocks), [&]() {{ {entry}({', '.join(args)}); }});")
    lines.append("}")
    files[f"{entry}_emu.cpp"] = "#include <algorithm>\n#include <vector>\n" + "\n".join(lines) + "\n"
    opt = opt or os.environ.get("K31_ASCENDC_OPT", "")
    src = translation_unit(files, entry)
    named = "k31_group_" + hashlib.sha256(src.encode()).hexdigest()[:16]
    lib = emu_build.build(src.replace(entry, named), name=named,
                          extra_flags=(*((opt,) if opt else ()), "-fwrapv", "-ffp-contract=off"))
    fn = getattr(lib, f"k31_launch_{named}")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def launch(ptrs) -> int:
        return fn(ptrs)
    launch.last_error = lambda: emu_build.last_error(lib)
    launch.source = files[f"{entry}_emu.cpp"].replace(entry, named)
    return launch
