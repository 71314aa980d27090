#!/usr/bin/env python
"""The DP encoder's per-rank buffers at attention-TP 2, 4 and 8, vs the cap.

SGLang's real ``Qwen3VLForConditionalGeneration`` is built with
``--mm-enable-dp-encoder`` on every rank, and a step of single-image requests
goes through SGLang's real prefill-step function
(``mm_schedule._get_chunked_prefill_embedding``), so each encoder call runs
SGLang's real DP runner (``mm_utils.run_dp_sharded_mrope_vision_model``).
The runner pads every rank's output to the largest rank's share, all-gathers
the padded outputs and reassembles the images in order.

Measured per rank, by observing the tensors the runner allocates (the
all-gather's input and result, through a wrapper on the rank's
attention-TP group; the runner's return value, through a wrapper on the
name the model calls); the largest over the step's calls:

* padded local output, gather buffer and reassembled output (bytes);
* useful bytes: the real rows of the call with the largest gather, the part
  of its gather buffer that is kept;
* the gather as the formula gives it: attention-TP x the largest rank's
  share (output tokens, from SGLang's load balancer on the call's patch
  counts) x the tower's output row (out_hidden_size x (1 + deepstack
  layers) x dtype bytes); a call of one image is broadcast instead (0);
  the run stops if a measured gather differs from it;
* encoder calls (the cap splits a step);
* vision step time, median of ``--repeats`` steps between barriers, only
  where each rank has a core of its own, or a GPU of its own over NCCL/RCCL;
* on a GPU, the step's device peak (``torch.cuda.max_memory_allocated``
  over the step minus what was allocated before it).

Batches: ``small`` (16 images of 64 patches), ``large+small`` (one of 4096
patches, then 15 of 64), ``large+tiny`` (one of 4096, then 7 of 4). Caps:
unset and ``--caps`` (``--mm-max-encoder-input-tokens-per-batch``, set with
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
def observed_runner(model, calls: list):
    """Record, per DP-runner call, the grids, the all-gather's input and
    result, a broadcast's tensor and the runner's output (nbytes)."""
    from sglang.srt.models import qwen3_vl
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group
    real_runner, real_gather, real_bcast = (
        qwen3_vl.run_dp_sharded_mrope_vision_model,
        group.all_gather,
        group.broadcast,
    )

    def runner(vision_model, pixel_values, grid_thw_list, **kwargs):
        calls.append(dict(grids=[list(g) for g in grid_thw_list], local=0, gather=0))
        out = real_runner(vision_model, pixel_values, grid_thw_list, **kwargs)
        calls[-1]["out"] = out.nbytes
        calls[-1]["row"] = out[0].nbytes if out.shape[0] else 0
        return out

    def all_gather(input_, *args, **kwargs):
        result = real_gather(input_, *args, **kwargs)
        if calls:
            calls[-1].update(local=input_.nbytes, gather=result.nbytes)
        return result

    def broadcast(tensor, *args, **kwargs):
        if calls:
            calls[-1]["broadcast"] = tensor.nbytes
        return real_bcast(tensor, *args, **kwargs)

    qwen3_vl.run_dp_sharded_mrope_vision_model = runner
    group.all_gather, group.broadcast = all_gather, broadcast
    try:
        yield calls
    finally:
        qwen3_vl.run_dp_sharded_mrope_vision_model = real_runner
        del group.all_gather, group.broadcast


def predicted_gather(grids, ranks: int, merge: int, row_bytes: int) -> int:
    """attention-TP x the largest share (output tokens) x the output row; a
    one-image call is broadcast, with no gather."""
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    if len(grids) == 1:
        return 0
    patches = [U.patches(g) for g in grids]
    order, counts, _ = get_dp_encoder_lb_assignment(patches, ranks)
    shares, start = [], 0
    for n in counts:
        shares.append(sum(patches[i] // merge**2 for i in order[start : start + n]))
        start += n
    return ranks * max(shares) * row_bytes


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
                    step(requests)  # warm-up: this step's shapes
                    calls = []
                    with observed_runner(model, calls):
                        step(requests)
                    _, peak = step(requests, measure_peak=device == "cuda")
                    times = [step(requests)[0] for _ in range(opts["repeats"])]
                rows.append(
                    dict(batch=name, cap=cap, calls=calls, peak_mib=peak, s=times)
                )
    return dict(device=dev.describe(), rows=rows)


def summarize(per_rank: list, opts: dict, timed: bool) -> list:
    """One row per (batch, cap): each rank's largest buffers over the calls,
    checked against the formula."""
    ranks, merge = len(per_rank), opts["vision"]["spatial_merge_size"]
    out = []
    for i, row in enumerate(per_rank[0]["rows"]):
        mine = [r["rows"][i] for r in per_rank]
        per = {k: [] for k in ("local", "gather", "out", "useful", "predicted")}
        for r in mine:
            calls = r["calls"]
            per["local"].append(max(c["local"] for c in calls))
            per["gather"].append(max(c["gather"] for c in calls))
            per["out"].append(max(c["out"] for c in calls))
            # The real rows of the call with the largest gather (0: no gather).
            peak = max(calls, key=lambda c: c["gather"])
            per["useful"].append(peak["out"] if peak["gather"] else 0)
            per["predicted"].append(
                max(predicted_gather(c["grids"], ranks, merge, c["row"]) for c in calls)
            )
            for c in calls:
                want = predicted_gather(c["grids"], ranks, merge, c["row"])
                if c["gather"] != want:
                    sys.exit(
                        f"bench_dp_encoder_gather: measured gather {c['gather']} B "
                        f"!= formula {want} B ({ranks} ranks, grids {c['grids']})"
                    )
        step_s = [max(ts) for ts in zip(*(r["s"] for r in mine))]
        out.append(
            dict(
                ranks=ranks,
                batch=row["batch"],
                cap=row["cap"],
                calls=len(mine[0]["calls"]),
                **per,
                step_ms=1000 * statistics.median(step_s) if timed else None,
                peak_mib=[r["peak_mib"] for r in mine],
            )
        )
    return out


def _bytes(values: list) -> str:
    return str(values[0]) if len(set(values)) == 1 else " / ".join(map(str, values))


def to_markdown(rows: list, device: str) -> str:
    gpu = any(m is not None for r in rows for m in r["peak_mib"])
    headers = [
        "attention-TP",
        "batch",
        "cap",
        "encoder calls",
        "padded local (B)",
        "gather buffer (B)",
        "formula (B)",
        "reassembled (B)",
        "useful (B)",
        "step median (ms)",
    ] + (["device peak (MiB, per rank)"] if gpu else [])
    body = []
    for r in rows:
        body.append(
            [
                r["ranks"],
                r["batch"],
                "unset" if r["cap"] is None else r["cap"],
                r["calls"],
                _bytes(r["local"]),
                _bytes(r["gather"]),
                _bytes(r["predicted"]),
                _bytes(r["out"]),
                _bytes(r["useful"]),
                "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}",
            ]
            + ([" / ".join(f"{m:.1f}" for m in r["peak_mib"])] if gpu else [])
        )
    head = (
        f"Device: {device}. Per rank, the largest over the step's encoder calls; "
        "one value where every rank measured the same, else rank 0 / 1 / ...\n"
    )
    if any(r["step_ms"] is None for r in rows):
        head += "Step median '-': the ranks share cores or a GPU.\n"
    return head + "\n" + U.markdown_table(headers, body)


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
        dist_backend="gloo" if device == "cpu" else args.dist_backend,
    )
    rows, described = [], None
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
    else:
        from cpu_support.ranks.gloo import run_on_ranks

        for ranks in args.tp:
            per_rank = run_on_ranks(rank_main, ranks, opts, timeout=1800)
            # Eight ranks on two cores time the scheduler, not the tower.
            timed = ranks <= (os.cpu_count() or 1)
            rows += summarize(per_rank, opts, timed)
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
            to_markdown(rows, described),
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
            json.dump(dict(device=described, vision=vision, rows=rows), f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
