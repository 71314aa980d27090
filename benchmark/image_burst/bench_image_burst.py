#!/usr/bin/env python
"""Image bursts against ONE running SGLang server, through sglang's bench_serving.

The seed's experiment (shared/seeds/001_*): optionally a text-only warm-up
burst (so only the vision tower is cold), then K image bursts, each a
``python -m sglang.benchmark.serving --backend sglang-oai-chat --dataset-name
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
``sglang:mm_encoder_calls_total`` and ``sglang:mm_encoder_items_per_call`` (read
for ``modality="image"``) and ``sglang:mm_encoder_tp_rank_share_total`` (per
scheduler, told apart by its ``tp_rank`` label) with ``--enable-metrics``; a
pristine build exports none of them (n/a).

``--server-log FILE``: the server's log (stdout+stderr). Torch compile
events logged after the server reported ready are counted per rank, in
total and per burst. An event is one ``[__recompiles] Recompiling function``
record (``TORCH_LOGS=recompiles``) or one ``torchdynamo start tracing``
record (``TORCH_LOGS=dynamo``, which also shows first compiles), counted
once per process and dynamo compile id.

``--triton-cache-dir`` / ``--inductor-cache-dir``: the server's
TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR. Their entries are snapshotted
when the run starts (after ready) and after the warm-up and each burst; the
table's "Kernel cache entries after ready" is what each added (a Triton
kernel is its hash folder; an Inductor entry a file, or under
``triton/<device>/`` a kernel folder, counted per device index). Not given:
"not counted".

``--mixed``: closed-loop bursts of mixed image sizes (from the
processor's 32x32 floor up), repeats of the previous burst's images and an
undecodable image, sent with bench_serving's chat-completions request function
(see ``mixed_plan`` and benchmark/image_burst/README.md, "Mixed traffic"); reports bursts
per minute, requests/s and TTFT mean/P99.

Example (a server on :30000)::

    python benchmark/image_burst/bench_image_burst.py --base-url http://127.0.0.1:30000 \\
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # cpu_support
    sys.path.insert(0, ROOT)

from cpu_support.bench import vit_bench_util as U  # noqa: E402
from cpu_support.server.cpu_server import scheduler_titles  # noqa: E402

READY_MARKER = "The server is fired up and ready to roll!"


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def ttft_summary(ttft_ms: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean, P50 and P99 of per-request TTFTs in ms (None each without any), for
    the requests this harness sends itself; a bench_serving run's come from
    its own result fields (``summarize_record``). numpy's default (linear)
    percentile: the definition bench_serving uses."""
    if not ttft_ms:
        return {"mean_ttft_ms": None, "p50_ttft_ms": None, "p99_ttft_ms": None}
    p50, p99 = (float(x) for x in np.percentile(ttft_ms, [50, 99]))
    return {
        "mean_ttft_ms": statistics.fmean(ttft_ms),
        "p50_ttft_ms": p50,
        "p99_ttft_ms": p99,
    }


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
    return {
        "completed": len(ok),
        "failed": failed,
        **ttft_summary(ttft_ms),
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
_START_TRACING = re.compile(
    r"^Step 1: torchdynamo start tracing (?P<fn>\S+) (?P<where>\S+)"
)


@dataclass
class CompileEvent:
    rank: str  # "rank0" when the line names it, else "pid1234"
    pid: int
    compile_id: str
    function: str
    where: str
    line_no: int


def parse_compile_events(
    lines: Sequence[str], start_line: int = 0
) -> List[CompileEvent]:
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
        events.append(
            CompileEvent(
                rank, pid, m.group("cid"), hit.group("fn"), hit.group("where"), n
            )
        )
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
ENCODER_ITEMS = "sglang:mm_encoder_items_per_call"
ENCODER_RANK_GRIDS = "sglang:mm_encoder_tp_rank_share_total"
# The call series' modality label of the images a burst sends.
IMAGE = "image"


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
    """The encoder-call series of one Prometheus text exposition (see above),
    summed over every label but ``path`` (calls) and ``tp_rank`` (grids per
    rank). Calls and items are the image calls' (``modality="image"``); the
    DP encoder's grids have no modality (for images, a grid is an image)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {
        "calls": 0.0,
        "calls_by_path": {},
        "images_sum": 0.0,
        "images_count": 0.0,
        "images_buckets": {},
        "rank_grids": {},
    }
    found = False
    ours = (ENCODER_CALLS, ENCODER_RANK_GRIDS, ENCODER_ITEMS + "_count")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found = found or sample.name in ours
            if sample.name == ENCODER_RANK_GRIDS:
                rank = sample.labels.get("tp_rank", "")
                out["rank_grids"][rank] = (
                    out["rank_grids"].get(rank, 0.0) + sample.value
                )
            elif sample.labels.get("modality") != IMAGE:
                continue
            elif sample.name == ENCODER_CALLS:
                out["calls"] += sample.value
                path = sample.labels.get("path", "")
                out["calls_by_path"][path] = (
                    out["calls_by_path"].get(path, 0.0) + sample.value
                )
            elif sample.name == ENCODER_ITEMS + "_sum":
                out["images_sum"] += sample.value
            elif sample.name == ENCODER_ITEMS + "_count":
                out["images_count"] += sample.value
            elif sample.name == ENCODER_ITEMS + "_bucket":
                le = float(sample.labels["le"])
                out["images_buckets"][le] = (
                    out["images_buckets"].get(le, 0.0) + sample.value
                )
    return out if found else None


def encoder_call_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Encoder calls made between two scrapes, and images per call (mean, max).

    The max is read from the histogram: the smallest bucket edge whose
    cumulative count grew by every call of the interval (exact up to 16
    images, where the buckets are one apart).
    """
    if after is None:
        return None
    before = before or {
        "calls": 0.0,
        "calls_by_path": {},
        "images_sum": 0.0,
        "images_count": 0.0,
        "images_buckets": {},
        "rank_grids": {},
    }
    calls = after["calls"] - before["calls"]
    n = after["images_count"] - before["images_count"]
    images = after["images_sum"] - before["images_sum"]
    grown = {
        le: c - before["images_buckets"].get(le, 0.0)
        for le, c in after["images_buckets"].items()
    }
    top = min((le for le, d in grown.items() if n > 0 and d >= n), default=None)
    return {
        "encoder_calls": int(round(calls)),
        "calls_by_path": {
            k: int(round(v - before["calls_by_path"].get(k, 0.0)))
            for k, v in after["calls_by_path"].items()
        },
        "images": int(round(images)),
        "images_per_call_mean": (images / n) if n > 0 else None,
        "images_per_call_max": (
            None if top is None or top == float("inf") else int(top)
        ),
        # DP encoder: grids each scheduler (tp_rank) encoded in the interval.
        "rank_grids": {
            k: int(round(v - before["rank_grids"].get(k, 0.0)))
            for k, v in sorted(after["rank_grids"].items())
        },
    }


def images_per_rank(encoder: Optional[dict]) -> Optional[List[int]]:
    """Images each attention-TP rank encoded, rank 0 first, from an encoder delta.

    Read from ``sglang:mm_encoder_tp_rank_share_total`` (each scheduler's, by
    its ``tp_rank`` label), which the series exports with ``--enable-metrics``:
    the inputs each rank's DP encoder encoded, a burst's image one grid (its
    tiles on InternVL). ``None`` (n/a) when the server exports no such series
    (a pristine build or metrics off).
    """
    if not encoder or not encoder.get("rank_grids"):
        return None
    try:
        per = {int(k): v for k, v in encoder["rank_grids"].items()}
    except ValueError:
        raise BenchError(
            f"{ENCODER_RANK_GRIDS} has a non-integer tp_rank label: "
            f"{sorted(encoder['rank_grids'])}"
        ) from None
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


_VERSION_PROBE = """
import importlib.util, os
path = os.path.join(os.path.dirname(importlib.util.find_spec("sglang").origin), "_version.py")
if os.path.isfile(path):
    ns = {}
    exec(open(path).read(), ns)
    print(ns["__version__"])
else:
    import importlib.metadata
    print(importlib.metadata.version("sglang"))
"""


def sglang_version(
    python: str = sys.executable, python_path: Sequence[str] = ()
) -> str:
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            list(python_path) + [env.get("PYTHONPATH", "")]
        )
    # The build's generated sglang/_version.py read on its own (else its
    # metadata): importing the package would import most of SGLang (seconds)
    # for one string.
    out = subprocess.run(
        [python, "-c", _VERSION_PROBE], capture_output=True, text=True, env=env
    )
    return out.stdout.strip() or "unknown"


