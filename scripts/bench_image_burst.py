#!/usr/bin/env python
"""Image bursts against ONE running SGLang server, through sglang.bench_serving.

The seed's experiment (shared/seeds/001_*): optionally a text-only warm-up
burst (so only the vision tower is cold), then K image bursts, each a
``python -m sglang.bench_serving --backend sglang-oai-chat --dataset-name
image`` run. Defaults are the seed's: 2 bursts of 64 prompts at concurrency
64, 512x512 images, 1024 input / 128 output tokens, seed 42.

Output: a JSON file with every raw number (bench_serving's result and
per-request details per burst, the counts below) and a markdown table per
burst (completed/failed, mean/P50/P99 TTFT, output tok/s), headed by the
exact command, the sglang version, the series hash (``series.py status``),
the server flags and the date. Failed requests are counted and shown. A text
warm-up that completes no request stops the run at once (one-line error, exit
2): the image bursts would fail the same way.

Model files: bench_serving loads the tokenizer and the image processor from
``--model``, and runs offline (``HF_HUB_OFFLINE=1``), so nothing is fetched
while a burst is measured. ``--model`` is therefore resolved to a local folder
first: a folder as given, a repo id to its Hugging Face cache snapshot at
``--revision`` (the server's). A pinned download records no "main", so the
repo id alone would fail every request offline. The requests then carry that
folder as their ``model`` field, which SGLang does not check (it serves one
model; only a ``:`` in the name selects a LoRA adapter).

Time limit per bench_serving run: ``--timeout``, by default derived from the
burst (``burst_timeout_s``: 180 s to start, then 60 s plus 0.25 s per output
token for every wave of ``--max-concurrency`` requests; 272 s for the seed's
burst), so a hung burst fails in minutes.

Images per rank, encoder calls and images per call come from the server's
``/metrics`` (scraped before and after each burst): the series exports
``sglang:mm_encoder_calls_total``, ``sglang:mm_encoder_call_images`` and
``sglang:mm_encoder_rank_images_total`` (label ``rank``) with
``--enable-metrics``; a pristine build exports none of them (n/a).

``--server-log FILE``: the server's log (stdout+stderr). Torch compile
events logged after the server reported ready are counted per rank, in
total and per burst. An event is one ``[__recompiles] Recompiling function``
record (``TORCH_LOGS=recompiles``) or one ``torchdynamo start tracing``
record (``TORCH_LOGS=dynamo``, which also shows first compiles), counted
once per process and dynamo compile id.

Example (a server on :30000)::

    python scripts/bench_image_burst.py --base-url http://127.0.0.1:30000 \\
        --model Qwen/Qwen3-VL-8B-Instruct --server-log server.log \\
        --warmup-text-prompts 64 --out-json burst.json --out-md burst.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_MARKER = "The server is fired up and ready to roll!"


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def burst_stats(
    ttfts_s: Sequence[float],
    errors: Sequence[str],
    output_lens: Sequence[int],
    duration_s: float,
    num_prompts: Optional[int] = None,
) -> Dict[str, Optional[float]]:
    """Completed/failed counts, TTFT mean/P50/P99 (ms) and output tok/s.

    A request failed when its error is non-empty. TTFTs and output tokens of
    completed requests only. ``num_prompts`` (if given) also counts requests
    missing from the lists as failed.
    """
    if not (len(ttfts_s) == len(errors) == len(output_lens)):
        raise ValueError(
            f"ttfts ({len(ttfts_s)}), errors ({len(errors)}) and output_lens "
            f"({len(output_lens)}) must have one entry per request"
        )
    ok = [i for i, e in enumerate(errors) if not e]
    failed = len(errors) - len(ok)
    if num_prompts is not None:
        if num_prompts < len(errors):
            raise ValueError(f"num_prompts {num_prompts} < {len(errors)} results")
        failed += num_prompts - len(errors)
    ttft_ms = [1000.0 * ttfts_s[i] for i in ok]
    out_tokens = sum(int(output_lens[i]) for i in ok)
    # numpy's default (linear) percentile: the definition bench_serving uses.
    p50, p99 = (float(x) for x in np.percentile(ttft_ms, [50, 99])) if ttft_ms else (None, None)
    return {
        "completed": len(ok),
        "failed": failed,
        "mean_ttft_ms": statistics.fmean(ttft_ms) if ttft_ms else None,
        "p50_ttft_ms": p50,
        "p99_ttft_ms": p99,
        "output_tokens": out_tokens,
        "duration_s": duration_s,
        "output_tok_s": out_tokens / duration_s if ttft_ms and duration_s > 0 else None,
    }


# ---------------------------------------------------------------------------
# Server-log counters
# ---------------------------------------------------------------------------

# glog-style torch log line: optional "[rankN]:" prefix, level+date, time, pid,
# source, then the dynamo compile id "[frame/compile]".
_TORCH_LINE = re.compile(
    r"^(?:\[rank(?P<rank>\d+)\]:)?[IWVDE]\d{4} [\d:.]+\s+(?P<pid>\d+) \S+\] "
    r"\[(?P<cid>\d+/\d+)\](?: \[__recompiles\])? (?P<msg>.*)$"
)
_RECOMPILING = re.compile(r"^Recompiling function (?P<fn>\S+) in (?P<where>\S+)")
_START_TRACING = re.compile(r"^Step 1: torchdynamo start tracing (?P<fn>\S+) (?P<where>\S+)")


@dataclass
class CompileEvent:
    rank: str  # "rank0" when the line names it, else "pid1234"
    pid: int
    compile_id: str
    function: str
    where: str
    line_no: int


def parse_compile_events(lines: Sequence[str], start_line: int = 0) -> List[CompileEvent]:
    """Torch compile events in ``lines``, one per (process, compile id)."""
    seen = set()
    events: List[CompileEvent] = []
    for n, raw in enumerate(lines, start=start_line):
        m = _TORCH_LINE.match(raw.rstrip("\n"))
        if not m:
            continue
        msg = m.group("msg")
        hit = _RECOMPILING.match(msg) or _START_TRACING.match(msg)
        if not hit:
            continue
        pid = int(m.group("pid"))
        key = (pid, m.group("cid"))
        if key in seen:
            continue
        seen.add(key)
        rank = f"rank{m.group('rank')}" if m.group("rank") is not None else f"pid{pid}"
        events.append(CompileEvent(rank, pid, m.group("cid"), hit.group("fn"),
                                   hit.group("where"), n))
    return events


def ready_line_index(lines: Sequence[str], marker: str = READY_MARKER) -> Optional[int]:
    """Index of the first line holding ``marker`` (the server reported ready)."""
    for i, line in enumerate(lines):
        if marker in line:
            return i
    return None


def compiles_per_rank(events: Sequence[CompileEvent]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for e in events:
        out[e.rank] = out.get(e.rank, 0) + 1
    return dict(sorted(out.items()))


ENCODER_CALLS = "sglang:mm_encoder_calls_total"
ENCODER_IMAGES = "sglang:mm_encoder_call_images"
ENCODER_RANK_IMAGES = "sglang:mm_encoder_rank_images_total"


def scrape_encoder_metrics(base_url: str, timeout: float = 10.0) -> Optional[dict]:
    """The fork's encoder-call series from ``GET /metrics``, summed over labels.

    ``None`` when the server exports none (metrics off, or a build without the
    series' metrics patch, e.g. pristine SGLang): the table then says n/a.
    """
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None
    return parse_encoder_metrics(text)


def parse_encoder_metrics(text: str) -> Optional[dict]:
    """The encoder-call series of one Prometheus text exposition (see above)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"calls": 0.0, "calls_by_path": {}, "images_sum": 0.0, "images_count": 0.0,
           "images_buckets": {}, "rank_images": {}}
    found = False
    ours = (ENCODER_CALLS, ENCODER_RANK_IMAGES, ENCODER_IMAGES + "_count")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found = found or sample.name in ours
            if sample.name == ENCODER_CALLS:
                out["calls"] += sample.value
                path = sample.labels.get("path", "")
                out["calls_by_path"][path] = out["calls_by_path"].get(path, 0.0) + sample.value
            elif sample.name == ENCODER_IMAGES + "_sum":
                out["images_sum"] += sample.value
            elif sample.name == ENCODER_IMAGES + "_count":
                out["images_count"] += sample.value
            elif sample.name == ENCODER_RANK_IMAGES:
                rank = sample.labels.get("rank", "")
                out["rank_images"][rank] = out["rank_images"].get(rank, 0.0) + sample.value
            elif sample.name == ENCODER_IMAGES + "_bucket":
                le = float(sample.labels["le"])
                out["images_buckets"][le] = out["images_buckets"].get(le, 0.0) + sample.value
    return out if found else None


