"""scripts/gpu_vit_check.py through its --tiny CPU path.

The script is the product (it is what runs when a GPU is lent), so it runs
as a subprocess, exactly as documented, and the test checks that what it
wrote holds together: call counts that follow from the burst and the caps,
the bf16 batched-vs-alone rows with deterministic inference off and on (on:
bitwise), the SDPA rows' launches
per layer (one per distinct image size in the call), and a markdown table that
shows the numbers of the JSON; each section's own files under --out hold
what the whole report holds, and the CUDA-graph section says why it did not
run on the CPU. One more test runs the check in a process that
records the embedding cache at the moment each peak-memory measurement starts.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "gpu_vit_check.py"
REPEATS = 1


def _expected_calls(patch_counts, cap):
    """Consecutive calls of at most ``cap`` patches; a larger image alone."""
    if cap is None:
        return 1
    calls, load = 0, None
    for n in patch_counts:
        if load is None or load + n > cap:
            calls, load = calls + 1, n
        else:
            load += n
    return calls


def _table_rows(markdown: str, first_header: str):
    """The body rows (lists of cells) of the table whose header starts with ``first_header``."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            rows = []
            for body in lines[i + 2 :]:
                if not body.startswith("|"):
                    break
                rows.append([c.strip() for c in body.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"no table starting with {first_header!r}:\n{markdown}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_vit_check")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--repeats", str(REPEATS), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_vit_check.json").read_text())
    markdown = (out / "gpu_vit_check.md").read_text()
    return report, markdown, proc.stdout, out


def test_each_section_is_written_on_its_own(run):
    report, markdown, _, out = run
    assert report["complete"] is True and "stopped" not in report
    names = ["steps", "caps", "diffs", "sdpa", "graphs"]
    assert report["sections_done"] == names
    for n, name in enumerate(names, start=1):
        section = json.loads((out / f"{n:02d}-{name}.json").read_text())
        assert section[name] == report[name] and section["device"] == report["device"]
        text = (out / f"{n:02d}-{name}.md").read_text().strip()
        assert text in markdown
    # No GPU here: the CUDA-graph section says so instead of measuring.
    assert report["graphs"] == {"skipped": "CUDA graphs need a GPU (--device cuda)", "rows": []}
    assert "ViT CUDA graphs on (SGLANG_VIT_ENABLE_CUDA_GRAPH=1): skipped: CUDA graphs need a GPU" in markdown
    assert "INCOMPLETE" not in markdown


def test_per_request_and_batched_steps(run):
    report, _, _, _ = run
    n = report["requests"]
    assert n == len(report["grids"]) == 16
    assert report["patches"] == sum(t * h * w for t, h, w in report["grids"])
    steps = {s["path"]: s for s in report["steps"]}
    assert set(steps) == {"per-request", "batched"}
    assert steps["per-request"]["calls"] == n and steps["per-request"]["images_max"] == 1
    assert steps["batched"]["calls"] == 1 and steps["batched"]["images_max"] == n
    counts = [t * h * w for t, h, w in report["grids"]]
    assert steps["per-request"]["call_patches"] == [[c] for c in counts]
    assert steps["batched"]["call_patches"] == [counts]
    for s in steps.values():
        assert s["images"] == n
        assert len(s["warm_ms"]) == REPEATS


def test_cap_rows_follow_from_the_burst(run):
    report, _, _, _ = run
    counts = [t * h * w for t, h, w in report["grids"]]
    caps = report["caps"]
    assert [c["cap"] for c in caps][-1] is None and len(caps) >= 2
    for row in caps:
        assert row["calls"] == _expected_calls(counts, row["cap"]), row
        assert row["images"] == report["requests"]
        # The calls carry the misses in request order, each under the cap
        # unless it holds one image.
        assert [n for call in row["call_patches"] for n in call] == counts
        for call in row["call_patches"]:
            assert row["cap"] is None or sum(call) <= row["cap"] or len(call) == 1, row
        assert row["patches_max"] == max(sum(call) for call in row["call_patches"])


def test_bf16_batched_vs_alone_rows(run):
    report, _, _, _ = run
    rows = {d["deterministic"]: d for d in report["diffs"]}
    assert set(rows) == {False, True}
    for d in rows.values():
        assert d["dtype"] == "bfloat16"
        assert d["images"] == report["requests"]
        assert 0 <= d["bitwise_equal_images"] <= d["images"]
        assert -1.0 <= d["min_token_cosine"] <= d["mean_token_cosine"] <= 1.0 + 1e-12
        assert (d["max_abs_diff"] == 0) == d["bitwise"]
    # Deterministic inference: one image per encoder call, bitwise equal to alone.
    assert rows[True]["calls"] == report["requests"]
    assert rows[True]["bitwise"] and report["deterministic_bitwise_ok"]
    assert rows[False]["calls"] == 1


