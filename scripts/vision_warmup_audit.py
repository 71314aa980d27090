"""Compile audit of the post-load vision warm-up, on CPU (docs/warmup.md).

For the tiny Qwen3-VL and GLM-5-Next towers (SGLang's real classes), each case
in a fresh process: warm the tower with the grids the patch ships (or none,
or only the first), then run a serving sweep from the 16-token floor to the
8000-token ceiling, one tower call per entry, the way the DP encoder calls a
rank's tower. Compiles are Dynamo's own counter (``frames.ok``, one per
compiled or recompiled frame); seconds are wall time on this machine.

    .venv/bin/python scripts/vision_warmup_audit.py [--fresh-inductor-cache]

``--fresh-inductor-cache`` points TORCHINDUCTOR_CACHE_DIR at an empty folder
so the warm-up pays full Inductor code generation, as on a first launch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The serving sweep (tower calls), as the DP encoder hands a rank its share:
# the 16-token floor of --mm-process-config (8x8 patches, and a 2x32 strip, the
# floor at a 1:16 aspect), multi-image calls, a 6144-patch image. The tests
# sweep these too (test_vision_warmup.py).
SERVING_SWEEP = [
    [(1, 8, 8)],
    [(1, 2, 32)],
    [(1, 16, 16)],
    [(1, 8, 8)] * 3,
    [(1, 20, 36)],
    [(1, 8, 8), (1, 40, 60)],
    [(1, 16, 16)] * 7,
    [(1, 64, 64)],
    [(1, 64, 96)],
]
# ...then the --mm-process-config ceiling: 8000 tokens = 32000 patches in one
# call. The compiled pieces only see the call's total patch count, so 32 images
# adding up to 8000 tokens reach the same shapes as one ceiling image (the
# seed's 2464x2520 is 7920 tokens) without a 32000x32000 attention on CPU.
CEILING_CALL = [(1, 32, 32)] * 31 + [(1, 16, 16)]
SWEEP = SERVING_SWEEP + [CEILING_CALL]


def _shipped_calls(kind):
    if kind == "qwen3_vl":
        from sglang.srt.models.qwen3_vl import qwen3_vl_vision_warm_up_calls

        return qwen3_vl_vision_warm_up_calls()
    from sglang.srt.models.glm5_next import _VISION_WARM_UP_GRIDS

    return [[grid] for grid in _VISION_WARM_UP_GRIDS]


def _case(rank, world_size, init_method, kind, warm):
    import torch
    from torch._dynamo.utils import counters

    from cpu_support import tiny_qwen3_vl as T
    from cpu_support import tiny_vl_family as F
    from sglang.srt.multimodal.mm_utils import _dummy_patch_dim, warm_up_vision_tower
    from sglang.srt.utils.common import DynamicGradMode

    T.publish_cpu_context(tp_size=1, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl() if kind == "qwen3_vl" else F.build_tiny_glm5_next()
    tower = model.visual
    calls = _shipped_calls(kind)
    if warm == "first grid":
        calls = calls[:1]
    elif warm == "none":
        calls = []

    def compiled():
        return int(counters["frames"]["ok"])

    start = time.perf_counter()
    if calls:
        warm_up_vision_tower(tower, calls)
    warm_s = time.perf_counter() - start
    after_warm = compiled()
    per_call = []
    width = _dummy_patch_dim(tower)
    with DynamicGradMode():
        for call in SWEEP:
            before = compiled()
            n = sum(math.prod(g) for g in call)
            tower(torch.randn(n, width), torch.tensor(call))
            per_call.append(compiled() - before)
    return dict(
        calls=calls,
        warm_s=warm_s,
        warm_compiles=after_warm,
        sweep_compiles=compiled() - after_warm,
        per_call=per_call,
    )


def _run_case(run_on_ranks, kind, warm, attempts=3):
    """One case in a fresh process; retried when its gloo port was taken."""
    for attempt in range(attempts):
        try:
            return run_on_ranks(_case, 1, kind, warm, timeout=900)[0]
        except Exception as exc:  # RankFailed carries the rank's traceback
            if "EADDRINUSE" not in str(exc) or attempt == attempts - 1:
                raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-inductor-cache", action="store_true")
    args = parser.parse_args()
    if args.fresh_inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")

    from cpu_support.ranks import run_on_ranks

    def fmt(call):
        runs = []  # consecutive repeats of one grid as "Nx[t,h,w]"
        for grid in call:
            if runs and runs[-1][0] == grid:
                runs[-1][1] += 1
            else:
                runs.append([grid, 1])
        text = ["[" + ",".join(map(str, g)) + "]" for g, _ in runs]
        return "+".join(t if k == 1 else f"{k}x{t}" for t, (_, k) in zip(text, runs))

    print("sweep:", ", ".join(fmt(c) for c in SWEEP))
    print(
        "| tower | warm-up | warm-up calls | compiles in warm-up | warm-up s "
        "| compiles in sweep | per sweep call |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind in ("qwen3_vl", "glm5_next"):
        for warm in ("none", "first grid", "shipped"):
            r = _run_case(run_on_ranks, kind, warm)
            print(
                f"| {kind} | {warm} | {' '.join(fmt(c) for c in r['calls']) or '-'} "
                f"| {r['warm_compiles']} | {r['warm_s']:.1f} | {r['sweep_compiles']} "
                f"| {r['per_call']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
