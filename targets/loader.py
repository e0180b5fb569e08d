"""Writing generated Python modules to disk and importing them. Files go to the compile cache
(lowering/cache.py: `K31_CACHE_DIR`, default ~/.cache/k31dsl) under kind "gen", named by their
content hash, written atomically with a checksum, so concurrent processes and repeated compiles
reuse them and a damaged file is rewritten; Triton needs a real file to read kernel source from."""
from __future__ import annotations

import hashlib
import importlib.util
import sys


def load_module(source: str, stem: str):
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"k31gen_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    from k31dsl.lowering.cache import default_cache, key
    path = default_cache().get_or_build("gen", f"{name}.py", lambda: source, key(ir_text=source, target=stem))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod
