#!/usr/bin/env python
"""Base vs series image bursts, one fresh server per run, alternating A B A B.

For each of ``--runs N`` rounds, build A (pristine sglang) then build B (the
series applied): launch a fresh ``sglang.launch_server``, wait for
``/health``, run the text warm-up and the image bursts with
``bench_image_burst.run_bursts`` (``sglang.bench_serving`` underneath), stop
the server (its whole process group, by PID), next. The two installs are
given as two Python interpreters (``--a-python``/``--b-python``) and/or two
``--target`` trees (``--a-target``/``--b-target``: a folder holding an
``sglang`` package, put first on the server's ``PYTHONPATH``; make a pristine
one with ``pip install --no-deps --target DIR sglang==0.5.23`` and a series one
by copying it and running ``scripts/series.py apply --target``).

Prints the seed-style table: Build, Burst, Mean TTFT, P99 TTFT, Output tok/s,
images per rank (when logged), compiles after ready, each the median across
runs with the spread (min-max), plus failed requests and launch-to-ready
seconds. Writes all raw numbers to ``--out-dir``/ab.json and the table to
ab.md. Ready-made GPU invocations: docs/benchmarks.md ("Image-burst A/B").

Server flags: everything after ``--`` is passed to ``launch_server`` (the
harness adds ``--host``/``--port``). ``--cpu`` runs the fork's tiny Qwen3-VL
CPU server instead (docs/cpu.md), where ``--simulate-rocm-gate`` makes only
the ViT-batching gate see ROCm (demo scaffolding).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
import time
from typing import Dict, List, Optional, Sequence

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

import bench_image_burst as B  # noqa: E402
from cpu_support.cpu_server import (  # noqa: E402
    CpuServer,
    ServerFailed,
    ServerProcess,
    free_port,
)


class ABError(RuntimeError):
    pass


def spread(values: Sequence[Optional[float]]) -> Optional[Dict[str, float]]:
    """Median, min and max of the non-missing values (None if none)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return {"median": B.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt_spread(s: Optional[Dict[str, float]], digits: int = 1) -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def aggregate(runs: List[dict], labels: Sequence[str]) -> List[dict]:
    """One row per (build, burst) across runs: medians and spreads."""
    rows = []
    for label in labels:
        mine = [r for r in runs if r["build"] == label]
        if not mine:
            continue
        nbursts = max(len(r["result"]["bursts"]) for r in mine)
        for k in range(nbursts):
            stats = [r["result"]["bursts"][k]["stats"] for r in mine
                     if k < len(r["result"]["bursts"])]
            images = [s.get("images_per_rank") for s in stats]
            compiles = [s.get("compiles_per_rank") for s in stats]
            rows.append({
                "build": label,
                "burst": k + 1,
                "runs": len(stats),
                "completed": sum(s["completed"] for s in stats),
                "failed": sum(s["failed"] for s in stats),
                "mean_ttft_ms": spread([s["mean_ttft_ms"] for s in stats]),
                "p99_ttft_ms": spread([s["p99_ttft_ms"] for s in stats]),
                "output_tok_s": spread([s["output_tok_s"] for s in stats]),
                "images_per_rank": images,
                "encoder": [s.get("encoder") for s in stats],
                "compiles_per_rank": compiles,
                "compiles_total": spread([sum(c.values()) if c is not None else None
                                          for c in compiles]),
            })
    return rows


def _fmt_per_run(values: List, fmt) -> str:
    shown = [fmt(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else "; ".join(shown)


def table(rows: List[dict], ready: Dict[str, dict]) -> str:
    out = [
        "| Build | Burst | Mean TTFT (ms) | P99 TTFT (ms) | Output tok/s | Images per rank "
        "| Encoder calls | Images per call (mean / max) | Compiles after ready | Completed / failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['build']} | {r['burst']} | {fmt_spread(r['mean_ttft_ms'])} | "
            f"{fmt_spread(r['p99_ttft_ms'])} | {fmt_spread(r['output_tok_s'])} | "
            f"{_fmt_per_run(r['images_per_rank'], B.fmt_images)} | "
            f"{_fmt_per_run(r['encoder'], lambda e: B.fmt_encoder(e)[0])} | "
            f"{_fmt_per_run(r['encoder'], lambda e: B.fmt_encoder(e)[1])} | "
            f"{_fmt_per_run(r['compiles_per_rank'], B.fmt_compiles)} | "
            f"{r['completed']} / {r['failed']} |"
        )
    out.append("")
    out.append("Medians across runs, (min–max) when there are several; per-run values "
               "separated by `;` where they differ.")
    for label, s in ready.items():
        out.append(f"Launch to /health 200, {label}: {fmt_spread(s)} s")
    return "\n".join(out)


def launch(build: dict, args, log_path: str) -> ServerProcess:
    if args.cpu:
        return CpuServer(
            args.model_path, log_path=log_path, tp_size=args.tp_size,
            dp_encoder=args.mm_enable_dp_encoder, python=build["python"],
            python_path=[build["target"]] if build["target"] else (),
            simulate_rocm_gate=args.simulate_rocm_gate, log_vit_calls=True,
            ready_timeout=args.ready_timeout,
            # /metrics feeds the "encoder calls" and "images per call" columns
            # (series builds; a pristine build shows n/a).
            extra_args=["--enable-metrics"],
        )
    port = free_port()
    cmd = [build["python"], "-m", "sglang.launch_server", "--model-path", args.model_path,
           *args.server_args, "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ)
    env["TORCH_LOGS"] = args.torch_logs
    if build["target"]:
        env["PYTHONPATH"] = os.pathsep.join([build["target"]] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return ServerProcess(cmd, env=env, port=port, log_path=log_path,
                         ready_timeout=args.ready_timeout)


def run_ab(args, builds: List[dict], echo=print) -> dict:
    os.makedirs(args.out_dir, exist_ok=True)
    cfg = B.BurstConfig(
        num_prompts=args.num_prompts, max_concurrency=args.max_concurrency,
        image_resolution=args.image_resolution, image_count=args.image_count,
        input_len=args.input_len, output_len=args.output_len, seed=args.seed,
    )
    wcfg = B.BurstConfig(
        num_prompts=args.warmup_text_prompts, max_concurrency=args.max_concurrency,
        input_len=args.warmup_text_input_len or args.input_len,
        output_len=args.warmup_text_output_len or args.output_len, seed=args.seed,
    )
    runs = []
    for i in range(args.runs):
        for build in builds:
            tag = f"run{i + 1}-{build['label']}"
            log_path = os.path.join(args.out_dir, f"{tag}.server.log")
            srv = launch(build, args, log_path)
            echo(f"[{tag}] launching ({build['label']}: {build['python']}"
                 + (f", PYTHONPATH={build['target']}" if build["target"] else "") + ")")
            try:
                ready = srv.start()
                echo(f"[{tag}] /health 200 after {ready:.1f} s")
                result = B.run_bursts(
                    base_url=srv.base_url, model=args.model_path, tokenizer=args.tokenizer,
                    bursts=args.bursts, cfg=cfg, seed_step=args.seed_step,
                    warmup_text_prompts=args.warmup_text_prompts, warmup_text_cfg=wcfg,
                    server_log=log_path, work_dir=os.path.join(args.out_dir, tag),
                    timeout=args.burst_timeout, echo=lambda m: echo(f"[{tag}] {m}"),
                )
            finally:
                left = srv.stop()
                if left:
                    echo(f"[{tag}] WARNING: processes left after stop: {left}")
            runs.append({"run": i + 1, "build": build["label"], "ready_s": ready,
                         "server_flags": srv.server_flags, "server_env": _env_of(srv),
                         "server_log": log_path, "result": result})
    labels = [b["label"] for b in builds]
    rows = aggregate(runs, labels)
    ready = {lab: spread([r["ready_s"] for r in runs if r["build"] == lab]) for lab in labels}
    return {"runs": runs, "rows": rows, "ready_s": ready, "config": vars(cfg),
            "warmup_text_config": vars(wcfg) if args.warmup_text_prompts else None,
            "seed_step": args.seed_step}


def _env_of(srv: ServerProcess) -> Dict[str, str]:
    keys = ("SGLANG_USE_CPU_ENGINE", "SGLANG_CPU_OMP_THREADS_BIND", "SGLANG_NCCL_SO_PATH",
            "TORCH_LOGS", "FORK_DEMO_SIMULATE_ROCM_GATE", "FORK_DEMO_LOG_VIT_CALLS", "PYTHONPATH")
    return {k: srv.env[k] for k in keys if k in srv.env}


def report(ab: dict, builds: List[dict], command: str) -> str:
    cfg = ab["config"]
    first = ab["runs"][0]
    lines = ["## Image-burst A/B", ""]
    lines.append(f"- command: `{command}`")
    for b in builds:
        lines.append(f"- {b['label']}: sglang {b['version']}, series {b['series_hash']} "
                     f"({b['python']}" + (f", PYTHONPATH={b['target']})" if b["target"] else ")"))
    lines.append(f"- server flags: `{shlex.join(first['server_flags'])}`")
    env = {k: v for k, v in first["server_env"].items() if k != "PYTHONPATH"}
    if env:
        lines.append("- server env: " + ", ".join(f"`{k}={v}`" for k, v in env.items()))
    w = ab.get("warmup_text_config")
    lines.append(
        f"- per run: fresh server; "
        + (f"text warm-up {w['num_prompts']} prompts ({w['input_len']}/{w['output_len']} tokens); "
           if w else "no warm-up; ")
        + f"{len(first['result']['bursts'])} image bursts x {cfg['num_prompts']} prompts at "
        f"concurrency {cfg['max_concurrency']}, {cfg['image_count']} image(s) of "
        f"{cfg['image_resolution']}, {cfg['input_len']}/{cfg['output_len']} tokens, seeds "
        + ", ".join(str(b["seed"]) for b in first["result"]["bursts"])
    )
    order = " ".join(r["build"] for r in ab["runs"])
    lines.append(f"- runs: {len(ab['runs']) // len(builds)} per build, order {order}")
    lines.append(f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}")
    lines += ["", table(ab["rows"], ab["ready_s"])]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokenizer", help="for bench_serving (default: --model-path)")
    p.add_argument("--a-python", default=sys.executable)
    p.add_argument("--a-target", help="folder holding build A's sglang (first on PYTHONPATH)")
    p.add_argument("--a-label", default="base")
    p.add_argument("--b-python", default=sys.executable)
    p.add_argument("--b-target", help="folder holding build B's sglang")
    p.add_argument("--b-label", default="series")
    p.add_argument("--runs", type=int, default=2, help="rounds of A then B")
    p.add_argument("--bursts", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--image-resolution", default="512x512")
    p.add_argument("--image-count", type=int, default=1)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--seed-step", type=int, default=0, help="see bench_image_burst.py")
    p.add_argument("--warmup-text-prompts", type=int, default=64,
                   help="text-only warm-up prompts per fresh server (0: none)")
    p.add_argument("--warmup-text-input-len", type=int)
    p.add_argument("--warmup-text-output-len", type=int)
    p.add_argument("--torch-logs", default="recompiles,dynamo",
                   help="TORCH_LOGS for the server (compiles after ready are counted from it)")
    p.add_argument("--ready-timeout", type=float, default=1800.0)
    p.add_argument("--burst-timeout", type=float, default=3600.0)
    p.add_argument("--out-dir", default="ab_image_burst")
    p.add_argument("--cpu", action="store_true", help="the fork's CPU server (docs/cpu.md)")
    p.add_argument("--tp-size", type=int, default=2, help="--cpu only")
    p.add_argument("--mm-enable-dp-encoder", action="store_true", help="--cpu only")
    p.add_argument("--simulate-rocm-gate", action="store_true", help="--cpu only (demo)")
    p.add_argument("server_args", nargs=argparse.REMAINDER,
                   help="-- then launch_server flags (GPU runs)")
    return p


def parse(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.server_args and args.server_args[0] == "--":
        args.server_args = args.server_args[1:]
    for name in ("runs", "bursts", "num_prompts", "max_concurrency", "image_count",
                 "input_len", "output_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        B.parse_resolution(args.image_resolution)
    except ValueError as e:
        p.error(str(e))
    if args.cpu and args.server_args:
        p.error("--cpu builds its own server flags; drop the arguments after --")
    if not args.cpu and (args.simulate_rocm_gate or args.mm_enable_dp_encoder):
        p.error("--simulate-rocm-gate/--mm-enable-dp-encoder are --cpu options; "
                "pass launch_server flags after -- instead")
    for side in ("a", "b"):
        t = getattr(args, f"{side}_target")
        if t and not os.path.isdir(os.path.join(t, "sglang")):
            p.error(f"--{side}-target {t} holds no sglang package")
        py = getattr(args, f"{side}_python")
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            p.error(f"--{side}-python {py} is not an executable")
    if args.a_label == args.b_label:
        p.error("--a-label and --b-label must differ")
    return args


def describe_builds(args) -> List[dict]:
    builds = []
    for side in ("a", "b"):
        py, target = getattr(args, f"{side}_python"), getattr(args, f"{side}_target")
        path = [target] if target else ()
        where = B.sglang_dir(py, path)
        if where is None:
            raise ABError(f"build {side.upper()}: {py} cannot import sglang")
        if target and os.path.realpath(where) != os.path.realpath(target):
            raise ABError(
                f"build {side.upper()}: {py} imports sglang from {where}, not from "
                f"--{side}-target {target} (an editable install can shadow PYTHONPATH)")
        builds.append({"label": getattr(args, f"{side}_label"), "python": py, "target": target,
                       "version": B.sglang_version(py, path), "series_hash": B.series_hash(where)})
    return builds


def main(argv=None) -> int:
    args = parse(argv)
    try:
        builds = describe_builds(args)
    except ABError as e:
        print(f"ab_image_burst: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["scripts/ab_image_burst.py",
                          *(argv if argv is not None else sys.argv[1:])])
    try:
        ab = run_ab(args, builds)
    except (ServerFailed, B.BenchError, ABError) as e:
        print(f"ab_image_burst: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    text = report(ab, builds, command)
    with open(os.path.join(args.out_dir, "ab.json"), "w") as f:
        json.dump({"command": command, "builds": builds, **ab}, f, indent=1)
    with open(os.path.join(args.out_dir, "ab.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if any(r["failed"] for r in ab["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
