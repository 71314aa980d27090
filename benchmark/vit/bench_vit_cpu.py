"""Vision step on CPU: per-request vs batched, old vs new SDPA attention.

SGLang's real Qwen3-VL vision tower (random weights, sizes from the flags)
encodes N single-image requests two ways:

* per-request: ``get_image_feature([item])`` once per request (N calls);
* batched: ``get_image_feature(items)`` once for all N images.

Each is run in one process and as the DP encoder on 2 gloo ranks
(``mm_enable_dp_encoder``, attention-TP 2), where SGLang's
``run_dp_sharded_mrope_vision_model`` splits the images of one call across
the ranks. "new" is the installed backend (the fork's patch: each packed
sequence attended on its own). "old" swaps in, for this benchmark process
only, a re-implementation of the unpatched behaviour: one SDPA call over the
concatenation under a dense block-diagonal [1, s, s] boolean mask, cached per
cu_seqlens like the original. The product has no such switch.

Every (setting, image size, attention) point runs in fresh processes, so
the old path's dense masks cannot leave their heap to the next point. Times
are medians over --repeats runs after --warmup runs, the two phases
alternating in order; the speed-up is the median over repeats of the ratio
of the two phases within one repeat (run back to back, they share whatever
load the machine had then). The rank processes run with glibc keeping
freed memory (--malloc keep-heap, the default; why: the docstring of
cpu_support.bench.vit_bench_util.keep_heap_malloc_env).

Peak memory comes from one more, untimed run of each phase: the free heap
handed back to the OS first (malloc_trim) and the old path's mask cache
emptied, it is the growth of the process's peak RSS (VmHWM, reset via
/proc/self/clear_refs) over its RSS when the phase starts; for 2 ranks, the
larger of the two.

Example (the benchmark/vit/README.md table):
    .venv/bin/python benchmark/vit/bench_vit_cpu.py --repeats 7
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

from cpu_support.bench import vit_bench_util as U  # noqa: E402  (stdlib only at import)
from cpu_support.standins.prepare import prepare_cpu_process  # noqa: E402

prepare_cpu_process()

# ---------------------------------------------------------------------------
# One point (one process, or one rank): a size and an attention, both phases
# ---------------------------------------------------------------------------


def _worker(rank, world_size, init_method, cfg):
    import gc

    import torch
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    dp = world_size > 1
    config = T.tiny_qwen3_vl_config(vision=cfg["vision"])
    model_dir = T.write_config_dir(config)
    T.publish_cpu_context(
        tp_size=world_size, rank=rank, dp_encoder=dp, model_path=model_dir
    )
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(config, seed=0)

    def barrier():
        if dp:
            torch.distributed.barrier()

    grid = (1, cfg["size"] // cfg["patch"], cfg["size"] // cfg["patch"])
    items = [
        T.image_item(grid, seed=1000 + i, config=config) for i in range(cfg["images"])
    ]

    def per_request():
        return [model.get_image_feature([item]) for item in items]

    def batched():
        return model.get_image_feature(items)

    phases = (("per_request", per_request), ("batched", batched))
    times = {name: [] for name, _ in phases}
    peaks = {}
    with U.dense_masked_attention(cfg["attention"] == "old"), torch.no_grad():
        for _ in range(cfg["warmup"]):
            for _, fn in phases:
                fn()
        # Alternate the order every repeat so that load from other
        # processes on a shared machine hits both phases alike.
        for r in range(cfg["repeats"]):
            for name, fn in phases if r % 2 == 0 else phases[::-1]:
                barrier()
                t0 = time.perf_counter()
                fn()
                barrier()
                times[name].append(time.perf_counter() - t0)
        # Memory in one more, untimed run per phase, from a trimmed heap and
        # (old) an empty mask cache: what the phase needs.
        for name, fn in phases:
            U.forget_dense_masks()
            gc.collect()
            U.release_free_heap()
            barrier()
            with U.PeakRss() as mem:
                fn()
            peaks[name] = mem.mib
    row = dict(size=cfg["size"], attention=cfg["attention"])
    for name, _ in phases:
        row[name + "_ms"] = 1000 * statistics.median(times[name])
        row[name + "_range"] = (1000 * min(times[name]), 1000 * max(times[name]))
        row[name + "_mib"] = peaks[name]
    # Repeat r's two phases run back to back, so a burst of load from
    # outside hits both: their ratio cancels most of it.
    row["speedup"] = statistics.median(
        p / b for p, b in zip(times["per_request"], times["batched"])
    )
    return row


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--images", type=int, default=8, help="single-image requests")
    p.add_argument("--sizes", default="224,448", help="image sides in pixels")
    p.add_argument("--attention", default="old,new")
    p.add_argument("--settings", default="1proc,dp2", help="1proc and/or dp2")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument(
        "--malloc",
        choices=("keep-heap", "default"),
        default="keep-heap",
        help="glibc allocator of the rank processes (see vit_bench_util.keep_heap_malloc_env)",
    )
    args = p.parse_args(argv)

    from cpu_support.ranks.gloo import run_on_ranks

    if args.malloc == "keep-heap":
        U.keep_heap_malloc_env()  # read by glibc when each rank process starts

    patch = 16
    cfg = dict(
        vision=dict(
            depth=args.depth,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_heads=args.heads,
            patch_size=patch,
            deepstack_visual_indexes=[args.depth // 2],
        ),
        patch=patch,
        images=args.images,
        repeats=args.repeats,
        warmup=args.warmup,
    )
    settings = {"1proc": ("1 process", 1), "dp2": ("DP encoder, 2 gloo ranks", 2)}
    rows = []
    for key in args.settings.split(","):
        label, world = settings[key]
        for side in [int(x) for x in args.sizes.split(",")]:
            for which in args.attention.split(","):
                # Fresh processes for every point: the old path's masks (GiBs
                # at 448) must not leave their heap behind for the next point.
                point = dict(cfg, size=side, attention=which)
                t0 = time.perf_counter()
                row, *others = run_on_ranks(
                    _worker, world, point, timeout=3600, threads_per_rank=args.threads
                )
                for other in others:
                    for k in ("per_request_mib", "batched_mib"):
                        row[k] = max(row[k], other[k])
                rows.append(dict(row, setting=label))
                print(
                    f"# {label}, {side}, {which}: {time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                )

    print(
        f"Qwen3-VL vision tower (SGLang's code, random weights): depth {args.depth}, "
        f"hidden {args.hidden}, {args.heads} heads, fp32, {args.images} single-image "
        f"requests, {args.threads} thread(s) per process, malloc {args.malloc}; "
        f"median of {args.repeats} after {args.warmup} warm-up (min–max in brackets), "
        f"fresh processes per row.\n"
    )

    def ms(r, phase):
        lo, hi = r[phase + "_range"]
        return f"{r[phase + '_ms']:.0f} ms ({lo:.0f}–{hi:.0f})"

    print(
        U.markdown_table(
            [
                "setting",
                "image",
                "attention",
                "per-request (N calls)",
                "batched (1 call)",
                "batched speed-up (paired)",
                "peak mem per-request",
                "peak mem batched",
            ],
            [
                [
                    r["setting"],
                    f"{r['size']}×{r['size']}",
                    r["attention"],
                    ms(r, "per_request"),
                    ms(r, "batched"),
                    f"{r['speedup']:.2f}×",
                    f"{r['per_request_mib']:.0f} MiB",
                    f"{r['batched_mib']:.0f} MiB",
                ]
                for r in rows
            ],
            align="lll",
        )
    )
    return rows


if __name__ == "__main__":
    main()
