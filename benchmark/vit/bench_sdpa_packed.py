"""One vision attention layer on the CPU, pristine 0.5.23 vs the series: the
``sdpa`` backend's block-diagonal mask against per-sequence attention.

The layer is SGLang's own ``VisionAttention`` (block 0's ``attn`` of a
random-weight ``Qwen3VLMoeVisionModel``: qkv projection, rotary embedding,
``VisionSdpaAttention``, output projection; fp32, ``--mm-attention-backend
sdpa``), fed one cross-request encoder call: the images of a batch packed
back to back, ``cu_seqlens`` as the tower builds it, rotary cos/sin from the
tower's ``rot_pos_emb``. Each (batch, tree) runs in its own process with the
tree first on ``PYTHONPATH`` (default: make setup's pristine and series trees),
on the same seeded weights and inputs.

Batches: ``--images`` images of the ``--mix`` sizes (Qwen3-VL: 16-pixel
patches, sides multiples of 32), interleaved so that neighbours differ in size
as in a burst of single-image requests; ``--distinct`` adds batches whose
images all have different patch counts (one length per image, the per-length
loop's worst case).

Per row:

* mask MiB: the bytes of the mask tensors ``VisionSdpaAttention`` builds
  (``_generate_mask_cache`` wrapped, counted on a miss) and the bytes of the
  ``attn_mask`` handed to ``F.scaled_dot_product_attention``, read off the
  tensors in one untimed call with an empty mask cache; SDPA calls: that
  call's ``F.scaled_dot_product_attention`` calls.
* layer ms: process CPU time (``time.process_time``) of one layer call,
  median (min-max) over --repeats after --warmup. "new mask": the mask cache
  emptied first (a call's first layer builds its mask); "cached": right after,
  same ``cu_seqlens`` (a call's other layers). Wall-clock medians for the
  cached call come with them; on a shared machine the CPU times are the
  figures to compare.
* peak MiB: growth of the process's peak RSS over one more call from a trimmed
  heap and an empty mask cache (``vit_bench_util.PeakRss``; glibc keeps freed
  memory, ``keep_heap_malloc_env``, as in bench_vit_cpu).
* rows: the series' layer output against pristine's, max |diff|; the script
  stops (exit 1) when they differ by more than fp32 tolerance.

    .venv/bin/python benchmark/vit/bench_sdpa_packed.py                # 8, 32, 64 + 64 distinct
    .venv/bin/python benchmark/vit/bench_sdpa_packed.py --images 8 --distinct '' --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cpu_support.bench import vit_bench_util as U  # noqa: E402  (stdlib only)
from cpu_support.standins.prepare import prepare_cpu_process  # noqa: E402

prepare_cpu_process()  # before any sglang import, in the workers too

TREES = os.path.join(ROOT, ".cache", "trees")
PRISTINE_TREE = os.path.join(TREES, "sglang-0.5.23-pristine")
SERIES_TREE = os.path.join(TREES, "sglang-0.5.23-series")
# Thumbnails to mid-size images, 64 to 400 patches (mean 164.5): a 64-image
# call is 10528 patches, whose dense mask and fp32 scores still fit a CPU box.
DEFAULT_MIX = "320x320,224x224,256x192,160x160,192x128,224x160,128x128,256x128"
RTOL = ATOL = 1e-5
SEED = 0


def mixed_grids(mix, n):
    """The first ``n`` images of the mix repeated, sizes interleaved."""
    kinds = U.parse_burst(",".join(f"{size}:{n}" for size in mix.split(",")))
    return U.burst_grids(kinds)[:n]


def distinct_grids(n):
    """``n`` images of ``n`` different patch counts: the smallest counts from
    16 up (even sides for the 2x2 merge, aspect at most 1:6), large and small
    alternating as requests of any size arrive (64 images: 16 to 420 patches,
    13596 in all)."""
    counts = {}
    for h in range(2, 80, 2):
        for w in range(h, 6 * h + 1, 2):
            if h * w >= 16:
                counts.setdefault(h * w, (1, h, w))
    picks = sorted(counts)[:n]
    order = [picks[i // 2] if i % 2 else picks[-1 - i // 2] for i in range(n)]
    return [counts[c] for c in order]


# ---------------------------------------------------------------------------
# Worker: one tree, one batch, in its own process
# ---------------------------------------------------------------------------


def _mask_probe(VisionSdpaAttention, F):
    """Wrap the mask cache and SDPA; returns (log, restore)."""
    log = {"built_bytes": 0, "built": 0, "sdpa_calls": 0, "sdpa_mask_bytes": 0}
    saved_sdpa = F.scaled_dot_product_attention
    saved_cache = VisionSdpaAttention.__dict__.get("_generate_mask_cache")
    cache = getattr(saved_cache, "__func__", None)

    def sdpa(*args, **kwargs):
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        log["sdpa_calls"] += 1
        if mask is not None:
            log["sdpa_mask_bytes"] += mask.numel() * mask.element_size()
        return saved_sdpa(*args, **kwargs)

    def mask_cache(*args):
        misses = cache.cache_info().misses
        mask = cache(*args)
        if cache.cache_info().misses > misses:
            log["built"] += 1
            log["built_bytes"] += mask.numel() * mask.element_size()
        return mask

    F.scaled_dot_product_attention = sdpa
    if cache is not None:
        VisionSdpaAttention._generate_mask_cache = staticmethod(mask_cache)

    def restore():
        F.scaled_dot_product_attention = saved_sdpa
        if cache is not None:
            VisionSdpaAttention._generate_mask_cache = saved_cache

    return log, restore


def worker(cfg, out_prefix):
    import gc

    import torch
    import torch.nn.functional as F
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    import sglang
    from sglang.srt.layers.attention.vision import (
        VisionSdpaAttention,
        prepare_vision_attention_metadata,
    )
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel

    torch.set_num_threads(cfg["threads"])
    heads, head_dim = cfg["heads"], cfg["head_dim"]
    hidden = heads * head_dim
    config = T.tiny_qwen3_vl_config(
        vision=U.bench_vision(depth=2, hidden=hidden, heads=heads)
    )
    T.publish_cpu_context(model_path=T.write_config_dir(config))
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{U.free_port()}")
    with T.default_dtype(torch.float32):
        tower = Qwen3VLMoeVisionModel(config.vision_config)
    T.fill_weights_(tower, SEED)
    tower.eval()
    layer = tower.blocks[0].attn
    backend = type(layer.qkv_backend).__name__

    grids = [list(g) for g in cfg["grids"]]
    lengths = [t * h * w for t, h, w in grids]
    total = sum(lengths)
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(1, total, hidden, generator=gen)
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    with torch.no_grad():
        cos, sin = tower.rot_pos_emb(grids)
    metadata = prepare_vision_attention_metadata(cu_seqlens, device=x.device)
    clear_masks = getattr(
        getattr(VisionSdpaAttention, "_generate_mask_cache", None),
        "cache_clear",
        lambda: None,
    )

    def call():
        return layer(
            x,
            cu_seqlens=cu_seqlens,
            rotary_pos_emb_cos=cos,
            rotary_pos_emb_sin=sin,
            forward_metadata=metadata,
        )

    def timed():
        c0, w0 = time.process_time(), time.perf_counter()
        out = call()
        return out, time.process_time() - c0, time.perf_counter() - w0

    with torch.no_grad():
        for _ in range(cfg["warmup"]):
            clear_masks()
            call()
        # Masks and calls, read off one untimed call.
        clear_masks()
        log, restore = _mask_probe(VisionSdpaAttention, F)
        try:
            out = call()
        finally:
            restore()
        cold, cached, cached_wall = [], [], []
        for _ in range(cfg["repeats"]):
            clear_masks()
            _, cpu, _ = timed()
            cold.append(cpu)
            _, cpu, wall = timed()
            cached.append(cpu)
            cached_wall.append(wall)
        clear_masks()
        gc.collect()
        U.release_free_heap()
        with U.PeakRss() as mem:
            call()
    torch.save(out, out_prefix + ".pt")
    row = dict(
        sglang=os.path.dirname(os.path.dirname(sglang.__file__)),
        backend=backend,
        images=len(grids),
        patches=total,
        lengths=len(set(lengths)),
        peak_mib=mem.mib,
        cold_ms=[1e3 * t for t in cold],
        cached_ms=[1e3 * t for t in cached],
        cached_wall_ms=[1e3 * t for t in cached_wall],
        **log,
    )
    with open(out_prefix + ".json", "w") as f:
        json.dump(row, f)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def series_status(tree):
    """``scripts/series.py status --json --target TREE``, parsed (or an error)."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "series.py"), "status"]
        + ["--json", "--target", tree],
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": (proc.stderr.strip() or "no output")[-200:]}


