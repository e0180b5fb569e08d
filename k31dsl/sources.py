"""Where `k31dsl compile` gets kernels from: a Python file imported from its path (its
@k.kernel functions, also those kept in tables by factories), a folder of such files, or a `.k31`
text file; plus `--constexpr NAME=VALUE` parsing. Every failure is a K31Error at the user's line."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

from k31dsl.dsl.errors import K31Error, Loc, error


def _user_frame_loc(exc: BaseException, path: Path) -> Loc | None:
    """The deepest traceback frame inside the user's file, as a Loc."""
    loc = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and Path(frame.filename).resolve() == path.resolve():
            loc = Loc(frame.filename, frame.lineno or 0, 0)
    return loc


def _package_module_name(path: Path) -> str | None:
    """`ops/quant.py` (or `ops/dsa/attention.py`) of this checkout is `k31dsl.ops.quant`
    (`k31dsl.ops.dsa.attention`): import it under that name so that relative imports work and
    its ops do not register twice."""
    target = path.resolve()
    for name in ("k31dsl.dsl", "k31dsl.ops", "k31dsl.model", "k31dsl.lowering", "k31dsl.targets", "k31dsl"):
        try:
            pkg = importlib.import_module(name)
        except ImportError:
            continue
        for d in getattr(pkg, "__path__", []):
            root = Path(d).resolve()
            if not target.is_relative_to(root):
                continue
            parts = target.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            folders = [root.joinpath(*parts[:i]) for i in range(1, len(parts))]
            if all((f / "__init__.py").is_file() for f in folders):
                return ".".join((name, *parts))
    return None


def import_path(path: Path):
    """Import a Python file as a module; errors while running it become K31Errors at their line."""
    if not path.is_file():
        raise K31Error(f"{path}: no such file")
    pkg_name = _package_module_name(path)
    try:
        if pkg_name is not None:
            return importlib.import_module(pkg_name)
        name = "k31user_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, str(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.parent))    # sibling imports, as `python FILE` allows
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            sys.path.remove(str(path.parent))
        return module
    except SyntaxError as e:
        loc = Loc(e.filename or str(path), e.lineno or 0, max((e.offset or 1) - 1, 0))
        raise error(f"syntax error: {e.msg}", loc) from None
    except K31Error as e:
        if e.loc is not None:
            raise
        raise error(e.message, _user_frame_loc(e, path), e.hint) from None
    except Exception as e:  # noqa: BLE001 - the user's module-level code failed
        loc = _user_frame_loc(e, path)
        raise error(f"importing {path} raised {type(e).__name__}: {e}", loc,
                    f"run `python {path}` to see the full traceback") from None


def _module_kernel_defs(module) -> list:
    """The KernelDefs a module holds: top-level names, one level into dicts/lists/tuples, and the
    kernels of the ops it registers (the op library builds kernel variants in factories)."""
    from k31dsl.dsl.lang import KernelDef
    from k31dsl.ops.registry import REGISTRY
    found: dict[int, KernelDef] = {}
    candidates = list(vars(module).values())
    candidates += [spec.kernels for spec in REGISTRY.values()
                   if getattr(spec.fn, "__module__", None) == module.__name__]
    for value in candidates:
        items = value.values() if isinstance(value, dict) else (
            value if isinstance(value, (list, tuple)) else [value])
        for item in items:
            if isinstance(item, KernelDef):
                found.setdefault(id(item), item)
    return sorted(found.values(), key=lambda d: (d.file, d.first_line, d.name))


def _kernel_defs(module, path: Path, selected: str | None) -> list:
    kdefs = _module_kernel_defs(module)
    if selected:
        match = [d for d in kdefs if d.name == selected]
        if not match:
            names = ", ".join(d.name for d in kdefs) or "none"
            raise K31Error(f"{path}: no @k.kernel named `{selected}` (kernels here: {names})")
        return match
    own = [d for d in kdefs if Path(d.file).resolve() == path.resolve()]
    if not own:
        raise K31Error(f"{path}: no @k.kernel functions defined in this file",
                       hint="decorate a function with @k.kernel, or name one with PATH::KERNEL")
    return own


