"""The compile cache: generated code and builds on disk, keyed by what produced them.

    root = $K31_CACHE_DIR, else $XDG_CACHE_HOME/k31dsl, else ~/.cache/k31dsl
    root/<kind>/<name>          the entry (a generated .py module, a source file, a built library)
    root/<kind>/<name>.sum      {"sha256", "bytes", "key", "version"} of the entry, written after it
    root/.locks/<kind>-<name>.lock   held while one process builds the entry

`key(...)` hashes the IR text, target, options and the k31dsl version; `name` is derived from it
(plus a suffix) unless the caller picks one. Writes are atomic (a temp file in the same folder,
then rename), so a reader never sees half an entry, and concurrent processes that build the same
entry simply both write the same bytes; a lock file per entry keeps them from building twice. A
read checks the payload against its `.sum`: a missing, truncated or corrupt entry is deleted and
rebuilt, never trusted. `k31dsl cache info|clear` reports and empties it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from k31dsl.version import __version__

SUM = ".sum"


def cache_dir() -> Path:
    root = os.environ.get("K31_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "k31dsl"


def key(ir_text: str = "", target: str = "", options: dict | None = None, **extra) -> str:
    """A hex digest of everything the entry depends on (the k31dsl version included)."""
    parts = {"ir": ir_text, "target": target, "options": options or {}, "version": __version__, **extra}
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (POSIX flock; no lock where flock is missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Cache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else cache_dir()
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "builds": 0}

    def path(self, kind: str, name: str) -> Path:
        return self.root / kind / name

    def read(self, kind: str, name: str, discard: bool = True) -> bytes | None:
        """The entry's bytes if present and intact, else None; a damaged entry is deleted unless
        discard=False. get_or_build's first look does not delete: without its lock it may see an
        entry another process is writing (data already in place, checksum not yet), and deleting
        that would pull the file from under the writer (seen in CI: two CP ranks building one
        generated module)."""
        path = self.path(kind, name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(Path(str(path) + SUM).read_text())
            ok = meta["bytes"] == len(data) and meta["sha256"] == _digest(data)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            if not discard:
                return None
            self.stats["corrupt"] += 1
            for p in (path, Path(str(path) + SUM)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            return None
        return data

    def write(self, kind: str, name: str, data: bytes, entry_key: str = "") -> Path:
        path = self.path(kind, name)
        _write_atomic(path, data)
        meta = {"sha256": _digest(data), "bytes": len(data), "key": entry_key, "version": __version__}
        _write_atomic(Path(str(path) + SUM), json.dumps(meta).encode())
        return path

    def get_or_build(self, kind: str, name: str, build: Callable[[], bytes | str], entry_key: str = "") -> Path:
        """The path of an intact entry, building and storing it first when missing or damaged."""
        if self.read(kind, name, discard=False) is not None:
            self.stats["hits"] += 1
            return self.path(kind, name)
        with _locked(self.root / ".locks" / f"{kind}-{name}.lock"):
            if self.read(kind, name) is not None:          # another process built it meanwhile
                self.stats["hits"] += 1
                return self.path(kind, name)
            self.stats["misses"] += 1
            data = build()
            self.stats["builds"] += 1
            return self.write(kind, name, data.encode() if isinstance(data, str) else data, entry_key)

    def text(self, kind: str, name: str, build: Callable[[], str], entry_key: str = "") -> str:
        return self.get_or_build(kind, name, build, entry_key).read_text()

    # ------------------------------------------------------------ maintenance
    def entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.glob("*/*") if p.is_file() and not p.name.endswith(SUM)
                and not p.name.startswith(".tmp-") and not p.parent.name.startswith(".")]

    def info(self) -> dict:
        kinds: dict[str, dict] = {}
        for p in self.entries():
            k = kinds.setdefault(p.parent.name, {"entries": 0, "bytes": 0})
            k["entries"] += 1
            k["bytes"] += p.stat().st_size
        return {"root": str(self.root), "version": __version__, "kinds": kinds,
                "entries": sum(k["entries"] for k in kinds.values()),
                "bytes": sum(k["bytes"] for k in kinds.values())}

    def clear(self) -> int:
        """Remove every entry (and stray temp/lock files); returns the number of entries removed."""
        n = len(self.entries())
        if self.root.is_dir():
            for d in self.root.iterdir():
                if d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)
        return n


def default_cache() -> Cache:
    """A Cache at the current cache_dir() (re-read so K31_CACHE_DIR changes take effect)."""
    root = cache_dir()
    if _DEFAULT[0] is None or _DEFAULT[0].root != root:
        _DEFAULT[0] = Cache(root)
    return _DEFAULT[0]


_DEFAULT: list = [None]
