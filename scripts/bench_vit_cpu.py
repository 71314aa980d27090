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
freed memory (--malloc keep-heap, the default; see KEEP_HEAP for why).

Peak memory comes from one more, untimed run of each phase: the free heap
handed back to the OS first (malloc_trim) and the old path's mask cache
emptied, it is the growth of the process's peak RSS (VmHWM, reset via
/proc/self/clear_refs) over its RSS when the phase starts; for 2 ranks, the
larger of the two.

Example (the docs/benchmarks.md table):
    .venv/bin/python scripts/bench_vit_cpu.py --repeats 7
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_support.standins import prepare_cpu_process  # noqa: E402

prepare_cpu_process()

# ---------------------------------------------------------------------------
# The unpatched attention, re-implemented for comparison ("old")
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _old_block_diagonal_mask(total: int, bounds: tuple):
    import torch

    mask = torch.zeros(1, total, total, dtype=torch.bool)
    for start, end in zip(bounds[:-1], bounds[1:]):
        mask[:, start:end, start:end] = True
    return mask


def _old_masked_forward(self, q, k, v, bsz, cu_seqlens=None, attention_mask=None, **kwargs):
    """Unpatched semantics for the flatten_batch case the tower uses."""
    import torch.nn.functional as F

    total = q.shape[0]
    mask = attention_mask
    if mask is None and cu_seqlens is not None:
        mask = _old_block_diagonal_mask(total, tuple(cu_seqlens.tolist()))
    qh, kh, vh = (
        t.reshape(1, total, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v)
    )
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, dropout_p=self.dropout, scale=self.scale
    )
    return out.transpose(1, 2).reshape(total, q.shape[1], q.shape[2])


class attention_impl:
    """Context: use "old" (masked) or "new" (installed) SDPA attention."""

    def __init__(self, which: str):
        self.which = which

    def __enter__(self):
        from sglang.srt.layers.attention.vision import VisionSdpaAttention

        self.saved = VisionSdpaAttention.forward
        if self.which == "old":
            VisionSdpaAttention.forward = _old_masked_forward
        return self

    def __exit__(self, *exc):
        from sglang.srt.layers.attention.vision import VisionSdpaAttention

        VisionSdpaAttention.forward = self.saved
        _old_block_diagonal_mask.cache_clear()


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------

# glibc's malloc, as PyTorch's CPU allocator uses it, maps every tensor over
# its (dynamic, at most 32 MiB) mmap threshold afresh and unmaps it on free:
# a batched call's 30-40 MiB activations are page-faulted in again on every
# layer, while a one-image call's few-MiB tensors are reused from the heap.
# That taxes exactly the batched path, and a serving process never pays it on
# a GPU (PyTorch's caching allocator keeps its blocks); PyTorch's CPU tuning
# guide swaps in jemalloc/tcmalloc for the same reason. These settings make
# glibc keep freed memory instead. --malloc default measures without them.
KEEP_HEAP = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 34),
    "MALLOC_TOP_PAD_": str(1 << 29),
}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _release_free_heap() -> None:
    """Hand the allocator's free memory back to the OS (glibc malloc_trim).

    With the heap kept (see KEEP_HEAP), freed tensors stay resident; trimming
    first makes a phase's RSS growth its own need again.
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak RSS growth (MiB) over a phase."""

    def __enter__(self):
        import gc

        gc.collect()
        _release_free_heap()
        self.exact = _reset_peak()
        self.start = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        self.mib = max(0, _status_kib("VmHWM") - self.start) / 1024


# ---------------------------------------------------------------------------
# One process (or rank): every size x attention, per-request and batched
# ---------------------------------------------------------------------------


