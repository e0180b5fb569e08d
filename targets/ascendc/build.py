"""Build AscendC C++ (generated or hand-written) against the k31emu CPU emulation header into a
shared library and load it with ctypes.

Libraries live in the shared compile cache (lowering/cache.py: `<K31_CACHE_DIR or
~/.cache/k31dsl>/ascendc/`, atomic writes, a checksum per entry, a lock per build) under the
content hash of the sources, the compiler flags, the compiler version and every emulator header,
so an edit to any of them rebuilds.  Concurrent processes never load a half-written file; a
cached .so that is corrupt (checksum) or fails to load is rebuilt.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from k31dsl.dsl.errors import K31Error
from k31dsl.lowering.cache import default_cache

EMU_DIR = Path(__file__).resolve().parent / "emu"
BASE_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")
MAX_DIAG_LINES = 80

_loaded: dict[str, ctypes.CDLL] = {}


def compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise K31Error(f"the AscendC emulator needs a C++17 compiler, and '{cxx}' was not found",
                       hint="install g++ (apt-get install g++) or point $CXX at one")
    return cxx


@functools.lru_cache(maxsize=None)
def _compiler_id(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def _header_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(EMU_DIR.glob("*.h")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


KIND = "ascendc"


def _key(sources: Sequence[str], flags: Sequence[str], cxx: str) -> str:
    h = hashlib.sha256()
    for s in sources:
        h.update(s.encode())
        h.update(b"\0")
    h.update(" ".join(flags).encode())
    h.update(_compiler_id(cxx).encode())
    h.update(_header_digest().encode())
    return h.hexdigest()[:24]


def _compile(src_paths: list[Path], flags: Sequence[str], cxx: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="k31emu-") as tmpdir:
        out = Path(tmpdir) / "lib.so"
        cmd = [cxx, *flags, "-I", str(EMU_DIR), *map(str, src_paths), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).splitlines()
            shown = lines[:MAX_DIAG_LINES]
            if len(lines) > len(shown):
                shown.append(f"... ({len(lines) - len(shown)} more lines)")
            raise K31Error(
                "g++ could not compile the AscendC kernel against the k31emu emulator:\n"
                + "\n".join(shown),
                hint=f"source: {' '.join(map(str, src_paths))}; flags: {' '.join(flags)}")
        return out.read_bytes()


def build(sources: str | Iterable[str], name: str = "kernel",
          extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile C++ source text(s) (each including "kernel_operator.h") into one shared library
    and return it loaded.  Errors in the source become a K31Error quoting g++'s diagnostics."""
    srcs = [sources] if isinstance(sources, str) else list(sources)
    cxx = compiler()
    flags = (*BASE_FLAGS, *extra_flags)
    key = _key(srcs, flags, cxx)
    if key in _loaded:
        return _loaded[key]
    cache = default_cache()
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:40] or "kernel"
    src_paths = [cache.get_or_build(KIND, f"{stem}-{key}-{i}.cpp", lambda t=text: t, key)
                 for i, text in enumerate(srcs)]
    so_name = f"{stem}-{key}.so"
    so = cache.get_or_build(KIND, so_name, lambda: _compile(src_paths, flags, cxx), key)
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:  # intact bytes that still do not load (e.g. another toolchain's): rebuild once
        so = cache.write(KIND, so_name, _compile(src_paths, flags, cxx), key)
        lib = ctypes.CDLL(str(so))
    lib.k31emu_last_error.restype = ctypes.c_char_p
    lib.k31emu_last_error.argtypes = []
    _loaded[key] = lib
    return lib


def last_error(lib: ctypes.CDLL) -> str:
    msg = lib.k31emu_last_error()
    return msg.decode(errors="replace") if msg else ""


def check(lib: ctypes.CDLL, rc: int, what: str = "kernel") -> None:
    """Turn a non-zero emulator launch status into a K31Error carrying the emulator message."""
    if rc != 0:
        raise K31Error(f"AscendC emulator: {what} failed: {last_error(lib) or f'status {rc}'}")


def _arg(a):
    if isinstance(a, ctypes._SimpleCData) or isinstance(a, ctypes.c_void_p):
        return a
    if isinstance(a, bool):
        return ctypes.c_int32(int(a))
    if isinstance(a, int):
        return ctypes.c_int64(a)
    if hasattr(a, "__array_interface__"):
        return ctypes.c_void_p(a.__array_interface__["data"][0])
    if hasattr(a, "data_ptr"):
        return ctypes.c_void_p(a.data_ptr())
    if isinstance(a, (bytes, bytearray)):
        return ctypes.c_char_p(bytes(a))
    raise K31Error(f"cannot pass {type(a).__name__} to an emulated kernel",
                   hint="pass NumPy arrays / torch CPU tensors, ints, or ctypes scalars "
                        "(e.g. ctypes.c_float for a float argument)")


def call(lib: ctypes.CDLL, symbol: str, *args) -> None:
    """Call an `extern "C" int symbol(...)` launch wrapper (one that returns k31emu::Launch's
    status); arrays/tensors pass as pointers, ints as 64-bit (fine for any integer parameter
    on x86-64 and AArch64), other scalars as given ctypes values.  Failure -> K31Error."""
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    rc = fn(*[_arg(a) for a in args])
    check(lib, rc, symbol)
