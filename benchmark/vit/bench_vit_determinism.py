#!/usr/bin/env python
"""Determinism of cross-request ViT batching on CPU: batched vs each image alone.

SGLang's real Qwen3-VL vision tower (random weights, sizes from the flags)
and SGLang's real scheduler step (``mm_schedule._get_chunked_prefill_embedding``)
encode a burst of single-image requests of mixed sizes. "alone" is each image
through ``get_image_feature([item])`` on its own, assembled like the step.

Per image, batched vs alone: how many images are bitwise equal, the max
|diff|, and the mean and minimum per-token cosine (float64), in fp32 and bf16.
"per-sequence" is the SDPA vision attention as this series builds it; "dense
mask (0.5.23)" swaps in, for this benchmark process only, the unpatched
behaviour (all packed sequences in one SDPA call under a block-diagonal
mask). The product has no such switch.

Deterministic inference is not measured: the series has no path of its own
for it, and the batch-invariant ops ``--enable-deterministic-inference``
installs (``ModelRunner.maybe_enable_batch_invariant_mode``) need an
accelerator. One process.

Example (the benchmark/vit/README.md table):
    .venv/bin/python benchmark/vit/bench_vit_determinism.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time

# The repository root, for cpu_support.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

from cpu_support.bench import vit_bench_util as U  # noqa: E402

DEFAULT_BURST = "224x224:4,448x448:2,128x448:2,672x672:1"
DTYPES = ("float32", "bfloat16")


def _per_image_diff(batched, alone, tokens_per_image):
    """Aggregate batched-vs-alone differences over the images' row blocks."""
    import torch
    import torch.nn.functional as F

    assert batched.shape == alone.shape, (batched.shape, alone.shape)
    equal, max_abs, cos_all = 0, 0.0, []
    for b, a in zip(
        torch.split(batched, tokens_per_image), torch.split(alone, tokens_per_image)
    ):
        equal += bool(torch.equal(b, a))
        max_abs = max(max_abs, float((b.double() - a.double()).abs().max()))
        cos_all.append(F.cosine_similarity(b.double(), a.double(), dim=-1))
    cos = torch.cat(cos_all)
    return {
        "images": len(tokens_per_image),
        "bitwise_equal": equal,
        "max_abs": max_abs,
        "mean_cos": float(cos.mean()),
        "min_cos": float(cos.min()),
    }


def _worker(rank, world_size, init_method, cfg):
    import torch
    from cpu_support.ranks import mm_harness as H
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    config = T.tiny_qwen3_vl_config(vision=cfg["vision"])
    T.publish_cpu_context(
        tp_size=world_size, rank=rank, model_path=T.write_config_dir(config)
    )
    T.init_gloo(rank, world_size, init_method)
    requests = [
        H.make_request([g], seed=i, config=config) for i, g in enumerate(cfg["grids"])
    ]
    tokens = [(U.patches(g) // (U.MERGE * U.MERGE)) for g in cfg["grids"]]

    diffs = []
    for dtype_name in cfg["dtypes"]:
        model = T.build_tiny_qwen3_vl(config, dtype=getattr(torch, dtype_name), seed=0)
        with torch.no_grad():
            for attention in cfg["attention"]:
                with U.dense_masked_attention(attention == "dense"):
                    H.fresh_embedding_cache()
                    batched = H.run_prefill_embedding(model, requests)
                    alone = H.reference_rows(model, requests)
                diffs.append(
                    dict(
                        dtype=dtype_name,
                        attention=attention,
                        **_per_image_diff(batched, alone, tokens),
                    )
                )
        del model
    return {"diffs": diffs}


def _fmt_cos(c: float, bitwise: bool) -> str:
    """A cosine as ``1 − x``; "1 (bitwise)" when every row compared was equal."""
    if bitwise:
        return "1 (bitwise)"
    return f"1 − {1.0 - c:.1e}" if 1.0 - c >= 1e-15 else "1 − <1e-15"


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--burst",
        type=U.burst_arg,
        default=U.burst_arg(DEFAULT_BURST),
        help=f"single-image requests, WxH:count,... in pixels (default {DEFAULT_BURST})",
    )
    p.add_argument(
        "--dtypes", default="float32,bfloat16", help="comma list of float32, bfloat16"
    )
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = p.parse_args(argv)
    args.repeats = 1  # what check_run_args checks; this benchmark times nothing
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d!r}: choose from {', '.join(DTYPES)}")
    if not dtypes:
        p.error("need at least one dtype")
    U.check_run_args(p, args)

    grids = U.burst_grids(args.burst)
    cfg = dict(
        vision=U.bench_vision(args.depth, args.hidden, args.heads),
        grids=grids,
        dtypes=dtypes,
        attention=["per-sequence", "dense"],
    )
    from cpu_support.ranks.gloo import run_on_ranks

    t0 = time.perf_counter()
    diffs = run_on_ranks(_worker, 1, cfg, timeout=3600, threads_per_rank=args.threads)[
        0
    ]["diffs"]
    print(f"# 1 process: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    total = sum(U.patches(g) for g in grids)
    kinds = ", ".join(f"{n}× {w}×{h}" for w, h, n in args.burst)
    print(
        f"Qwen3-VL vision tower (SGLang's code, random weights): depth {args.depth}, hidden "
        f"{args.hidden}, {args.heads} heads. Burst: {len(grids)} single-image requests ({kinds}) "
        f"= {total} patches, through the real scheduler step. {args.threads} thread(s) per "
        f"process.\n"
    )
    if diffs:
        print("Batched vs alone, 1 process:\n")
        print(
            U.markdown_table(
                [
                    "attention",
                    "dtype",
                    "images bitwise equal",
                    "max abs diff",
                    "mean token cosine",
                    "min token cosine",
                ],
                [
                    [
                        (
                            "per-sequence (series)"
                            if d["attention"] == "per-sequence"
                            else "dense mask (0.5.23)"
                        ),
                        d["dtype"],
                        f"{d['bitwise_equal']} / {d['images']}",
                        f"{d['max_abs']:.3g}",
                        _fmt_cos(d["mean_cos"], d["bitwise_equal"] == d["images"]),
                        _fmt_cos(d["min_cos"], d["bitwise_equal"] == d["images"]),
                    ]
                    for d in diffs
                ],
                align="llrrrr",
            )
        )
        print()
    print(
        f"\nCommand: {shlex.join([os.path.relpath(sys.executable), 'benchmark/vit/bench_vit_determinism.py'] + (sys.argv[1:] if argv is None else list(argv)))}"
    )
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    return diffs


if __name__ == "__main__":
    main()