def sglang_dir(
    python: str = sys.executable, python_path: Sequence[str] = ()
) -> Optional[str]:
    """The folder holding the ``sglang`` package that ``python`` imports."""
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            list(python_path) + [env.get("PYTHONPATH", "")]
        )
    out = subprocess.run(
        [
            python,
            "-c",
            "import os, importlib.util as u; "
            "print(os.path.dirname(os.path.dirname(u.find_spec('sglang').origin)))",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    return out.stdout.strip() or None


def series_status(target: Optional[str]) -> dict:
    """``python scripts/series.py status --target TARGET --json``, parsed.

    On failure: ``{"error": "..."}`` (one line) instead of the status.
    """
    if not target:
        return {"error": "no sglang target"}
    series_py = os.path.join(ROOT, "scripts", "series.py")
    if not os.path.isfile(series_py):
        return {"error": "scripts/series.py missing"}
    proc = subprocess.run(
        [sys.executable, series_py, "status", "--json", "--target", target],
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": f"series.py status failed: {proc.stderr.strip()[:200]}"}


def describe_status(st: dict) -> str:
    """``series.py status`` in a few words, for one-line messages."""
    if st.get("error"):
        return f"unknown ({st['error']})"
    if not st.get("applied"):
        return "series not applied"
    return (
        f"applied, series {(st.get('series_hash') or '?')[:12]}, {len(st.get('patches') or [])} patch(es)"
        + ("" if st.get("current") else ", not the repo's current series")
    )


def series_hash(target: Optional[str]) -> str:
    """The applied series' hash in ``target`` per ``series.py status --json``.

    ``"none (pristine)"`` when no series is applied there; ``"unknown (...)"``
    when it cannot be told (e.g. a remote server: pass ``--series-hash``).
    """
    st = series_status(target)
    if st.get("error"):
        return f"unknown ({st['error']})"
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
        raise ValueError(
            f"image resolution must be HEIGHTxWIDTH, e.g. 512x512; got {text!r}"
        )
    return int(m.group(1)), int(m.group(2))


# sglang 0.5.23 moved bench_serving here; ``-m sglang.bench_serving`` still
# runs it, with a FutureWarning on every run. The flags are the same.
BENCH_SERVING_MODULE = "sglang.benchmark.serving"


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
        python,
        "-m",
        BENCH_SERVING_MODULE,
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer or model,
        "--random-input-len",
        str(cfg.input_len),
        "--random-output-len",
        str(cfg.output_len),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(cfg.num_prompts),
        "--max-concurrency",
        str(cfg.max_concurrency),
        "--seed",
        str(cfg.seed),
        # No extra unmeasured request: the text warm-up burst is explicit, and
        # an image warm-up request would warm the encoder we want cold.
        "--warmup-requests",
        "0",
        "--output-file",
        output_file,
        "--output-details",
        "--disable-tqdm",
    ]
    if text_only:
        cmd += ["--dataset-name", "random-ids"]
    else:
        cmd += [
            "--dataset-name",
            "image",
            "--image-resolution",
            cfg.image_resolution,
            "--image-count",
            str(cfg.image_count),
            "--image-format",
            cfg.image_format,
            "--image-content",
            cfg.image_content,
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
            f"--revision"
        ) from None


def run_bench_serving(
    cmd: List[str], output_file: str, log_file: str, timeout: float
) -> Tuple[Optional[dict], int, str]:
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
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
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


def summarize_record(
    record: Optional[dict], num_prompts: int, rc: int, tail: str
) -> dict:
    """A bench_serving run's completed/failed counts, TTFT mean/P50/P99 (ms) and
    output tok/s, taken from its own result fields (``completed``,
    ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``,
    ``total_output_tokens``, ``output_throughput``, ``duration``); failed is
    ``num_prompts`` minus completed. No request completed: no TTFT or tok/s
    (bench_serving writes 0 there). A crashed run counts all failed."""
    if record is None or "completed" not in record:
        why = tail.strip().splitlines()[-1] if tail.strip() else f"exit code {rc}"
        stats = burst_stats([], [], [], 0.0, num_prompts=num_prompts)
        stats["harness_error"] = f"bench_serving produced no result (rc={rc}): {why}"
        return stats
    completed = int(record["completed"])
    if completed > num_prompts:
        raise BenchError(
            f"bench_serving reports {completed} completed of {num_prompts} prompts"
        )

    def field(key: str) -> Optional[float]:
        return float(record[key]) if completed and record.get(key) is not None else None

    stats = {
        "completed": completed,
        "failed": num_prompts - completed,
        "mean_ttft_ms": field("mean_ttft_ms"),
        "p50_ttft_ms": field("median_ttft_ms"),
        "p99_ttft_ms": field("p99_ttft_ms"),
        "output_tokens": int(record.get("total_output_tokens") or 0),
        "duration_s": float(record.get("duration") or 0.0),
        "output_tok_s": field("output_throughput"),
    }
    if rc != 0:
        stats["harness_error"] = f"bench_serving exited with code {rc}"
    return stats


def cache_hits(cfg: BurstConfig, encoder: Optional[dict], completed: int) -> dict:
    """Images the burst's completed requests sent, and how many of them the
    encoder did not run on (served from SGLang's multimodal embedding cache):
    sent minus the images the series' ``sglang:mm_encoder_items_per_call``
    counted in the burst. ``None`` without those metrics (pristine, metrics off)."""
    sent = completed * cfg.image_count
    hits = None if not encoder else max(0, sent - encoder["images"])
    return {"images_sent": sent, "encoder_cache_hits": hits}


def first_error(record: Optional[dict], stats: dict) -> str:
    """One line saying why requests failed: the harness's note or the first error."""
    if stats.get("harness_error"):
        return stats["harness_error"]
    for e in (record or {}).get("errors") or []:
        lines = [x.strip() for x in (e or "").splitlines() if x.strip()]
        if lines:
            return lines[-1][:200]
    return "no error recorded"


# ---------------------------------------------------------------------------
# Beside the images: a text-only stream, unseen image sizes, peak memory
# ---------------------------------------------------------------------------


def _ttft_summary(records: List[dict]) -> dict:
    ok = [1000.0 * r["ttft"] for r in records if r["success"]]
    return {"completed": len(ok), "failed": len(records) - len(ok), **ttft_summary(ok)}


def _chat_input(RequestFuncInput, model: str, api_url: str, content, output_len: int):
    messages = [{"role": "user", "content": content}]
    return RequestFuncInput(
        model=model,
        prompt=messages,
        api_url=api_url,
        prompt_len=0,
        output_len=output_len,
        lora_name="",
        image_data=None,
        extra_request_body={},
    )


class TextStream:
    """Text-only chat requests, ``concurrency`` in flight at all times, from
    ``start()`` until ``stop()`` (which waits for the ones in flight), sent with
    bench_serving's chat-completions request function in a thread of its own."""

    def __init__(
        self,
        base_url: str,
        model: str,
        concurrency: int,
        output_len: int,
        seed: int = 0,
    ):
        if concurrency < 1 or output_len < 1:
            raise BenchError(
                "the text stream needs concurrency >= 1 and output length >= 1"
            )
        self.base_url, self.model = base_url, model
        self.concurrency, self.output_len, self.seed = concurrency, output_len, seed
        self.records: List[dict] = []
        self._stop = None
        self._thread = None

    def start(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import asyncio

        func, RequestFuncInput = _bench_serving_request_func()
        api_url = self.base_url.rstrip("/") + "/v1/chat/completions"
        words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]

        async def worker(w: int) -> None:
            n = 0
            while not self._stop.is_set():
                rng = np.random.default_rng((self.seed, w, n))
                text = (
                    f"Stream {w}.{n}: "
                    + " ".join(rng.choice(words, size=24))
                    + ". Continue the list."
                )
                sent = time.time()
                o = await func(
                    request_func_input=_chat_input(
                        RequestFuncInput,
                        self.model,
                        api_url,
                        [{"type": "text", "text": text}],
                        self.output_len,
                    )
                )
                self.records.append(
                    {
                        "worker": w,
                        "n": n,
                        "success": bool(o.success),
                        "sent": sent,
                        "ttft": float(o.ttft or 0.0),
                        "error": (o.error or "")[-200:],
                    }
                )
                n += 1

        async def drive() -> None:
            await asyncio.gather(*(worker(w) for w in range(self.concurrency)))

        asyncio.run(drive())

    def stop(self, window: Optional[Tuple[float, float]] = None) -> dict:
        """The whole stream's TTFTs, and (``window``: wall-clock start, end) those
        of the requests sent inside it (``in_window``)."""
        self._stop.set()
        self._thread.join(timeout=600)
        out = dict(
            _ttft_summary(self.records),
            concurrency=self.concurrency,
            output_len=self.output_len,
        )
        if window is not None:
            out["window_s"] = window[1] - window[0]
            out["in_window"] = _ttft_summary(
                [r for r in self.records if window[0] <= r["sent"] <= window[1]]
            )
        return out


# bench_serving's run ends this long at most after its last request completed
# (results printed and written); the image window reaches back from the exit.
IMAGE_WINDOW_SLACK_S = 2.0


def image_window(
    record: Optional[dict], now: Optional[float] = None
) -> Optional[Tuple[float, float]]:
    """The wall-clock span in which a just-finished bench_serving run sent its
    image requests: its ``duration`` (first request to last completion) back
    from now, plus ``IMAGE_WINDOW_SLACK_S``; None without a duration. The
    text stream runs from before bench_serving's start-up (tens of seconds of
    imports), so only its requests sent in this window ran beside images."""
    if not record or not record.get("duration"):
        return None
    end = time.time() if now is None else now
    return (end - float(record["duration"]) - IMAGE_WINDOW_SLACK_S, end)


class MemorySampler:
    """Peak memory per rank over one burst.

    CPU (``pids`` given): each scheduler process's peak RSS over the burst
    (``/proc/PID/clear_refs`` resets the peak mark at the start, VmHWM read at
    the end). GPU (``gpu_reader`` given, e.g. the A/B's smi reading): the
    largest used memory per GPU seen while polling every ``interval`` seconds
    (the driver's view, which includes what PyTorch's allocator keeps cached;
    a server process's own ``torch.cuda.max_memory_allocated`` is not
    reachable from outside it).
    """

    def __init__(self, pids=None, gpu_reader=None, interval: float = 0.25):
        self.pids, self.gpu_reader, self.interval = pids, gpu_reader, interval
        self._procs: Dict[int, str] = {}
        self._peak: Dict[str, float] = {}
        self._thread = self._stop = None

    def start(self) -> None:
        import threading

        self._procs = scheduler_titles(self.pids()) if self.pids else {}
        for pid in self._procs:
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
        self._peak = {}
        if self.gpu_reader is not None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while True:
            for gpu, used in (self.gpu_reader() or {}).items():
                self._peak[gpu] = max(used, self._peak.get(gpu, 0.0))
            if self._stop.wait(self.interval):
                return

    def stop(self) -> dict:
        out = {}
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            out["gpu_peak_used_mib"] = dict(sorted(self._peak.items()))
        rss = {}
        for pid, title in self._procs.items():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            rss[title] = int(line.split()[1]) / 1024
            except OSError:
                rss[title] = None
        if self._procs:
            out["scheduler_peak_rss_mib"] = dict(sorted(rss.items()))
        return out


DEFAULT_UNSEEN_SIZES = "97x1003,1003x97,544x544,1056x1056,1344x1344"


def sizes_arg(text: str) -> List[Tuple[int, int]]:
    """argparse type for ``--unseen-sizes``."""
    try:
        return parse_sizes(text)
    except BenchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_sizes(text: str) -> List[Tuple[int, int]]:
    """``"97x1003,544x544"`` -> [(97, 1003), (544, 544)] (HEIGHTxWIDTH)."""
    try:
        return [
            parse_resolution(part.strip()) for part in text.split(",") if part.strip()
        ]
    except ValueError as e:
        raise BenchError(f"--unseen-sizes: {e}") from None


def unseen_size_pass(
    base_url: str,
    model: str,
    sizes: Sequence[Tuple[int, int]],
    output_len: int,
    take_log,
    seed: int = 0,
    echo=print,
    take_caches=None,
) -> List[dict]:
    """For each (height, width): a fresh image of that size sent alone, then a
    second fresh image of the same size (new bytes, so no embedding-cache hit);
    both TTFTs, the first's extra TTFT over the second, and the compiles the
    server logged after each (``take_log`` reads the new server-log lines)
    and the compile-cache entries each added (``take_caches``, if given)."""
    import asyncio

    func, RequestFuncInput = _bench_serving_request_func()
    api_url = base_url.rstrip("/") + "/v1/chat/completions"
    rows = []
    for i, (h, w) in enumerate(sizes):
        row = {"height": h, "width": w}
        for which in ("first", "repeat"):
            rng = np.random.default_rng((seed, 4049, i, which == "repeat"))
            content = [
                {
                    "type": "image_url",
                    "image_url": {"url": _mixed_image_uri(rng, w, h)},
                },
                {
                    "type": "text",
                    "text": f"Unseen size {h}x{w} ({which}): describe it.",
                },
            ]
            o = asyncio.run(
                func(
                    request_func_input=_chat_input(
                        RequestFuncInput, model, api_url, content, output_len
                    )
                )
            )
            first_line, lines = take_log()
            row[f"{which}_ok"] = bool(o.success)
            row[f"{which}_ttft_ms"] = (
                1000.0 * float(o.ttft or 0.0) if o.success else None
            )
            row[f"{which}_error"] = (
                (o.error or "").strip().splitlines()[-1][:200]
                if not o.success and o.error
                else ""
            )
            row[f"{which}_compiles"] = compiles_per_rank(
                parse_compile_events(lines, first_line)
            )
            row[f"{which}_cache_entries"] = take_caches() if take_caches else None
        row["extra_ttft_ms"] = (
            row["first_ttft_ms"] - row["repeat_ttft_ms"]
            if row["first_ok"] and row["repeat_ok"]
            else None
        )
        echo(
            f"unseen size {h}x{w}: first {fmt_ms(row['first_ttft_ms'])} ms, repeat "
            f"{fmt_ms(row['repeat_ttft_ms'])} ms, compiles {sum(row['first_compiles'].values())} + "
            f"{sum(row['repeat_compiles'].values())}"
        )
        rows.append(row)
    return rows


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
    text_stream: Optional[dict] = None,
    memory: Optional["MemorySampler"] = None,
    unseen_sizes: Sequence[Tuple[int, int]] = (),
    unseen_output_len: int = 4,
    compile_caches: Optional[Dict[str, Optional[str]]] = None,
) -> dict:
    """Text warm-up (optional) then ``bursts`` image bursts; the raw results.

    The reviewer's three costs (benchmark/image_burst/README.md, "Beside the images"):
    ``text_stream`` (``{"concurrency": N, "output_len": L}``) runs a text-only
    stream of N concurrent requests during every image burst and records its
    TTFTs, all of them and those sent while the burst's image requests were in
    flight (``image_window``); ``memory`` (a ``MemorySampler``) records each burst's peak memory
    per rank; ``unseen_sizes`` ((height, width) pairs), after the bursts, sends
    one fresh image of each size alone and then a second fresh image of the
    same size, and records both TTFTs and the compiles each one caused.

    ``compile_caches`` (``{"triton": DIR, "inductor": DIR}``, the server's
    TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR): the folders' entries are
    snapshotted when this starts (the A/B calls it as soon as ``/health``
    answers) and after the warm-up, each burst and each unseen-size request;
    each records the entries it added (``cache_entries``:
    ``vit_bench_util.new_cache_entries``), and ``result["compile_caches"]``
    all added after ready. A kernel built after ready is one of them even
    when Dynamo logged nothing for it.

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
            first, lines = first + i + 1, lines[i + 1 :]
        after_ready.extend(lines)
        return first, lines

    caches_at_ready = caches_last = (
        U.cache_snapshot(compile_caches) if compile_caches else None
    )

    def take_caches() -> Optional[dict]:
        """Entries the compile caches gained since the last call (None: not counted)."""
        nonlocal caches_last
        if caches_last is None:
            return None
        now = U.cache_snapshot(compile_caches)
        new = U.new_cache_entries(caches_last, now)
        caches_last = now
        return new

    result = {"warmup": None, "bursts": [], "work_dir": work_dir}
    take_log()  # everything up to now: start-up, before the first burst
    if warmup_text_prompts > 0:
        wcfg = warmup_text_cfg or BurstConfig(
            num_prompts=warmup_text_prompts,
            max_concurrency=cfg.max_concurrency,
            input_len=cfg.input_len,
            output_len=cfg.output_len,
            seed=cfg.seed,
        )
        out = os.path.join(work_dir, "warmup_text.jsonl")
        cmd = bench_serving_command(
            base_url=base_url,
            model=model,
            tokenizer=tokenizer,
            output_file=out,
            cfg=wcfg,
            text_only=True,
            python=python,
        )
        echo(
            f"text warm-up: {wcfg.num_prompts} prompts, concurrency {wcfg.max_concurrency}, "
            f"{wcfg.input_len}/{wcfg.output_len} tokens"
        )
        log_file = os.path.join(work_dir, "warmup_text.log")
        limit = timeout or burst_timeout_s(wcfg)
        rec, rc, tail = run_bench_serving(cmd, out, log_file, limit)
        first, lines = take_log()
        stats = summarize_record(rec, wcfg.num_prompts, rc, tail)
        stats["timeout_s"] = limit
        stats["compiles_per_rank"] = compiles_per_rank(
            parse_compile_events(lines, first)
        )
        stats["cache_entries"] = take_caches()
        result["warmup"] = {
            "command": cmd,
            "stats": stats,
            "bench_serving": rec,
            "config": vars(wcfg),
        }
        if stats["completed"] == 0:
            raise BenchError(
                f"text warm-up completed 0 of {wcfg.num_prompts} requests "
                f"({first_error(rec, stats)}); stopped before any image burst (log {log_file})"
            )
    for k in range(bursts):
        out = os.path.join(work_dir, f"burst{k + 1}.jsonl")
        bcfg = BurstConfig(**{**vars(cfg), "seed": cfg.seed + k * seed_step})
        cmd = bench_serving_command(
            base_url=base_url,
            model=model,
            tokenizer=tokenizer,
            output_file=out,
            cfg=bcfg,
            python=python,
        )
        echo(
            f"image burst {k + 1}/{bursts}: {cfg.num_prompts} prompts, concurrency "
            f"{cfg.max_concurrency}, {cfg.image_resolution}, {cfg.input_len}/{cfg.output_len} tokens"
        )
        metrics_before = scrape_encoder_metrics(base_url)
        t0 = time.time()
        limit = timeout or burst_timeout_s(bcfg)
        stream = None
        if text_stream:
            stream = TextStream(
                base_url,
                model,
                text_stream["concurrency"],
                text_stream["output_len"],
                seed=cfg.seed + 7919 * (k + 1),
            )
            stream.start()
        if memory is not None:
            memory.start()
        rec = None
        try:
            rec, rc, tail = run_bench_serving(
                cmd, out, os.path.join(work_dir, f"burst{k + 1}.log"), limit
            )
        finally:
            mem = memory.stop() if memory is not None else None
            text = stream.stop(image_window(rec)) if stream is not None else None
        encoder = encoder_call_delta(metrics_before, scrape_encoder_metrics(base_url))
        first, lines = take_log()
        stats = summarize_record(rec, cfg.num_prompts, rc, tail)
        stats["timeout_s"] = limit
        events = parse_compile_events(lines, first)
        stats["compiles_per_rank"] = compiles_per_rank(events)
        stats["compile_events"] = [vars(e) for e in events]
        stats["cache_entries"] = take_caches()  # kernels built in this burst
        stats["images_per_rank"] = images_per_rank(encoder)  # from /metrics
        stats["wall_s"] = time.time() - t0
        stats["encoder"] = encoder  # from /metrics; None without the series' metrics
        stats.update(cache_hits(cfg, encoder, stats["completed"]))
        stats["text_stream"] = text  # TTFTs of the text-only stream beside the burst
        stats["memory"] = mem  # peak memory per rank over the burst
        same = [b["burst"] for b in result["bursts"] if b["seed"] == bcfg.seed]
        result["bursts"].append(
            {
                "burst": k + 1,
                "seed": bcfg.seed,
                "command": cmd,
                "same_images_as_burst": same[0] if same else None,
                "stats": stats,
                "bench_serving": rec,
            }
        )
    if unseen_sizes:
        result["unseen_sizes"] = unseen_size_pass(
            base_url,
            model,
            unseen_sizes,
            unseen_output_len,
            take_log,
            seed=cfg.seed,
            echo=echo,
            take_caches=take_caches,
        )
    if cursor is not None:
        take_log()
        events = parse_compile_events(after_ready)
        result["server_log"] = {
            "path": os.path.abspath(server_log),
            "ready_marker_seen": ready_seen,
            "compiles_after_ready_per_rank": compiles_per_rank(events),
            "compile_events_after_ready": [vars(e) for e in events],
        }
    if caches_at_ready is not None:
        take_caches()
        result["compile_caches"] = {
            "dirs": {k: os.path.abspath(v) for k, v in compile_caches.items() if v},
            "entries_at_ready": {k: len(v) for k, v in caches_at_ready.items()},
            "new_after_ready": U.new_cache_entries(caches_at_ready, caches_last),
        }
    result["config"] = dict(vars(cfg), seed_step=seed_step)
    return result


# ---------------------------------------------------------------------------
# Mixed traffic: bursts of mixed image sizes, repeats, a bad input
# ---------------------------------------------------------------------------
#
# bench_serving's image dataset draws every request of a run from one size
# range and cannot repeat an image or send a bad one, and each bench_serving
# run is a new process (seconds of imports), so a closed loop of small bursts
# cannot be one run per burst. The mixed mode therefore keeps bench_serving's
# client, its chat-completions request function (the same payload, streaming
# and TTFT measurement as ``--backend sglang-oai-chat``), and drives it with
# its own requests: one burst = all of a burst's requests sent at once, the
# next burst when every one has answered.

# The tiny model's processor (and Qwen3-VL's): 16-px patches merged 2x2, so a
# side is rounded to 32 px and 32x32 is the smallest image it accepts.
MIXED_MIN_SIDE = 32


@dataclass
class MixedConfig:
    bursts: int = 60
    burst_size: int = 8  # good single-image requests per burst
    repeats: int = 2  # of them, images already sent (cache hits)
    bad: int = 1  # extra requests per burst with an undecodable image
    min_width: int = MIXED_MIN_SIDE
    max_width: int = 448
    min_height: int = MIXED_MIN_SIDE
    max_height: int = 320
    output_len: int = 8
    seed: int = 42


@dataclass
class MixedRequest:
    burst: int
    index: int  # position in the burst
    kind: str  # "fresh", "repeat" or "bad"
    width: int
    height: int
    image_id: str  # equal ids carry identical bytes
    text: str
    data_uri: str = field(default="", repr=False)


def _validate_mixed(cfg: MixedConfig) -> None:
    if cfg.bursts < 1 or cfg.burst_size < 1:
        raise ValueError("bursts and burst_size must be >= 1")
    if not 0 <= cfg.repeats < cfg.burst_size:
        raise ValueError(f"repeats must be in [0, burst_size), got {cfg.repeats}")
    if cfg.bad < 0:
        raise ValueError("bad must be >= 0")
    if cfg.output_len < 1:
        raise ValueError("output_len must be >= 1")
    if not (
        1 <= cfg.min_width <= cfg.max_width and 1 <= cfg.min_height <= cfg.max_height
    ):
        raise ValueError(
            f"size bounds must satisfy 1 <= min <= max: width "
            f"{cfg.min_width}-{cfg.max_width}, height {cfg.min_height}-{cfg.max_height}"
        )


def _mixed_image_uri(rng: "np.random.Generator", width: int, height: int) -> str:
    """A PNG data URI of ``width`` x ``height``: random 8-px blocks, so it is
    cheap to encode and decode (the image's content does not matter to a
    random-weight model; its size does)."""
    import base64
    import io

    from PIL import Image

    bw, bh = -(-width // 8), -(-height // 8)
    blocks = rng.integers(0, 256, size=(bh, bw, 3), dtype=np.uint8)
    arr = np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)[:height, :width]
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# Not an image: the server's loader fails on it and answers the request
# with an error, as it would for a client's corrupt upload.
BAD_IMAGE_URI = "data:image/png;base64," + "bm90IGFuIGltYWdl"  # b"not an image"


def mixed_plan(cfg: MixedConfig, with_images: bool = True) -> List[List[MixedRequest]]:
    """Every burst's requests, deterministic in ``cfg.seed``.

    Burst k holds ``burst_size - repeats`` fresh images (sizes uniform in the
    bounds, each side independent), ``repeats`` requests whose image (same
    bytes) was sent before, and ``bad`` requests with an undecodable image;
    the order within a burst is shuffled. A repeat reuses a fresh image of
    burst k-1 (an embedding-cache hit if the server kept it); in burst 0 it
    reuses one of the burst's own fresh images (two identical images in
    flight at once). ``with_images=False`` skips making the PNGs (sizes and
    ids are the same).
    """
    _validate_mixed(cfg)
    rng = np.random.default_rng(cfg.seed)
    fresh_n = cfg.burst_size - cfg.repeats
    plan: List[List[MixedRequest]] = []
    previous: List[MixedRequest] = []
    for k in range(cfg.bursts):
        fresh = []
        for j in range(fresh_n):
            w = int(rng.integers(cfg.min_width, cfg.max_width + 1))
            h = int(rng.integers(cfg.min_height, cfg.max_height + 1))
            # Each image from its own generator: the plan's sizes do not
            # depend on whether the pixels are made.
            pix_seed = int(rng.integers(0, 2**63 - 1))
            uri = (
                _mixed_image_uri(np.random.default_rng(pix_seed), w, h)
                if with_images
                else ""
            )
            fresh.append(MixedRequest(k, -1, "fresh", w, h, f"b{k}i{j}", "", uri))
        source = previous or fresh
        picks = rng.choice(
            len(source), size=cfg.repeats, replace=len(source) < cfg.repeats
        )
        repeats = [
            MixedRequest(
                k,
                -1,
                "repeat",
                source[p].width,
                source[p].height,
                source[p].image_id,
                "",
                source[p].data_uri,
            )
            for p in picks
        ]
        bad = [
            MixedRequest(k, -1, "bad", 0, 0, f"b{k}bad{j}", "", BAD_IMAGE_URI)
            for j in range(cfg.bad)
        ]
        burst = fresh + repeats + bad
        order = rng.permutation(len(burst))
        burst = [burst[i] for i in order]
        for i, r in enumerate(burst):
            r.index = i
            # Distinct text per request: no two requests share a prefix past
            # the chat template, whatever their image.
            r.text = f"Request {k}.{i}: describe the image in a few words."
        plan.append(burst)
        previous = fresh
    return plan


def plan_summary(plan: List[List[MixedRequest]]) -> dict:
    reqs = [r for b in plan for r in b]
    good = [r for r in reqs if r.kind != "bad"]
    return {
        "bursts": len(plan),
        "requests": len(reqs),
        "fresh": sum(r.kind == "fresh" for r in reqs),
        "repeat": sum(r.kind == "repeat" for r in reqs),
        "bad": sum(r.kind == "bad" for r in reqs),
        "width_min_max": [min(r.width for r in good), max(r.width for r in good)],
        "height_min_max": [min(r.height for r in good), max(r.height for r in good)],
        # the processor rounds each side to a multiple of 32 px (16-px
        # patches, merged 2x2), at least 32: about this many patches each
        "patches_mean": statistics.fmean(
            (max(1, round(r.width / 32)) * 2) * (max(1, round(r.height / 32)) * 2)
            for r in good
        ),
    }


def _bench_serving_request_func():
    """bench_serving's chat-completions request function, ready to call.

    Its module reads a few CLI options from a module global ``args``; they
    are set here to bench_serving's defaults for ``--backend sglang-oai-chat``
    (streaming, ignore_eos on, no request printing).
    """
    import argparse as _ap

    from sglang.benchmark import serving as bs

    bs.set_global_args(
        _ap.Namespace(
            backend="sglang-oai-chat",
            disable_stream=False,
            disable_ignore_eos=False,
            print_requests=False,
            return_logprob=False,
            dataset_name="custom",
        )
    )
    return bs.ASYNC_REQUEST_FUNCS["sglang-oai-chat"], bs.RequestFuncInput


def mixed_stats(records: List[dict], wall_s: float, bursts: int) -> dict:
    """requests/s, TTFT mean/P50/P99 (good requests), bursts per minute.

    A burst counts as served when every good request in it completed; a bad
    request is expected to fail (one that completed is counted apart).
    """
    good = [r for r in records if r["kind"] != "bad"]
    ok = [r for r in good if r["success"]]
    ttft_ms = [1000.0 * r["ttft"] for r in ok]
    served = {b for b in range(bursts)} - {r["burst"] for r in good if not r["success"]}
    by_kind = {}
    for kind in ("fresh", "repeat"):
        xs = [1000.0 * r["ttft"] for r in ok if r["kind"] == kind]
        by_kind[kind] = statistics.fmean(xs) if xs else None
    return {
        "bursts": bursts,
        "bursts_served": len(served),
        "good_requests": len(good),
        "completed": len(ok),
        "failed": len(good) - len(ok),
        "bad_requests": sum(r["kind"] == "bad" for r in records),
        "bad_accepted": sum(1 for r in records if r["kind"] == "bad" and r["success"]),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "bursts_per_min": 60.0 * len(served) / wall_s if wall_s > 0 else None,
        **ttft_summary(ttft_ms),
        "mean_ttft_ms_by_kind": by_kind,
    }


def run_mixed_bursts(
    *,
    base_url: str,
    model: str,
    cfg: MixedConfig,
    plan: Optional[List[List[MixedRequest]]] = None,
    echo=print,
) -> dict:
    """Send ``plan`` (default ``mixed_plan(cfg)``) burst by burst; the raw results.

    Images are made before the clock starts, so the client's PNG encoding
    does not compete with the server for the CPU while it is measured.
    """
    import asyncio

    plan = plan if plan is not None else mixed_plan(cfg)
    func, RequestFuncInput = _bench_serving_request_func()
    api_url = base_url.rstrip("/") + "/v1/chat/completions"

    def request_input(r: MixedRequest):
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": r.data_uri}},
                    {"type": "text", "text": r.text},
                ],
            }
        ]
        return RequestFuncInput(
            model=model,
            prompt=messages,
            api_url=api_url,
            prompt_len=0,
            output_len=cfg.output_len,
            lora_name="",
            image_data=None,
            extra_request_body={},
        )

    records: List[dict] = []

    async def drive() -> float:
        t0 = time.perf_counter()
        for burst in plan:
            outs = await asyncio.gather(
                *(func(request_func_input=request_input(r)) for r in burst)
            )
            for r, o in zip(burst, outs):
                err = (o.error or "").strip().splitlines()
                records.append(
                    {
                        "burst": r.burst,
                        "index": r.index,
                        "kind": r.kind,
                        "width": r.width,
                        "height": r.height,
                        "image_id": r.image_id,
                        "success": bool(o.success),
                        "ttft": float(o.ttft or 0.0),
                        "latency": float(o.latency or 0.0),
                        "output_len": int(o.output_len or 0),
                        "error": err[-1][:200] if err else "",
                    }
                )
        return time.perf_counter() - t0

    metrics_before = scrape_encoder_metrics(base_url)
    wall = asyncio.run(drive())
    encoder = encoder_call_delta(metrics_before, scrape_encoder_metrics(base_url))
    stats = mixed_stats(records, wall, len(plan))
    stats["encoder"] = encoder
    stats["images_per_rank"] = images_per_rank(encoder)
    echo(
        f"mixed: {stats['bursts_served']}/{len(plan)} bursts served in {wall:.1f} s "
        f"({fmt_ms(stats['bursts_per_min'])} /min, {fmt_ms(stats['requests_per_s'])} req/s, "
        f"TTFT mean {fmt_ms(stats['mean_ttft_ms'])} ms, P99 {fmt_ms(stats['p99_ttft_ms'])} ms)"
    )
    return {
        "config": vars(cfg),
        "plan": plan_summary(plan),
        "stats": stats,
        "requests": records,
    }


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
    return (
        f"{sum(per_rank.values())} ("
        + ", ".join(f"{k}: {v}" for k, v in per_rank.items())
        + ")"
    )


def fmt_images(per_rank: Optional[List[int]]) -> str:
    return "n/a" if per_rank is None else " / ".join(str(x) for x in per_rank)


def fmt_encoder(encoder: Optional[dict]) -> Tuple[str, str]:
    """("encoder calls", "images per call mean / max") table cells."""
    if not encoder:
        return "n/a", "n/a"
    mean = encoder["images_per_call_mean"]
    top = encoder["images_per_call_max"]
    return (
        str(encoder["encoder_calls"]),
        f"{'n/a' if mean is None else f'{mean:.2f}'} / {'n/a' if top is None else top}",
    )


def header_lines(meta: dict) -> List[str]:
    lines = [
        f"- command: `{meta['command']}`",
        f"- sglang: {meta['sglang_version']}; series: {meta['series_hash']}",
        f"- server flags: `{meta['server_flags']}`",
    ]
    if meta.get("server_env"):
        lines.append(
            "- server env: "
            + ", ".join(f"`{k}={v}`" for k, v in meta["server_env"].items())
        )
    lines.append(f"- date: {meta['date']}")
    return lines


BURST_HEADERS = [
    "Burst",
    "Completed",
    "Failed",
    "Mean TTFT (ms)",
    "P50 TTFT (ms)",
    "P99 TTFT (ms)",
    "Output tok/s",
    "Images per rank",
    "Encoder calls",
    "Images per call (mean / max)",
    "Compiles after ready",
    "Kernel cache entries after ready",
]


def burst_table(result: dict, counted_compiles: bool) -> List[str]:
    table = []
    if result.get("warmup"):
        s = result["warmup"]["stats"]
        table.append(
            ["text warm-up", s["completed"], s["failed"]]
            + [fmt_ms(s[k]) for k in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms")]
            + [fmt_ms(s["output_tok_s"]), "–", "–", "–"]
            + [fmt_compiles(s.get("compiles_per_rank"), counted_compiles)]
            + [U.fmt_cache_entries(s.get("cache_entries"))]
        )
    for b in result["bursts"]:
        s = b["stats"]
        table.append(
            [b["burst"], s["completed"], s["failed"]]
            + [fmt_ms(s[k]) for k in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms")]
            + [fmt_ms(s["output_tok_s"]), fmt_images(s.get("images_per_rank"))]
            + list(fmt_encoder(s.get("encoder")))
            + [fmt_compiles(s.get("compiles_per_rank"), counted_compiles)]
            + [U.fmt_cache_entries(s.get("cache_entries"))]
        )
    rows = U.markdown_table(BURST_HEADERS, table, align="l" * 12).split("\n")
    errs = [
        (b["burst"], b["stats"]["harness_error"])
        for b in result["bursts"]
        if b["stats"].get("harness_error")
    ]
    for burst, err in errs:
        rows.append(f"\nBurst {burst}: {err}")
    return rows


def markdown_report(result: dict, meta: dict) -> str:
    cfg = result["config"]
    lines = (
        ["## Image bursts", ""]
        + header_lines(meta)
        + [
            f"- bursts: {len(result['bursts'])} x {cfg['num_prompts']} prompts at concurrency "
            f"{cfg['max_concurrency']}, {cfg['image_count']} image(s) of {cfg['image_resolution']}, "
            f"{cfg['input_len']} input / {cfg['output_len']} output tokens, seed "
            + ", ".join(str(b["seed"]) for b in result["bursts"]),
        ]
    )
    w = result.get("warmup")
    lines.append(
        f"- warm-up: {w['config']['num_prompts']} text-only prompts"
        if w
        else "- warm-up: none"
    )
    lines += ["", *burst_table(result, counted_compiles="server_log" in result)]
    return "\n".join(lines) + "\n"


def mixed_table(results: List[Tuple[str, dict]]) -> List[str]:
    """One row per (label, run_mixed_bursts result)."""
    table = []
    for label, res in results:
        s = res["stats"]
        kinds = s["mean_ttft_ms_by_kind"]
        table.append(
            [label, f"{s['bursts_served']}/{s['bursts']}", f"{s['wall_s']:.1f}"]
            + [fmt_ms(s["bursts_per_min"]), f"{s['requests_per_s']:.2f}"]
            + [fmt_ms(s["mean_ttft_ms"]), fmt_ms(s["p99_ttft_ms"])]
            + [f"{fmt_ms(kinds['fresh'])} / {fmt_ms(kinds['repeat'])}", s["failed"]]
            + [f"{s['bad_requests'] - s['bad_accepted']}/{s['bad_requests']}"]
            + list(fmt_encoder(s.get("encoder")))
            + [fmt_images(s.get("images_per_rank"))]
        )
    headers = [
        "Run",
        "Bursts served",
        "Wall (s)",
        "Bursts/min",
        "Requests/s",
        "Mean TTFT (ms)",
        "P99 TTFT (ms)",
        "Mean TTFT fresh / repeat (ms)",
        "Failed (good)",
        "Bad rejected",
        "Encoder calls",
        "Images per call (mean / max)",
        "Images per rank",
    ]
    return U.markdown_table(headers, table, align="l" * len(headers)).split("\n")


def mixed_report(results: List[Tuple[str, dict]], meta: dict) -> str:
    cfg = results[-1][1]["config"]
    plan = results[-1][1]["plan"]
    lines = (
        ["## Mixed image bursts", ""]
        + header_lines(meta)
        + [
            f"- bursts: {cfg['bursts']} x ({cfg['burst_size']} single-image requests, "
            f"{cfg['repeats']} of them repeats, + {cfg['bad']} bad), sent together, the next when all "
            f"answered; widths {cfg['min_width']}-{cfg['max_width']}, heights "
            f"{cfg['min_height']}-{cfg['max_height']} px (mean {plan['patches_mean']:.0f} patches), "
            f"{cfg['output_len']} output tokens, seed {cfg['seed']}",
            "",
            *mixed_table(results),
        ]
    )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--model",
        required=True,
        help="the server's model: a local folder, or a repo id found in the local "
        "Hugging Face cache at --revision (bench_serving loads the tokenizer "
        "and the image processor from that folder, offline)",
    )
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
    p.add_argument(
        "--seed-step",
        type=int,
        default=0,
        help="burst k uses seed + (k-1)*STEP; 0 (the seed's protocol) repeats the "
        "same images, which the server's embedding cache may then serve "
        "without running the encoder",
    )
    p.add_argument(
        "--warmup-text-prompts",
        type=int,
        default=0,
        help="text-only warm-up burst of N prompts first (0: none)",
    )
    p.add_argument("--server-log", help="server log to count compiles after ready")
    p.add_argument(
        "--triton-cache-dir",
        help="the server's TRITON_CACHE_DIR: count the entries (kernels) each burst "
        "adds to it",
    )
    p.add_argument(
        "--inductor-cache-dir",
        help="the server's TORCHINDUCTOR_CACHE_DIR: count the entries each burst "
        "adds to it (per device index where it files Triton kernels under triton/N)",
    )
    p.add_argument("--ready-marker", default=READY_MARKER)
    p.add_argument(
        "--server-flags",
        default="(not given)",
        help="the server's flags, for the header",
    )
    p.add_argument(
        "--sglang-target",
        help="folder holding the server's sglang (for version + series hash)",
    )
    p.add_argument(
        "--series-hash", help="override the series hash in the header (remote servers)"
    )
    p.add_argument("--out-json", default="image_burst.json")
    p.add_argument("--out-md", default="image_burst.md")
    p.add_argument(
        "--work-dir", help="where bench_serving's files go (default: a temp dir)"
    )
    add_mixed_arguments(p)
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds per bench_serving run (default: derived from the burst, "
        f"{BURST_START_S:.0f} + per wave of --max-concurrency requests "
        f"{BURST_WAVE_S:.0f} + {BURST_TOKEN_S} per output token)",
    )
    return p


def add_mixed_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "mixed traffic (--mixed)",
        "closed-loop bursts of mixed image sizes with repeats and a bad input, through "
        "bench_serving's chat-completions request function (see mixed_plan)",
    )
    d = MixedConfig()
    g.add_argument(
        "--mixed",
        action="store_true",
        help="send mixed bursts instead of bench_serving image runs",
    )
    g.add_argument("--mixed-bursts", type=int, default=d.bursts)
    g.add_argument(
        "--mixed-burst-size",
        type=int,
        default=d.burst_size,
        help="good single-image requests per burst",
    )
    g.add_argument(
        "--mixed-repeats",
        type=int,
        default=d.repeats,
        help="of them, images sent before (cache hits)",
    )
    g.add_argument(
        "--mixed-bad",
        type=int,
        default=d.bad,
        help="extra requests per burst whose image cannot be decoded",
    )
    g.add_argument(
        "--mixed-min-size",
        default=f"{d.min_height}x{d.min_width}",
        help="smallest HEIGHTxWIDTH (the processor's floor is 32x32)",
    )
    g.add_argument(
        "--mixed-max-size",
        default=f"{d.max_height}x{d.max_width}",
        help="largest HEIGHTxWIDTH",
    )
    g.add_argument("--mixed-output-len", type=int, default=d.output_len)
    g.add_argument(
        "--mixed-warmup-bursts",
        type=int,
        default=3,
        help="untimed mixed bursts first (another seed), so first-call compiles "
        "fall outside the measurement",
    )


def mixed_config_from_args(
    args, seed_offset: int = 0, bursts: Optional[int] = None
) -> MixedConfig:
    try:
        (min_h, min_w), (max_h, max_w) = (
            parse_resolution(args.mixed_min_size),
            parse_resolution(args.mixed_max_size),
        )
    except ValueError as e:
        raise BenchError(str(e)) from None
    cfg = MixedConfig(
        bursts=args.mixed_bursts if bursts is None else bursts,
        burst_size=args.mixed_burst_size,
        repeats=args.mixed_repeats,
        bad=args.mixed_bad,
        min_width=min_w,
        max_width=max_w,
        min_height=min_h,
        max_height=max_h,
        output_len=args.mixed_output_len,
        seed=args.seed + seed_offset,
    )
    try:
        _validate_mixed(cfg)
    except ValueError as e:
        raise BenchError(f"mixed traffic: {e}") from None
    return cfg


def run_mixed(args, base_url: str, model: str, echo=print) -> dict:
    """Untimed mixed warm-up bursts (seed + 1000), then the measured ones."""
    warm = None
    if args.mixed_warmup_bursts > 0:
        wcfg = mixed_config_from_args(
            args, seed_offset=1000, bursts=args.mixed_warmup_bursts
        )
        echo(f"mixed warm-up: {wcfg.bursts} bursts (seed {wcfg.seed})")
        warm = run_mixed_bursts(base_url=base_url, model=model, cfg=wcfg, echo=echo)
    cfg = mixed_config_from_args(args)
    echo(f"mixed: making {cfg.bursts} bursts' images (seed {cfg.seed})")
    plan = mixed_plan(cfg)
    res = run_mixed_bursts(
        base_url=base_url, model=model, cfg=cfg, plan=plan, echo=echo
    )
    res["warmup"] = (
        None if warm is None else {"stats": warm["stats"], "config": warm["config"]}
    )
    return res


def validate(args) -> None:
    for name in (
        "bursts",
        "num_prompts",
        "max_concurrency",
        "image_count",
        "input_len",
        "output_len",
    ):
        if getattr(args, name) < 1:
            raise BenchError(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    if args.warmup_text_prompts < 0:
        raise BenchError("--warmup-text-prompts must be >= 0")
    try:
        parse_resolution(args.image_resolution)
    except ValueError as e:
        raise BenchError(str(e)) from None
    if args.server_log and not os.path.isfile(args.server_log):
        raise BenchError(f"--server-log {args.server_log} does not exist")
    for flag, path in (
        ("--triton-cache-dir", args.triton_cache_dir),
        ("--inductor-cache-dir", args.inductor_cache_dir),
    ):
        if path and not os.path.isdir(path):
            raise BenchError(f"{flag} {path} is not a folder")
    if args.timeout is not None and args.timeout <= 0:
        raise BenchError(f"--timeout must be > 0, got {args.timeout}")


def cache_dirs_of(args) -> Optional[Dict[str, str]]:
    """``{"triton": DIR, "inductor": DIR}`` of the cache folders given (None: none)."""
    dirs = {
        k: v
        for k, v in (
            ("triton", args.triton_cache_dir),
            ("inductor", args.inductor_cache_dir),
        )
        if v
    }
    return dirs or None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate(args)
        cfg = BurstConfig(
            num_prompts=args.num_prompts,
            max_concurrency=args.max_concurrency,
            image_resolution=args.image_resolution,
            image_count=args.image_count,
            input_len=args.input_len,
            output_len=args.output_len,
            seed=args.seed,
        )
        model_dir = local_model_dir(args.model, args.revision)
        if args.mixed:
            mixed_config_from_args(args)  # fail on bad bounds before anything is sent
            return _main_mixed(args, argv, model_dir)
        result = run_bursts(
            base_url=args.base_url,
            model=model_dir,
            tokenizer=args.tokenizer or model_dir,
            bursts=args.bursts,
            cfg=cfg,
            seed_step=args.seed_step,
            warmup_text_prompts=args.warmup_text_prompts,
            server_log=args.server_log,
            ready_marker=args.ready_marker,
            work_dir=args.work_dir,
            timeout=args.timeout,
            compile_caches=cache_dirs_of(args),
        )
    except BenchError as e:
        print(f"bench_image_burst: {e}", file=sys.stderr)
        return 2
    meta = _run_meta(args, argv, model_dir)
    report = markdown_report(result, meta)
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, **result}, f, indent=1)
    with open(args.out_md, "w") as f:
        f.write(report)
    print(report)
    failed = sum(b["stats"]["failed"] for b in result["bursts"])
    return 1 if failed else 0


def _run_meta(args, argv, model_dir: str) -> dict:
    """What a report says about its run: command, build, server flags, model, date."""
    target = args.sglang_target or sglang_dir()
    return {
        "command": shlex.join(
            [
                os.path.relpath(sys.argv[0]) if sys.argv else "bench_image_burst.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "sglang_version": sglang_version(
            python_path=[args.sglang_target] if args.sglang_target else ()
        ),
        "series_hash": args.series_hash or series_hash(target),
        "server_flags": args.server_flags,
        "model_dir": model_dir,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def _main_mixed(args, argv, model_dir: str) -> int:
    result = run_mixed(args, args.base_url, model_dir)
    meta = dict(_run_meta(args, argv, model_dir), loadavg=os.getloadavg())
    report = mixed_report([("mixed", result)], meta)
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, "mixed": result}, f, indent=1)
    with open(args.out_md, "w") as f:
        f.write(report)
    print(report)
    return 1 if result["stats"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
