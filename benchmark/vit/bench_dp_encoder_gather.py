#!/usr/bin/env python
"""The DP encoder's per-rank buffers at attention-TP 2, 4 and 8, padded and
exact, vs the cap.

SGLang's real ``Qwen3VLForConditionalGeneration`` is built with
``--mm-enable-dp-encoder`` on every rank, and a step of single-image requests
goes through SGLang's real prefill-step function
(``mm_schedule._get_chunked_prefill_embedding``), so each encoder call runs
SGLang's real DP runner (``mm_utils.run_dp_sharded_mrope_vision_model``).
Each step runs twice, through two gathers of uneven shares (``--paths``):

* ``padded``: every rank's output padded to the largest share and
  all-gathered (SGLang 0.5.23; forced through
  ``mm_utils.dp_encoder_gather_path``);
* ``exact``: the runner's own choice, each rank's exact rows into one buffer
  of the call's rows (PyNccl's all-gather-v on NCCL/RCCL, one broadcast per
  rank on gloo).

Measured per rank, by observing the tensors the rank's attention-TP group
gathers (through wrappers on its ``all_gather``, ``all_gatherv`` and
``broadcast``) and the runner's return value; the largest over the step's
calls:

* gather input, gather buffer and reassembled output (bytes); useful bytes:
  the real rows of the call with the largest gather;
* received / output: the gather buffer (a one-image call: its broadcast)
  over the call's output; the run stops if the exact path's exceeds 1.1;
* the gather as the formula gives it (docs/batching.md), from SGLang's load
  balancer on the call's patch counts and the output row: the call's rows
  exact or for equal shares, attention-TP x the largest share padded, none
  for a one-image call (broadcast); the run stops if a measured gather
  differs from it;
* encoder calls (the cap splits a step);
* vision step time, median and range of ``--repeats`` steps between
  barriers (the two paths alternate), only where each rank has a core of
  its own, or a GPU of its own over NCCL/RCCL;
* on a GPU, the step's device peak (``torch.cuda.max_memory_allocated``
  over the step minus what was allocated before it).

The pre-sharded video runner (``run_dp_presharded_mrope_vision_model``,
GLM-5-Next's decoded frames; the same tower, attention-TP + 1 frames, two on
rank 0) and InternVL's tile runner (``run_dp_sharded_vision_model``; a tiny
InternViT encoder, attention-TP + 1 tiles) run both paths too, checked
against the same formula.

Batches: ``small`` (16 images of 64 patches), ``large+small`` (one of 4096
patches, then 15 of 64), ``large+tiny`` (one of 4096, then 7 of 4),
``2large+tiny`` (two of 4096 among 6 of 4). Caps: unset and ``--caps``
(``--mm-max-encoder-input-tokens-per-batch``, set with
``get_mm().override``).

CPU (gloo ranks spawned by ``cpu_support.ranks.gloo``; the tiny tower of
``gpu_vit_check.py``):
    .venv/bin/python benchmark/vit/bench_dp_encoder_gather.py --tp 2,4,8
GPU (one run per width, the patched tree first on PYTHONPATH):
    PYTHONPATH=/tmp/sglang-series/python torchrun --nproc-per-node 8 benchmark/vit/bench_dp_encoder_gather.py
More ranks than GPUs (a one-GPU box): ``--dist-backend gloo`` puts rank r on
GPU r mod count, SGLang's PyNccl off; the runner's all-gather and broadcast
then go through gloo, which copies CUDA tensors through the host (no step time).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import shlex
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (ROOT, os.path.join(ROOT, "benchmark", "gpu_check")):
    if path not in sys.path:
        sys.path.insert(0, path)

import gpu_vit_check as G  # noqa: E402  (stdlib only at import)
from cpu_support.bench import vit_bench_util as U  # noqa: E402

LARGE, SMALL, TINY = (1, 64, 64), (1, 8, 8), (1, 2, 2)
BATCHES = {
    "small": [SMALL] * 16,
    "large+small": [LARGE] + [SMALL] * 15,
    "large+tiny": [LARGE] + [TINY] * 7,
    "2large+tiny": [LARGE] + [TINY] * 3 + [LARGE] + [TINY] * 3,
}
CAPS = (512, 2048)
# The text part only has to build at attention-TP 8: heads divisible by 8.
TEXT_TP8 = dict(
    num_attention_heads=8,
    num_key_value_heads=8,
    head_dim=8,
    rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2]},
)


@contextlib.contextmanager
def gather_path(path: str):
    """``exact``: the runner's own choice. ``padded``: every uneven call
    through the padded all-gather, as SGLang 0.5.23 gathers."""
    from sglang.srt.multimodal import mm_utils

    real = getattr(mm_utils, "dp_encoder_gather_path", None)
    if path == "exact" and real is None:
        sys.exit("bench_dp_encoder_gather: this sglang has no exact gather")
    if path == "padded" and real is not None:
        mm_utils.dp_encoder_gather_path = lambda group, shares: (
            "all_gather" if len(set(shares)) == 1 else "padded"
        )
    try:
        yield
    finally:
        if real is not None:
            mm_utils.dp_encoder_gather_path = real


@contextlib.contextmanager
def observed_group(calls: list):
    """Record, per DP-runner call (appended by the caller), what the rank's
    attention-TP group gathers: the gather's input (``local``) and the buffer
    it fills (``gather``; for one broadcast per rank, the one buffer the
    pieces belong to), or a one-image call's broadcast."""
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group
    real = {
        n: getattr(group, n, None) for n in ("all_gather", "all_gatherv", "broadcast")
    }

    def all_gather(input_, *args, **kwargs):
        result = real["all_gather"](input_, *args, **kwargs)
        if calls:
            calls[-1].update(local=input_.nbytes, gather=result.nbytes)
        return result

    def all_gatherv(input_, *args, **kwargs):
        result = real["all_gatherv"](input_, *args, **kwargs)
        if calls:
            calls[-1].update(local=input_.nbytes, gather=result[0].nbytes)
        return result

    def broadcast(tensor, src=0, **kwargs):
        if calls and len(calls[-1]["grids"]) == 1:
            calls[-1]["broadcast"] = tensor.nbytes
        elif calls:  # one piece of the exact buffer
            calls[-1]["gather"] = tensor.untyped_storage().nbytes()
            if src == group.rank_in_group:
                calls[-1]["local"] = tensor.nbytes
        return real["broadcast"](tensor, src=src, **kwargs)

    group.all_gather, group.broadcast = all_gather, broadcast
    if real["all_gatherv"] is not None:
        group.all_gatherv = all_gatherv
    try:
        yield calls
    finally:
        for name, fn in real.items():
            if fn is not None:
                delattr(group, name)


