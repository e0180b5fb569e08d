"""The compile cache: hit, miss, corrupt or truncated entries rebuilt, concurrent writers, keys,
`k31dsl cache info|clear`, and the generated-module loader going through it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from k31dsl.lowering.cache import Cache, key


@pytest.fixture
def cache(tmp_path):
    return Cache(tmp_path / "c")


def test_miss_then_hit(cache):
    calls = []
    build = lambda: calls.append(1) or "print('hi')\n"      # noqa: E731
    p1 = cache.get_or_build("gen", "m.py", build, "k1")
    p2 = cache.get_or_build("gen", "m.py", build, "k1")
    assert p1 == p2 and p1.read_text() == "print('hi')\n" and len(calls) == 1
    assert cache.stats["misses"] == 1 and cache.stats["hits"] == 1
    meta = json.loads((p1.parent / "m.py.sum").read_text())
    assert meta["bytes"] == 12 and meta["key"] == "k1"


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_sum", "bad_sum"])
def test_damaged_entry_is_detected_and_rebuilt(cache, damage):
    data = os.urandom(4096)
    path = cache.get_or_build("bin", "lib.so", lambda: data)
    if damage == "truncate":
        path.write_bytes(data[:1000])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "no_sum":
        (path.parent / "lib.so.sum").unlink()
    else:
        (path.parent / "lib.so.sum").write_text("{not json")
    assert cache.read("bin", "lib.so") is None and cache.stats["corrupt"] == 1
    rebuilt = []
    path = cache.get_or_build("bin", "lib.so", lambda: rebuilt.append(1) or data)
    assert rebuilt == [1] and path.read_bytes() == data and cache.read("bin", "lib.so") == data


def test_entry_being_written_is_not_deleted_by_a_reader(cache):
    """An entry whose data is in place but whose checksum is not yet (another process between its
    two atomic writes) reads as absent without being deleted; get_or_build's look before its lock
    is that kind of read, and rebuilds under the lock (a damaged entry found there is replaced)."""
    data = os.urandom(2048)
    path = cache.get_or_build("gen", "m.py", lambda: data)
    (path.parent / "m.py.sum").unlink()              # the writer has not written the checksum yet
    assert cache.read("gen", "m.py", discard=False) is None and path.read_bytes() == data
    assert cache.stats["corrupt"] == 0
    rebuilt = []
    assert cache.get_or_build("gen", "m.py", lambda: rebuilt.append(1) or data) == path
    assert rebuilt == [1] and cache.read("gen", "m.py") == data


def test_key_depends_on_ir_target_options_and_version(monkeypatch):
    base = key("kernel k {}", "triton", {"mode": "gpu"})
    assert base == key("kernel k {}", "triton", {"mode": "gpu"})
    assert len({base, key("kernel k { }", "triton", {"mode": "gpu"}), key("kernel k {}", "numpy", {"mode": "gpu"}),
                key("kernel k {}", "triton", {"mode": "interpret"})}) == 4
    import k31dsl.lowering.cache as c
    monkeypatch.setattr(c, "__version__", "9.9.9")
    assert key("kernel k {}", "triton", {"mode": "gpu"}) != base


WORKER = textwrap.dedent("""
    import os, sys, time
    from k31dsl.lowering.cache import Cache
    c = Cache(sys.argv[1])
    def build():
        time.sleep(0.2)                      # long enough for the others to pile up
        return (b"payload-" * 200000)
    p = c.get_or_build("bin", "shared.bin", build)
    ok = p.read_bytes() == b"payload-" * 200000
    print(c.stats["builds"], ok)
""")


def test_concurrent_processes_build_once_and_read_whole_entries(tmp_path):
    root = tmp_path / "shared"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(root)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(ok == "True" for _, ok in outs)
    assert sum(int(b) for b, _ in outs) == 1            # the lock: one process built it
    leftovers = [f.name for f in (root / "bin").iterdir() if f.name.startswith(".tmp-")]
    assert leftovers == []
    assert Cache(root).read("bin", "shared.bin") == b"payload-" * 200000


def test_info_and_clear(cache):
    cache.get_or_build("gen", "a.py", lambda: "x = 1\n")
    cache.get_or_build("gen", "b.py", lambda: "x = 22\n")
    cache.get_or_build("ascendc", "k.so", lambda: b"\x7fELF")
    info = cache.info()
    assert info["entries"] == 3 and info["kinds"]["gen"] == {"entries": 2, "bytes": 13}
    assert info["kinds"]["ascendc"]["bytes"] == 4
    assert cache.clear() == 3 and cache.info()["entries"] == 0


def test_generated_modules_go_through_the_cache(tmp_path, monkeypatch):
    from k31dsl.targets.loader import load_module
    monkeypatch.setenv("K31_CACHE_DIR", str(tmp_path / "k31"))
    src = f"VALUE = {os.getpid()}  # {tmp_path}\n"
    mod = load_module(src, "probe")
    assert mod.VALUE == os.getpid()
    files = sorted(p.name for p in (tmp_path / "k31" / "gen").iterdir())
    assert files[0].startswith("k31gen_probe_") and files[1] == files[0] + ".sum"
    assert Cache(tmp_path / "k31").read("gen", files[0]) == src.encode()


def test_cli_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    from k31dsl.cli import main
    monkeypatch.setenv("K31_CACHE_DIR", str(tmp_path / "cc"))
    Cache(tmp_path / "cc").get_or_build("gen", "a.py", lambda: "x = 1\n")
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["root"] == str(tmp_path / "cc") and info["entries"] == 1
    assert main(["cache", "info"]) == 0
    assert str(tmp_path / "cc") in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert Cache(tmp_path / "cc").info()["entries"] == 0
