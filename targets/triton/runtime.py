"""Triton target runtime: emit, write the module to the generated-code cache, import it and call
its launcher. On a GPU a kernel with several `configs` is autotuned: each config, merged with the
constexprs the call fixes (passed by keyword, or dtypes bound from its tensors), is timed once per
(argument-shape key, fixed constexprs) with triton.testing.do_bench (on clones of the arguments, so
that outputs are written once) and the fastest is remembered. Only the configs that agree with what
the call fixes are candidates; with fewer than two there is nothing to tune and the first matching
config's launch options apply, as everywhere off the GPU."""
from __future__ import annotations

from k31dsl.dsl.errors import K31Error, error, naming_the_call
from k31dsl.dsl.ir import Kernel
from k31dsl.targets.common import CompiledKernel, call_signature, check_args, forced_config
from k31dsl.targets.loader import load_module
from k31dsl.targets.triton.emit import LAUNCH_KEYS, detect_mode, emit


def emit_files(kernel: Kernel, **options) -> dict[str, str]:
    return {f"{kernel.name}.py": emit(kernel, **options)}


@naming_the_call
def _check_devices(kernel: Kernel, kdef, args, mode: str):
    import torch
    want = "cpu" if mode == "interpret" else "cuda"
    for p, a in zip(kernel.params, args):
        if p.is_tensor and isinstance(a, torch.Tensor) and a.device.type != want:
            where = p.loc if p.loc.line else kernel.loc
            if mode == "interpret":
                hint = "the Triton interpreter (TRITON_INTERPRET=1 or no GPU) runs on CPU tensors: pass x.cpu()"
            else:
                hint = "move the tensor to the GPU with x.cuda(), or run with TRITON_INTERPRET=1"
            raise error(f"argument `{p.name}` of `{kernel.name}` is on {a.device}, the Triton target in {mode} "
                        f"mode needs {want} tensors", where, hint)


def build(kernel: Kernel, kdef=None, **options):
    options.setdefault("mode", detect_mode())
    src = emit(kernel, **options)
    mod = load_module(src, f"triton_{kernel.name}")
    fn = getattr(mod, kernel.name)
    mode = options["mode"]

    def launch(*args):
        if kdef is not None:
            _check_devices(kernel, kdef, args, mode)
        fn(*args)
    launch.raw = fn              # the generated launcher, for calls whose signature was checked
    launch.source = src
    launch.module = mod
    return launch


class TritonKernel(CompiledKernel):
    """Adds the interpreter/GPU mode to the specialisation key and GPU autotuning over configs."""

    def __init__(self, kdef, **options):
        self.mode = options.get("mode") or detect_mode()
        super().__init__(kdef, "triton", self._build, **options)
        self._tuned: dict = {}
        self.tune_log: dict = {}     # shape key -> [(config, median ms or None if it could not run)]

    def _build(self, kernel: Kernel, **launch):
        return build(kernel, self.kdef, **{**self.options, **launch, "mode": self.mode})

    # Launch keys (num_warps, num_stages) travel with the constexprs of a call so that configs
    # that differ only in them are separate specialisations; the kernel IR never sees them.
    def ir(self, **constexprs) -> Kernel:
        return super().ir(**{k: v for k, v in constexprs.items() if k not in LAUNCH_KEYS})

    def _split(self, args, kwargs):
        launch = {k: kwargs[k] for k in LAUNCH_KEYS if k in kwargs}
        cx, rest = super()._split(args, {k: v for k, v in kwargs.items() if k not in LAUNCH_KEYS})
        return {**cx, **launch}, rest

    def _checked_launcher(self, args, cx: dict):
        kernel = self.ir(**cx)
        check_args(kernel, self.kdef, tuple(args), self.allow_numpy)
        key = tuple(sorted(cx.items()))
        if key not in self._launch:
            self._launch[key] = self._build(kernel, **{k: v for k, v in cx.items() if k in LAUNCH_KEYS})
        return self._launch[key]

    def __call__(self, *args, **kwargs):
        key = call_signature(args, kwargs)
        fast = self._fast.get(key) if key is not None else None
        if fast is not None:
            return fast(*args)
        cx, rest = self._split(args, kwargs)          # passed + dtype constexprs bound from tensors
        if forced_config() is not None:               # K31_CONFIG: that config, no tuning
            cx = self._forced(cx, LAUNCH_KEYS)[0]
        elif self.mode == "gpu" and self._tunable(cx):
            skey = (self._shape_key(args, kwargs), tuple(sorted(cx.items())))
            if skey not in self._tuned:
                if not rest:                          # wrong calls fail as they would untuned
                    kernel = self.ir(**cx)
                    _check_devices(kernel, self.kdef, check_args(kernel, self.kdef, args, False), self.mode)
                self._tuned[skey] = self._autotune(args, rest, cx, skey)
            cx = {**cx, **self._tuned[skey]}
        if rest:                                      # parameters by keyword: the checked slow path
            return self._call_checked(args, rest, cx)
        launch = self._checked_launcher(args, cx)
        _check_devices(self.ir(**cx), self.kdef, args, self.mode)
        if key is not None:
            self._fast[key] = launch.raw
        return launch.raw(*args)

    def _tunable(self, passed: dict) -> bool:
        """Autotune when at least two configs agree with what the call fixed."""
        return len(self._candidates(passed)) >= 2

    @staticmethod
    def _shape_key(args, kwargs):
        def facts(a):
            return (tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") else type(a).__name__
        return tuple(facts(a) for a in args) + tuple((k, facts(v)) for k, v in sorted(kwargs.items()))

    def _autotune(self, args, rest: dict, passed: dict, key=None) -> dict:
        """The constexprs of the fastest config (timed with `passed` merged in), for this call.
        Every config's time goes to tune_log[key] (benchmarks report the losers too)."""
        import torch
        import triton.testing
        best, best_ms, log = None, float("inf"), []
        for cfg in self._candidates(passed):
            cx = {**passed, **cfg}              # launch keys included: each config its own build
            clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            kw = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in rest.items()}
            try:
                ms = triton.testing.do_bench(lambda: CompiledKernel.__call__(self, *clones, **kw, **cx))
            except K31Error:
                raise
            except Exception:  # noqa: BLE001 - a config that cannot run (resources) just loses
                log.append((dict(cfg), None))
                continue
            log.append((dict(cfg), float(ms)))
            if ms < best_ms:
                best, best_ms = dict(cfg), ms
        self.tune_log[key] = log
        if best is None:
            raise error(f"no config of `{self.kdef.name}` could run on this GPU", self.kdef.loc,
                        "add a config with smaller tiles or fewer stages")
        return best


def compile(kdef, **options):  # noqa: A001 - the targets' common entry point
    return TritonKernel(kdef, **options)


__all__ = ["compile", "emit_files", "build"]
