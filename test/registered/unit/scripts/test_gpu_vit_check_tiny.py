"""benchmark/gpu_check/gpu_vit_check.py through its --tiny CPU path.

The script is the product (it is what runs on a GPU box). It runs
once for the module, in a subprocess, through its own ``main`` with the
documented arguments (``--tiny --repeats 1 --out DIR``), in a process that
also notes, for every step the check times, the series' record of each
encoder call in it (each ``observe_encoder_call`` the series makes, after the
call, on the ``MMEncoderMetricsCollector`` a scheduler with
``--enable-metrics`` publishes; the real method still runs) and, where the
step measures peak memory, how many bytes the embedding cache held when the
measurement started. The tests read that one run: the per-request and
batched steps are the series' two paths; the cap rows
(``--mm-max-encoder-input-tokens-per-batch``, one rank) are the series' capped
calls, each measured from an empty embedding cache; the bf16 batched-vs-alone
row; the SDPA rows' launches per layer (one per distinct image size in the
call).

The check's writers are controls, run on a report built here (they read no
SGLang): each section's own files are written as the section ends and hold
what the whole report holds, the markdown shows the numbers of the JSON, and
the CUDA-graph section says why it did not run on the CPU.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=13, suite="stage-a-test-cpu")

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import gpu_vit_check as G
import pytest

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "benchmark" / "gpu_check" / "gpu_vit_check.py"
REPEATS = 1
SECTION_NAMES = [name for name, _ in G.SECTIONS]


def _expected_calls(patch_counts, cap):
    """Consecutive calls of at most ``cap`` patches (one rank: the whole
    call's); a larger image alone."""
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


# The check's own main(), in a process that observes every timed step: the
# series' observation of each encoder call in it and, when the step measures
# peak memory, the embedding cache's bytes when the measurement starts (read
# right before the start value: anything cached then would be freed inside the
# measurement and lower the peak). After the check publishes its context, the
# scheduler's metrics collector is published as with --enable-metrics (rank 0
# of one), noting each encoder call it is handed before the real method runs
# (mm_harness.noting_observations). Nothing the check computes is replaced.
_OBSERVED_RUN = textwrap.dedent(
    """
    import contextlib, json, sys
    scripts, observed_path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.path.insert(0, scripts)
    import gpu_vit_check as G

    steps = []

    real_init_ranks = G.init_ranks

    def init_ranks(*args, **kwargs):
        # What a scheduler with --enable-metrics publishes for the encoder
        # path: rank 0 of one here.
        real_init_ranks(*args, **kwargs)
        from cpu_support.ranks.mm_harness import (
            noting_observations, vit_metrics_collector)
        from sglang.srt.runtime_context import get_resources

        def note(observed):
            if steps and "path" in observed:  # the encoder calls
                steps[-1]["lines"].append(observed)

        get_resources().mm_encoder_metrics = noting_observations(
            vit_metrics_collector({"tp_rank": 0})[0], note)

    real_step = G.timed_step

    def timed_step(model, requests, dev, **kwargs):
        steps.append(dict(requests=len(requests), batched=kwargs.get("batched", True),
                          cap=kwargs.get("cap"),
                          measure_peak=kwargs.get("measure_peak", False), lines=[]))
        return real_step(model, requests, dev, **kwargs)

    class Observed(G.Device):
        @contextlib.contextmanager
        def peak(self):
            from sglang.srt.managers import mm_schedule

            cache = mm_schedule.embedding_cache
            steps[-1]["cached_at_peak_start"] = 0 if cache is None else cache.current_size
            with super().peak() as out:
                yield out

    G.init_ranks = init_ranks
    G.timed_step = timed_step
    G.Device = Observed
    try:
        status = G.main(argv)
    finally:
        with open(observed_path, "w") as f:
            json.dump(steps, f)
    sys.exit(status)
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu_vit_check")
    out, probe, observed = work / "out", work / "observed_run.py", work / "steps.json"
    probe.write_text(_OBSERVED_RUN)
    # MALLOC_* set as the check sets them: its _prepare_process must not re-exec.
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MALLOC_MMAP_THRESHOLD_="131072",
        MALLOC_TRIM_THRESHOLD_="131072",
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(probe),
            str(SCRIPT.parent),
            str(observed),
            "--tiny",
            "--repeats",
            str(REPEATS),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_vit_check.json").read_text())
    markdown = (out / "gpu_vit_check.md").read_text()
    # The whole check ran and printed what it wrote.
    assert report["complete"] is True and report["sections_done"] == SECTION_NAMES
    assert markdown.strip() in proc.stdout
    return report, json.loads(observed.read_text())


def _encoder_call_line(path, images, patches):
    """The series' observation of one encoder call of ``images`` single-image
    requests in this one-rank process."""
    return dict(
        path=path, modality="image", requests=images, items=images, patches=patches
    )


def _burst_steps(report, steps, **match):
    """The observed steps on the check's burst whose settings match ``match``."""
    found = [
        s
        for s in steps
        if s["requests"] == report["requests"]
        and all(s[k] == v for k, v in match.items())
    ]
    assert found, match
    return found


def test_per_request_and_batched_steps_are_the_series_two_paths(run):
    report, steps = run
    n = report["requests"]
    assert n == len(report["grids"]) == 16
    assert report["patches"] == sum(t * h * w for t, h, w in report["grids"])
    by_path = {s["path"]: s for s in report["steps"]}
    assert set(by_path) == {"per-request", "batched"}
    assert (
        by_path["per-request"]["calls"] == n
        and by_path["per-request"]["images_max"] == 1
    )
    assert by_path["batched"]["calls"] == 1 and by_path["batched"]["images_max"] == n
    counts = [t * h * w for t, h, w in report["grids"]]
    assert by_path["per-request"]["call_patches"] == [[c] for c in counts]
    assert by_path["batched"]["call_patches"] == [counts]
    for s in by_path.values():
        assert s["images"] == n
        assert len(s["warm_ms"]) == REPEATS
    # What ran: with the gate pinned off, the series' per-request path, one
    # call per request; pinned on, its cross-request call with every request.
    for step in _burst_steps(report, steps, batched=False):
        assert step["lines"] == [
            _encoder_call_line("per_request", 1, c) for c in counts
        ]
    for step in _burst_steps(report, steps, batched=True, cap=None):
        assert step["lines"] == [_encoder_call_line("batched", n, sum(counts))]


def test_cap_rows_are_the_series_capped_calls_measured_from_an_empty_cache(run):
    report, steps = run
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
        # Each of the row's steps made those calls on the series' batched path.
        expected = [
            _encoder_call_line("batched", len(call), sum(call))
            for call in row["call_patches"]
        ]
        row_steps = _burst_steps(report, steps, batched=True, cap=row["cap"])
        for step in row_steps:
            assert step["lines"] == expected, row["cap"]
        # One peak measurement per row, after the previous step's embeddings
        # left the cache.
        measured = [s for s in row_steps if s["measure_peak"]]
        assert [s["cached_at_peak_start"] for s in measured] == [0], row["cap"]


def test_bf16_batched_vs_alone_row(run):
    report, _ = run
    (d,) = report["diffs"]
    assert d["dtype"] == "bfloat16"
    assert d["images"] == report["requests"]
    assert 0 <= d["bitwise_equal_images"] <= d["images"]
    assert -1.0 <= d["min_token_cosine"] <= d["mean_token_cosine"] <= 1.0 + 1e-12
    assert (d["max_abs_diff"] == 0) == d["bitwise"]
    assert d["calls"] == 1  # the batched step: one cross-request call


def test_sdpa_rows_launch_once_per_distinct_size(run):
    report, _ = run
    rows = report["sdpa"]
    assert [r["layout"] for r in rows] == [
        "one size",
        "2 sizes alternating",
        "4 distinct sizes",
    ]
    assert [r["distinct_sizes"] for r in rows] == [1, 2, 4]
    for r in rows:
        assert r["backend"] == "sdpa" and r["images"] == 4
        # One encoder call attends each distinct length with its own SDPA call
        # per layer; a call per request attends its one image once per layer.
        assert r["batched_calls"] == 1 and r["per_request_calls"] == r["images"]
        assert r["batched_sdpa_per_layer"] == r["distinct_sizes"]
        assert r["per_request_sdpa_per_layer"] == 1


# ---------------------------------------------------------------------------
# The check's writers, on a report built here (controls: no SGLang involved)
# ---------------------------------------------------------------------------


def _built_report():
    """A report shaped as run() fills it, with made-up numbers, finished
    sections and the CUDA-graph section as the CPU gives it."""
    rng = random.Random(5)

    def ms():
        return rng.uniform(0.5, 900.0)

    report = dict(
        device="CPU (2 cores, test)",
        tiny=True,
        dtype="bfloat16",
        vision=G.TINY_VISION,
        attention_backend="sdpa (VisionSdpaAttention)",
        requests=6,
        patches=480,
        build_s=ms(),
        complete=False,
        sections_done=[],
    )
    sections = dict(
        steps=[
            dict(
                path=path,
                calls=calls,
                images_mean=6 / calls,
                images_max=images_max,
                first_ms=ms(),
                warm_median_ms=ms(),
            )
            for path, calls, images_max in (("per-request", 6, 1), ("batched", 1, 6))
        ],
        caps=[
            dict(
                cap=cap,
                calls=calls,
                images_mean=6 / calls,
                images_max=6 // calls,
                patches_max=480 // calls,
                step_ms=ms(),
                peak_mib=rng.uniform(1, 50),
            )
            for cap, calls in ((80, 6), (160, 3), (None, 1))
        ],
        diffs=[
            dict(
                dtype="bfloat16",
                calls=1,
                step_ms=ms(),
                bitwise_equal_images=2,
                images=6,
                max_abs_diff=rng.uniform(1e-3, 1e-1),
                mean_token_cosine=1 - rng.uniform(0, 1e-3),
                min_token_cosine=1 - rng.uniform(1e-3, 1e-2),
                bitwise=False,
            )
        ],
        sdpa=[
            dict(
                backend="sdpa",
                layout=layout,
                images=4,
                distinct_sizes=sizes,
                patches=64 * 4,
                batched_sdpa_per_layer=sizes,
                per_request_sdpa_per_layer=1,
                batched_ms=ms(),
                per_request_ms=ms(),
            )
            for layout, sizes in (
                ("one size", 1),
                ("2 sizes alternating", 2),
                ("4 distinct sizes", 4),
            )
        ],
        graphs=G.graph_rows(None, None, G.Device("cpu"), None),
    )
    return report, sections


@pytest.mark.control(
    reason="harness: the check writes each section's files as it ends (its writer "
    "on a report built in the test)"
)
def test_each_section_is_written_on_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_VIT_CHECK_TEST_PAUSE_AFTER", raising=False)
    report, sections = _built_report()
    out = tmp_path / "out"
    files = G.SectionFiles(str(out))
    files.report(report)
    for n, name in enumerate(SECTION_NAMES, start=1):
        report[name] = sections[name]
        files.section_done(name, report)
        section = json.loads((out / f"{n:02d}-{name}.json").read_text())
        assert section[name] == report[name] and section["device"] == report["device"]
        whole = json.loads((out / "gpu_vit_check.json").read_text())
        assert (
            whole["sections_done"] == SECTION_NAMES[:n] and whole["complete"] is False
        )
        assert set(SECTION_NAMES[n:]).isdisjoint(whole)
        markdown = (out / "gpu_vit_check.md").read_text()
        assert (out / f"{n:02d}-{name}.md").read_text().strip() in markdown
        missing = [title for key, title in G.SECTIONS[n:]]
        assert (
            f"INCOMPLETE (running); not measured: {'; '.join(missing) or 'nothing'}."
            in markdown
        )
    report["complete"] = True
    files.report(report)
    markdown = (out / "gpu_vit_check.md").read_text()
    assert "INCOMPLETE" not in markdown
    # No GPU: the CUDA-graph section says so instead of measuring.
    assert report["graphs"] == {
        "skipped": "CUDA graphs need a GPU (--device cuda)",
        "rows": [],
    }
    assert (
        "ViT CUDA graphs on (SGLANG_VIT_ENABLE_CUDA_GRAPH=1) and off, batched steps "
        "in calls of at most 8192 patches: skipped: CUDA graphs need a GPU" in markdown
    )


@pytest.mark.control(
    reason="harness: the check's markdown shows the numbers of its JSON (on a report "
    "built in the test)"
)
def test_markdown_shows_the_json():
    report, sections = _built_report()
    report.update(sections, complete=True)
    markdown = G.to_markdown(report)
    steps = _table_rows(markdown, "path")
    assert [(r[0], int(r[1]), r[3], r[4]) for r in steps] == [
        (s["path"], s["calls"], f"{s['first_ms']:.1f}", f"{s['warm_median_ms']:.1f}")
        for s in report["steps"]
    ]
    caps = _table_rows(markdown, "cap")
    assert [(r[0], int(r[1]), r[5]) for r in caps] == [
        (
            "none" if c["cap"] is None else str(c["cap"]),
            c["calls"],
            f"{c['peak_mib']:.1f}",
        )
        for c in report["caps"]
    ]
    diffs = _table_rows(markdown, "dtype")
    assert [(r[0], int(r[1]), r[3], r[4]) for r in diffs] == [
        (
            "bfloat16",
            d["calls"],
            f"{d['bitwise_equal_images']} / {d['images']}",
            f"{d['max_abs_diff']:.3g}",
        )
        for d in report["diffs"]
    ]
    sdpa = _table_rows(markdown, "backend")
    assert [(r[0], r[1], r[3], r[4]) for r in sdpa] == [
        (
            s["backend"],
            s["layout"],
            f"{s['batched_sdpa_per_layer']:g} / {s['per_request_sdpa_per_layer']:g}",
            f"{s['batched_ms']:.1f}",
        )
        for s in report["sdpa"]
    ]


@pytest.mark.control(reason="argument checks of the script")
@pytest.mark.parametrize(
    "bad",
    [
        ["--caps", "0"],
        ["--burst", "100x64:2"],
        ["--repeats", "0"],
        ["--sdpa-images", "1"],
    ],
)
def test_bad_input_is_one_clear_line(bad):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", *bad],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("usage:") is False and "error:" in last, proc.stderr


def test_every_section_records_what_it_compiled_after_ready(run):
    report, _ = run
    built = report["built_after_ready"]
    assert set(built["dirs"]) == {"triton", "inductor"}
    assert list(built["sections"]) == SECTION_NAMES
    for b in built["sections"].values():
        assert set(b["cache_entries"]) == {"triton", "inductor"}
        assert b["dynamo_graphs"] >= 0
    markdown = G.to_markdown(report)
    assert markdown.count("Compiled in this section (after ready): Dynamo graphs ") == 5


@pytest.mark.control(
    reason="harness: the check's kernel-build counter on folders filled in the test"
)
def test_kernel_builds_count_the_cache_entries_added_after_ready(tmp_path):
    dirs = {"triton": str(tmp_path / "t"), "inductor": str(tmp_path / "i")}
    os.makedirs(os.path.join(dirs["inductor"], "old"))
    Path(dirs["inductor"], "old", "before-ready.py").write_text("x")
    builds = G.KernelBuilds(dirs)
    Path(dirs["triton"], "k1").mkdir(parents=True)
    Path(dirs["triton"], "k1", "k.json").write_text("x")
    Path(dirs["inductor"], "triton", "0", "h").mkdir(parents=True)
    Path(dirs["inductor"], "triton", "0", "h", "k.json").write_text("x")
    first = builds.take()
    assert first["dynamo_graphs"] == 0
    assert first["cache_entries"]["triton"]["entries"] == ["k1"]
    assert first["cache_entries"]["inductor"]["per_device"] == {"0": 1}
    assert builds.take()["cache_entries"]["triton"]["new"] == 0  # nothing new since
    report, sections = _built_report()
    report.update(sections, complete=True)
    report["built_after_ready"] = dict(builds.summary(), sections={"steps": first})
    assert (
        "Compiled in this section (after ready): Dynamo graphs 0; "
        "Triton 1 / Inductor 1 (triton/0: 1)." in G.to_markdown(report)
    )
