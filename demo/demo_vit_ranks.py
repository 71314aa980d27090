#!/usr/bin/env python
"""Where a prefill step's images land with the DP encoder, per-request vs batched.

SGLang's real Qwen3-VL vision tower (tiny sizes, random weights) on two gloo
ranks on the CPU, attention-TP 2, ``--mm-enable-dp-encoder``, ROCm simulated
(``mm_harness.on_platform("ROCm")``: ``override_platform`` and the gate's
``mm_schedule._is_hip``). A handful of single-image requests
go through the real ``mm_schedule._get_chunked_prefill_embedding``:

* per-request: what SGLang 0.5.23 does on ROCm (the gate says per-request
  while the tower still shards each call over both ranks);
* batched: what the series does on ROCm with the DP encoder at TP > 1.

Prints: path, encoder calls and images per rank, vision-step median time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

# The repository root, for cpu_support.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cpu_support.bench.vit_bench_util import markdown_table  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402

VISION = dict(
    depth=4, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=64
)


def _rank(rank, world_size, init_method, requests, image, repeats, batched):
    import torch
    from cpu_support.ranks import mm_harness as H
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.runtime_context import get_mm

    config = T.tiny_qwen3_vl_config(vision=VISION)
    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(config),
    )
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(config, seed=1)
    grid = (1, image // 16, image // 16)
    reqs = [H.make_request([grid], seed=i, config=config) for i in range(requests)]
    # Upstream on ROCm: per-request whatever the DP encoder says.
    gate = (
        contextlib.nullcontext()
        if batched
        else get_mm().override(mm_enable_dp_encoder=False)
    )
    times, calls = [], None
    with torch.no_grad(), H.on_platform("ROCm"), gate:
        for step in range(repeats + 1):  # step 0 warms (compiles); not timed
            H.fresh_embedding_cache()
            with H.TowerCalls().attach(model.visual) as seen:
                torch.distributed.barrier()
                t0 = time.perf_counter()
                H.run_prefill_embedding(model, reqs)
                torch.distributed.barrier()
                elapsed = time.perf_counter() - t0
            if step:
                times.append(elapsed)
                calls = seen.calls
    return {"calls": len(calls), "images": sum(len(c) for c in calls), "times": times}


def run(requests: int = 6, image: int = 224, repeats: int = 5):
    rows = []
    for batched in (False, True):
        per_rank = run_on_ranks(
            _rank, 2, requests, image, repeats, batched, timeout=600
        )
        step = [max(ts) for ts in zip(*(r["times"] for r in per_rank))]
        rows.append(
            {
                "path": "batched" if batched else "per-request",
                "calls": [r["calls"] for r in per_rank],
                "images": [r["images"] for r in per_rank],
                "median_ms": 1000 * statistics.median(step),
            }
        )
    return rows


def format_table(rows, requests, image, repeats) -> str:
    lines = [
        f"DP encoder on 2 gloo ranks (CPU), ROCm simulated, {requests} single-image "
        f"requests of {image}x{image}, vision step median of {repeats}",
        "",
        markdown_table(
            [
                "path",
                "encoder calls (rank 0 / rank 1)",
                "images (rank 0 / rank 1)",
                "vision step median (ms)",
            ],
            [
                [
                    r["path"],
                    f"{r['calls'][0]} / {r['calls'][1]}",
                    f"{r['images'][0]} / {r['images'][1]}",
                    f"{r['median_ms']:.1f}",
                ]
                for r in rows
            ],
            align="llll",
        ),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument(
        "--image",
        type=int,
        default=224,
        help="square image side in pixels (multiple of 32)",
    )
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.image % 32 or args.image <= 0:
        ap.error("--image must be a positive multiple of 32")
    rows = run(args.requests, args.image, args.repeats)
    print(format_table(rows, args.requests, args.image, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
