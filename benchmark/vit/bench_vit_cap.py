#!/usr/bin/env python
"""Encoder call cap on CPU: peak memory and vision-step time vs the cap.

A burst of single-image requests of mixed sizes goes through SGLang's real
``mm_schedule._get_chunked_prefill_embedding`` (the prefill step's
multimodal embedding, cross-request ViT batching) with SGLang's real
Qwen3-VL vision tower (random weights, sizes from the flags), once per value
of ``--mm-max-encoder-patches-per-rank`` (set with ``get_mm().override``).

Every (setting, cap) point runs in fresh processes: one process, or the DP
encoder on 2 gloo ranks (attention-TP 2, ``mm_enable_dp_encoder``; the cap is
per rank). In each, after the model is built, one untimed warm-up step runs
at the same cap; then each of ``--repeats`` steps starts from an empty
embedding cache and is timed between barriers.

Peak step memory: VmHWM at the end of a step minus VmRSS at its start, the
peak mark reset through /proc/self/clear_refs before each step, with glibc's
mmap threshold pinned so freed activations leave the RSS (see
cpu_support/bench/vit_bench_util.py); the max over the repeats, and over the ranks.

"calls" / "images per call" are the scheduler's encoder calls
(``get_image_feature``); "max patches / rank / call" is the largest tower
call a rank ran, which the cap bounds unless one image is larger.

Step time is reported as wall time and as CPU time (process time of the
busiest rank); with one torch thread per process the CPU time is the step's
compute and does not grow with other load on a shared machine, so the
per-patch cost and the knee use it.

Splitter table (``--splitter-only`` prints just it, in a few seconds): the
scheduler-side milliseconds per step that splitting a step's cache misses
into capped calls costs (``vit_batching.split_encoder_calls``; no encoding),
at 64, 512 and 1024 images of 64 patches, cap 16384, attention-TP 2, next to
a reference splitter that re-runs the DP load balancer on the growing
call for every image. Both must give the same calls;
the run stops with an error if they do not.

Example (the benchmark/vit/README.md table):
    .venv/bin/python benchmark/vit/bench_vit_cap.py --caps 1,512,1024,2048,4096,none
    .venv/bin/python benchmark/vit/bench_vit_cap.py --splitter-only
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time

# The repository root, for cpu_support.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

from cpu_support.bench import vit_bench_util as U  # noqa: E402

DEFAULT_BURST = "224x224:6,448x448:4,128x448:4,672x672:2"


def _point(rank, world_size, init_method, cfg, cap):
    import torch
    from cpu_support.ranks import mm_harness as H
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.runtime_context import get_mm

    dp = world_size > 1
    config = T.tiny_qwen3_vl_config(vision=cfg["vision"])
    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=dp,
        model_path=T.write_config_dir(config),
    )
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(config, seed=0)
    requests = [
        H.make_request([g], seed=i, config=config) for i, g in enumerate(cfg["grids"])
    ]

    def barrier():
        if dp:
            torch.distributed.barrier()

    def step():
        H.fresh_embedding_cache()
        barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        H.run_prefill_embedding(model, requests)
        c1 = time.process_time()
        barrier()
        return time.perf_counter() - t0, c1 - c0

    times, cpu, peaks = [], [], []
    with torch.no_grad(), get_mm().override(mm_max_encoder_patches_per_rank=cap):
        step()  # warm-up at this cap: same call shapes as the timed steps
        baseline = U.rss_mib()
        for _ in range(cfg["repeats"]):
            with U.EncoderCallLog(model) as log, H.TowerCalls().attach(
                model.visual
            ) as tower:
                with U.PeakRss() as mem:
                    wall, used = step()
            times.append(wall)
            cpu.append(used)
            peaks.append(mem.mib)
    tower_patches = [sum(U.patches(g) for g in call) for call in tower.calls]
    return {
        "times": times,
        "cpu": cpu,
        "peak_mib": max(peaks),
        "baseline_mib": baseline,
        "calls": log.calls,
        "tower_patches_max": max(tower_patches, default=0),
        "tower_calls": len(tower.calls),
    }


SPLITTER_IMAGES = (64, 512, 1024)
SPLITTER_PATCHES = 64  # patches per image
SPLITTER_CAP = 16384  # --mm-max-encoder-patches-per-rank
SPLITTER_RANKS = 2  # attention-TP width of the DP encoder


def prefix_call_groups(patches, cap, ranks):
    """The reference splitter: walk the images in order and, for each one,
    ask SGLang's DP load balancer for the busiest rank's share of the current
    call plus that image; over the cap closes the call. One balancer run (a sort of the
    whole trial list) per image: quadratic and worse in the call's length."""
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    if not patches:
        return []
    if cap is None:
        return [list(range(len(patches)))]
    groups, current = [], []
    for index, size in enumerate(patches):
        if current:
            trial = [patches[i] for i in current] + [size]
            if ranks <= 1:
                busiest = sum(trial)
            else:
                busiest = max(get_dp_encoder_lb_assignment(trial, ranks)[2])
            if busiest > cap:
                groups.append(current)
                current = []
        current.append(index)
    groups.append(current)
    return groups


