#!/usr/bin/env python
"""The ViT step at TP2 with the DP encoder: per-request calls vs one cross-request call.

The configuration the series is about, on two ranks: SGLang's real
``Qwen3VLForConditionalGeneration`` (the Qwen3-VL-8B vision sizes of
``gpu_vit_check.py``, random weights; ``--tiny`` for the tiny tower) built
with ``--tp-size 2 --mm-enable-dp-encoder`` on every rank, and a burst of
single-image requests through SGLang's real prefill-step function
(``mm_schedule._get_chunked_prefill_embedding``). The vision tower's DP
runner (``mm_utils.run_dp_sharded_mrope_vision_model``) splits each encoder
call's images over the ranks:

* per-request: the platform gate pinned off, one encoder call per request
  (upstream 0.5.23 on ROCm): a one-image call lands on one rank;
* batched: the gate pinned on, one cross-request call (the series on ROCm,
  upstream on CUDA): the images spread over both ranks.

Per path and rank: encoder calls, tower calls and images the rank's tower
encoded, the first step (unseen shapes) and the warmed median (every step
between barriers, so a step lasts until its slowest rank is done), and the
step's peak memory (``torch.cuda.max_memory_allocated`` over the step minus
what was allocated before it, on a GPU; peak RSS growth on the CPU). Writes
``vit_dp_step.json`` / ``vit_dp_step.md`` under ``--out`` (created if
missing) and prints the table.

GPU (two devices; the patched tree first on PYTHONPATH, nothing installed):
    PYTHONPATH=/tmp/sglang-series torchrun --nproc-per-node 2 benchmark/gpu_check/gpu_vit_dp_step.py --out vit-dp-step
CPU dry run (two gloo ranks spawned by ``cpu_support.ranks.gloo``, tiny sizes;
what ``make test`` runs):
    .venv/bin/python benchmark/gpu_check/gpu_vit_dp_step.py --dry-run --out /tmp/vit-dp-step
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, HERE):  # cpu_support, and gpu_vit_check beside this file
    if path not in sys.path:
        sys.path.insert(0, path)

import gpu_vit_check as G  # noqa: E402  (stdlib only at import)
from cpu_support.bench import vit_bench_util as U  # noqa: E402


def rank_main(rank: int, world_size: int, init_method: str, opts: dict) -> dict:
    """One rank: build, then both paths; returns this rank's numbers."""
    import torch
    from cpu_support.ranks.mm_harness import TowerCalls

    device = opts["device"]
    vision = G.TINY_VISION if opts["tiny"] else G.QWEN3_VL_8B_VISION
    config, model_dir = G.make_config(vision)
    model = G.build_dp_encoder_rank(
        config, model_dir, opts, rank, world_size, init_method
    )
    dev = G.Device(device)
    requests = G.make_requests(opts["grids"], config)
    group = torch.distributed.group.WORLD

    def step(batched: bool, measure_peak: bool = False):
        G.empty_embedding_cache()
        with G.pinned_gate(batched), TowerCalls().attach(
            model.visual
        ) as tower, U.EncoderCallLog(model) as log, (
            dev.peak() if measure_peak else contextlib.nullcontext({})
        ) as mem:
            seconds = G.timed_prefill_step(model, requests, device, dev, group)
        return seconds, log.calls, tower.calls, mem.get("mib")

    out = {
        "rank": rank,
        "device": dev.describe(),
        "attention_backend": G._attention_backend(model),
        "paths": [],
    }
    with torch.no_grad():
        warm = G.make_requests([(1, 4, 4)], config, seed=99)
        G.empty_embedding_cache()
        G.prefill_step(
            model, warm, device
        )  # process-level warm-up on an unrelated shape
        for batched in (False, True):
            first, calls, tower, _ = step(batched)
            _, _, _, peak = step(batched, measure_peak=True)
            warmed = [step(batched)[0] for _ in range(opts["repeats"])]
            out["paths"].append(
                dict(
                    path="batched" if batched else "per-request",
                    encoder_calls=len(calls),
                    tower_calls=len(tower),
                    images_on_rank=sum(len(c) for c in tower),
                    patches_on_rank=sum(U.patches(g) for c in tower for g in c),
                    first_ms=1000 * first,
                    warm_ms=[1000 * s for s in warmed],
                    peak_mib=peak,
                )
            )
    return out


def summarize(per_rank: list, opts: dict) -> dict:
    paths = []
    for i, name in enumerate(r["path"] for r in per_rank[0]["paths"]):
        rows = [r["paths"][i] for r in per_rank]
        # Every step ends at a barrier, so all ranks measure the same step; the
        # slowest rank's number is the step's.
        step_ms = [max(ts) for ts in zip(*(r["warm_ms"] for r in rows))]
        paths.append(
            dict(
                path=name,
                encoder_calls=rows[0]["encoder_calls"],
                tower_calls_per_rank=[r["tower_calls"] for r in rows],
                images_per_rank=[r["images_on_rank"] for r in rows],
                patches_on_ranks=[r["patches_on_rank"] for r in rows],
                first_ms=max(r["first_ms"] for r in rows),
                warm_median_ms=statistics.median(step_ms),
                warm_min_ms=min(step_ms),
                warm_max_ms=max(step_ms),
                peak_mib_per_rank=[r["peak_mib"] for r in rows],
            )
        )
    return dict(
        device=per_rank[0]["device"],
        ranks=len(per_rank),
        tiny=opts["tiny"],
        dtype=opts["dtype"],
        attention_backend=per_rank[0]["attention_backend"],
        requests=len(opts["grids"]),
        patches=sum(U.patches(g) for g in opts["grids"]),
        repeats=opts["repeats"],
        paths=paths,
        per_rank=per_rank,
    )