def describe(st):
    if st.get("error"):
        return f"unknown ({st['error']})"
    if not st.get("applied"):
        return f"sglang {st.get('sglang_version')}, no series applied"
    current = "" if st.get("current") else ", not the repository's current series"
    return (
        f"sglang {st.get('sglang_version')}, series {st['series_hash'][:12]} "
        f"({len(st.get('patches') or [])} patches{current})"
    )


def run_point(tree, cfg, out_prefix, timeout):
    """One worker process with ``tree`` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = str(cfg["threads"])
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)]
        + ["--worker-out", out_prefix],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"worker on {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    with open(out_prefix + ".json") as f:
        row = json.load(f)
    if os.path.realpath(row["sglang"]) != os.path.realpath(tree):
        raise SystemExit(f"worker imported sglang from {row['sglang']}, not {tree}")
    return row


def spread(ms):
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}–{max(ms):.1f})"


def mib(nbytes):
    return f"{nbytes / 2**20:.1f}"


def batches_arg(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a comma list of counts: {text!r}")
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError("image counts must be positive")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--images", type=batches_arg, default=[8, 32, 64])
    p.add_argument(
        "--distinct",
        type=batches_arg,
        default=[64],
        help="batches whose images all differ in patch count ('' for none)",
    )
    p.add_argument("--mix", default=DEFAULT_MIX, help="WxH sizes, comma-separated")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=72, help="Qwen3-VL's is 72")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--pristine-tree", default=PRISTINE_TREE)
    p.add_argument("--series-tree", default=SERIES_TREE)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker), args.worker_out)
        return 0
    U.check_run_args(p, args, tower=False)
    if args.heads < 1 or args.head_dim < 2 or args.head_dim % 2:
        p.error("--heads must be >= 1 and --head-dim even")
    try:
        mixed_grids(args.mix, 1)
        batches = [(f"{n} mixed", mixed_grids(args.mix, n)) for n in args.images]
        batches += [(f"{n} distinct", distinct_grids(n)) for n in args.distinct]
    except ValueError as e:
        p.error(str(e))
    if not batches:
        p.error("no batch to run")

    import torch

    U.keep_heap_malloc_env()  # read by glibc when each worker starts
    trees = {"pristine": args.pristine_tree, "series": args.series_tree}
    status = {name: series_status(tree) for name, tree in trees.items()}
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="bench-sdpa-") as tmp:
        for label, grids in batches:
            cfg = dict(
                grids=grids,
                heads=args.heads,
                head_dim=args.head_dim,
                repeats=args.repeats,
                warmup=args.warmup,
                threads=args.threads,
            )
            point = {}
            for name, tree in trees.items():
                t0 = time.perf_counter()
                prefix = os.path.join(tmp, f"{len(results)}-{name}")
                point[name] = run_point(tree, cfg, prefix, args.timeout)
                point[name]["out"] = torch.load(prefix + ".pt")
                print(
                    f"# {label}, {name}: {time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                )
            base, new = point["pristine"]["out"], point["series"]["out"]
            diff = (base - new).abs().max().item() if base.shape == new.shape else None
            if diff is None or not torch.allclose(new, base, rtol=RTOL, atol=ATOL):
                print(
                    f"rows differ at {label}: max |diff| {diff} "
                    f"(tolerance rtol {RTOL}, atol {ATOL}); stopping",
                    file=sys.stderr,
                )
                return 1
            ratio = statistics.median(
                s / b
                for s, b in zip(
                    point["series"]["cached_ms"], point["pristine"]["cached_ms"]
                )
            )
            for name in trees:
                r = point[name]
                del r["out"]
                r.update(batch=label, tree=name, max_abs_diff=diff)
                results.append(r)
                rows.append(
                    [
                        label,
                        r["patches"],
                        r["lengths"],
                        name,
                        f"{mib(r['built_bytes'])} ({r['built']})",
                        mib(r["sdpa_mask_bytes"]),
                        r["sdpa_calls"],
                        spread(r["cold_ms"]),
                        spread(r["cached_ms"]),
                        f"{statistics.median(r['cached_wall_ms']):.1f}",
                        f"{r['peak_mib']:.0f}",
                        f"{ratio:.3f}" if name == "series" else "",
                        f"{diff:.1e}" if name == "series" else "",
                    ]
                )

    print(
        f"One VisionAttention layer (Qwen3-VL block 0, SGLang's code, sdpa backend, "
        f"random weights, fp32): {args.heads} heads x {args.head_dim}, "
        f"{args.threads} thread(s), torch {torch.__version__}; "
        f"CPU ms median (min–max) of {args.repeats} after {args.warmup} warm-up; "
        f"mixed sizes: {args.mix}.\n"
    )
    for name, tree in trees.items():
        print(f"- {name}: {tree}: {describe(status[name])}")
    print()
    print(
        U.markdown_table(
            [
                "images",
                "patches",
                "lengths",
                "tree",
                "mask built MiB (masks)",
                "SDPA mask MiB",
                "SDPA calls",
                "layer CPU ms, new mask",
                "layer CPU ms, cached",
                "wall ms, cached",
                "peak MiB",
                "cached CPU vs pristine",
                "rows max abs diff",
            ],
            rows,
            align="lrrl",
        )
    )
    command = ["python", os.path.relpath(os.path.abspath(__file__), ROOT)]
    print("\n    " + shlex.join(command + list(sys.argv[1:] if argv is None else argv)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(status=status, rows=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