def encoder_call_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Encoder calls made between two scrapes, and images per call (mean, max).

    The max is read from the histogram: the smallest bucket edge whose
    cumulative count grew by every call of the interval (exact up to 8 images,
    where the buckets are one apart).
    """
    if after is None:
        return None
    before = before or {"calls": 0.0, "calls_by_path": {}, "images_sum": 0.0,
                        "images_count": 0.0, "images_buckets": {}, "rank_images": {}}
    calls = after["calls"] - before["calls"]
    n = after["images_count"] - before["images_count"]
    images = after["images_sum"] - before["images_sum"]
    grown = {le: c - before["images_buckets"].get(le, 0.0) for le, c in after["images_buckets"].items()}
    top = min((le for le, d in grown.items() if n > 0 and d >= n), default=None)
    return {
        "encoder_calls": int(round(calls)),
        "calls_by_path": {k: int(round(v - before["calls_by_path"].get(k, 0.0)))
                          for k, v in after["calls_by_path"].items()},
        "images": int(round(images)),
        "images_per_call_mean": (images / n) if n > 0 else None,
        "images_per_call_max": (None if top is None or top == float("inf") else int(top)),
        # DP encoder: images each attention-TP rank encoded in the interval.
        "rank_images": {k: int(round(v - before["rank_images"].get(k, 0.0)))
                        for k, v in sorted(after["rank_images"].items())},
    }


def images_per_rank(encoder: Optional[dict]) -> Optional[List[int]]:
    """Images each attention-TP rank encoded, rank 0 first, from an encoder delta.

    Read from ``sglang:mm_encoder_rank_images_total`` (label ``rank``), which
    the series exports with ``--enable-metrics`` when the DP encoder splits a
    call; ``None`` (n/a) when the server exports no such series (a pristine
    build, metrics off, or no DP encoder).
    """
    if not encoder or not encoder.get("rank_images"):
        return None
    try:
        per = {int(k): v for k, v in encoder["rank_images"].items()}
    except ValueError:
        raise BenchError(f"{ENCODER_RANK_IMAGES} has a non-integer rank label: "
                         f"{sorted(encoder['rank_images'])}") from None
    return [per.get(r, 0) for r in range(max(per) + 1)]


class LogCursor:
    """Reads a growing server log from where the previous call stopped."""

    def __init__(self, path: str):
        self.path = path
        self.lines_read = 0
        self._offset = 0

    def read_new(self) -> List[str]:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1  # keep a half-written last line for later
        self._offset += cut
        lines = data[:cut].decode("utf-8", "replace").splitlines(keepends=True)
        self.lines_read += len(lines)
        return lines


# ---------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------


def sglang_version(python: str = sys.executable, python_path: Sequence[str] = ()) -> str:
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(list(python_path) + [env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [python, "-c", "import sglang.version as v; print(v.__version__)"],
        capture_output=True, text=True, env=env,
    )
    return out.stdout.strip() or "unknown"


def sglang_dir(python: str = sys.executable, python_path: Sequence[str] = ()) -> Optional[str]:
    """The folder holding the ``sglang`` package that ``python`` imports."""
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(list(python_path) + [env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [python, "-c", "import os, importlib.util as u; "
         "print(os.path.dirname(os.path.dirname(u.find_spec('sglang').origin)))"],
        capture_output=True, text=True, env=env,
    )
    return out.stdout.strip() or None


def series_hash(target: Optional[str]) -> str:
    """The applied series' hash in ``target`` per ``series.py status --json``.

    ``"none (pristine)"`` when no series is applied there; ``"unknown (...)"``
    when it cannot be told (e.g. a remote server: pass ``--series-hash``).
    """
    if not target:
        return "unknown (no sglang target)"
    series_py = os.path.join(ROOT, "scripts", "series.py")
    if not os.path.isfile(series_py):
        return "unknown (scripts/series.py missing)"
    proc = subprocess.run(
        [sys.executable, series_py, "status", "--json", "--target", target],
        capture_output=True, text=True,
    )
    try:
        st = json.loads(proc.stdout)
    except ValueError:
        return f"unknown (series.py status failed: {proc.stderr.strip()[:200]})"
    if not st.get("applied"):
        return "none (pristine)"
    h = st.get("series_hash") or "?"
    return h if st.get("current") else f"{h} (not the repo's current series)"


# ---------------------------------------------------------------------------
# bench_serving driver
# ---------------------------------------------------------------------------


@dataclass
class BurstConfig:
    num_prompts: int = 64
    max_concurrency: int = 64
    image_resolution: str = "512x512"
    image_count: int = 1
    input_len: int = 1024
    output_len: int = 128
    seed: int = 42
    image_format: str = "png"
    image_content: str = "random"


def parse_resolution(text: str) -> Tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text or "")
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise ValueError(f"image resolution must be HEIGHTxWIDTH, e.g. 512x512; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def bench_serving_command(
    *,
    base_url: str,
    model: str,
    tokenizer: Optional[str],
    output_file: str,
    cfg: BurstConfig,
    text_only: bool = False,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> List[str]:
    cmd = [
        python, "-m", "sglang.bench_serving",
        "--backend", "sglang-oai-chat",
        "--base-url", base_url,
        "--model", model,
        "--tokenizer", tokenizer or model,
        "--random-input-len", str(cfg.input_len),
        "--random-output-len", str(cfg.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(cfg.num_prompts),
        "--max-concurrency", str(cfg.max_concurrency),
        "--seed", str(cfg.seed),
        # No extra unmeasured request: the text warm-up burst is explicit, and
        # an image warm-up request would warm the encoder we want cold.
        "--warmup-requests", "0",
        "--output-file", output_file,
        "--output-details",
        "--disable-tqdm",
    ]
    if text_only:
        cmd += ["--dataset-name", "random-ids"]
    else:
        cmd += [
            "--dataset-name", "image",
            "--image-resolution", cfg.image_resolution,
            "--image-count", str(cfg.image_count),
            "--image-format", cfg.image_format,
            "--image-content", cfg.image_content,
        ]
    return cmd + list(extra)


# A burst's time limit (``burst_timeout_s``): bench_serving's own start
# (imports, tokenizer and processor, generating the random images) plus, per
# wave of ``max_concurrency`` requests, a fixed allowance and one per output
# token. The seed's burst (64 prompts at concurrency 64, 128 output tokens) gets
# 180 + 60 + 32 = 272 s; its measured bursts took 2-4 s of TTFT.
BURST_START_S = 180.0
BURST_WAVE_S = 60.0
BURST_TOKEN_S = 0.25


def burst_timeout_s(cfg: BurstConfig) -> float:
    """Seconds after which a bench_serving run of ``cfg`` counts as hung."""
    waves = math.ceil(cfg.num_prompts / cfg.max_concurrency)
    return BURST_START_S + waves * (BURST_WAVE_S + BURST_TOKEN_S * cfg.output_len)


def local_model_dir(model: str, revision: Optional[str] = None) -> str:
    """The local folder bench_serving loads the tokenizer and processor from.

    bench_serving runs offline (``run_bench_serving``), so it must be given a
    folder: ``model`` itself when it is one, else the Hugging Face cache's
    snapshot of ``model`` at ``revision`` (what a server started with
    ``--revision`` downloaded). A repo id alone would be looked up at revision
    "main", which a pinned download never records, and every request would fail.
    """
    if os.path.isdir(model):
        return os.path.abspath(model)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, revision=revision, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - not cached, bad repo id, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BenchError(
            f"{model} at revision {revision or 'main'} is not in the local Hugging Face cache "
            f"({type(e).__name__}: {first[:160]}); pass its local folder or the server's "
            f"--revision") from None


def run_bench_serving(cmd: List[str], output_file: str, log_file: str,
                      timeout: float) -> Tuple[Optional[dict], int, str]:
    """Run one bench_serving burst; return (last JSONL record or None, rc, tail).

    Offline (``HF_HUB_OFFLINE=1`` unless the caller's environment says
    otherwise): nothing is downloaded while a burst is measured; the model and
    tokenizer given to bench_serving are local folders (``local_model_dir``).
    """
    if os.path.exists(output_file):
        os.remove(output_file)
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    with open(log_file, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            log.write(f"\nbench_image_burst: timed out after {timeout:.0f} s, killed\n")
    with open(log_file, errors="replace") as f:
        tail = "".join(f.readlines()[-15:])
    record = None
    if os.path.exists(output_file):
        with open(output_file) as f:
            rows = [line for line in f if line.strip()]
        if rows:
            record = json.loads(rows[-1])
    return record, rc, tail


def summarize_record(record: Optional[dict], num_prompts: int, rc: int, tail: str) -> dict:
    """burst_stats from a bench_serving record; a crashed run counts all failed."""
    if record is None or "ttfts" not in record:
        why = tail.strip().splitlines()[-1] if tail.strip() else f"exit code {rc}"
        stats = burst_stats([], [], [], 0.0, num_prompts=num_prompts)
        stats["harness_error"] = f"bench_serving produced no result (rc={rc}): {why}"
        return stats
    stats = burst_stats(
        record["ttfts"], [e or "" for e in record["errors"]],
        record["output_lens"], float(record.get("duration") or 0.0),
        num_prompts=num_prompts,
    )
    if rc != 0:
        stats["harness_error"] = f"bench_serving exited with code {rc}"
    return stats


def first_error(record: Optional[dict], stats: dict) -> str:
    """One line saying why requests failed: the harness's note or the first error."""
    if stats.get("harness_error"):
        return stats["harness_error"]
    for e in (record or {}).get("errors") or []:
        lines = [x.strip() for x in (e or "").splitlines() if x.strip()]
        if lines:
            return lines[-1][:200]
    return "no error recorded"


