#!/usr/bin/env python
"""`make demo`: the seed's experiment, small, on a real SGLang server on the CPU.

1. If ``demo/demo_vit_ranks.py`` is present: its in-process two-rank table
   (where a prefill step's images land, per-request vs batched).
2. The tiny Qwen3-VL CPU server (``sglang.launch_server``, TP2,
   ``--mm-enable-dp-encoder``, ROCm decision simulated for the ViT gate only),
   pristine SGLang 0.5.23 vs the series, a fresh server per run: text warm-up,
   two image bursts through ``sglang.benchmark.serving``, then the seed-style table
   (Build, Burst, Mean TTFT, P99 TTFT, Output tok/s, images per rank and
   encoder calls from ``/metrics`` (the series build; n/a on pristine),
   compiles after ready). Small defaults so it finishes in a few minutes on
   2 cores; every one is a flag (``python demo/demo.py --help``).

Pristine and series are two ``--target`` trees under ``.cache/trees``
(cpu_support/server/sglang_trees.py); the server's Python is this venv's.
The ROCm simulation is demo scaffolding (docs/cpu.md), not in the patches.

The terminal gets only the demo's progress lines and tables; everything else
(library warnings, rank output, tracebacks) goes to ``OUT_DIR/demo.log``, the
servers' output to ``OUT_DIR/*.server.log``, and the last line says where.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMAGE_BURST = os.path.join(ROOT, "benchmark", "image_burst")
# cpu_support, the A/B harness (ab_image_burst) and demo_vit_ranks beside this file.
for path in (ROOT, IMAGE_BURST, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

DEFAULTS = dict(
    runs=1,
    bursts=2,
    num_prompts=8,
    max_concurrency=8,
    image_resolution="224x224",
    input_len=64,
    output_len=8,
    seed=42,
    seed_step=1,
    warmup_text_prompts=4,
)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "demo"))
    p.add_argument(
        "--skip-ranks-demo",
        action="store_true",
        help="skip the in-process two-rank table",
    )
    return p.parse_args(argv)


class Terminal:
    """Only the demo's own lines reach the terminal; everything else goes to a log.

    While active, file descriptors 1 and 2 point at ``log_path``, so warnings
    and messages from transformers, torch, gloo ranks and any child process
    land there; ``say`` writes to the terminal the demo started with (and
    copies the line into the log, for context).
    """

    def __init__(self, log_path: str):
        self.log_path = log_path
        self._saved = None

    def __enter__(self) -> "Terminal":
        sys.stdout.flush()
        sys.stderr.flush()
        self._log = open(self.log_path, "w", buffering=1)
        self._saved = (os.dup(1), os.dup(2))
        self._term = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
        os.dup2(self._log.fileno(), 1)
        os.dup2(self._log.fileno(), 2)
        return self

    def say(self, msg: str = "") -> None:
        self._term.write(msg + "\n")
        self._term.flush()
        sys.stdout.flush()
        self._log.write(f"[demo] {msg}\n" if msg else "\n")

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._term.close()
        self._log.close()


def main(argv=None) -> int:
    args = parse(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    where = os.path.relpath(args.out_dir, ROOT)
    log_path = os.path.join(args.out_dir, "demo.log")
    t0 = time.monotonic()
    with Terminal(log_path) as term:
        try:
            rc = run(args, argv, term)
        except Exception as e:  # noqa: BLE001 - one line here, the traceback in the log
            traceback.print_exc()
            first = (str(e).strip().splitlines() or [""])[0]
            term.say(f"demo: {type(e).__name__}: {first}")
            rc = 1
        term.say(
            f"(demo wall time {time.monotonic() - t0:.0f} s; everything else it printed is in "
            f"{where}/demo.log, raw numbers in {where}/ab.json, tables in {where}/ab.md, "
            f"server logs in {where}/*.server.log)"
        )
    return rc


def run(args, argv, term: Terminal) -> int:
    say = term.say
    if not args.skip_ranks_demo and os.path.isfile(
        os.path.join(HERE, "demo_vit_ranks.py")
    ):
        import demo_vit_ranks as R

        say("== In-process: SGLang's Qwen3-VL tower on two gloo ranks ==")
        requests, image, repeats = 6, 224, 5
        say(R.format_table(R.run(requests, image, repeats), requests, image, repeats))
        say()

    import ab_image_burst as AB
    from cpu_support.server.sglang_trees import TreeError, pristine_tree, series_tree
    from cpu_support.tiny_models.make_tiny_model import make_tiny_model

    say("== Real server: sglang.launch_server on the CPU, pristine vs series ==")
    model = make_tiny_model(os.path.join(ROOT, ".cache", "tiny-qwen3-vl"))
    try:
        pristine, series = pristine_tree(), series_tree()
    except TreeError as e:
        say(f"demo: {str(e).splitlines()[0]}")
        return 1
    ab_argv = [
        "--cpu",
        "--model-path",
        model,
        "--tp-size",
        "2",
        "--mm-enable-dp-encoder",
        "--simulate-rocm-gate",
        "--a-target",
        pristine,
        "--a-label",
        "pristine",
        "--b-target",
        series,
        "--b-label",
        "series",
        "--out-dir",
        args.out_dir,
    ]
    for k in DEFAULTS:
        ab_argv += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    ab_args = AB.parse(ab_argv)
    say(
        f"settings: tiny Qwen3-VL ({model}), TP2 + --mm-enable-dp-encoder, ROCm gate simulated; "
        f"{args.runs} run(s) per build alternating pristine/series, fresh server each; "
        f"text warm-up {args.warmup_text_prompts} prompts; {args.bursts} image bursts x "
        f"{args.num_prompts} prompts at concurrency {args.max_concurrency}, "
        f"{args.image_resolution}, {args.input_len}/{args.output_len} tokens, seed {args.seed} "
        f"(+{args.seed_step} per burst: new images, so the encoder runs in every burst)"
    )
    command = shlex.join(
        ["demo/demo.py", *(argv if argv is not None else sys.argv[1:])]
    )
    try:
        builds = AB.describe_builds(ab_args)
        ab = AB.run_ab(ab_args, builds, echo=say, command=command)
    except (AB.ServerFailed, AB.B.BenchError, AB.ABError) as e:
        say(f"demo: {str(e).splitlines()[0]}")
        return 1
    text = AB.report(ab, builds, command)
    with open(os.path.join(args.out_dir, "ab.md"), "w") as f:
        f.write(text)
    say()
    say(text.rstrip("\n"))
    return 1 if any(r["failed"] for r in ab["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
