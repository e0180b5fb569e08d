"""Writing generated Python modules to disk and importing them. Files go to the generated-code
directory (`K31_CACHE_DIR`, default ~/.cache/k31dsl) under their content hash, written
atomically, so concurrent processes and repeated compiles reuse them; Triton needs a real file
to read kernel source from."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("K31_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "k31dsl"
    return base


def gen_dir() -> Path:
    d = cache_dir() / "gen"
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_module(source: str, stem: str):
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"k31gen_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = gen_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod
