#!/usr/bin/env python
"""Profile the CPU server's vision tower under mixed traffic.

One fresh CPU server (tiny Qwen3-VL, TP2, DP encoder, ROCm gate simulated)
per ``--target`` tree, with ``cpu_support/server/startup_hooks/vit_profile``
timing every vision-tower call on every rank; untimed mixed warm-up bursts, then
``--bursts`` mixed bursts (``bench_image_burst.run_mixed``) while

* ``py-spy record`` samples each scheduler process (``--py-spy``, raw
  collapsed stacks per thread into OUT/LABEL/spy-<pid>.txt), and
* every thread's CPU seconds over the bursts are read from /proc
  (OUT/LABEL/threads.json): which threads of a scheduler are busy.

Prints, per build, the tower's calls per rank: images and patches per call,
wall and CPU milliseconds per call and per image, and the bursts' numbers.
``FORK_VIT_PROFILE_TORCH=N`` in the environment also writes torch.profiler
operator tables for N calls per rank (see
cpu_support/server/startup_hooks/vit_profile).

    .venv/bin/python benchmark/image_burst/profile_mixed_cpu.py --out /tmp/prof \\
        --build series=.cache/trees/sglang-0.5.23-series \\
        --build pristine=.cache/trees/sglang-0.5.23-pristine [--omp-threads 0] [--py-spy]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, HERE):  # cpu_support, and bench_image_burst beside this file
    if path not in sys.path:
        sys.path.insert(0, path)

import bench_image_burst as B  # noqa: E402
from cpu_support.server.cpu_server import CpuServer, scheduler_titles  # noqa: E402


def thread_cpu(pids: List[int]) -> Dict[str, float]:
    """CPU seconds so far of every thread of ``pids``: ``"pid/tid/name" -> s``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        for tid in (
            os.listdir(f"/proc/{pid}/task")
            if os.path.isdir(f"/proc/{pid}/task")
            else []
        ):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1 : st.rindex(")")]
            fields = st[st.rindex(")") + 2 :].split()
            out[f"{pid}/{tid}/{name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def scheduler_pids(srv: CpuServer) -> Dict[str, int]:
    """``{"TP0": pid, "TP1": pid}`` of the server's scheduler processes."""
    found = {
        title.split("_", 1)[1]: pid
        for pid, title in scheduler_titles(srv.pids()).items()
        if "_" in title
    }
    return dict(sorted(found.items()))


def summarize_calls(
    prof_dir: str, pids: Dict[str, int], since: float
) -> Dict[str, dict]:
    """Per rank: the tower calls made after ``since`` (perf_counter clock of
    the server: all calls of the measured bursts, not the warm-up's)."""
    out = {}
    for rank, pid in pids.items():
        path = os.path.join(prof_dir, f"calls-{pid}.jsonl")
        calls = []
        if os.path.exists(path):
            with open(path) as f:
                calls = [json.loads(line) for line in f if line.strip()]
        calls = [c for c in calls if c["t"] >= since]
        if not calls:
            out[rank] = {"calls": 0}
            continue
        images = sum(c["images"] for c in calls)
        out[rank] = {
            "calls": len(calls),
            "images": images,
            "images_per_call": images / len(calls),
            "patches_per_call": statistics.fmean(c["patches"] for c in calls),
            "wall_ms_per_call": 1000 * statistics.fmean(c["wall_s"] for c in calls),
            "cpu_ms_per_call": 1000
            * statistics.fmean(c["process_cpu_s"] for c in calls),
            "wall_ms_per_image": 1000 * sum(c["wall_s"] for c in calls) / images,
            "cpu_ms_per_image": 1000 * sum(c["process_cpu_s"] for c in calls) / images,
            "wall_us_per_patch": 1e6
            * sum(c["wall_s"] for c in calls)
            / max(1, sum(c["patches"] for c in calls)),
            "threads": sorted({c["threads"] for c in calls}),
        }
    return out


def profile_build(label: str, target: str, args, out_dir: str) -> dict:
    work = os.path.join(out_dir, label)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prof_dir = os.path.join(work, "vit")
    srv = CpuServer(
        args.model,
        log_path=os.path.join(work, "server.log"),
        tp_size=2,
        dp_encoder=True,
        python_path=[os.path.abspath(target)],
        simulate_rocm_gate=True,
        omp_threads=args.omp_threads,
        vit_profile_dir=prof_dir,
        torch_logs=None,
        ready_timeout=900,
        extra_args=["--enable-metrics"],
    )
    with srv:
        print(f"[{label}] ready after {srv.ready_seconds:.1f} s", flush=True)
        pids = scheduler_pids(srv)
        margs = argparse.Namespace(**vars(args))
        margs.mixed_bursts = args.bursts
        wcfg = B.mixed_config_from_args(
            margs, seed_offset=1000, bursts=args.warmup_bursts
        )
        B.run_mixed_bursts(
            base_url=srv.base_url,
            model=args.model,
            cfg=wcfg,
            echo=lambda m: print(f"[{label}] warm-up {m}", flush=True),
        )
        cfg = B.mixed_config_from_args(margs)
        plan = B.mixed_plan(cfg)
        # the server's perf_counter and ours share CLOCK_MONOTONIC on Linux
        since = time.perf_counter()
        cpu0, load0 = thread_cpu(list(pids.values())), os.getloadavg()[0]
        spies = []
        if args.py_spy:
            spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            for rank, pid in pids.items():
                spies.append(
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "--pid",
                            str(pid),
                            "--rate",
                            str(args.py_spy_rate),
                            "--threads",
                            "--format",
                            "raw",
                            "--nonblocking",
                            "-o",
                            os.path.join(work, f"spy-{rank}.txt"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=open(os.path.join(work, f"spy-{rank}.log"), "w"),
                    )
                )
        t0 = time.perf_counter()
        res = B.run_mixed_bursts(
            base_url=srv.base_url,
            model=args.model,
            cfg=cfg,
            plan=plan,
            echo=lambda m: print(f"[{label}] {m}", flush=True),
        )
        dt = time.perf_counter() - t0
        cpu1, load1 = thread_cpu(list(pids.values())), os.getloadavg()[0]
        for p in spies:
            p.send_signal(2)  # SIGINT: py-spy writes what it has
        for p in spies:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        calls = summarize_calls(prof_dir, pids, since)
    busy = sorted(((cpu1[k] - cpu0.get(k, 0.0), k) for k in cpu1), reverse=True)
    threads = [
        {"thread": k, "cpu_s": round(c, 2), "share_of_core": round(c / dt, 3)}
        for c, k in busy
        if c > 0.05
    ]
    summary = {
        "label": label,
        "target": target,
        "omp_threads": args.omp_threads,
        "loadavg": [load0, load1],
        "stats": res["stats"],
        "tower": calls,
        "threads": threads,
        "scheduler_pids": pids,
    }
    with open(os.path.join(work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def print_summary(s: dict) -> None:
    st = s["stats"]
    print(
        f"== {s['label']} (OMP_NUM_THREADS {s['omp_threads']}; load {s['loadavg'][0]:.1f} -> "
        f"{s['loadavg'][1]:.1f}): {st['bursts_per_min']:.1f} bursts/min, "
        f"{st['requests_per_s']:.2f} req/s, TTFT mean {st['mean_ttft_ms']:.0f} ms, "
        f"P99 {st['p99_ttft_ms']:.0f} ms"
    )
    for rank, c in s["tower"].items():
        if not c["calls"]:
            print(f"   {rank}: no tower call")
            continue
        print(
            f"   {rank}: {c['calls']} calls, {c['images_per_call']:.2f} images and "
            f"{c['patches_per_call']:.0f} patches per call, {c['wall_ms_per_call']:.1f} ms wall / "
            f"{c['cpu_ms_per_call']:.1f} ms CPU per call, {c['wall_ms_per_image']:.1f} / "
            f"{c['cpu_ms_per_image']:.1f} ms per image, {c['wall_us_per_patch']:.0f} us wall per "
            f"patch, threads {c['threads']}"
        )
    for t in s["threads"][:6]:
        print(
            f"   thread {t['thread']}: {t['cpu_s']} s CPU ({100 * t['share_of_core']:.0f}% of a core)"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--model", default=os.path.join(ROOT, ".cache", "tiny-qwen3-vl"))
    p.add_argument("--build", action="append", required=True, help="LABEL=TARGET_TREE")
    p.add_argument("--out", required=True)
    p.add_argument("--bursts", type=int, default=20)
    p.add_argument("--warmup-bursts", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--omp-threads", type=int, help="see cpu_server.py (default: CPUs per rank)"
    )
    p.add_argument("--py-spy", action="store_true")
    p.add_argument("--py-spy-rate", type=int, default=50)
    B.add_mixed_arguments(p)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    summaries = []
    for spec in args.build:
        label, _, target = spec.partition("=")
        summaries.append(profile_build(label, target, args, args.out))
        print_summary(summaries[-1])
    with open(os.path.join(args.out, "profile.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    print()
    for s in summaries:
        print_summary(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