def _ms_per_step(split, patches, cap, ranks, budget_s, max_steps):
    """Median CPU milliseconds (process time: robust to other load on a shared
    machine) of ``split(patches, cap, ranks)`` over at least one step,
    repeated while the budget lasts (at most ``max_steps``)."""
    times, spent = [], 0.0
    while not times or (spent < budget_s and len(times) < max_steps):
        t0 = time.process_time()
        groups = split(patches, cap, ranks)
        dt = time.process_time() - t0
        times.append(dt)
        spent += dt
    return 1000 * statistics.median(times), groups


def splitter_rows(
    images=SPLITTER_IMAGES,
    patches=SPLITTER_PATCHES,
    cap=SPLITTER_CAP,
    ranks=SPLITTER_RANKS,
    budget_s=0.3,
):
    """One row per image count: calls, ms per step now and before the fix,
    and whether both gave the same calls."""
    # Both import here, so that no timed step pays for an import.
    from sglang.srt.multimodal.mm_utils import (  # noqa: F401
        get_dp_encoder_lb_assignment,
    )
    from sglang.srt.multimodal.vit_batching import split_encoder_calls

    rows = []
    for n in images:
        sizes = [patches] * n
        # The series' splitter takes each item's pieces (one grid: one piece).
        now_ms, now = _ms_per_step(
            split_encoder_calls, [[size] for size in sizes], cap, ranks, budget_s, 200
        )
        now = [list(call) for call in now]
        old_ms, old = _ms_per_step(prefix_call_groups, sizes, cap, ranks, budget_s, 5)
        rows.append(
            dict(
                images=n,
                calls=len(now),
                now_ms=now_ms,
                prefix_ms=old_ms,
                same_groups=now == old,
            )
        )
    return rows


def splitter_table(
    rows, patches=SPLITTER_PATCHES, cap=SPLITTER_CAP, ranks=SPLITTER_RANKS
):
    head = (
        f"Splitter, scheduler side: images of {patches} patches, cap {cap} patches per "
        f"rank per call, attention-TP {ranks} (DP encoder); median CPU ms per step "
        f"of splitting the step's cache misses into calls (no encoding).\n"
    )
    table = U.markdown_table(
        [
            "images",
            "calls",
            "split_encoder_calls (ms)",
            "pre-fix: balancer per image (ms)",
            "same calls",
        ],
        [
            [
                r["images"],
                r["calls"],
                f"{r['now_ms']:.3f}",
                f"{r['prefix_ms']:.1f}",
                "yes" if r["same_groups"] else "NO",
            ]
            for r in rows
        ],
    )
    return head + "\n" + table