def _constexpr_names(kdef) -> list[str]:
    """The constexpr parameters of a kernel (dtype constexprs of `k.Tensor["XT", ...]` included)."""
    return list(kdef.signature().constexprs)


def parse_constexpr(item: str) -> tuple[str, object]:
    """`BD=64` -> ("BD", 64); values are Python literals, true/false, or a dtype name (`XT=bf16`
    or `XT=k.bf16`, e.g. for a dtype constexpr)."""
    from k31dsl.dsl import dtypes as D
    name, eq, text = item.partition("=")
    name, text = name.strip(), text.strip()
    if not eq or not name.isidentifier() or not text:
        raise K31Error(f"--constexpr {item!r}: write NAME=VALUE, e.g. --constexpr BD=64")
    if text in ("true", "false"):
        return name, text == "true"
    if text.removeprefix("k.") in D.BY_NAME:
        return name, D.BY_NAME[text.removeprefix("k.")]
    try:
        return name, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise K31Error(f"--constexpr {item!r}: {text!r} is not a number, true/false or a dtype "
                       f"name ({', '.join(D.BY_NAME)})") from None


def load_kernels(spec: str, constexprs: dict) -> list:
    """Kernel IRs for `PATH[::KERNEL]`: a Python file with @k.kernel functions, a .k31 file, or a
    folder (every kernel of the .py files under it, subfolders included, e.g. `ops/` for the
    whole op library)."""
    path_text, _, selected = spec.partition("::")
    path = Path(path_text)
    if path.suffix == ".k31":
        return _load_k31(path, selected, constexprs)
    if path.is_dir():
        kdefs = []
        for file in sorted(f for f in path.rglob("*.py") if "__pycache__" not in f.parts):
            kdefs += [d for d in _module_kernel_defs(import_path(file))
                      if Path(d.file).resolve() == file.resolve()]
        if selected:
            kdefs = [d for d in kdefs if d.name == selected]
        if not kdefs:
            what = f"a kernel named `{selected}`" if selected else "@k.kernel functions"
            raise K31Error(f"{path}: no .py file in this folder defines {what}")
    elif path.suffix != ".py":
        raise K31Error(f"{path}: expected a Python file (.py) with @k.kernel functions, a .k31 IR "
                       "file or a folder of Python files")
    else:
        kdefs = _kernel_defs(import_path(path), path, selected or None)
    known = {d.name: _constexpr_names(d) for d in kdefs}
    for name in constexprs:
        if not any(name in names for names in known.values()):
            have = "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in known.items())
            raise K31Error(f"--constexpr {name}: no selected kernel has a constexpr named {name} "
                           f"(constexprs by kernel: {have})")
    return [d.ir(**{n: v for n, v in constexprs.items() if n in known[d.name]}) for d in kdefs]


def _load_k31(path: Path, selected: str, constexprs: dict) -> list:
    if constexprs:
        raise K31Error(f"{path}: a .k31 kernel is already specialised; --constexpr applies to "
                       "Python sources")
    if not path.is_file():
        raise K31Error(f"{path}: no such file")
    try:
        from k31dsl.dsl.parse import parse_file
    except ImportError:
        raise K31Error("the .k31 parser (dsl/parse.py) is not built yet") from None
    parsed = parse_file(str(path))
    kernels = list(parsed) if isinstance(parsed, (list, tuple)) else [parsed]
    if selected:
        match = [k for k in kernels if k.name == selected]
        if not match:
            names = ", ".join(k.name for k in kernels)
            raise K31Error(f"{path}: no kernel named `{selected}` (kernels here: {names})")
        kernels = match
    return kernels
