"""What a rank-consistent miss decision would cost per image step.

SGLang PR #40247 (open) makes attention-TP ranks agree on which multimodal
items are embedding-cache misses: every rank all-reduces (MAX) one flag per
item over the attention-TP group before it encodes, so a rank with a hit
re-encodes when a peer misses. The series does not carry it (docs/design.md,
"Rank consistency"); this measures the collective that decision adds, on two
gloo ranks of SGLang's real groups, over the CPU group SGLang gives every
group coordinator (``attn_tp_group.cpu_group``), for a step of 1, 8 and 64
items. Prints a markdown table of the median and p90 microseconds per step.

    .venv/bin/python benchmark/vit/bench_miss_agreement.py [--reps 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The repository root, for cpu_support.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

ITEMS = (1, 8, 64)


def _rank(rank, world_size, init_method, reps):
    import torch
    import torch.distributed as dist
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.runtime_context import get_parallel

    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    group = get_parallel().attn_tp_group.cpu_group
    out = {}
    for items in ITEMS:
        flags = torch.zeros(items, dtype=torch.uint8)
        for _ in range(20):  # connection set-up and first-call costs
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        seconds = []
        for i in range(reps):
            flags = torch.zeros(items, dtype=torch.uint8)
            flags[i % items] = rank  # a rank-local miss, as in the real decision
            start = time.perf_counter()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
            seconds.append(time.perf_counter() - start)
        seconds.sort()
        out[items] = (statistics.median(seconds), seconds[int(0.9 * len(seconds))])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=500)
    args = parser.parse_args(argv)
    if args.reps < 10:
        parser.error("--reps must be at least 10")

    from cpu_support.ranks.gloo import run_on_ranks

    results = run_on_ranks(_rank, 2, args.reps, timeout=600)
    from cpu_support.bench.vit_bench_util import markdown_table

    print(
        markdown_table(
            [
                "items in the step",
                "median us (rank 0 / rank 1)",
                "p90 us (rank 0 / rank 1)",
            ],
            [
                [
                    items,
                    " / ".join(f"{r[items][0] * 1e6:.0f}" for r in results),
                    " / ".join(f"{r[items][1] * 1e6:.0f}" for r in results),
                ]
                for items in ITEMS
            ],
            align="rrr",
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