@contextlib.contextmanager
def observed_runner(model, calls: list):
    """Record, per call of the model's DP runner, its grids, its gather
    (``observed_group``) and its output (nbytes; ``row``: one row)."""
    from sglang.srt.models import qwen3_vl

    real_runner = qwen3_vl.run_dp_sharded_mrope_vision_model

    def runner(vision_model, pixel_values, grid_thw_list, **kwargs):
        calls.append(dict(grids=[list(g) for g in grid_thw_list], local=0, gather=0))
        out = real_runner(vision_model, pixel_values, grid_thw_list, **kwargs)
        calls[-1]["out"] = out.nbytes
        calls[-1]["row"] = out[0].nbytes if out.shape[0] else 0
        return out

    qwen3_vl.run_dp_sharded_mrope_vision_model = runner
    try:
        with observed_group(calls):
            yield calls
    finally:
        qwen3_vl.run_dp_sharded_mrope_vision_model = real_runner


def shares_of(grids, ranks: int, merge: int) -> list:
    """Each rank's output tokens, as SGLang's load balancer assigns the
    call's images by patch count."""
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    patches = [U.patches(g) for g in grids]
    order, counts, _ = get_dp_encoder_lb_assignment(patches, ranks)
    shares, start = [], 0
    for n in counts:
        shares.append(sum(patches[i] // merge**2 for i in order[start : start + n]))
        start += n
    return shares


def predicted_gather(shares, row_bytes: int, path: str, one_image=False) -> int:
    """The gather buffer by the formula: the call's T rows exact (or equal
    shares), attention-TP x the largest share padded; a one-image call is
    broadcast into its output, with no gather."""
    if one_image:
        return 0
    if path == "exact" or len(set(shares)) == 1:
        return sum(shares) * row_bytes
    return len(shares) * max(shares) * row_bytes


def per_path(grids, run) -> dict:
    """One record per gather path of one call of ``run`` (a DP runner), as
    ``observed_runner`` keeps them."""
    import torch

    records = {}
    for path in PATHS:
        calls = [dict(grids=grids, local=0, gather=0)]
        with gather_path(path), observed_group(calls), torch.no_grad():
            out = run()
        calls[0].update(out=out.nbytes, row=out[0].nbytes)
        records[path] = calls[0]
    return records


def presharded_calls(model, config, rank: int, ranks: int, device, dtype) -> list:
    """The pre-sharded video runner (GLM-5-Next's decoded frames) on the same
    tower: ranks + 1 frames of the ``small`` grid, two on rank 0, one on each
    other rank; one record per path, as ``observed_runner`` keeps them."""
    import torch

    from sglang.srt.multimodal.mm_utils import run_dp_presharded_mrope_vision_model

    v = config.vision_config
    counts = [2] + [1] * (ranks - 1)
    frames = [list(SMALL)] * (ranks + 1)
    mine = frames[: counts[rank]]
    values = v.in_channels * v.temporal_patch_size * v.patch_size**2
    generator = torch.Generator().manual_seed(rank)
    pixels = torch.randn(
        sum(U.patches(g) for g in mine), values, generator=generator
    ).to(device=device, dtype=dtype)
    return per_path(
        frames,
        lambda: run_dp_presharded_mrope_vision_model(
            model.visual, pixels, mine, frames, counts
        ),
    )


# InternViT at tiny sizes: 32x32-pixel tiles of 8x8 patches, 17 rows a tile.
INTERN_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
INTERN_VIT |= dict(num_attention_heads=2, image_size=32, patch_size=8)
INTERN_VIT |= dict(qkv_bias=True, qk_normalization=False, norm_type="layer_norm")


def tile_calls(rank: int, ranks: int, device, dtype) -> dict:
    """InternVL's tile runner (``run_dp_sharded_vision_model``) on a tiny
    InternViT encoder: attention-TP + 1 tiles, ceil(tiles / attention-TP) a
    rank, the last ranks padded; one record per path."""
    import torch

    from sglang.srt.configs.internvl import InternVisionConfig
    from sglang.srt.models.internvl import InternVisionModel
    from sglang.srt.multimodal.mm_utils import run_dp_sharded_vision_model

    config = InternVisionConfig(**INTERN_VIT, hidden_act="gelu")
    vit = InternVisionModel(config, use_data_parallel=True).to(device, dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in sorted(vit.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    tiles = torch.randn(ranks + 1, 17, 32, generator=generator).to(device, dtype)
    return per_path(
        [[1, 1, 1]] * (ranks + 1),
        lambda: run_dp_sharded_vision_model(tiles, vit.encoder),
    )


def rank_main(rank: int, world_size: int, init_method: str, opts: dict) -> dict:
    import torch

    from sglang.srt.runtime_context import get_mm

    device = opts["device"]
    # The text part shardable at TP8.
    config, model_dir = G.make_config(opts["vision"], TEXT_TP8, "dp-encoder-gather")
    model = G.build_dp_encoder_rank(
        config, model_dir, opts, rank, world_size, init_method
    )
    dev = G.Device(device)
    group = torch.distributed.group.WORLD

    def step(requests, measure_peak=False):
        G.empty_embedding_cache()
        with dev.peak() if measure_peak else contextlib.nullcontext({}) as mem:
            seconds = G.timed_prefill_step(model, requests, device, dev, group)
        return seconds, mem.get("mib")

    rows = []
    with torch.no_grad():
        for name in opts["batches"]:
            requests = G.make_requests(BATCHES[name], config)
            for cap in opts["caps"]:
                with get_mm().override(mm_max_encoder_input_tokens_per_batch=cap):
                    found = {}
                    for path in opts["paths"]:
                        with gather_path(path):
                            step(requests)  # warm-up: this step's shapes
                            calls = []
                            with observed_runner(model, calls):
                                step(requests)
                            _, peak = step(requests, measure_peak=device == "cuda")
                        found[path] = dict(calls=calls, peak_mib=peak, s=[])
                    # The paths alternate, so both see the same load.
                    for _ in range(opts["repeats"]):
                        for path in opts["paths"]:
                            with gather_path(path):
                                found[path]["s"].append(step(requests)[0])
                for path in opts["paths"]:
                    rows.append(dict(batch=name, cap=cap, path=path, **found[path]))
    presharded = presharded_calls(
        model, config, rank, world_size, device, getattr(torch, opts["dtype"])
    )
    tiles = tile_calls(rank, world_size, device, getattr(torch, opts["dtype"]))
    return dict(device=dev.describe(), rows=rows, presharded=presharded, tiles=tiles)


MAX_EXACT_RATIO = 1.1
PATHS = ("padded", "exact")
RUNNERS = {
    "presharded": "pre-sharded video (2 frames on rank 0, 1 on the others)",
    "tiles": "InternVL tiles (attention-TP + 1)",
}


def check_call(c: dict, ranks: int, merge: int, path: str, runner: str) -> tuple:
    """Stop if the call's gather differs from the formula, or if the exact
    path received more than MAX_EXACT_RATIO x the call's output; return the
    formula's gather and what the rank received over the call's output."""
    if runner == "presharded":  # two frames on rank 0, one on each other
        frame = U.patches(SMALL) // merge**2
        shares = [2 * frame] + [frame] * (ranks - 1)
    elif runner == "tiles":  # ceil(tiles / ranks) a rank, in order
        n = len(c["grids"])
        each = -(-n // ranks)
        shares = [max(0, min(each, n - r * each)) for r in range(ranks)]
    else:
        shares = shares_of(c["grids"], ranks, merge)
    one_image = runner == "mrope" and len(c["grids"]) == 1
    want = predicted_gather(shares, c["row"], path, one_image)
    where = f"{runner}, {path}, {ranks} ranks, grids {c['grids']}"
    if c["gather"] != want:
        sys.exit(
            f"bench_dp_encoder_gather: measured gather {c['gather']} B "
            f"!= formula {want} B ({where})"
        )
    ratio = (c["gather"] or c.get("broadcast", 0)) / c["out"] if c["out"] else 0.0
    if path == "exact" and ratio > MAX_EXACT_RATIO:
        sys.exit(
            f"bench_dp_encoder_gather: a rank received {ratio:.2f} x the "
            f"call's output (> {MAX_EXACT_RATIO}; {where})"
        )
    return want, ratio


def summarize(per_rank: list, opts: dict, timed: bool) -> list:
    """One row per (batch, cap, path): each rank's largest buffers over the
    calls, each call checked against the formula."""
    ranks, merge = len(per_rank), opts["vision"]["spatial_merge_size"]
    out = []
    for i, row in enumerate(per_rank[0]["rows"]):
        mine = [r["rows"][i] for r in per_rank]
        keys = ("local", "gather", "out", "useful", "predicted", "ratio")
        per = {k: [] for k in keys}
        for r in mine:
            calls = r["calls"]
            checked = [check_call(c, ranks, merge, row["path"], "mrope") for c in calls]
            wants, ratios = zip(*checked)
            per["local"].append(max(c["local"] for c in calls))
            per["gather"].append(max(c["gather"] for c in calls))
            per["out"].append(max(c["out"] for c in calls))
            # The real rows of the call with the largest gather (0: no gather).
            peak = max(calls, key=lambda c: c["gather"])
            per["useful"].append(peak["out"] if peak["gather"] else 0)
            per["predicted"].append(max(wants))
            per["ratio"].append(round(max(ratios), 2))
        step_s = [max(ts) for ts in zip(*(r["s"] for r in mine))]
        out.append(
            dict(
                ranks=ranks,
                batch=row["batch"],
                cap=row["cap"],
                path=row["path"],
                calls=len(mine[0]["calls"]),
                **per,
                step_ms=1000 * statistics.median(step_s) if timed else None,
                step_range_ms=(
                    [1000 * min(step_s), 1000 * max(step_s)] if timed else None
                ),
                peak_mib=[r["peak_mib"] for r in mine],
            )
        )
    return out


def summarize_presharded(per_rank: list, opts: dict) -> list:
    """The pre-sharded video and InternVL tile runners' buffers per path,
    checked likewise."""
    ranks, merge = len(per_rank), opts["vision"]["spatial_merge_size"]
    rows = []
    for runner, path in itertools.product(("presharded", "tiles"), PATHS):
        calls = [r[runner][path] for r in per_rank]
        ratios = [check_call(c, ranks, merge, path, runner)[1] for c in calls]
        rows.append(
            dict(
                ranks=ranks,
                runner=RUNNERS[runner],
                path=path,
                local=[c["local"] for c in calls],
                gather=[c["gather"] for c in calls],
                out=[c["out"] for c in calls],
                ratio=[round(x, 2) for x in ratios],
            )
        )
    return rows


def _bytes(values: list) -> str:
    return str(values[0]) if len(set(values)) == 1 else " / ".join(map(str, values))


def to_markdown(rows: list, presharded: list, device: str) -> str:
    gpu = any(m is not None for r in rows for m in r["peak_mib"])
    headers = [
        "attention-TP",
        "batch",
        "cap",
        "path",
        "encoder calls",
        "gather input (B)",
        "gather buffer (B)",
        "formula (B)",
        "reassembled (B)",
        "useful (B)",
        "received / output",
        "step median (ms)",
        "step min-max (ms)",
    ] + (["device peak (MiB, per rank)"] if gpu else [])
    body = []
    for r in rows:
        timed = r["step_ms"] is not None
        body.append(
            [
                r["ranks"],
                r["batch"],
                "unset" if r["cap"] is None else r["cap"],
                r["path"],
                r["calls"],
                _bytes(r["local"]),
                _bytes(r["gather"]),
                _bytes(r["predicted"]),
                _bytes(r["out"]),
                _bytes(r["useful"]),
                _bytes(r["ratio"]),
                f"{r['step_ms']:.1f}" if timed else "-",
                "%.1f-%.1f" % tuple(r["step_range_ms"]) if timed else "-",
            ]
            + ([" / ".join(f"{m:.1f}" for m in r["peak_mib"])] if gpu else [])
        )
    head = (
        f"Device: {device}. Per rank, the largest over the step's encoder calls; "
        "one value where every rank measured the same, else rank 0 / 1 / ...; "
        "received / output: the largest over the calls of the gather buffer "
        "(a one-image call: its broadcast) over the call's output.\n"
    )
    if any(r["step_ms"] is None for r in rows):
        head += "Step '-': the ranks share cores or a GPU.\n"
    pre = U.markdown_table(
        ["attention-TP", "runner", "path", "gather input (B)", "gather buffer (B)"]
        + ["output (B)", "received / output"],
        [
            [r["ranks"], r["runner"], r["path"], _bytes(r["local"])]
            + [_bytes(r["gather"])]
            + [_bytes(r["out"]), _bytes(r["ratio"])]
            for r in presharded
        ],
    )
    return (
        head
        + "\n"
        + U.markdown_table(headers, body)
        + "\n\nThe pre-sharded video runner (frames of the small grid) and "
        "InternVL's tile runner (a tiny InternViT, 17 rows a tile), on the same "
        "ranks; every buffer equal to the formula:\n\n" + pre
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tp", default="2,4,8", help="attention-TP widths (CPU only)")
    p.add_argument(
        "--batches", default=",".join(BATCHES), help=f"of {', '.join(BATCHES)}"
    )
    p.add_argument(
        "--caps",
        default=",".join(map(str, CAPS)),
        help="cap values besides unset (empty: unset only)",
    )
    p.add_argument(
        "--paths",
        default="padded,exact",
        help="padded (SGLang 0.5.23's all-gather), exact (the runner's own gather)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed steps (>= 1)")
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default=None,
        help="default: cuda under torchrun, else cpu (gloo ranks of its own)",
    )
    p.add_argument(
        "--dist-backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="cuda only: gloo runs rank r on GPU r mod count (more ranks than GPUs)",
    )
    p.add_argument(
        "--out", default=None, help="also write dp_encoder_gather.json/.md here"
    )
    p.add_argument(
        "--vision",
        choices=["tiny", "qwen3-vl-8b"],
        default=None,
        help="tower sizes (default: tiny on the CPU, Qwen3-VL-8B on a GPU)",
    )
    args = p.parse_args(argv)
    try:
        args.tp = [int(t) for t in args.tp.split(",") if t]
        args.caps = [None] + [int(c) for c in args.caps.split(",") if c]
    except ValueError as e:
        p.error(f"--tp and --caps take comma lists of integers ({e})")
    args.batches = [b for b in args.batches.split(",") if b]
    args.paths = [x for x in args.paths.split(",") if x]
    if not args.paths or set(args.paths) - {"padded", "exact"}:
        p.error("--paths takes padded and/or exact")
    unknown = [b for b in args.batches if b not in BATCHES]
    if unknown or not args.batches or args.repeats < 1 or min(args.tp) < 2:
        p.error("--batches from the list, --repeats >= 1, each --tp >= 2")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.device is None:
        args.device = "cuda" if torchrun else "cpu"
    if args.device == "cuda" and not torchrun:
        p.error("--device cuda runs one rank per process: start it with torchrun")
    return args


def main(argv=None):
    args = parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    device = args.device
    gloo_gpu = device == "cuda" and args.dist_backend == "gloo"
    vision = args.vision or ("qwen3-vl-8b" if device == "cuda" else "tiny")
    opts = dict(
        device=device,
        vision=G.QWEN3_VL_8B_VISION if vision == "qwen3-vl-8b" else G.TINY_VISION,
        dtype="bfloat16" if device == "cuda" else "float32",
        attention_backend=None if device == "cuda" else "sdpa",
        batches=args.batches,
        caps=args.caps,
        repeats=args.repeats,
        paths=args.paths,
        dist_backend="gloo" if device == "cpu" else args.dist_backend,
    )
    rows, presharded, described = [], [], None
    if torchrun:
        from cpu_support.standins import prepare

        if device == "cpu":
            prepare.prepare_cpu_process()  # before SGLang's first import
        elif gloo_gpu:
            # NCCL refuses two ranks on one GPU: SGLang's PyNccl off, as on the CPU.
            os.environ["SGLANG_NCCL_SO_PATH"] = prepare.MISSING_NCCL_PATH
        import torch

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if device == "cpu":
            torch.set_num_threads(1)
        elif gloo_gpu:
            local_rank %= torch.cuda.device_count()
        opts["local_rank"] = local_rank
        mine = rank_main(rank, world, "env://", opts)
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        if rank != 0:
            return None
        # Timed where each rank has a GPU over NCCL/RCCL, or a core of its own.
        timed = (
            world <= (os.cpu_count() or 1)
            if device == "cpu"
            else args.dist_backend == "nccl"
        )
        rows, described = summarize(gathered, opts, timed), gathered[0]["device"]
        presharded = summarize_presharded(gathered, opts)
    else:
        from cpu_support.ranks.gloo import run_on_ranks

        for ranks in args.tp:
            per_rank = run_on_ranks(rank_main, ranks, opts, timeout=1800)
            # Eight ranks on two cores time the scheduler, not the tower.
            timed = ranks <= (os.cpu_count() or 1)
            rows += summarize(per_rank, opts, timed)
            presharded += summarize_presharded(per_rank, opts)
            described = per_rank[0]["device"]
    if torchrun:
        described += f", {len(gathered)} ranks over {opts['dist_backend']}"
    cmd = [os.path.relpath(sys.executable), "benchmark/vit/bench_dp_encoder_gather.py"]
    if torchrun:
        cmd = ["torchrun", "--nproc-per-node", str(len(gathered))] + cmd[1:]
    text = "\n".join(
        [
            f"Qwen3-VL vision tower ({vision} sizes, random weights), {opts['dtype']}, "
            f"--mm-enable-dp-encoder; batches: "
            + "; ".join(f"{b}: {len(BATCHES[b])} images" for b in args.batches),
            to_markdown(rows, presharded, described),
            "",
            f"Command: {shlex.join(cmd + (sys.argv[1:] if argv is None else list(argv)))}",
            f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        ]
    )
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, "dp_encoder_gather")
        with open(stem + ".json", "w") as f:
            record = dict(device=described, vision=vision, rows=rows)
            json.dump(dict(record, presharded=presharded), f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
