#!/usr/bin/env python
"""Base vs series image bursts, one fresh server per run, alternating A B A B.

For each of ``--runs N`` rounds, build A (pristine sglang) then build B (the
series applied): launch a fresh ``sglang.launch_server``, wait for
``/health``, run the text warm-up and the image bursts with
``bench_image_burst.run_bursts`` (``sglang.benchmark.serving`` underneath), stop
the server (its whole process group, by PID), next. The two installs are
given as two Python interpreters (``--a-python``/``--b-python``) and/or two
``--target`` trees (``--a-target``/``--b-target``: a folder holding an
``sglang`` package, put first on the server's ``PYTHONPATH``; make a pristine
one with ``pip install --no-deps --target DIR sglang==0.5.23`` and a series one
by copying it and running ``scripts/series.py apply --target``).

Prints the seed-style table: Build, Burst, Mean TTFT, P99 TTFT, Output tok/s,
images per rank, encoder calls and images per call (from ``/metrics``: the
series' ``sglang:mm_encoder_*`` with ``--enable-metrics``; n/a on a pristine
build), compiles after ready, each the median across runs with the spread
(min-max), plus failed requests and launch-to-ready seconds. Writes all raw
numbers to ``--out-dir``/ab.json after every finished run (a temp file
renamed over it, so a failed launch later keeps every finished run; it says
``"complete": false`` and the error until the last run is in) and the table
to ab.md at the end. Ready-made GPU invocations: benchmark/image_burst/README.md
("Image-burst A/B").

Before the first timed launch (GPU runs), the model is fetched untimed:
``huggingface_hub.snapshot_download(MODEL, revision=R)`` with the
``--revision`` of the launch flags (none: main) when ``--model-path`` is not
a local folder; its folder and seconds go to ab.json (``prefetch``). That
folder is also what bench_serving loads the tokenizer and processor from
(offline; see bench_image_burst.py). Between launches the harness waits until
every GPU's used memory (``nvidia-smi``, else ``rocm-smi``, else ``amd-smi``)
is back within ``--gpu-release-slack-mib`` of what it was before the first
launch, for at most ``--gpu-release-timeout`` seconds (then it stops with an
error); without such a tool, or with ``--cpu``, it says so and does not wait.
A text warm-up that completes no request stops the whole A/B at once.

``--mixed``: instead of bench_serving image runs, each fresh
server gets untimed mixed warm-up bursts and then ``--mixed-bursts`` closed-loop
bursts of mixed image sizes with repeats and a bad input
(``bench_image_burst.run_mixed``); the table then shows bursts per minute,
requests/s, TTFT mean/P99 and the load average per run (benchmark/image_burst/README.md,
"Mixed traffic"). ``--omp-threads`` (``--cpu``) sets the CPU server's
``OMP_NUM_THREADS``; 0 leaves it unset (torch's default threads).

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
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, HERE):  # cpu_support, and bench_image_burst beside this file
    if path not in sys.path:
        sys.path.insert(0, path)

import bench_image_burst as B  # noqa: E402
from cpu_support.bench import vit_bench_util as U  # noqa: E402
from cpu_support.server.cpu_server import (  # noqa: E402
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
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


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
            stats = [
                r["result"]["bursts"][k]["stats"]
                for r in mine
                if k < len(r["result"]["bursts"])
            ]
            images = [s.get("images_per_rank") for s in stats]
            compiles = [s.get("compiles_per_rank") for s in stats]
            rows.append(
                {
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
                    "compiles_total": spread(
                        [sum(c.values()) if c is not None else None for c in compiles]
                    ),
                    "cache_entries": [s.get("cache_entries") for s in stats],
                }
            )
    return rows


def _fmt_per_run(values: List, fmt) -> str:
    shown = [fmt(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else "; ".join(shown)


def _fmt_cache_counts(counts: Optional[dict]) -> str:
    """Kernel cache entries without the entry names (those stay in ab.json)."""
    return U.fmt_cache_entries(counts)


def table(rows: List[dict], ready: Dict[str, dict]) -> str:
    headers = [
        "Build",
        "Burst",
        "Mean TTFT (ms)",
        "P99 TTFT (ms)",
        "Output tok/s",
        "Images per rank",
        "Encoder calls",
        "Images per call (mean / max)",
        "Compiles after ready",
        "Completed / failed",
        "Kernel cache entries after ready",
    ]
    out = U.markdown_table(
        headers,
        [
            [
                r["build"],
                r["burst"],
                fmt_spread(r["mean_ttft_ms"]),
                fmt_spread(r["p99_ttft_ms"]),
                fmt_spread(r["output_tok_s"]),
                _fmt_per_run(r["images_per_rank"], B.fmt_images),
                _fmt_per_run(r["encoder"], lambda e: B.fmt_encoder(e)[0]),
                _fmt_per_run(r["encoder"], lambda e: B.fmt_encoder(e)[1]),
                _fmt_per_run(r["compiles_per_rank"], B.fmt_compiles),
                f"{r['completed']} / {r['failed']}",
                _fmt_per_run(r.get("cache_entries") or [None], _fmt_cache_counts),
            ]
            for r in rows
        ],
        align="l" * len(headers),
    ).split("\n")
    out.append("")
    out.append(
        "Medians across runs, (min–max) when there are several; per-run values "
        "separated by `;` where they differ."
    )
    for label, s in ready.items():
        out.append(f"Launch to /health 200, {label}: {fmt_spread(s)} s")
    return "\n".join(out)


def aggregate_mixed(runs: List[dict], labels: Sequence[str]) -> List[dict]:
    """One row per build across runs of mixed traffic: medians and spreads."""
    rows = []
    for label in labels:
        stats = [
            r["mixed"]["stats"] for r in runs if r["build"] == label and r.get("mixed")
        ]
        if not stats:
            continue
        rows.append(
            {
                "build": label,
                "runs": len(stats),
                "bursts_served": [s["bursts_served"] for s in stats],
                "bursts": [s["bursts"] for s in stats],
                "bursts_per_min": spread([s["bursts_per_min"] for s in stats]),
                "requests_per_s": spread([s["requests_per_s"] for s in stats]),
                "mean_ttft_ms": spread([s["mean_ttft_ms"] for s in stats]),
                "p99_ttft_ms": spread([s["p99_ttft_ms"] for s in stats]),
                "failed": sum(s["failed"] for s in stats),
                "bad_rejected": sum(
                    s["bad_requests"] - s["bad_accepted"] for s in stats
                ),
                "bad_requests": sum(s["bad_requests"] for s in stats),
                "encoder": [s.get("encoder") for s in stats],
                "loadavg": [
                    r.get("loadavg")
                    for r in runs
                    if r["build"] == label and r.get("mixed")
                ],
            }
        )
    return rows


def mixed_table(rows: List[dict], ready: Dict[str, dict]) -> str:
    headers = [
        "Build",
        "Bursts/min",
        "Requests/s",
        "Mean TTFT (ms)",
        "P99 TTFT (ms)",
        "Bursts served",
        "Failed (good)",
        "Bad rejected",
        "Encoder calls",
        "Images per call (mean / max)",
        "Load average (1 min, start → end)",
    ]
    table_rows = []
    for r in rows:
        served = "; ".join(f"{a}/{b}" for a, b in zip(r["bursts_served"], r["bursts"]))
        load = "; ".join(
            "n/a" if la is None else f"{la[0]:.1f} → {la[1]:.1f}" for la in r["loadavg"]
        )
        table_rows.append(
            [
                r["build"],
                fmt_spread(r["bursts_per_min"]),
                fmt_spread(r["requests_per_s"], 2),
                fmt_spread(r["mean_ttft_ms"]),
                fmt_spread(r["p99_ttft_ms"]),
                served,
                r["failed"],
                f"{r['bad_rejected']}/{r['bad_requests']}",
                _fmt_per_run(r["encoder"], lambda e: B.fmt_encoder(e)[0]),
                _fmt_per_run(r["encoder"], lambda e: B.fmt_encoder(e)[1]),
                load,
            ]
        )
    out = U.markdown_table(headers, table_rows, align="l" * len(headers)).split("\n")
    out.append("")
    out.append(
        "Medians across runs, (min–max) when there are several; per-run values "
        "separated by `;` where they differ."
    )
    for label, s in ready.items():
        out.append(f"Launch to /health 200, {label}: {fmt_spread(s)} s")
    return "\n".join(out)


def launch(build: dict, args, log_path: str, ready_timeout: float) -> ServerProcess:
    if args.cpu:
        return CpuServer(
            args.model_path,
            log_path=log_path,
            tp_size=args.tp_size,
            dp_encoder=args.mm_enable_dp_encoder,
            python=build["python"],
            python_path=[build["target"]] if build["target"] else (),
            simulate_rocm_gate=args.simulate_rocm_gate,
            ready_timeout=ready_timeout,
            omp_threads=args.omp_threads,
            # /metrics feeds the "encoder calls" and "images per call" columns
            # (series builds; a pristine build shows n/a).
            extra_args=["--enable-metrics"] + build["extra_args"],
        )
    port = free_port()
    cmd = [
        build["python"],
        "-m",
        "sglang.launch_server",
        "--model-path",
        args.model_path,
        *args.server_args,
        *build["extra_args"],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = dict(os.environ)
    env["TORCH_LOGS"] = args.torch_logs
    if build["target"]:
        env["PYTHONPATH"] = os.pathsep.join(
            [build["target"]] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    return ServerProcess(
        cmd, env=env, port=port, log_path=log_path, ready_timeout=ready_timeout
    )


def server_revision(server_args: Sequence[str]) -> Optional[str]:
    """The ``--revision`` among the launch flags (None when not pinned)."""
    rev = None
    for i, a in enumerate(server_args):
        if a == "--revision" and i + 1 < len(server_args):
            rev = server_args[i + 1]
        elif a.startswith("--revision="):
            rev = a.split("=", 1)[1]
    return rev


def prefetch_model(model_path: str, revision: Optional[str], echo=print) -> dict:
    """Make sure the model's files are on disk before any timed launch.

    A local folder is used as it is. Otherwise the whole snapshot at
    ``revision`` is fetched with ``huggingface_hub.snapshot_download`` (which
    returns at once when it is cached already); the seconds it took are
    recorded, not counted in any launch-to-ready time.
    """
    if os.path.isdir(model_path):
        return {
            "model": model_path,
            "revision": revision,
            "local_dir": os.path.abspath(model_path),
            "fetched": False,
            "seconds": 0.0,
            "note": "local folder, nothing to fetch",
        }
    import huggingface_hub

    echo(f"pre-fetching {model_path} at revision {revision or 'main'} (untimed)")
    t0 = time.monotonic()
    try:
        local = huggingface_hub.snapshot_download(model_path, revision=revision)
    except Exception as e:  # noqa: BLE001 - network, auth, unknown repo or revision
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ABError(
            f"pre-fetching {model_path} at revision {revision or 'main'} failed: "
            f"{type(e).__name__}: {first[:200]}"
        ) from None
    seconds = time.monotonic() - t0
    echo(f"model files in {local} ({seconds:.1f} s)")
    return {
        "model": model_path,
        "revision": revision,
        "local_dir": local,
        "fetched": True,
        "seconds": seconds,
    }


# ---------------------------------------------------------------------------
# GPU memory between launches
# ---------------------------------------------------------------------------


def _parse_nvidia_smi(text: str) -> Dict[str, float]:
    used = {}
    for line in text.strip().splitlines():
        index, mib = (x.strip() for x in line.split(","))
        used[index] = float(mib)
    return used


def _parse_rocm_smi(text: str) -> Dict[str, float]:
    used = {}
    for card, fields in json.loads(text).items():
        if isinstance(fields, dict) and "VRAM Total Used Memory (B)" in fields:
            used[card] = int(fields["VRAM Total Used Memory (B)"]) / 2**20
    return used


def _parse_amd_smi(text: str) -> Dict[str, float]:
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    used = {}
    for n, gpu in enumerate(data):
        v = gpu["mem_usage"]["used_vram"]
        used[str(gpu.get("gpu", n))] = float(v["value"] if isinstance(v, dict) else v)
    return used


# (tool, query, parser); the first tool on PATH is used.
SMI_QUERIES = (
    (
        "nvidia-smi",
        [
            "nvidia-smi",
            "--query-gpu=index,memory.used",
            "--format=csv,noheader,nounits",
        ],
        _parse_nvidia_smi,
    ),
    ("rocm-smi", ["rocm-smi", "--showmeminfo", "vram", "--json"], _parse_rocm_smi),
    ("amd-smi", ["amd-smi", "metric", "--mem-usage", "--json"], _parse_amd_smi),
)


# The variables that restrict which GPUs a launch may use, per tool family.
VISIBLE_VARS = {
    "nvidia-smi": ("CUDA_VISIBLE_DEVICES",),
    "rocm-smi": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    "amd-smi": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}


def visible_gpus(tool: str) -> Tuple[Optional[List[int]], str]:
    """The GPU indices the servers may use (``*_VISIBLE_DEVICES``), or None for all.

    Only comma lists of indices are understood; anything else (UUIDs) means
    every GPU is read, and the note says so.
    """
    for var in VISIBLE_VARS.get(tool, ()):
        value = os.environ.get(var)
        if value is None:
            continue
        parts = [x.strip() for x in value.split(",") if x.strip()]
        if all(x.isdigit() for x in parts):
            return [int(x) for x in parts], f"{var}={value}"
        return None, f"{var}={value} is not a list of indices: reading every GPU"
    return None, ""


def _gpu_index(key: str) -> Optional[int]:
    """0 for "0", "card0" or "GPU0"; None when the key holds no index."""
    digits = "".join(ch for ch in key if ch.isdigit())
    return int(digits) if digits else None


def gpu_memory_used() -> Tuple[Optional[str], Dict[str, float], str]:
    """(tool, {gpu: used MiB}, note): the note says why the dict is empty.

    Only the GPUs ``*_VISIBLE_DEVICES`` lets the servers use are read, so
    another user's job on another GPU of the box cannot stall or stop the
    memory wait.
    """
    for tool, cmd, parse_out in SMI_QUERIES:
        if shutil.which(tool) is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return tool, {}, f"{tool} failed: {e}"
        if out.returncode != 0:
            why = (out.stderr.strip().splitlines() or [""])[0][:160]
            return (
                tool,
                {},
                f"{shlex.join(cmd)} exited with code {out.returncode}: {why}",
            )
        try:
            used = parse_out(out.stdout)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return (
                tool,
                {},
                f"cannot read {shlex.join(cmd)}'s output ({type(e).__name__}: {e})",
            )
        if not used:
            return tool, {}, f"{shlex.join(cmd)} listed no GPU"
        visible, why = visible_gpus(tool)
        if visible is not None:
            used = {g: u for g, u in used.items() if _gpu_index(g) in visible}
            if not used:
                return (
                    tool,
                    {},
                    f"{shlex.join(cmd)} listed none of the GPUs {why} names",
                )
        return tool, used, ""
    return None, {}, "no nvidia-smi, rocm-smi or amd-smi on PATH"


def wait_gpu_memory_released(
    baseline: Dict[str, float],
    *,
    slack_mib: float,
    timeout: float,
    poll: float = 2.0,
    echo=print,
) -> dict:
    """Wait until every GPU of ``baseline`` is back within ``slack_mib`` of it.

    Returns what was seen; raises ``ABError`` after ``timeout`` seconds. An
    empty baseline (no tool) returns at once with a note.
    """
    if not baseline:
        return {
            "waited_s": 0.0,
            "note": "no GPU memory reading before the first launch: not waiting",
        }
    t0 = time.monotonic()
    while True:
        tool, used, note = gpu_memory_used()
        if not used:
            return {"waited_s": time.monotonic() - t0, "note": f"not waiting: {note}"}
        high = {
            g: u
            for g, u in used.items()
            if g in baseline and u > baseline[g] + slack_mib
        }
        waited = time.monotonic() - t0
        if not high:
            return {"tool": tool, "waited_s": waited, "used_mib": used}
        if waited >= timeout:
            g, u = max(high.items(), key=lambda kv: kv[1] - baseline[kv[0]])
            raise ABError(
                f"GPU memory not released {timeout:.0f} s after the previous server stopped: "
                f"GPU {g} uses {u:.0f} MiB ({baseline[g]:.0f} MiB before the first launch, "
                f"slack {slack_mib:.0f} MiB; {tool})"
            )
        time.sleep(min(poll, max(0.05, timeout - waited)))


# ---------------------------------------------------------------------------
# The A/B loop
# ---------------------------------------------------------------------------


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` to a temp file in the same folder, then rename it over ``path``."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d
    )
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ---------------------------------------------------------------------------
# Cold launches: fresh compile caches per launch, ready timeout from launches
# ---------------------------------------------------------------------------

# Compile caches SGLang's servers write: torch.compile (Inductor) and Triton;
# each launch gets them empty, and the bursts count the entries added after
# ready (bench_image_burst.run_bursts, compile_caches).
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# Kernel caches of ROCm libraries a server may use, each launch its own empty
# folder too (not counted per burst): TileLang's kernel cache, MIOpen's user
# performance database and its compiled-kernel cache. Empty folders: nothing
# an earlier launch built is reused.
ROCM_CACHE_VARS = (
    "TILELANG_CACHE_DIR",
    "MIOPEN_USER_DB_PATH",
    "MIOPEN_CUSTOM_CACHE_DIR",
)
# aiter reads AITER_JIT_DIR (newer releases) or JIT_WORKSPACE_DIR (older ones).
AITER_VARS = ("AITER_JIT_DIR", "JIT_WORKSPACE_DIR")
FIRST_READY_TIMEOUT_S = 1800.0
READY_TIMEOUT_FACTOR = 3.0
MIN_READY_TIMEOUT_S = 300.0


def count_files(path: str) -> int:
    return (
        sum(len(files) for _, _, files in os.walk(path)) if os.path.isdir(path) else 0
    )


def snapshot_tree(src: str, dest: str) -> dict:
    """``dest`` := a copy of ``src`` made of hard links (a plain copy across file systems)."""
    if not os.path.isdir(src):
        raise ABError(f"--aiter-jit-dir {src} is not a folder")
    if os.path.exists(dest):
        shutil.rmtree(dest)
    t0 = time.monotonic()
    try:
        shutil.copytree(src, dest, symlinks=True, copy_function=os.link)
        how = "hard links"
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, symlinks=True)
        how = "copy"
    return {
        "source": os.path.abspath(src),
        "snapshot": os.path.abspath(dest),
        "how": how,
        "files": count_files(dest),
        "seconds": time.monotonic() - t0,
    }


def fresh_caches(args, tag: str) -> dict:
    """New, empty compile-cache folders for one launch (and the aiter snapshot's copy).

    ``cold`` is True when every folder was empty when the server started:
    nothing an earlier launch compiled can be reused.
    """
    root = os.path.join(args.cache_root, tag)
    if os.path.exists(root):
        shutil.rmtree(root)
    env = {}
    for var in CACHE_VARS + (() if args.cpu else ROCM_CACHE_VARS):
        env[var] = os.path.join(root, var.lower())
        os.makedirs(env[var])
    if args.aiter_jit_dir:
        jit = os.path.join(root, "aiter_jit")
        snapshot_tree(os.path.join(args.cache_root, "aiter-jit-snapshot"), jit)
        for var in AITER_VARS:
            env[var] = jit
    empty = {k: count_files(v) == 0 for k, v in env.items() if k in CACHE_VARS}
    return {
        "root": root,
        "env": env,
        "cold": all(empty.values()),
        "aiter_jit": (
            "the snapshot taken before the first launch"
            if args.aiter_jit_dir
            else ("not separated: --aiter-jit-dir not given" if not args.cpu else None)
        ),
    }


def ready_timeout_for(args, measured: Sequence[float]) -> float:
    """``--ready-timeout``, else a few times the slowest launch measured so far
    (at least 300 s), else 1800 s for the first launch."""
    if args.ready_timeout is not None:
        return args.ready_timeout
    if not measured:
        return FIRST_READY_TIMEOUT_S
    return max(MIN_READY_TIMEOUT_S, READY_TIMEOUT_FACTOR * max(measured))


def run_ab(args, builds: List[dict], echo=print, command: str = "") -> dict:
    """Every launch of the A/B; ab.json is rewritten after each finished run."""
    os.makedirs(args.out_dir, exist_ok=True)
    ab_json = os.path.join(args.out_dir, "ab.json")
    cfg = B.BurstConfig(
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        image_resolution=args.image_resolution,
        image_count=args.image_count,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    wcfg = B.BurstConfig(
        num_prompts=args.warmup_text_prompts,
        max_concurrency=args.max_concurrency,
        input_len=args.warmup_text_input_len or args.input_len,
        output_len=args.warmup_text_output_len or args.output_len,
        seed=args.seed,
    )
    labels = [b["label"] for b in builds]
    runs: List[dict] = []
    state = {
        "command": command,
        "builds": builds,
        "complete": False,
        "error": None,
        "runs": runs,
        "config": vars(cfg),
        "warmup_text_config": vars(wcfg) if args.warmup_text_prompts else None,
        "seed_step": args.seed_step,
        "prefetch": None,
        "gpu_memory_before": None,
        "throwaway": [],
        "aiter_jit_snapshot": None,
    }

    def save() -> None:
        if args.mixed:
            state["mixed_rows"] = aggregate_mixed(runs, labels)
            state["rows"] = []
        else:
            state["rows"] = aggregate(runs, labels)
        state["ready_s"] = {
            lab: spread([r["ready_s"] for r in runs if r["build"] == lab])
            for lab in labels
        }
        write_json_atomic(ab_json, state)

    try:
        if args.cpu:
            bench_model, gpu_before = args.model_path, {}
            state["gpu_memory_before"] = {"note": "--cpu: no GPU memory to wait for"}
        else:
            state["prefetch"] = prefetch_model(
                args.model_path, server_revision(args.server_args), echo=echo
            )
            bench_model = state["prefetch"]["local_dir"]
            tool, gpu_before, note = gpu_memory_used()
            state["gpu_memory_before"] = {
                "tool": tool,
                "used_mib": gpu_before,
                "note": note,
            }
            if note:
                echo(
                    f"GPU memory: {note}; launches will not wait for it to be released"
                )
        save()
        if args.aiter_jit_dir:
            state["aiter_jit_snapshot"] = snapshot_tree(
                args.aiter_jit_dir, os.path.join(args.cache_root, "aiter-jit-snapshot")
            )
            echo(
                f"aiter JIT folder {args.aiter_jit_dir} snapshotted (hard links) before the first launch"
            )
        launches: List[dict] = (
            []
        )  # every launch, throwaway ones included, for the ready timeout

        def one_launch(build: dict, tag: str, run_no: Optional[int]) -> dict:
            gpu_wait = None
            if launches and not args.cpu:
                gpu_wait = wait_gpu_memory_released(
                    gpu_before,
                    slack_mib=args.gpu_release_slack_mib,
                    timeout=args.gpu_release_timeout,
                    echo=echo,
                )
                if gpu_wait["waited_s"] >= 1:
                    echo(f"[{tag}] waited {gpu_wait['waited_s']:.1f} s for GPU memory")
            ready_timeout = ready_timeout_for(args, [x["ready_s"] for x in launches])
            log_path = os.path.join(args.out_dir, f"{tag}.server.log")
            srv = launch(build, args, log_path, ready_timeout=ready_timeout)
            caches = fresh_caches(args, tag)
            srv.env.update(caches["env"])
            echo(
                f"[{tag}] launching ({build['label']}: {build['python']}"
                + (f", PYTHONPATH={build['target']}" if build["target"] else "")
                + f"; cold caches under {caches['root']}; ready timeout {ready_timeout:.0f} s)"
            )
            mixed = result = None
            load_start = None
            try:
                ready = srv.start()
                echo(f"[{tag}] /health 200 after {ready:.1f} s")
                launches.append({"tag": tag, "ready_s": ready})
                load_start = os.getloadavg()[0]
                if run_no is None:
                    pass  # a throwaway launch: up, then down
                elif args.mixed:
                    mixed = B.run_mixed(
                        args,
                        srv.base_url,
                        bench_model,
                        echo=lambda m: echo(f"[{tag}] {m}"),
                    )
                else:
                    memory = None
                    if args.memory:
                        memory = (
                            B.MemorySampler(pids=srv.pids)
                            if args.cpu
                            else B.MemorySampler(
                                gpu_reader=lambda: gpu_memory_used()[1]
                            )
                        )
                    result = B.run_bursts(
                        base_url=srv.base_url,
                        model=bench_model,
                        tokenizer=args.tokenizer or bench_model,
                        bursts=args.bursts,
                        cfg=cfg,
                        seed_step=args.seed_step,
                        warmup_text_prompts=args.warmup_text_prompts,
                        warmup_text_cfg=wcfg,
                        server_log=log_path,
                        work_dir=os.path.join(args.out_dir, tag),
                        timeout=args.burst_timeout,
                        echo=lambda m: echo(f"[{tag}] {m}"),
                        text_stream=(
                            {
                                "concurrency": args.text_stream_concurrency,
                                "output_len": args.text_stream_output_len,
                            }
                            if args.text_stream_concurrency
                            else None
                        ),
                        memory=memory,
                        unseen_sizes=args.unseen_sizes,
                        unseen_output_len=args.unseen_output_len,
                        compile_caches={
                            "triton": caches["env"]["TRITON_CACHE_DIR"],
                            "inductor": caches["env"]["TORCHINDUCTOR_CACHE_DIR"],
                        },
                    )
            finally:
                left = srv.stop()
                if left:
                    echo(f"[{tag}] WARNING: processes left after stop: {left}")
            caches["files_after"] = {
                k: count_files(v) for k, v in caches["env"].items()
            }
            return {
                "run": run_no,
                "build": build["label"],
                "ready_s": ready,
                "ready_timeout_s": ready_timeout,
                "caches": caches,
                "server_flags": srv.server_flags,
                "server_env": _env_of(srv),
                "server_log": log_path,
                "gpu_memory_wait": gpu_wait,
                "result": result,
                "mixed": mixed,
                "loadavg": [load_start, os.getloadavg()[0]],
            }

        if args.throwaway_launch:
            for build in builds:
                state["throwaway"].append(
                    one_launch(build, f"throwaway-{build['label']}", None)
                )
                save()
        for i in range(args.runs):
            for build in builds:
                runs.append(one_launch(build, f"run{i + 1}-{build['label']}", i + 1))
                save()
    except BaseException as e:
        state["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0]
        save()
        raise
    state["complete"] = True
    save()
    return state


def _env_of(srv: ServerProcess) -> Dict[str, str]:
    keys = (
        "SGLANG_USE_CPU_ENGINE",
        "SGLANG_CPU_OMP_THREADS_BIND",
        "SGLANG_NCCL_SO_PATH",
        "TORCH_LOGS",
        "FORK_DEMO_SIMULATE_ROCM_GATE",
        "OMP_NUM_THREADS",
        "PYTHONPATH",
    )
    return {k: srv.env[k] for k in keys if k in srv.env}


def _builds_and_flags(builds: List[dict], first: dict) -> List[str]:
    """Report lines: each build (version, series, interpreter, tree) and the server flags."""
    lines = [
        f"- {b['label']}: sglang {b['version']}, series {b['series_hash']} "
        f"({b['python']}"
        + (f", PYTHONPATH={b['target']})" if b["target"] else ")")
        + (
            f", its own flags `{shlex.join(b['extra_args'])}`"
            if b.get("extra_args")
            else ""
        )
        for b in builds
    ]
    return lines + [f"- server flags: `{shlex.join(first['server_flags'])}`"]


def _server_env(first: dict) -> List[str]:
    """Report line: the server environment the harness set (PYTHONPATH aside)."""
    env = {k: v for k, v in first["server_env"].items() if k != "PYTHONPATH"}
    return (
        ["- server env: " + ", ".join(f"`{k}={v}`" for k, v in env.items())]
        if env
        else []
    )


def _launch_lines(ab: dict) -> List[str]:
    """Report lines: whether every launch was cold, the ready timeouts, throwaway launches."""
    launches = list(ab.get("throwaway") or []) + list(ab["runs"])
    with_caches = [r for r in launches if r.get("caches")]
    if not with_caches:
        return []
    cold = [r for r in with_caches if r["caches"]["cold"]]
    root = os.path.dirname(with_caches[0]["caches"]["root"])
    aiter = with_caches[0]["caches"].get("aiter_jit")
    caches_env = with_caches[0]["caches"]["env"]
    lines = [
        f"- compile caches: {len(cold)} of {len(with_caches)} launches cold (each its own empty "
        f"TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR under {root}"
        + (
            ", and " + ", ".join(v for v in ROCM_CACHE_VARS if v in caches_env)
            if any(v in caches_env for v in ROCM_CACHE_VARS)
            else ""
        )
        + ")"
        + (f"; aiter JIT: {aiter}" if aiter else "")
    ]
    timeouts = sorted({round(r["ready_timeout_s"]) for r in with_caches})
    lines.append("- ready timeouts (s): " + ", ".join(str(t) for t in timeouts))
    if ab.get("throwaway"):
        lines.append(
            "- untimed throwaway launches first: "
            + ", ".join(f"{r['build']} {r['ready_s']:.1f} s" for r in ab["throwaway"])
        )
    return lines


def _burst_image_lines(ab: dict, labels: Sequence[str]) -> List[str]:
    """Report lines: which images the later bursts sent, and the encoder-cache hits."""
    first = ab["runs"][0]["result"]["bursts"]
    if len(first) < 2:
        return []
    later = first[1:]
    if all(b.get("same_images_as_burst") for b in later):
        which = "burst 2 sends" if len(first) == 2 else f"bursts 2-{len(first)} send"
        what = (
            f"{which} burst 1's images again (seed {first[0]['seed']}, the seed's protocol; "
            "--seed-step 1 for fresh ones)"
        )
    else:
        what = (
            "every burst sends fresh images (seeds "
            + ", ".join(str(b["seed"]) for b in first)
            + ")"
        )
    lines = [f"- burst images: {what}"]
    for label in labels:
        hits = []
        for r in ab["runs"]:
            if r["build"] != label or not r.get("result"):
                continue
            for b in r["result"]["bursts"][1:]:
                h = b["stats"].get("encoder_cache_hits")
                hits.append("n/a" if h is None else f"{h}/{b['stats']['images_sent']}")
        if hits:
            lines.append(
                f"- encoder-cache hits in bursts 2+ (images sent minus images encoded, "
                f"from /metrics), {label}: " + "; ".join(hits)
            )
    return lines


def mixed_ab_report(ab: dict, builds: List[dict], command: str) -> str:
    first = ab["runs"][0]
    m = first["mixed"]
    cfg, plan = m["config"], m["plan"]
    lines = ["## Mixed-traffic A/B", "", f"- command: `{command}`"]
    lines.extend(_builds_and_flags(builds, first))
    lines.extend(_server_env(first))
    w = m.get("warmup")
    lines.append(
        f"- per run: fresh server; "
        + (
            f"{w['config']['bursts']} untimed mixed warm-up bursts (seed {w['config']['seed']}); "
            if w
            else "no warm-up; "
        )
        + f"{cfg['bursts']} bursts x ({cfg['burst_size']} single-image requests, "
        f"{cfg['repeats']} of them repeats of the previous burst's images, + {cfg['bad']} bad "
        f"image) sent together, the next when all answered; widths {cfg['min_width']}-"
        f"{cfg['max_width']}, heights {cfg['min_height']}-{cfg['max_height']} px (about "
        f"{plan['patches_mean']:.0f} patches per image), {cfg['output_len']} output tokens, "
        f"seed {cfg['seed']}"
    )
    order = " ".join(r["build"] for r in ab["runs"])
    lines.append(f"- runs: {len(ab['runs']) // len(builds)} per build, order {order}")
    lines.extend(_launch_lines(ab))
    lines.append(
        f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}"
    )
    lines += ["", mixed_table(ab["mixed_rows"], ab["ready_s"])]
    return "\n".join(lines) + "\n"


def report(ab: dict, builds: List[dict], command: str) -> str:
    if ab.get("mixed_rows"):
        return mixed_ab_report(ab, builds, command)
    cfg = ab["config"]
    first = ab["runs"][0]
    lines = ["## Image-burst A/B", ""]
    lines.append(f"- command: `{command}`")
    lines.extend(_builds_and_flags(builds, first))
    pf = ab.get("prefetch")
    if pf:
        lines.append(
            f"- model files: {pf['local_dir']} ("
            + (
                f"{pf['model']} at revision {pf['revision'] or 'main'}, fetched untimed "
                f"before the first launch in {pf['seconds']:.1f} s)"
                if pf["fetched"]
                else "a local folder)"
            )
        )
    lines.extend(_server_env(first))
    w = ab.get("warmup_text_config")
    lines.append(
        f"- per run: fresh server; "
        + (
            f"text warm-up {w['num_prompts']} prompts ({w['input_len']}/{w['output_len']} tokens); "
            if w
            else "no warm-up; "
        )
        + f"{len(first['result']['bursts'])} image bursts x {cfg['num_prompts']} prompts at "
        f"concurrency {cfg['max_concurrency']}, {cfg['image_count']} image(s) of "
        f"{cfg['image_resolution']}, {cfg['input_len']}/{cfg['output_len']} tokens, seeds "
        + ", ".join(str(b["seed"]) for b in first["result"]["bursts"])
    )
    order = " ".join(r["build"] for r in ab["runs"])
    lines.append(f"- runs: {len(ab['runs']) // len(builds)} per build, order {order}")
    lines.extend(_launch_lines(ab))
    lines.extend(_burst_image_lines(ab, [b["label"] for b in builds]))
    lines.append(
        f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}"
    )
    lines += ["", table(ab["rows"], ab["ready_s"])]
    lines += beside_tables(ab, [b["label"] for b in builds])
    return "\n".join(lines) + "\n"


def beside_tables(ab: dict, labels: Sequence[str]) -> List[str]:
    """The text stream, unseen-size and memory tables, when those options ran."""
    runs = [r for r in ab["runs"] if r.get("result")]
    out: List[str] = []
    stream = [
        r
        for r in runs
        if any(b["stats"].get("text_stream") for b in r["result"]["bursts"])
    ]
    if stream:
        s0 = stream[0]["result"]["bursts"][0]["stats"]["text_stream"]
        out += [
            "",
            f"Text-only stream beside the image bursts ({s0['concurrency']} concurrent requests, "
            f"{s0['output_len']} output tokens; medians across runs, (min–max)). \"Beside images\": "
            "the requests sent while the burst's image requests were in flight (bench_serving's "
            'duration back from its exit, + 2 s); "whole stream": from before bench_serving\'s '
            "start-up to its exit:",
            "",
        ]
        none = {
            "mean_ttft_ms": None,
            "p50_ttft_ms": None,
            "p99_ttft_ms": None,
            "completed": 0,
            "failed": 0,
        }
        table_rows = []
        for label in labels:
            mine = [r for r in stream if r["build"] == label]
            for k in range(max((len(r["result"]["bursts"]) for r in mine), default=0)):
                ts = [
                    r["result"]["bursts"][k]["stats"]["text_stream"]
                    for r in mine
                    if k < len(r["result"]["bursts"])
                ]
                ws = [t.get("in_window") or none for t in ts]
                table_rows.append(
                    [label, k + 1]
                    + [
                        fmt_spread(spread([t[key] for t in ws]))
                        for key in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms")
                    ]
                    + [
                        f"{sum(t['completed'] for t in ws)} / {sum(t['failed'] for t in ws)}"
                    ]
                    + [
                        fmt_spread(spread([t[key] for t in ts]))
                        for key in ("mean_ttft_ms", "p99_ttft_ms")
                    ]
                    + [
                        f"{sum(t['completed'] for t in ts)} / {sum(t['failed'] for t in ts)}"
                    ]
                )
        headers = [
            "Build",
            "Burst",
            "Beside images: mean TTFT (ms)",
            "P50 (ms)",
            "P99 (ms)",
            "completed / failed",
            "Whole stream: mean TTFT (ms)",
            "P99 (ms)",
            "completed / failed",
        ]
        out.append(U.markdown_table(headers, table_rows, align="l" * len(headers)))
    unseen = [r for r in runs if r["result"].get("unseen_sizes")]
    if unseen:
        out += [
            "",
            "Image sizes no warm-up used, after the bursts (first request of each size vs a second "
            "fresh image of that size; medians across runs, (min–max); compiles per run):",
            "",
        ]
        table_rows = []
        for label in labels:
            mine = [r["result"]["unseen_sizes"] for r in unseen if r["build"] == label]
            for i in range(max((len(m) for m in mine), default=0)):
                rows = [m[i] for m in mine if i < len(m)]
                table_rows.append(
                    [label, f"{rows[0]['height']}x{rows[0]['width']}"]
                    + [
                        fmt_spread(spread([x[key] for x in rows]))
                        for key in ("first_ttft_ms", "repeat_ttft_ms", "extra_ttft_ms")
                    ]
                    + [
                        _fmt_per_run([x[f"{w}_compiles"] for x in rows], B.fmt_compiles)
                        for w in ("first", "repeat")
                    ]
                    + [
                        _fmt_per_run(
                            [x.get(f"{w}_cache_entries") for x in rows],
                            _fmt_cache_counts,
                        )
                        for w in ("first", "repeat")
                    ]
                )
        headers = [
            "Build",
            "Size (HxW)",
            "First TTFT (ms)",
            "Repeat TTFT (ms)",
            "Extra TTFT of the first (ms)",
            "Compiles after the first",
            "Compiles after the repeat",
            "Kernel cache entries after the first",
            "Kernel cache entries after the repeat",
        ]
        out.append(U.markdown_table(headers, table_rows, align="l" * len(headers)))
    mem = [
        r for r in runs if any(b["stats"].get("memory") for b in r["result"]["bursts"])
    ]
    if mem:
        out += [
            "",
            "Peak memory per rank per burst (MiB; medians across runs, (min–max)): scheduler peak "
            "RSS on the CPU, the largest used memory per GPU seen by the smi tool on a GPU:",
            "",
        ]
        table_rows = []
        for label in labels:
            mine = [r for r in mem if r["build"] == label]
            for k in range(max((len(r["result"]["bursts"]) for r in mine), default=0)):
                ms = [
                    r["result"]["bursts"][k]["stats"].get("memory") or {}
                    for r in mine
                    if k < len(r["result"]["bursts"])
                ]
                per = {}
                for m in ms:
                    for key, v in {
                        **m.get("scheduler_peak_rss_mib", {}),
                        **m.get("gpu_peak_used_mib", {}),
                    }.items():
                        per.setdefault(key, []).append(v)
                cells = "; ".join(
                    f"{key}: {fmt_spread(spread(v), 0)}"
                    for key, v in sorted(per.items())
                )
                table_rows.append([label, k + 1, cells or "n/a"])
        out.append(
            U.markdown_table(["Build", "Burst", "Per rank / GPU"], table_rows, "lll")
        )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--model-path", required=True)
    p.add_argument(
        "--tokenizer",
        help="tokenizer folder for bench_serving (default: the model's "
        "local folder, see the pre-fetch above)",
    )
    p.add_argument("--a-python", default=sys.executable)
    p.add_argument(
        "--a-target", help="folder holding build A's sglang (first on PYTHONPATH)"
    )
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
    p.add_argument(
        "--warmup-text-prompts",
        type=int,
        default=64,
        help="text-only warm-up prompts per fresh server (0: none)",
    )
    p.add_argument("--warmup-text-input-len", type=int)
    p.add_argument("--warmup-text-output-len", type=int)
    p.add_argument(
        "--torch-logs",
        default="recompiles,dynamo",
        help="TORCH_LOGS for the server (compiles after ready are counted from it)",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=None,
        help="seconds from launch to /health 200 (default: 1800 for the first launch, "
        "then 3x the slowest launch so far, at least 300; the model is fetched before)",
    )
    p.add_argument(
        "--prefetch-only",
        action="store_true",
        help="fetch the model (the --revision after --) and stop: run it first, under its "
        "own time limit, so no download falls inside the A/B's",
    )
    p.add_argument(
        "--throwaway-launch",
        action="store_true",
        help="one untimed launch of each build first (for JIT caches that cannot be "
        "pointed elsewhere); also gives the ready timeout its first measurement",
    )
    p.add_argument(
        "--aiter-jit-dir",
        help="ROCm: aiter's JIT folder; snapshotted (hard links) before the first launch, "
        "and every launch gets its own copy as AITER_JIT_DIR / JIT_WORKSPACE_DIR",
    )
    p.add_argument(
        "--cache-root",
        help="where each launch's fresh TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR go "
        "(default OUT_DIR/caches)",
    )
    p.add_argument(
        "--burst-timeout",
        type=float,
        help="seconds per bench_serving run (default: derived from the burst, "
        "see bench_image_burst.burst_timeout_s; 272 s for the seed's)",
    )
    p.add_argument(
        "--gpu-release-timeout",
        type=float,
        default=300.0,
        help="seconds to wait, between launches, for GPU memory to be released",
    )
    p.add_argument(
        "--gpu-release-slack-mib",
        type=float,
        default=1024.0,
        help="released = every GPU within this many MiB of its use before the first launch",
    )
    p.add_argument(
        "--allow-patched-base",
        action="store_true",
        help="run even when build A's tree already carries the series (refused by default: "
        "a base copied after an in-place apply is not the base)",
    )
    p.add_argument("--out-dir", default="ab_image_burst")
    p.add_argument(
        "--cpu", action="store_true", help="the fork's CPU server (docs/cpu.md)"
    )
    p.add_argument("--tp-size", type=int, default=2, help="--cpu only")
    p.add_argument("--mm-enable-dp-encoder", action="store_true", help="--cpu only")
    p.add_argument(
        "--simulate-rocm-gate", action="store_true", help="--cpu only (demo)"
    )
    p.add_argument(
        "--omp-threads",
        type=int,
        help="--cpu only: OMP_NUM_THREADS of the server (default: the CPUs split per "
        "rank; 0: unset, torch's one thread per CPU in every rank)",
    )
    p.add_argument(
        "--a-extra-args",
        default="",
        help="launch flags for build A only, one shell-quoted string (e.g. a cap: "
        "'--mm-max-encoder-input-tokens-per-batch 8192'); --cpu too",
    )
    p.add_argument("--b-extra-args", default="", help="launch flags for build B only")
    g = p.add_argument_group(
        "beside the images (the reviewer's three costs; benchmark/image_burst/README.md)"
    )
    g.add_argument(
        "--text-stream-concurrency",
        type=int,
        default=0,
        help="a text-only stream of this many concurrent requests during every image burst "
        "(0: none); its TTFT mean/P50/P99 per build and burst",
    )
    g.add_argument("--text-stream-output-len", type=int, default=16)
    g.add_argument(
        "--unseen-sizes",
        type=B.sizes_arg,
        default=(),
        help="HxW,...: after the bursts, each size's first request vs a second fresh image "
        f"of the same size, with the compiles each caused (e.g. {B.DEFAULT_UNSEEN_SIZES})",
    )
    g.add_argument("--unseen-output-len", type=int, default=4)
    g.add_argument(
        "--memory",
        action="store_true",
        help="peak memory per rank per burst: scheduler peak RSS (--cpu) or the largest "
        "used memory per visible GPU seen by the smi tool every 0.25 s",
    )
    B.add_mixed_arguments(p)
    p.add_argument(
        "server_args",
        nargs=argparse.REMAINDER,
        help="-- then launch_server flags (GPU runs)",
    )
    return p


def parse(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.server_args and args.server_args[0] == "--":
        args.server_args = args.server_args[1:]
    for name in (
        "runs",
        "bursts",
        "num_prompts",
        "max_concurrency",
        "image_count",
        "input_len",
        "output_len",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        B.parse_resolution(args.image_resolution)
    except ValueError as e:
        p.error(str(e))
    if args.cpu and args.server_args:
        p.error("--cpu builds its own server flags; drop the arguments after --")
    if not args.cpu and (args.simulate_rocm_gate or args.mm_enable_dp_encoder):
        p.error(
            "--simulate-rocm-gate/--mm-enable-dp-encoder are --cpu options; "
            "pass launch_server flags after -- instead"
        )
    for side in ("a", "b"):
        t = getattr(args, f"{side}_target")
        if t and not os.path.isdir(os.path.join(t, "sglang")):
            p.error(f"--{side}-target {t} holds no sglang package")
        py = getattr(args, f"{side}_python")
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            p.error(f"--{side}-python {py} is not an executable")
    if args.mixed:
        try:
            B.mixed_config_from_args(args)
        except B.BenchError as e:
            p.error(str(e))
    if args.omp_threads is not None and (not args.cpu or args.omp_threads < 0):
        p.error("--omp-threads is a --cpu option and must be >= 0")
    if args.a_label == args.b_label:
        p.error("--a-label and --b-label must differ")
    for name in ("burst_timeout", "gpu_release_timeout", "ready_timeout"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.gpu_release_slack_mib < 0:
        p.error("--gpu-release-slack-mib must be >= 0")
    if (
        args.text_stream_concurrency < 0
        or args.text_stream_output_len < 1
        or args.unseen_output_len < 1
    ):
        p.error("--text-stream-concurrency must be >= 0 and the output lengths >= 1")
    for side in ("a", "b"):
        try:
            setattr(
                args,
                f"{side}_extra_args",
                shlex.split(getattr(args, f"{side}_extra_args")),
            )
        except ValueError as e:
            p.error(f"--{side}-extra-args: {e}")
    if args.mixed and (
        args.text_stream_concurrency or args.unseen_sizes or args.memory
    ):
        p.error(
            "--text-stream-concurrency, --unseen-sizes and --memory go with the image bursts, not --mixed"
        )
    if args.aiter_jit_dir and not os.path.isdir(args.aiter_jit_dir):
        p.error(f"--aiter-jit-dir {args.aiter_jit_dir} is not a folder")
    if args.prefetch_only and args.cpu:
        p.error("--prefetch-only fetches a GPU model; --cpu models are local folders")
    args.cache_root = os.path.abspath(
        args.cache_root or os.path.join(args.out_dir, "caches")
    )
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
                f"--{side}-target {target} (an editable install can shadow PYTHONPATH)"
            )
        status = B.series_status(where)
        if side == "a" and status.get("applied") and not args.allow_patched_base:
            # A base copied after an in-place apply is the series under another label.
            raise ABError(
                f"build A (the base) {where} carries the series (series.py status --target {where}: "
                f"{B.describe_status(status)}); copy the base tree before applying the series, "
                "or pass --allow-patched-base"
            )
        builds.append(
            {
                "label": getattr(args, f"{side}_label"),
                "python": py,
                "target": target,
                "extra_args": list(getattr(args, f"{side}_extra_args", [])),
                "tree": where,
                "version": B.sglang_version(py, path),
                "series_hash": B.series_hash(where),
                "series_status": {
                    k: status.get(k)
                    for k in ("applied", "current", "series_hash", "patches", "error")
                    if k in status
                },
            }
        )
    return builds


def _partial_report(out_dir: str, builds: List[dict], command: str) -> None:
    """ab.md from the finished runs in ab.json, marked incomplete (none: nothing)."""
    try:
        with open(os.path.join(out_dir, "ab.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return
    if not state.get("runs"):
        return
    text = report(state, builds, command)
    with open(os.path.join(out_dir, "ab.md"), "w") as f:
        f.write(text + f"\nINCOMPLETE: {state.get('error')}\n")


class ABStopped(BaseException):
    """SIGTERM. A BaseException, so that no ``except Exception`` on the way
    (e.g. around a psutil call while a launch is polled) can swallow it."""


def _stop_on_sigterm(signum, frame):
    # `timeout 90m python benchmark/image_burst/ab_image_burst.py ...` sends SIGTERM: leave
    # through the normal exits, so the running server is stopped and ab.json
    # records the interruption.
    raise ABStopped(f"stopped by signal {signum} (SIGTERM)")


def main(argv=None) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv=None) -> int:
    args = parse(argv)
    if args.prefetch_only:
        try:
            got = prefetch_model(args.model_path, server_revision(args.server_args))
        except ABError as e:
            print(f"ab_image_burst: {e}", file=sys.stderr)
            return 1
        os.makedirs(args.out_dir, exist_ok=True)
        write_json_atomic(os.path.join(args.out_dir, "prefetch.json"), got)
        return 0
    try:
        builds = describe_builds(args)
    except ABError as e:
        print(f"ab_image_burst: {e}", file=sys.stderr)
        return 2
    command = shlex.join(
        [
            "benchmark/image_burst/ab_image_burst.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    try:
        ab = run_ab(args, builds, command=command)
    except (ServerFailed, B.BenchError, ABError, ABStopped) as e:
        print(
            f"ab_image_burst: {str(e).splitlines()[0]} (finished runs: "
            f"{os.path.join(args.out_dir, 'ab.json')})",
            file=sys.stderr,
        )
        _partial_report(args.out_dir, builds, command)
        return 1
    text = report(ab, builds, command)
    with open(os.path.join(args.out_dir, "ab.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if any(r["failed"] for r in ab["rows"] + ab.get("mixed_rows", [])) else 0


if __name__ == "__main__":
    sys.exit(main())