def to_markdown(r: dict) -> str:
    def per_rank(xs, fmt=str):
        return " / ".join(fmt(x) for x in xs)

    head = (
        f"Device: {r['device']}; {r['ranks']} ranks, attention-TP {r['ranks']}, --mm-enable-dp-encoder. "
        f"Qwen3-VL vision tower{' (TINY sizes)' if r['tiny'] else ' (Qwen3-VL-8B sizes)'}, random weights, "
        f"{r['dtype']}, vision attention {r['attention_backend']}. {r['requests']} single-image requests, "
        f"{r['patches']} patches, through SGLang's prefill-step function; step = barrier to barrier, "
        f"warmed median of {r['repeats']} (min–max)."
    )
    table = U.markdown_table(
        [
            "path",
            "encoder calls",
            "tower calls (rank 0 / 1)",
            "images (rank 0 / 1)",
            "patches (rank 0 / 1)",
            "first step (ms)",
            "warmed step (ms)",
            "peak step memory per rank (MiB)",
        ],
        [
            [
                p["path"],
                p["encoder_calls"],
                per_rank(p["tower_calls_per_rank"]),
                per_rank(p["images_per_rank"]),
                per_rank(p["patches_on_ranks"]),
                f"{p['first_ms']:.1f}",
                f"{p['warm_median_ms']:.1f} ({p['warm_min_ms']:.1f}–{p['warm_max_ms']:.1f})",
                per_rank(p["peak_mib_per_rank"], lambda m: f"{m:.1f}"),
            ]
            for p in r["paths"]
        ],
    )
    return head + "\n\n" + table


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="two gloo ranks on the CPU (spawned here), tiny sizes: the same code path",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny tower and burst (implied by --dry-run)",
    )
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="default bfloat16 on a GPU, float32 on the CPU",
    )
    p.add_argument(
        "--burst",
        type=U.burst_arg,
        default=None,
        help=f"WxH:count,... single-image requests (default {G.BURST}; tiny {G.TINY_BURST})",
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="warmed steps per path (>= 1)"
    )
    p.add_argument(
        "--mm-attention-backend",
        default=None,
        help="vision attention backend (default: sdpa on the CPU, SGLang's choice on a GPU)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory (created if missing) for vit_dp_step.json / .md",
    )
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.tiny = args.tiny or args.dry_run
    args.device = "cpu" if args.dry_run else "cuda"
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.burst is None:
        args.burst = U.parse_burst(G.TINY_BURST if args.tiny else G.BURST)
    if args.device == "cpu" and args.mm_attention_backend is None:
        args.mm_attention_backend = "sdpa"
    return args


def _write(report: dict, out) -> str:
    text = (
        to_markdown(report)
        + f"\n\nCommand: {report['command']}\nDate: {report['date']}\n"
    )
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "vit_dp_step.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(out, "vit_dp_step.md"), "w") as f:
            f.write(text)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    opts = dict(
        device=args.device,
        tiny=args.tiny,
        dtype=args.dtype,
        grids=U.burst_grids(args.burst),
        repeats=args.repeats,
        attention_backend=args.mm_attention_backend,
    )
    meta = dict(
        command=shlex.join(
            ["python", "benchmark/gpu_check/gpu_vit_dp_step.py"]
            + (sys.argv[1:] if argv is None else list(argv))
        ),
        date=f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
    )
    if args.dry_run:
        from cpu_support.ranks.gloo import run_on_ranks

        U.pin_malloc_env()  # the ranks' peak RSS sees freed activations leave (vit_bench_util)
        per_rank = run_on_ranks(rank_main, 2, opts, timeout=900)
        report = dict(summarize(per_rank, opts), **meta)
        print(_write(report, args.out))
        return 0
    # Under torchrun: this process is one rank.
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(
            "gpu_vit_dp_step: run it under torchrun --nproc-per-node 2 (or --dry-run on the CPU)",
            file=sys.stderr,
        )
        return 2
    import torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != 2:
        print(
            f"gpu_vit_dp_step: needs 2 ranks (TP2), torchrun gave {world}",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        print(
            f"gpu_vit_dp_step: needs {world} visible GPUs, torch sees {torch.cuda.device_count()}",
            file=sys.stderr,
        )
        return 2
    opts["local_rank"] = int(os.environ.get("LOCAL_RANK", rank))
    mine = rank_main(rank, world, "env://", opts)
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, mine)
    if rank == 0:
        report = dict(summarize(gathered, opts), **meta)
        print(_write(report, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