def test_sdpa_rows_launch_once_per_distinct_size(run):
    report, _, _, _ = run
    rows = report["sdpa"]
    assert [r["layout"] for r in rows] == ["one size", "2 sizes alternating", "4 distinct sizes"]
    assert [r["distinct_sizes"] for r in rows] == [1, 2, 4]
    for r in rows:
        assert r["backend"] == "sdpa" and r["images"] == 4
        # One encoder call attends each distinct length with its own SDPA call
        # per layer; a call per request attends its one image once per layer.
        assert r["batched_calls"] == 1 and r["per_request_calls"] == r["images"]
        assert r["batched_sdpa_per_layer"] == r["distinct_sizes"]
        assert r["per_request_sdpa_per_layer"] == 1


def test_markdown_shows_the_json(run):
    report, markdown, stdout, _ = run
    assert markdown.strip() in stdout
    steps = _table_rows(markdown, "path")
    assert [(r[0], int(r[1]), r[3], r[4]) for r in steps] == [
        (s["path"], s["calls"], f"{s['first_ms']:.1f}", f"{s['warm_median_ms']:.1f}") for s in report["steps"]
    ]
    caps = _table_rows(markdown, "cap")
    assert [(r[0], int(r[1]), r[5]) for r in caps] == [
        ("none" if c["cap"] is None else str(c["cap"]), c["calls"], f"{c['peak_mib']:.1f}") for c in report["caps"]
    ]
    diffs = _table_rows(markdown, "dtype")
    assert [(r[0], r[1], r[4], r[5]) for r in diffs] == [
        ("bfloat16", "on" if d["deterministic"] else "off",
         f"{d['bitwise_equal_images']} / {d['images']}", f"{d['max_abs_diff']:.3g}") for d in report["diffs"]
    ]
    sdpa = _table_rows(markdown, "backend")
    assert [(r[0], r[1], r[3], r[4]) for r in sdpa] == [
        (s["backend"], s["layout"], f"{s['batched_sdpa_per_layer']:g} / {s['per_request_sdpa_per_layer']:g}",
         f"{s['batched_ms']:.1f}") for s in report["sdpa"]
    ]


# Runs the check's run() with a Device whose peak() first notes how many bytes
# the embedding cache holds: the start value is read right after, so anything
# still cached then is freed inside the measurement and lowers the peak.
_OBSERVE_PEAK_START = textwrap.dedent("""
    import contextlib, json, sys
    sys.path.insert(0, sys.argv[1])
    import gpu_vit_check as G
    G._prepare_process("cpu")
    from sglang.srt.managers import mm_schedule

    cached_at_start = []

    class Observed(G.Device):
        @contextlib.contextmanager
        def peak(self):
            cache = mm_schedule.embedding_cache
            cached_at_start.append(0 if cache is None else cache.current_size)
            with super().peak() as out:
                yield out

    G.Device = Observed
    report = G.run(G.parse_args(["--tiny", "--repeats", "1", "--burst", "64x64:2,128x128:1",
                                 "--caps", "64,none", "--sdpa-images", "2"]))
    print(json.dumps(dict(cached_at_start=cached_at_start, caps=[c["cap"] for c in report["caps"]])))
""")


@pytest.mark.control(reason="the check's own measurement order (cache emptied before the start value)")
def test_peak_memory_starts_from_an_empty_embedding_cache(tmp_path):
    probe = tmp_path / "observe_peak_start.py"
    probe.write_text(_OBSERVE_PEAK_START)
    # MALLOC_* set: _prepare_process must not re-exec this probe.
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, str(probe), str(SCRIPT.parent)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # One measurement per cap row, each after the previous step's embeddings left the cache.
    assert seen["caps"] == [64, None]
    assert seen["cached_at_start"] == [0, 0], seen


@pytest.mark.control(reason="argument checks of the script")
@pytest.mark.parametrize("bad", [["--caps", "0"], ["--burst", "100x64:2"], ["--repeats", "0"], ["--sdpa-images", "1"]])
def test_bad_input_is_one_clear_line(bad):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", *bad], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("usage:") is False and "error:" in last, proc.stderr
