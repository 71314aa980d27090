"""Run a function on N gloo ranks (one process each) and fail fast.

Each rank is a fresh process forked from a ``forkserver`` that imported
torch and SGLang once (``cpu_support.ranks.rank_preload``), so a rank starts in
well under a second instead of re-importing them, yet holds no state a rank
before it left: no compiled frame, no process group, no module-level cache.
(A rank whose ``MALLOC_*`` variables differ from the forkserver's is
spawned instead: glibc reads them only at process start.) It runs with the
parent's environment and ``sys.path`` as they are when it starts, calls
:func:`cpu_support.standins.prepare.prepare_cpu_process`, then
``fn(rank, world_size, init_method, *args)``. The parent returns the list of
per-rank results. If any rank raises or dies, the others are killed at once
and the parent raises with that rank's traceback: a dead worker must never
leave a collective hanging.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from multiprocessing import forkserver
from typing import Any, Callable, List

# free_port's one copy; importable from here as before.
from cpu_support.bench.vit_bench_util import free_port


class RankFailed(RuntimeError):
    pass


# What the forkserver imports before it forks any rank.
PRELOAD = "cpu_support.ranks.rank_preload"


# glibc reads these when a process starts, not when it forks: a rank that
# needs other values than the forkserver started with is spawned instead.
_STARTUP_ONLY_PREFIX = "MALLOC_"
_forkserver_startup_env = None


def _startup_env():
    return {k: v for k, v in os.environ.items() if k.startswith(_STARTUP_ONLY_PREFIX)}


def _context():
    global _forkserver_startup_env
    if (
        _forkserver_startup_env is not None
        and _startup_env() != _forkserver_startup_env
    ):
        return mp.get_context("spawn")
    _forkserver_startup_env = _startup_env()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    # Python 3.11's forkserver does not take the parent's sys.path, only its
    # environment: PYTHONPATH names the folder PRELOAD's package lives in.
    here = os.path.dirname(os.path.abspath(__file__))  # cpu_support/ranks
    root = os.path.dirname(os.path.dirname(here))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (before, root) if p)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before
    return ctx


def _child(fn, rank, world_size, init_method, args, kwargs, results, threads, env):
    try:
        # The forkserver's environment is the parent's at its first use.
        os.environ.clear()
        os.environ.update(env)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        from cpu_support.standins.prepare import prepare_cpu_process

        prepare_cpu_process()
        import torch

        torch.set_num_threads(threads)
        value = fn(rank, world_size, init_method, *args, **kwargs)
        # Plain pickle bytes: tensors sent through a multiprocessing queue
        # otherwise travel as shared-memory handles that die with this process.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1)


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 600.0,
    threads_per_rank: int = 1,
    **kwargs: Any,
) -> List[Any]:
    """``[fn(0, ...), fn(1, ...), ...]`` computed on ``world_size`` processes."""
    ctx = _context()
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        ctx.Process(
            target=_child,
            args=(
                fn,
                r,
                world_size,
                init_method,
                args,
                kwargs,
                results,
                threads_per_rank,
                dict(os.environ),
            ),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if (
                        r not in out
                        and not p.is_alive()
                        and p.exitcode not in (0, None)
                    ):
                        # Give a reporting rank a moment to flush its traceback.
                        try:
                            rank, ok, value = results.get(timeout=1.0)
                        except queue.Empty:
                            raise RankFailed(
                                f"rank {r} died with exit code {p.exitcode} "
                                "before reporting a result"
                            ) from None
                        break
                else:
                    if time.monotonic() > deadline:
                        raise RankFailed(
                            f"ranks timed out after {timeout:.0f}s; "
                            f"finished: {sorted(out)}"
                        )
                    continue
            if not ok:
                raise RankFailed(f"rank {rank} failed:\n{value}")
            out[rank] = pickle.loads(value)
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
