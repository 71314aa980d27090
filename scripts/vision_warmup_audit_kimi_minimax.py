"""Compile audit of proposed vision warm-ups for Kimi-VL, K2.5, K3 and MiniMax-VL, on CPU.

Same method as scripts/vision_warmup_audit.py: for each family's tiny tower
(SGLang's real classes, cpu_support/tiny_kimi_minimax.py), in a fresh process,
run the warm-up calls (or none) through ``call_tower_on_rank_share`` as the
DP runner hands a rank its share, then the serving sweep (16-token floor to
the 8000-token ceiling; grids turned into (h, w) for Kimi-VL). Compiles are
Dynamo's ``frames.ok`` counter.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/vision_warmup_audit_kimi_minimax.py \
        [--family kimi_k25 ...] [--warm proposed none] [--calls JSON]
        [--fresh-inductor-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from vision_warmup_audit import SWEEP  # noqa: E402  (t, h, w) grids

# Proposed warm-up calls per family, as (t, h, w); Kimi-VL's are handed to
# the tower as (h, w).
PROPOSED = {
    "kimi_vl": [[(1, 32, 48)]],
    "kimi_k25": [[(1, 32, 48)], [(1, 48, 80)]],
    "kimi_k3": [[(1, 32, 48)]],
    "minimax_vl": [[(1, 10, 14)], [(1, 32, 48)]],
}


def _case(family, calls):
    import torch
    from torch._dynamo.utils import counters

    from cpu_support import tiny_kimi_minimax as K
    from sglang.srt.utils.common import DynamicGradMode

    K.publish_cpu_context(tp_size=1, dp_encoder=True)
    K.init_gloo(0, 1, "file://" + tempfile.mktemp(prefix="gloo-"))
    tower = K.FAMILIES[family][0]()

    def compiled():
        return int(counters["frames"]["ok"])

    warm_per_call = []
    start = time.perf_counter()
    with DynamicGradMode():
        for call in calls:
            before = compiled()
            K.run_rank_share(tower, call, family=family)
            warm_per_call.append(compiled() - before)
    warm_s = time.perf_counter() - start
    after_warm = compiled()
    per_call = []
    start = time.perf_counter()
    with DynamicGradMode():
        for call in SWEEP:
            before = compiled()
            K.run_rank_share(tower, call, family=family, seed=1)
            per_call.append(compiled() - before)
    return dict(
        family=family,
        calls=calls,
        warm_s=round(warm_s, 2),
        warm_compiles=after_warm,
        warm_per_call=warm_per_call,
        sweep_compiles=compiled() - after_warm,
        sweep_per_call=per_call,
        sweep_s=round(time.perf_counter() - start, 2),
        dp=bool(getattr(tower, "use_data_parallel", None)),
        has_device=isinstance(getattr(tower, "device", None), torch.device),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="*", default=list(PROPOSED))
    parser.add_argument("--warm", nargs="*", default=["none", "proposed"])
    parser.add_argument("--calls", help="JSON list of calls, overrides --warm")
    parser.add_argument(
        "--fresh-inductor-cache",
        action="store_true",
        help="an empty TORCHINDUCTOR_CACHE_DIR per case (a first launch's compile time)",
    )
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        family, calls = json.loads(args._child)
        print("RESULT " + json.dumps(_case(family, calls)), flush=True)
        return
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for family in args.family:
        variants = (
            [("custom", json.loads(args.calls))]
            if args.calls
            else [(w, [] if w == "none" else PROPOSED[family]) for w in args.warm]
        )
        for name, calls in variants:
            if args.fresh_inductor_cache:
                env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
            proc = subprocess.run(
                [sys.executable, __file__, "--_child", json.dumps([family, calls])],
                env=env,
                capture_output=True,
                text=True,
            )
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if not lines:
                print(f"{family} {name}: FAILED\n{proc.stderr[-3000:]}", flush=True)
                continue
            print(f"{family} {name}: {lines[-1][7:]}", flush=True)


if __name__ == "__main__":
    main()
