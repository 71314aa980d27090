"""Profiling-only start-up hook: time every vision-tower call of a CPU server.

NOT part of the patch series. ``CpuServer(vit_profile_dir=DIR)`` (and
``cpu_server.py --vit-profile-dir DIR``) puts this directory first on the
server's ``PYTHONPATH`` and sets ``FORK_VIT_PROFILE_DIR=DIR``. Python then
imports this ``sitecustomize`` in every server process; it wraps
``Qwen3VLMoeVisionModel.forward`` (the Qwen3-VL tower, which the DP encoder
calls on each rank with that rank's share) right after the module is
imported, and appends one JSON line per call to ``DIR/calls-<pid>.jsonl``:
images, patches, the images' patch counts, wall seconds, this thread's CPU
seconds and the process's CPU seconds over the call, and the intra-op thread
count. Nothing else is changed; the call's result is returned as it is.

``FORK_VIT_PROFILE_TORCH=N`` additionally runs ``torch.profiler`` (CPU
activities) over the calls with index 10..10+N-1 of each process (after the
warm-up's) and writes the operator table of each to
``DIR/torchprof-<pid>-<call>.txt``.

Another ``sitecustomize`` later on ``sys.path`` (e.g. the ROCm gate
simulation's) is then loaded too, so both hooks work together.
"""

import json
import os
import sys
import time

# The repository root (four folders up from this hook's own), so that
# cpu_support imports in this server process.
sys.path.append(
    os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4)
    )
)
from cpu_support.server.startup_hooks.post_import import (  # noqa: E402
    chain_next_sitecustomize,
    patch_after_import,
)

_DIR_ENV = "FORK_VIT_PROFILE_DIR"
_TORCH_ENV = "FORK_VIT_PROFILE_TORCH"
_MODULE = "sglang.srt.models.qwen3_vl"
_CLASS = "Qwen3VLMoeVisionModel"
_FIRST_TORCH_CALL = 10


def _grid_list(grid_thw):
    if isinstance(grid_thw, list):
        return [list(map(int, g)) for g in grid_thw]
    return [list(map(int, g)) for g in grid_thw.tolist()]


def _wrap(forward, out_dir):
    state = {"n": 0}
    torch_calls = int(os.environ.get(_TORCH_ENV, "0") or 0)

    def timed_forward(self, x, grid_thw, *args, **kwargs):
        import torch

        n = state["n"]
        state["n"] += 1
        grids = _grid_list(grid_thw)
        prof = None
        if torch_calls and _FIRST_TORCH_CALL <= n < _FIRST_TORCH_CALL + torch_calls:
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False
            )
            prof.__enter__()
        w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        out = forward(self, x, grid_thw, *args, **kwargs)
        w1, t1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        if prof is not None:
            prof.__exit__(None, None, None)
            path = os.path.join(out_dir, f"torchprof-{os.getpid()}-{n}.txt")
            with open(path, "w") as f:
                f.write(
                    f"images {len(grids)} patches {sum(t * h * w for t, h, w in grids)} "
                    f"grids {grids}\n"
                )
                f.write(
                    prof.key_averages().table(
                        sort_by="self_cpu_time_total", row_limit=30
                    )
                )
        rec = {
            "call": n,
            "t": w0,
            "images": len(grids),
            "patches": sum(t * h * w for t, h, w in grids),
            "image_patches": [t * h * w for t, h, w in grids],
            "wall_s": w1 - w0,
            "thread_cpu_s": t1 - t0,
            "process_cpu_s": p1 - p0,
            "threads": torch.get_num_threads(),
        }
        with open(os.path.join(out_dir, f"calls-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        return out

    timed_forward.__wrapped__ = forward
    timed_forward.__fork_vit_profile__ = True
    return timed_forward


def _patch(module):
    out_dir = os.environ.get(_DIR_ENV)
    cls = getattr(module, _CLASS, None)
    if (
        not out_dir
        or cls is None
        or getattr(cls.forward, "__fork_vit_profile__", False)
    ):
        return
    os.makedirs(out_dir, exist_ok=True)
    cls.forward = _wrap(cls.forward, out_dir)
    sys.stderr.write(
        f"[fork vit profile] pid {os.getpid()}: timing {_CLASS}.forward -> {out_dir}\n"
    )


if os.environ.get(_DIR_ENV):
    patch_after_import(_MODULE, _patch)
chain_next_sitecustomize(__file__)
