#!/usr/bin/env python
"""Encoder call cap on CPU: peak memory and vision-step time vs the cap.

A burst of single-image requests of mixed sizes goes through SGLang's real
``mm_schedule._get_chunked_prefill_embedding`` (the prefill step's
multimodal embedding, cross-request ViT batching) with SGLang's real
Qwen3-VL vision tower (random weights, sizes from the flags), once per value
of ``--mm-max-encoder-input-tokens-per-batch`` (set with ``get_mm().override``).

Every (setting, cap) point runs in fresh processes: one process, or the DP
encoder on 2 gloo ranks (attention-TP 2, ``mm_enable_dp_encoder``; the cap
counts the whole call). In each, after the model is built, one untimed warm-up
step runs at the same cap; then each of ``--repeats`` steps starts from an
empty embedding cache and is timed between barriers.

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
calls a step of 64 images of 784 patches makes at a cap of 8192, attention-TP
2, 4 and 8, with the shipped splitter (``vit_batching.split_encoder_calls``,
the whole call counted) and with per-rank accounting (the DP load balancer's
busiest rank counted; not shipped), each with its largest call and its
largest rank share. No encoding.

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
    with torch.no_grad(), get_mm().override(mm_max_encoder_input_tokens_per_batch=cap):
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


SPLITTER_IMAGES = 64  # single-image requests in the step
SPLITTER_PATCHES = 784  # per image: 448x448 pixels in 16x16 patches (Qwen3-VL)
SPLITTER_CAP = 8192  # --mm-max-encoder-input-tokens-per-batch
SPLITTER_RANKS = (2, 4, 8)  # attention-TP widths of the DP encoder


def per_rank_call_groups(patches, cap, ranks):
    """Per-rank accounting, which the series does not ship, for comparison:
    walk the images in order and close the call when SGLang's DP load
    balancer would give some rank more than ``cap`` patches of it."""
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    groups, current = [], []
    for index, size in enumerate(patches):
        if current:
            trial = [patches[i] for i in current] + [size]
            if max(get_dp_encoder_lb_assignment(trial, ranks)[2]) > cap:
                groups.append(current)
                current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def _largest_share(patches, groups, ranks):
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    return max(
        max(get_dp_encoder_lb_assignment([patches[i] for i in g], ranks)[2])
        for g in groups
    )


def splitter_rows(
    images=SPLITTER_IMAGES,
    patches=SPLITTER_PATCHES,
    cap=SPLITTER_CAP,
    widths=SPLITTER_RANKS,
):
    """Per attention-TP width: the calls the shipped splitter
    (``vit_batching.split_encoder_calls``, the whole call counted) makes of
    the step, and those per-rank accounting would make; for each, the
    largest call and the largest rank share SGLang's balancer gives."""
    from sglang.srt.multimodal.vit_batching import split_encoder_calls

    sizes = [patches] * images
    rows = []
    for ranks in widths:
        shipped = [list(call) for call in split_encoder_calls(sizes, cap)]
        per_rank = per_rank_call_groups(sizes, cap, ranks)
        row = dict(ranks=ranks, images=images, cap=cap)
        for key, groups in (("whole", shipped), ("per_rank", per_rank)):
            row[key] = dict(
                calls=len(groups),
                call_max=max(sum(sizes[i] for i in g) for g in groups),
                share_max=_largest_share(sizes, groups, ranks),
            )
        rows.append(row)
    return rows


def splitter_table(rows):
    r0 = rows[0]
    head = (
        f"Splitter, scheduler side (no encoding): {r0['images']} images of "
        f"{SPLITTER_PATCHES} patches, cap {r0['cap']} input patches; the DP "
        f"encoder's balancer (get_dp_encoder_lb_assignment) gives the shares.\n"
    )
    table = U.markdown_table(
        [
            "attention-TP",
            "calls (whole call, shipped)",
            "largest call",
            "largest rank share",
            "calls (per-rank accounting)",
            "largest call",
            "largest rank share",
        ],
        [
            [
                r["ranks"],
                r["whole"]["calls"],
                r["whole"]["call_max"],
                r["whole"]["share_max"],
                r["per_rank"]["calls"],
                r["per_rank"]["call_max"],
                r["per_rank"]["share_max"],
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
        help="comma list of --mm-max-encoder-input-tokens-per-batch values (a call's "
        "input patches); 'none' = no cap",
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
        help="print only the splitter table (calls of a step, whole call vs per-rank "
        "accounting)",
    )
    args = p.parse_args(argv)
    if args.splitter_only:
        rows = splitter_rows()
        print(splitter_table(rows))
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
        "cap (patches/call)",
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
    results["splitter"] = splitter
    print(
        f"\nCommand: {shlex.join([os.path.relpath(sys.executable), 'benchmark/vit/bench_vit_cap.py'] + (sys.argv[1:] if argv is None else list(argv)))}"
    )
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    return results


if __name__ == "__main__":
    main()
