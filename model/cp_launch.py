"""Process management for context-parallel (CP) runs: start P ranks, connect them with
torch.distributed, bring rank 0's result back, and turn any rank's failure into one K31Error.
It knows nothing of the model math (model/distributed.py does that).

One host, P processes (`k31dsl run --cp P` uses this):

    def work(ctx, tokens):                 # module-level: it is pickled into each rank ("spawn")
        ...                                # ctx.rank, ctx.world, ctx.device, ctx.group, ctx.backend
        return logits                      # rank 0's return value comes back (tensors land on the CPU)
    logits = launch(work, 2, backend="gloo", timeout_s=300, args=(tokens,))

`launch` starts the ranks with torch.multiprocessing (start method "spawn"), serves their
rendezvous store from the calling process (a TCPStore on a free port the OS picks, so two runs
never race for a port; MASTER_ADDR/MASTER_PORT are set in each rank for code that reads them), and
calls `init_process_group(backend, rank, world_size, timeout=timeout_s)` in each. Backend "gloo"
runs on the CPU; "nccl" gives rank r the GPU cuda:r and keeps NVLink multicast off in every rank
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).

Faults, and how long they take to surface (no run hangs):
  * a rank raises: it writes its traceback for the parent and exits at once;
  * a rank dies (killed, os._exit, a crash): the parent sees its process end at once;
  * in both cases the parent waits FAILURE_GRACE_S for the other ranks' own errors (to tell the
    cause from its victims: ranks whose collective broke because a peer left), then terminates
    the survivors (SIGTERM, SIGKILL after TERM_GRACE_S) and raises a K31Error naming the failing
    rank and its error (its traceback, or its exit code / signal). Bound: the failure's exit
    + FAILURE_GRACE_S + TERM_GRACE_S (about 5 s);
  * a rank that hangs outside any collective while its peers wait in one: the peers' collective
    fails after `timeout_s` (init_process_group's timeout), which is then a failure as above
    (on NCCL, torch's watchdog aborts the process: a death). Bound: timeout_s + 5 s. `deadline_s` bounds the whole run as well, if given;
  * ranks still running `timeout_s` after rank 0 returned its result are a failure too;
  * the parent interrupted (Ctrl-C) or killed: the ranks are terminated, and each rank also
    exits by itself within a second of finding its parent gone.

Several hosts: torchrun starts the processes and provides RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; `from_env()` builds the same context from them (rank r on
cuda:LOCAL_RANK with NCCL when CUDA is there, gloo otherwise), so a script runs the same worker:

    # cp_job.py
    from k31dsl.model.cp_launch import from_env
    ctx = from_env(timeout_s=600)          # init_process_group from torchrun's variables
    result = work(ctx, tokens)             # every rank; rank 0 keeps the result
    ctx.close()

    # on each of 2 hosts with 8 GPUs (host0 reachable from host1 on port 29500):
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank {0|1} \\
             --master-addr host0 --master-port 29500 cp_job.py

`k31dsl run --cp P` does this itself when torchrun started it (each process is one rank):

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank {0|1} --master-addr host0 --master-port 29500 \\
             -m k31dsl run --cp 16 --config small --target triton --weights small.safetensors

torchrun restarts or stops the group when a process fails (its own fault handling); `handshake`
below works the same under either launcher.

Before any work the ranks must agree on the model: `handshake(config, weights, group)`
all-gathers each rank's config digest and weights fingerprint and raises a K31Error on every rank
naming the ranks that differ and how (config, or weights and which tensors).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_exits
from pathlib import Path

import torch

from k31dsl.dsl.errors import K31Error

BACKENDS = ("gloo", "nccl")
FAILURE_GRACE_S = 2.0       # after the first failure: time for the others to report their own errors
TERM_GRACE_S = 3.0          # SIGTERM -> SIGKILL for survivors
CLOSE_WAIT_S = 10.0         # the longest a finished rank waits for its process group's teardown
POLL_S = 0.5                # how often the parent looks at its deadline / a rank at its parent
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class RankContext:
    """What a worker gets: its rank, the world size, its device, the process group (the default
    group) and the backend."""
    rank: int
    world: int
    device: torch.device
    group: object
    backend: str
    local_rank: int = 0

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------- one host: launch

def launch(worker, ranks: int, *, backend: str = "gloo", timeout_s: float = 300.0, args=(),
           threads: int | None = None, deadline_s: float | None = None):
    """Run `worker(ctx, *args)` on `ranks` processes of this host; returns rank 0's return value.
    `worker` and `args` must be picklable (a module-level function). `threads`: torch intra-op
    threads per rank (default: OMP_NUM_THREADS, else this host's cores shared out, at least 1).
    `timeout_s`: each collective's timeout. Any rank's failure -> K31Error (the module docstring
    gives the time bounds)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise K31Error(f"launch: ranks must be an int >= 1, got {ranks!r}")
    if backend not in BACKENDS:
        raise K31Error(f"launch: backend must be one of {BACKENDS}, got {backend!r}")
    if not timeout_s > 0:
        raise K31Error(f"launch: timeout_s must be > 0, got {timeout_s!r}")
    if backend == "nccl":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < ranks:
            raise K31Error(f"launch: NCCL with {ranks} ranks needs {ranks} GPUs (one per rank); this host has {have}",
                           hint="use fewer ranks, or backend='gloo' on the CPU")
    if threads is None:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else max(1, (os.cpu_count() or 1) // ranks)
    import torch.distributed as dist
    import torch.multiprocessing as mp
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    spec = _Spec(ranks, backend, "127.0.0.1", store.port, float(timeout_s), int(threads), os.getpid())
    with tempfile.TemporaryDirectory(prefix="k31-cp-") as tmp:
        spawn = mp.get_context("spawn")
        procs = [spawn.Process(target=_rank_main, args=(r, spec, tmp, worker, tuple(args)),
                               name=f"k31-cp-rank{r}") for r in range(ranks)]
        try:
            for p in procs:
                try:
                    p.start()
                except (pickle.PicklingError, AttributeError, TypeError) as e:
                    raise K31Error(f"launch: the worker and its args must be picklable ({e})",
                                   hint="a module-level function, and args of plain data / tensors") from None
            failures, done = _watch(procs, tmp, deadline_s, timeout_s)
        finally:
            _terminate(procs)
            del store
        if failures:
            raise K31Error(_describe(failures, done, ranks), hint=_hint(failures))
        path = Path(tmp) / "result.pt"
        if not path.is_file():
            raise K31Error("launch: rank 0 ended without a result (internal)")
        return torch.load(path, map_location="cpu", weights_only=False)


@dataclass(frozen=True)
class _Spec:
    world: int
    backend: str
    addr: str
    port: int
    timeout_s: float
    threads: int
    parent_pid: int

    def env(self, rank: int) -> dict:
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(self.world), "MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port)}
        if self.backend == "nccl":
            env.update(NO_MULTICAST_ENV)
        return env


def _rank_main(rank: int, spec: _Spec, tmp: str, worker, args) -> None:
    """A rank's process: connect, run the worker, leave the result or the error for the parent,
    and exit at once (os._exit: no exit hook may wait on a peer that is gone)."""
    code = 0
    try:
        os.environ.update(spec.env(rank))
        _watch_parent(spec.parent_pid)
        torch.set_num_threads(spec.threads)
        ctx = _connect(rank, spec)
        result = worker(ctx, *args)
        if rank == 0:
            part = Path(tmp) / "result.pt.part"
            torch.save(result, part)
            part.rename(Path(tmp) / "result.pt")
        # Tear the group down, but never wait long on it (an NCCL teardown can block on peers
        # that have already left); os._exit below ends the process either way.
        closer = threading.Thread(target=ctx.close, name="k31-cp-close", daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT_S)
    except BaseException as e:            # noqa: BLE001 - every failure goes to the parent
        code = 1
        _write_error(Path(tmp), rank, e)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:             # noqa: BLE001
                pass
        os._exit(code)


def _connect(rank: int, spec: _Spec) -> RankContext:
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    device = torch.device("cpu")
    if spec.backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    store = dist.TCPStore(spec.addr, spec.port, spec.world, False, timeout=timeout)
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world, timeout=timeout)
    return RankContext(rank, spec.world, device, dist.group.WORLD, spec.backend, local_rank=rank)


def _watch_parent(parent_pid: int) -> None:
    """Exit when the launching process is gone (killed before it could terminate this rank)."""
    def loop():
        while True:
            time.sleep(POLL_S)
            if os.getppid() != parent_pid:
                os._exit(3)
    threading.Thread(target=loop, name="k31-cp-parent-watch", daemon=True).start()


def is_comm_error(e: BaseException) -> bool:
    """A collective that broke (a peer left, a timeout): a victim's error, not a cause."""
    import torch.distributed as dist
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "gloo/transport",
                                   "ProcessGroupGloo", "ProcessGroupNCCL", "NCCL error", "Timed out waiting",
                                   "Socket Timeout", "Broken pipe"))