def run_bursts(
    *,
    base_url: str,
    model: str,
    tokenizer: Optional[str] = None,
    bursts: int = 2,
    cfg: Optional[BurstConfig] = None,
    seed_step: int = 0,
    warmup_text_prompts: int = 0,
    warmup_text_cfg: Optional[BurstConfig] = None,
    server_log: Optional[str] = None,
    ready_marker: str = READY_MARKER,
    work_dir: Optional[str] = None,
    timeout: Optional[float] = None,
    python: str = sys.executable,
    echo=print,
) -> dict:
    """Text warm-up (optional) then ``bursts`` image bursts; the raw results.

    ``model`` and ``tokenizer`` go to bench_serving as they are (see
    ``local_model_dir``). ``timeout``: seconds per bench_serving run; None
    derives it from each run's size (``burst_timeout_s``). A text warm-up that
    completes no request raises ``BenchError`` before any image burst.
    """
    cfg = cfg or BurstConfig()
    if bursts < 1:
        raise ValueError("bursts must be >= 1")
    if cfg.num_prompts < 1 or cfg.max_concurrency < 1:
        raise ValueError("num_prompts and max_concurrency must be >= 1")
    parse_resolution(cfg.image_resolution)
    work_dir = work_dir or tempfile.mkdtemp(prefix="image-burst-")
    os.makedirs(work_dir, exist_ok=True)
    cursor = None
    after_ready: List[str] = []
    ready_seen = False
    if server_log:
        if not os.path.isfile(server_log):
            raise BenchError(f"--server-log {server_log} does not exist")
        cursor = LogCursor(server_log)

    def take_log() -> Tuple[int, List[str]]:
        """New server-log lines since the last call; only those after ready."""
        nonlocal ready_seen
        if cursor is None:
            return 0, []
        first = cursor.lines_read
        lines = cursor.read_new()
        if not ready_seen:
            i = ready_line_index(lines, ready_marker)
            if i is None:
                return first + len(lines), []
            ready_seen = True
            first, lines = first + i + 1, lines[i + 1:]
        after_ready.extend(lines)
        return first, lines

    result = {"warmup": None, "bursts": [], "work_dir": work_dir}
    take_log()  # everything up to now: start-up, before the first burst
    if warmup_text_prompts > 0:
        wcfg = warmup_text_cfg or BurstConfig(
            num_prompts=warmup_text_prompts, max_concurrency=cfg.max_concurrency,
            input_len=cfg.input_len, output_len=cfg.output_len, seed=cfg.seed,
        )
        out = os.path.join(work_dir, "warmup_text.jsonl")
        cmd = bench_serving_command(base_url=base_url, model=model, tokenizer=tokenizer,
                                    output_file=out, cfg=wcfg, text_only=True, python=python)
        echo(f"text warm-up: {wcfg.num_prompts} prompts, concurrency {wcfg.max_concurrency}, "
             f"{wcfg.input_len}/{wcfg.output_len} tokens")
        log_file = os.path.join(work_dir, "warmup_text.log")
        limit = timeout or burst_timeout_s(wcfg)
        rec, rc, tail = run_bench_serving(cmd, out, log_file, limit)
        first, lines = take_log()
        stats = summarize_record(rec, wcfg.num_prompts, rc, tail)
        stats["timeout_s"] = limit
        stats["compiles_per_rank"] = compiles_per_rank(parse_compile_events(lines, first))
        result["warmup"] = {"command": cmd, "stats": stats, "bench_serving": rec,
                            "config": vars(wcfg)}
        if stats["completed"] == 0:
            raise BenchError(
                f"text warm-up completed 0 of {wcfg.num_prompts} requests "
                f"({first_error(rec, stats)}); stopped before any image burst (log {log_file})")
    for k in range(bursts):
        out = os.path.join(work_dir, f"burst{k + 1}.jsonl")
        bcfg = BurstConfig(**{**vars(cfg), "seed": cfg.seed + k * seed_step})
        cmd = bench_serving_command(base_url=base_url, model=model, tokenizer=tokenizer,
                                    output_file=out, cfg=bcfg, python=python)
        echo(f"image burst {k + 1}/{bursts}: {cfg.num_prompts} prompts, concurrency "
             f"{cfg.max_concurrency}, {cfg.image_resolution}, {cfg.input_len}/{cfg.output_len} tokens")
        metrics_before = scrape_encoder_metrics(base_url)
        t0 = time.time()
        limit = timeout or burst_timeout_s(bcfg)
        rec, rc, tail = run_bench_serving(cmd, out, os.path.join(work_dir, f"burst{k + 1}.log"), limit)
        encoder = encoder_call_delta(metrics_before, scrape_encoder_metrics(base_url))
        first, lines = take_log()
        stats = summarize_record(rec, cfg.num_prompts, rc, tail)
        stats["timeout_s"] = limit
        events = parse_compile_events(lines, first)
        stats["compiles_per_rank"] = compiles_per_rank(events)
        stats["compile_events"] = [vars(e) for e in events]
        stats["images_per_rank"] = images_per_rank(encoder)  # from /metrics
        stats["wall_s"] = time.time() - t0
        stats["encoder"] = encoder  # from /metrics; None without the series' metrics
        result["bursts"].append({"burst": k + 1, "seed": bcfg.seed, "command": cmd,
                                 "stats": stats, "bench_serving": rec})
    if cursor is not None:
        take_log()
        events = parse_compile_events(after_ready)
        result["server_log"] = {
            "path": os.path.abspath(server_log),
            "ready_marker_seen": ready_seen,
            "compiles_after_ready_per_rank": compiles_per_rank(events),
            "compile_events_after_ready": [vars(e) for e in events],
        }
    result["config"] = dict(vars(cfg), seed_step=seed_step)
    return result


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt_ms(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def fmt_compiles(per_rank: Optional[Dict[str, int]], counted: bool = True) -> str:
    if not counted:
        return "not counted"
    if not per_rank:
        return "0"
    return f"{sum(per_rank.values())} (" + ", ".join(f"{k}: {v}" for k, v in per_rank.items()) + ")"


def fmt_images(per_rank: Optional[List[int]]) -> str:
    return "n/a" if per_rank is None else " / ".join(str(x) for x in per_rank)


def fmt_encoder(encoder: Optional[dict]) -> Tuple[str, str]:
    """("encoder calls", "images per call mean / max") table cells."""
    if not encoder:
        return "n/a", "n/a"
    mean = encoder["images_per_call_mean"]
    top = encoder["images_per_call_max"]
    return (str(encoder["encoder_calls"]),
            f"{'n/a' if mean is None else f'{mean:.2f}'} / {'n/a' if top is None else top}")


def header_lines(meta: dict) -> List[str]:
    lines = [
        f"- command: `{meta['command']}`",
        f"- sglang: {meta['sglang_version']}; series: {meta['series_hash']}",
        f"- server flags: `{meta['server_flags']}`",
    ]
    if meta.get("server_env"):
        lines.append("- server env: " + ", ".join(f"`{k}={v}`" for k, v in meta["server_env"].items()))
    lines.append(f"- date: {meta['date']}")
    return lines


def burst_table(result: dict, counted_compiles: bool) -> List[str]:
    rows = [
        "| Burst | Completed | Failed | Mean TTFT (ms) | P50 TTFT (ms) | P99 TTFT (ms) "
        "| Output tok/s | Images per rank | Encoder calls | Images per call (mean / max) "
        "| Compiles after ready |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if result.get("warmup"):
        s = result["warmup"]["stats"]
        rows.append(
            f"| text warm-up | {s['completed']} | {s['failed']} | {fmt_ms(s['mean_ttft_ms'])} | "
            f"{fmt_ms(s['p50_ttft_ms'])} | {fmt_ms(s['p99_ttft_ms'])} | {fmt_ms(s['output_tok_s'])} | "
            f"– | – | – | {fmt_compiles(s.get('compiles_per_rank'), counted_compiles)} |"
        )
    for b in result["bursts"]:
        s = b["stats"]
        rows.append(
            f"| {b['burst']} | {s['completed']} | {s['failed']} | {fmt_ms(s['mean_ttft_ms'])} | "
            f"{fmt_ms(s['p50_ttft_ms'])} | {fmt_ms(s['p99_ttft_ms'])} | {fmt_ms(s['output_tok_s'])} | "
            f"{fmt_images(s.get('images_per_rank'))} | "
            f"{' | '.join(fmt_encoder(s.get('encoder')))} | "
            f"{fmt_compiles(s.get('compiles_per_rank'), counted_compiles)} |"
        )
    errs = [(b["burst"], b["stats"]["harness_error"]) for b in result["bursts"]
            if b["stats"].get("harness_error")]
    for burst, err in errs:
        rows.append(f"\nBurst {burst}: {err}")
    return rows


def markdown_report(result: dict, meta: dict) -> str:
    cfg = result["config"]
    lines = ["## Image bursts", ""] + header_lines(meta) + [
        f"- bursts: {len(result['bursts'])} x {cfg['num_prompts']} prompts at concurrency "
        f"{cfg['max_concurrency']}, {cfg['image_count']} image(s) of {cfg['image_resolution']}, "
        f"{cfg['input_len']} input / {cfg['output_len']} output tokens, seed "
        + ", ".join(str(b["seed"]) for b in result["bursts"]),
    ]
    w = result.get("warmup")
    lines.append(
        f"- warm-up: {w['config']['num_prompts']} text-only prompts" if w else "- warm-up: none"
    )
    lines += ["", *burst_table(result, counted_compiles="server_log" in result)]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:30000")
    p.add_argument("--model", required=True,
                   help="the server's model: a local folder, or a repo id found in the local "
                        "Hugging Face cache at --revision (bench_serving loads the tokenizer "
                        "and the image processor from that folder, offline)")
    p.add_argument("--revision", help="the server's --revision (default: main)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the --model folder)")
    p.add_argument("--bursts", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--image-resolution", default="512x512", help="HEIGHTxWIDTH")
    p.add_argument("--image-count", type=int, default=1, help="images per request")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--seed-step", type=int, default=0,
                   help="burst k uses seed + (k-1)*STEP; 0 (the seed's protocol) repeats the "
                        "same images, which the server's embedding cache may then serve "
                        "without running the encoder")
    p.add_argument("--warmup-text-prompts", type=int, default=0,
                   help="text-only warm-up burst of N prompts first (0: none)")
    p.add_argument("--server-log", help="server log to count compiles after ready")
    p.add_argument("--ready-marker", default=READY_MARKER)
    p.add_argument("--server-flags", default="(not given)", help="the server's flags, for the header")
    p.add_argument("--sglang-target", help="folder holding the server's sglang (for version + series hash)")
    p.add_argument("--series-hash", help="override the series hash in the header (remote servers)")
    p.add_argument("--out-json", default="image_burst.json")
    p.add_argument("--out-md", default="image_burst.md")
    p.add_argument("--work-dir", help="where bench_serving's files go (default: a temp dir)")
    p.add_argument("--timeout", type=float,
                   help="seconds per bench_serving run (default: derived from the burst, "
                        f"{BURST_START_S:.0f} + per wave of --max-concurrency requests "
                        f"{BURST_WAVE_S:.0f} + {BURST_TOKEN_S} per output token)")
    return p


def validate(args) -> None:
    for name in ("bursts", "num_prompts", "max_concurrency", "image_count", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup_text_prompts < 0:
        raise BenchError("--warmup-text-prompts must be >= 0")
    try:
        parse_resolution(args.image_resolution)
    except ValueError as e:
        raise BenchError(str(e)) from None
    if args.server_log and not os.path.isfile(args.server_log):
        raise BenchError(f"--server-log {args.server_log} does not exist")
    if args.timeout is not None and args.timeout <= 0:
        raise BenchError(f"--timeout must be > 0, got {args.timeout}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate(args)
        cfg = BurstConfig(
            num_prompts=args.num_prompts, max_concurrency=args.max_concurrency,
            image_resolution=args.image_resolution, image_count=args.image_count,
            input_len=args.input_len, output_len=args.output_len, seed=args.seed,
        )
        model_dir = local_model_dir(args.model, args.revision)
        result = run_bursts(
            base_url=args.base_url, model=model_dir, tokenizer=args.tokenizer or model_dir,
            bursts=args.bursts, cfg=cfg, seed_step=args.seed_step,
            warmup_text_prompts=args.warmup_text_prompts,
            server_log=args.server_log, ready_marker=args.ready_marker,
            work_dir=args.work_dir, timeout=args.timeout,
        )
    except BenchError as e:
        print(f"bench_image_burst: {e}", file=sys.stderr)
        return 2
    target = args.sglang_target or sglang_dir()
    meta = {
        "command": shlex.join([os.path.relpath(sys.argv[0]) if sys.argv else "bench_image_burst.py",
                               *(argv if argv is not None else sys.argv[1:])]),
        "sglang_version": sglang_version(python_path=[args.sglang_target] if args.sglang_target else ()),
        "series_hash": args.series_hash or series_hash(target),
        "server_flags": args.server_flags,
        "model_dir": model_dir,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    report = markdown_report(result, meta)
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, **result}, f, indent=1)
    with open(args.out_md, "w") as f:
        f.write(report)
    print(report)
    failed = sum(b["stats"]["failed"] for b in result["bursts"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
