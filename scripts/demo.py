#!/usr/bin/env python
"""`make demo`: the seed's experiment, small, on a real SGLang server on the CPU.

1. If ``scripts/demo_vit_ranks.py`` is present: its in-process two-rank table
   (where a prefill step's images land, per-request vs batched).
2. The tiny Qwen3-VL CPU server (``sglang.launch_server``, TP2,
   ``--mm-enable-dp-encoder``, ROCm decision simulated for the ViT gate only),
   pristine SGLang 0.5.23 vs the series, a fresh server per run: text warm-up,
   two image bursts through ``sglang.bench_serving``, then the seed-style table
   (Build, Burst, Mean TTFT, P99 TTFT, Output tok/s, images per rank, compiles
   after ready). Small defaults so it finishes in a few minutes on 2 cores;
   every one is a flag (``python scripts/demo.py --help``).

Pristine and series are two ``--target`` trees under ``.cache/trees``
(scripts/cpu_support/sglang_trees.py); the server's Python is this venv's.
The ROCm simulation is demo scaffolding (docs/cpu.md), not in the patches.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
sys.path.insert(0, SCRIPTS)

DEFAULTS = dict(runs=1, bursts=2, num_prompts=8, max_concurrency=8, image_resolution="224x224",
                input_len=64, output_len=8, seed=42, seed_step=1, warmup_text_prompts=4)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "demo"))
    p.add_argument("--skip-ranks-demo", action="store_true",
                   help="skip the in-process two-rank table")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    t0 = time.monotonic()
    if not args.skip_ranks_demo and os.path.isfile(os.path.join(SCRIPTS, "demo_vit_ranks.py")):
        import demo_vit_ranks

        print("== In-process: SGLang's Qwen3-VL tower on two gloo ranks ==", flush=True)
        rc = demo_vit_ranks.main([])
        if rc:
            return rc
        print(flush=True)

    import ab_image_burst as AB
    from cpu_support.make_tiny_model import make_tiny_model
    from cpu_support.sglang_trees import TreeError, pristine_tree, series_tree

    print("== Real server: sglang.launch_server on the CPU, pristine vs series ==", flush=True)
    model = make_tiny_model(os.path.join(ROOT, ".cache", "tiny-qwen3-vl"))
    try:
        pristine, series = pristine_tree(), series_tree()
    except TreeError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    ab_argv = [
        "--cpu", "--model-path", model, "--tp-size", "2", "--mm-enable-dp-encoder",
        "--simulate-rocm-gate",
        "--a-target", pristine, "--a-label", "pristine",
        "--b-target", series, "--b-label", "series",
        "--out-dir", args.out_dir,
    ]
    for k in DEFAULTS:
        ab_argv += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    ab_args = AB.parse(ab_argv)
    print(
        f"settings: tiny Qwen3-VL ({model}), TP2 + --mm-enable-dp-encoder, ROCm gate simulated; "
        f"{args.runs} run(s) per build alternating pristine/series, fresh server each; "
        f"text warm-up {args.warmup_text_prompts} prompts; {args.bursts} image bursts x "
        f"{args.num_prompts} prompts at concurrency {args.max_concurrency}, "
        f"{args.image_resolution}, {args.input_len}/{args.output_len} tokens, seed {args.seed} "
        f"(+{args.seed_step} per burst: new images, so the encoder runs in every burst)",
        flush=True,
    )
    try:
        builds = AB.describe_builds(ab_args)
        ab = AB.run_ab(ab_args, builds, echo=lambda m: print(m, flush=True))
    except (AB.ServerFailed, AB.B.BenchError, AB.ABError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    text = AB.report(ab, builds, shlex.join(["scripts/demo.py", *(argv or sys.argv[1:])]))
    import json

    with open(os.path.join(args.out_dir, "ab.json"), "w") as f:
        json.dump({"builds": builds, **ab}, f, indent=1)
    with open(os.path.join(args.out_dir, "ab.md"), "w") as f:
        f.write(text)
    print()
    print(text)
    print(f"(demo wall time {time.monotonic() - t0:.0f} s; raw numbers and server logs in "
          f"{os.path.relpath(args.out_dir, ROOT)}/)")
    return 1 if any(r["failed"] for r in ab["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