def _write_error(tmp: Path, rank: int, e: BaseException) -> None:
    record = {"rank": rank, "time": time.time(), "type": type(e).__name__, "message": str(e),
              "k31": isinstance(e, K31Error), "comm": is_comm_error(e),
              "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))}
    part = tmp / f"error{rank}.json.part"
    part.write_text(json.dumps(record))
    part.rename(tmp / f"error{rank}.json")


# ---------------------------------------------------------------- the parent's watch

def _watch(procs, tmp: str, deadline_s: float | None, after_root_s: float):
    """Wait for every rank to end; on the first failure wait FAILURE_GRACE_S more for the others'
    errors; once rank 0 has its result the others get `after_root_s` more. Returns
    ({rank: failure record} (empty: all ranks succeeded), ranks that succeeded)."""
    t_end = None if deadline_s is None else time.monotonic() + deadline_s
    why = {"deadline": deadline_s}
    live = dict(enumerate(procs))
    failures: dict = {}
    done: set = set()
    grace_end = None
    while live:
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            break
        if t_end is not None and now >= t_end and grace_end is None:
            for r in live:
                failures[r] = {"rank": r, **why, "time": time.time()}
            break
        limits = [POLL_S] + [x - now for x in (t_end, grace_end) if x is not None]
        wait_for_exits([p.sentinel for p in live.values()], timeout=max(0.0, min(limits)))
        for r, p in list(live.items()):
            if p.exitcode is None:
                continue
            del live[r]
            if p.exitcode == 0:
                done.add(r)
                if r == 0 and live and (t_end is None or t_end > time.monotonic() + after_root_s):
                    t_end, why = time.monotonic() + after_root_s, {"after_root": after_root_s}
            else:
                failures[r] = _failure_of(r, p.exitcode, Path(tmp))
                if grace_end is None:
                    grace_end = time.monotonic() + FAILURE_GRACE_S
    return failures, done


def _failure_of(rank: int, exitcode: int, tmp: Path) -> dict:
    path = tmp / f"error{rank}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
    return {"rank": rank, "exitcode": exitcode, "time": time.time()}


def _terminate(procs) -> None:
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    for p in alive:
        p.terminate()
    t_end = time.monotonic() + TERM_GRACE_S
    for p in alive:
        p.join(max(0.0, t_end - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(TERM_GRACE_S)


def _cause_order(f: dict):
    # The cause first: an error of the rank's own, then a death, then a broken collective / deadline.
    if "message" in f and not f.get("comm"):
        kind = 0
    elif "exitcode" in f:
        kind = 1
    else:
        kind = 2
    return kind, f.get("time", 0.0), f["rank"]


def _what(f: dict) -> str:
    if "deadline" in f:
        return f"was still running at the run's deadline ({f['deadline']:g} s)"
    if "after_root" in f:
        return f"was still running {f['after_root']:g} s after rank 0 had finished"
    if "exitcode" in f:
        code = f["exitcode"]
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"died from {name}"
        return f"exited with code {code} without raising (os._exit or a crash)"
    if f.get("k31"):
        return f"refused: {f['message']}"
    return f"raised {f['type']}: {f['message']}\n{f['traceback'].rstrip()}"


def _describe(failures: dict, done: set, world: int) -> str:
    ordered = sorted(failures.values(), key=_cause_order)
    cause = ordered[0]
    lines = [f"context-parallel run ({world} ranks) failed: rank {cause['rank']} {_what(cause)}"]
    same = [f["rank"] for f in ordered[1:] if f.get("k31") and f.get("message") == cause.get("message")]
    if same:
        lines.append(f"(rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))} refused the same way)")
    for f in ordered[1:]:
        if f["rank"] in same:
            continue
        head = _what(f).splitlines()[0]            # victims: one short line each
        lines.append(f"then rank {f['rank']} {head[:200]}{'…' if len(head) > 200 else ''}")
    others = sorted(set(range(world)) - set(failures) - done)
    if others:
        lines.append(f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
                     f"{'were' if len(others) > 1 else 'was'} stopped")
    return "\n".join(lines)


def _hint(failures: dict) -> str | None:
    cause = sorted(failures.values(), key=_cause_order)[0]
    if "deadline" in cause or "after_root" in cause:
        return "look for a rank that hangs (or raise the deadline / timeout)"
    if cause.get("comm"):
        return "a collective failed or timed out: a peer may have hung or the network failed"
    return None


# ---------------------------------------------------------------- several hosts: torchrun

def from_env(backend: str | None = None, timeout_s: float = 300.0) -> RankContext:
    """The context of a process started by torchrun (or anything that sets RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT): init_process_group from those variables. backend None:
    NCCL on cuda:LOCAL_RANK when CUDA is there, else gloo."""
    import torch.distributed as dist
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise K31Error(f"from_env: {', '.join(missing)} not set; this process was not started by torchrun",
                       hint="torchrun --nproc-per-node P script.py, or launch() on one host")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in BACKENDS:
        raise K31Error(f"from_env: backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device("cpu")
    if backend == "nccl":
        for k, v in NO_MULTICAST_ENV.items():
            os.environ.setdefault(k, v)
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return RankContext(rank, world, device, dist.group.WORLD, backend, local_rank=local)


# ---------------------------------------------------------------- agreeing on the model

_P1, _P2 = 2147483647, 2147483629              # primes < 2^31: a 16-bit word's change d (0 < |d| < 2^16) is never 0 mod p
_A1, _A2 = 48271, 1_000_003                     # multipliers of the word positions
_CHUNK = 1 << 24                                # words per pass (bounds the int64 temporaries)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as 16-bit words (a zero byte appended to an odd count)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8)
    if raw.numel() % 2:
        raw = torch.cat([raw, raw.new_zeros(1)])
    return raw.view(torch.int16)


def _multipliers(device, n: int) -> torch.Tensor:
    """int64 [2, n]: word j's multiplier mod each prime, in [1, p) (so never 0 mod p)."""
    j = torch.arange(n, dtype=torch.int64, device=device)
    return torch.stack([(j + 1) * _A1 % _P1, j * _A2 % (_P2 - 1) + 1])


def _checksums(words: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    """Two position-weighted sums of 16-bit words mod two primes: int64 [2] on the words' device.
    Word j of chunk k weighs mult[:, j] * (k + 1). One changed word (0 < |d| < 2^16) always changes
    both sums (d * c * (k + 1) != 0 mod p); several changed words collide with probability ~1/p.
    No overflow: w * c < 2^47, a chunk's sum < 2^55, the running sum + s * (k + 1) < 2^62."""
    primes = torch.tensor([[_P1], [_P2]], dtype=torch.int64, device=words.device)
    out = torch.zeros(2, dtype=torch.int64, device=words.device)
    for k, start in enumerate(range(0, words.numel(), _CHUNK)):
        w = words[start:start + _CHUNK].to(torch.int64) + 32768                      # [0, 2^16)
        part = (w * mult[:, :w.numel()] % primes).sum(dim=1) % primes[:, 0]
        out = (out + part * (k + 1)) % primes[:, 0]
    return out


def tensor_fingerprints(weights: dict) -> dict[str, str]:
    """name -> a 16-hex hash of the tensor's shape, dtype and content checksums."""
    names = sorted(weights)
    words = {n: _words(weights[n]) for n in names}
    mults: dict = {}                # device -> multipliers for the longest chunk there (shared by all tensors)
    for w in words.values():
        n = min(_CHUNK, w.numel())
        if w.device not in mults or n > mults[w.device].shape[1]:
            mults[w.device] = _multipliers(w.device, n)
    sums = [_checksums(words[n], mults[words[n].device]) for n in names]
    values = torch.stack([s.to(sums[0].device) for s in sums]).cpu().tolist() if sums else []   # one sync
    out = {}
    for n, (s1, s2) in zip(names, values):
        t = weights[n]
        key = f"{n}|{tuple(t.shape)}|{t.dtype}|{s1}|{s2}"
        out[n] = hashlib.sha256(key.encode()).hexdigest()[:16]
    return out


def weights_fingerprint(weights: dict, per_tensor: dict | None = None) -> str:
    """A hash of the weights: sorted names, shapes, dtypes and two position-weighted checksums of
    each tensor's content (a few elementwise passes on the tensor's device; no per-element
    Python). One changed element always changes it."""
    per_tensor = tensor_fingerprints(weights) if per_tensor is None else per_tensor
    h = hashlib.sha256()
    for n in sorted(per_tensor):
        h.update(f"{n}={per_tensor[n]};".encode())
    return h.hexdigest()[:16]


def handshake(config, weights: dict, group=None) -> None:
    """Every rank calls this before any work: all-gathers (config digest, weights fingerprint) and
    raises a K31Error on every rank, naming the ranks that differ from rank 0 and how, if they do
    not all agree. `group`: a ProcessGroup, an object with `.group` (a Communicator), or None (the
    default group; a single process without torch.distributed agrees with itself)."""
    import torch.distributed as dist
    group = getattr(group, "group", group)
    if not dist.is_initialized():
        return
    per_tensor = tensor_fingerprints(weights)
    mine = {"config": config.digest(), "weights": weights_fingerprint(weights, per_tensor), "tensors": per_tensor,
            "rank": dist.get_rank()}
    world = dist.get_world_size(group)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    ref = everyone[0]
    problems = []
    for info in everyone[1:]:
        how = []
        if info["config"] != ref["config"]:
            how.append(f"config digest {info['config']} vs {ref['config']}")
        if info["weights"] != ref["weights"]:
            a, b = info["tensors"], ref["tensors"]
            differ = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
            shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
            how.append(f"weights fingerprint {info['weights']} vs {ref['weights']} (tensors {shown})")
        if how:
            problems.append(f"rank {info['rank']}: " + "; ".join(how))
    if problems:
        raise K31Error(f"the ranks do not run the same model; differing from rank 0: {' | '.join(problems)}",
                       hint="every rank must load the same config and weights (same file, or same --seed)")