def _worker(rank, world_size, init_method, cfg):
    import torch

    from cpu_support import tiny_qwen3_vl as T

    dp = world_size > 1
    config = T.tiny_qwen3_vl_config(vision=cfg["vision"])
    model_dir = T.write_config_dir(config)
    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=dp, model_path=model_dir)
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(config, seed=0)

    def barrier():
        if dp:
            torch.distributed.barrier()

    results = []
    for side in cfg["sizes"]:
        grid = (1, side // cfg["patch"], side // cfg["patch"])
        items = [
            T.image_item(grid, seed=1000 + i, config=config) for i in range(cfg["images"])
        ]

        def per_request():
            return [model.get_image_feature([item]) for item in items]

        def batched():
            return model.get_image_feature(items)

        phases = (("per_request", per_request), ("batched", batched))
        for which in cfg["attention"]:
            with attention_impl(which), torch.no_grad():
                for _ in range(cfg["warmup"]):
                    for _, fn in phases:
                        fn()
                times = {name: [] for name, _ in phases}
                peaks = {}
                # Alternate the order every repeat so that load from other
                # processes on a shared machine hits both phases alike.
                for r in range(cfg["repeats"]):
                    for name, fn in phases if r % 2 == 0 else phases[::-1]:
                        barrier()
                        t0 = time.perf_counter()
                        fn()
                        barrier()
                        times[name].append(time.perf_counter() - t0)
                # Memory in one more, untimed run per phase, from a trimmed
                # heap and (old) an empty mask cache: what the phase needs.
                for name, fn in phases:
                    _old_block_diagonal_mask.cache_clear()
                    barrier()
                    with PeakMemory() as mem:
                        fn()
                    peaks[name] = mem.mib
                row = dict(size=side, attention=which)
                for name, _ in phases:
                    row[name + "_ms"] = 1000 * statistics.median(times[name])
                    row[name + "_range"] = (1000 * min(times[name]), 1000 * max(times[name]))
                    row[name + "_mib"] = peaks[name]
                # Repeat r's two phases run back to back, so a burst of load
                # from outside hits both: their ratio cancels most of it.
                row["speedup"] = statistics.median(
                    p / b for p, b in zip(times["per_request"], times["batched"])
                )
                results.append(row)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        help="glibc allocator of the rank processes (see KEEP_HEAP)",
    )
    args = p.parse_args(argv)

    from cpu_support.ranks import run_on_ranks

    if args.malloc == "keep-heap":
        # Read by glibc when each rank process starts.
        os.environ.update(KEEP_HEAP)

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
        sizes=[int(s) for s in args.sizes.split(",")],
        attention=args.attention.split(","),
        images=args.images,
        repeats=args.repeats,
        warmup=args.warmup,
    )
    settings = {"1proc": ("1 process", 1), "dp2": ("DP encoder, 2 gloo ranks", 2)}
    rows = []
    for key in args.settings.split(","):
        label, world = settings[key]
        for side in cfg["sizes"]:
            for which in cfg["attention"]:
                # Fresh processes for every point: the old path's masks (GiBs
                # at 448) must not leave their heap behind for the next point.
                point = dict(cfg, sizes=[side], attention=[which])
                t0 = time.perf_counter()
                per_rank = run_on_ranks(
                    _worker, world, point, timeout=3600, threads_per_rank=args.threads
                )
                row = per_rank[0][0]
                for other in per_rank[1:]:
                    for k in ("per_request_mib", "batched_mib"):
                        row[k] = max(row[k], other[0][k])
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
    print(
        "| setting | image | attention | per-request (N calls) | batched (1 call) "
        "| batched speed-up (paired) | peak mem per-request | peak mem batched |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")

    def ms(r, phase):
        lo, hi = r[phase + "_range"]
        return f"{r[phase + '_ms']:.0f} ms ({lo:.0f}–{hi:.0f})"

    for r in rows:
        print(
            f"| {r['setting']} | {r['size']}×{r['size']} | {r['attention']} "
            f"| {ms(r, 'per_request')} | {ms(r, 'batched')} "
            f"| {r['speedup']:.2f}× "
            f"| {r['per_request_mib']:.0f} MiB | {r['batched_mib']:.0f} MiB |"
        )
    return rows


if __name__ == "__main__":
    main()