def knee(rows, tolerance: float):
    """The smallest cap whose per-patch time is within ``tolerance`` of the
    best of the setting (None = uncapped): where the per-patch cost stops
    dropping."""
    best = min(r["ms_per_1k"] for r in rows)
    for r in rows:  # rows are in increasing cap order, uncapped last
        if r["ms_per_1k"] <= best * (1 + tolerance):
            return r["cap"]
    return None


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--caps",
        type=U.caps_arg,
        default=U.caps_arg("1,512,1024,2048,4096,none"),
        help="comma list of --mm-max-encoder-patches-per-rank values (a rank's patches per "
        "call: the whole call's in one process); 'none' = no cap",
    )
    p.add_argument(
        "--burst",
        type=U.burst_arg,
        default=U.burst_arg(DEFAULT_BURST),
        help=f"single-image requests, WxH:count,... in pixels (default {DEFAULT_BURST})",
    )
    p.add_argument(
        "--settings", default="1proc,dp2", help="1proc and/or dp2 (comma list)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed steps per point (>= 1)"
    )
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument(
        "--knee-tolerance",
        type=float,
        default=0.05,
        help="knee = smallest cap within this fraction of the best ms per 1k patches",
    )
    p.add_argument(
        "--splitter-only",
        action="store_true",
        help="print only the splitter table (scheduler-side ms per step, now vs pre-fix)",
    )
    args = p.parse_args(argv)
    if args.splitter_only:
        rows = splitter_rows()
        print(splitter_table(rows))
        if not all(r["same_groups"] for r in rows):
            sys.exit(
                "bench_vit_cap: split_encoder_calls and the pre-fix splitter disagree"
            )
        return {"splitter": rows}
    settings = {"1proc": ("1 process", 1), "dp2": ("DP encoder, 2 gloo ranks", 2)}
    chosen = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in chosen:
        if s not in settings:
            p.error(f"unknown setting {s!r}: choose from {', '.join(settings)}")
    U.check_run_args(p, args)

    caps = sorted([c for c in args.caps if c is not None]) + [None] * (
        None in args.caps
    )
    grids = U.burst_grids(args.burst)
    total_patches = sum(U.patches(g) for g in grids)
    cfg = dict(
        vision=U.bench_vision(args.depth, args.hidden, args.heads),
        grids=grids,
        repeats=args.repeats,
    )

    U.pin_malloc_env()
    from cpu_support.ranks.gloo import run_on_ranks

    results = {}
    for key in chosen:
        label, world = settings[key]
        rows = []
        for cap in caps:
            t0 = time.perf_counter()
            per_rank = run_on_ranks(
                _point, world, cfg, cap, timeout=1800, threads_per_rank=args.threads
            )
            calls = U.summarize_calls(per_rank[0]["calls"])
            # A step ends at the slower rank's barrier; rank 0's clock covers it.
            median_s = statistics.median(per_rank[0]["times"])
            # CPU time of the step, the busiest rank: robust to other load on
            # a shared machine (one torch thread per process).
            cpu_s = max(statistics.median(r["cpu"]) for r in per_rank)
            rows.append(
                dict(
                    cap=cap,
                    **calls,
                    tower_patches_max=max(r["tower_patches_max"] for r in per_rank),
                    median_ms=1000 * median_s,
                    cpu_ms=1000 * cpu_s,
                    ms_per_1k=1000 * cpu_s / total_patches * 1000,
                    peak_mib=max(r["peak_mib"] for r in per_rank),
                    baseline_mib=max(r["baseline_mib"] for r in per_rank),
                )
            )
            print(
                f"# {label}, cap {cap}: {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        results[key] = rows

    kinds = ", ".join(f"{n}× {w}×{h}" for w, h, n in args.burst)
    print(
        f"Qwen3-VL vision tower (SGLang's code, random weights): depth {args.depth}, hidden "
        f"{args.hidden}, {args.heads} heads, fp32, SDPA (per-sequence, as built). Burst: "
        f"{len(grids)} single-image requests ({kinds}) = {total_patches} patches, through the "
        f"real scheduler step. {args.threads} thread(s) per process; step time median of "
        f"{args.repeats} after 1 warm-up (wall: rank 0 between barriers; CPU: process time of "
        f"the busiest rank, which the per-patch cost and the knee use); peak = max step RSS "
        f"growth over the repeats and ranks.\n"
    )
    headers = [
        "setting",
        "cap (patches/rank/call)",
        "calls",
        "images per call mean / max",
        "max patches / rank / call",
        "step wall median (ms)",
        "step CPU median (ms)",
        "CPU ms per 1k patches",
        "peak step memory (MiB)",
    ]
    table = []
    for key in chosen:
        for r in results[key]:
            table.append(
                [
                    settings[key][0],
                    "none" if r["cap"] is None else r["cap"],
                    r["calls"],
                    f"{r['images_mean']:.1f} / {r['images_max']}",
                    r["tower_patches_max"],
                    f"{r['median_ms']:.0f}",
                    f"{r['cpu_ms']:.0f}",
                    f"{r['ms_per_1k']:.1f}",
                    f"{r['peak_mib']:.0f}",
                ]
            )
    print(U.markdown_table(headers, table, align="llrrrrrrr"))
    print()
    for key in chosen:
        k = knee(results[key], args.knee_tolerance)
        print(
            f"Knee, {settings[key][0]}: cap {'none' if k is None else k} (smallest cap within "
            f"{100 * args.knee_tolerance:.0f}% of the best CPU ms per 1k patches)"
        )
    splitter = splitter_rows()
    print()
    print(splitter_table(splitter))
    if not all(r["same_groups"] for r in splitter):
        sys.exit("bench_vit_cap: split_encoder_calls and the pre-fix splitter disagree")
    results["splitter"] = splitter
    print(
        f"\nCommand: {shlex.join([os.path.relpath(sys.executable), 'benchmark/vit/bench_vit_cap.py'] + (sys.argv[1:] if argv is None else list(argv)))}"
    )
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    return results


if __name__ == "__main__":
    main()
