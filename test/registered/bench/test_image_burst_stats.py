"""Statistics and report plumbing of benchmark/image_burst/bench_image_burst.py and ab_image_burst.py."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import ab_image_burst as AB  # noqa: E402
import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.control(
    reason="statistics and report plumbing of the burst harness"
)


def test_burst_stats_counts_failures_and_uses_completed_only():
    ttfts = [0.1, 0.2, 0.0, 0.4]  # seconds; the failed one has no TTFT
    errors = ["", "", "HTTP 500: boom", ""]
    out_lens = [8, 8, 0, 6]
    s = B.burst_stats(ttfts, errors, out_lens, duration_s=2.0, num_prompts=5)
    assert s["completed"] == 3
    assert s["failed"] == 2  # one error + one request that never came back
    assert s["mean_ttft_ms"] == pytest.approx((100 + 200 + 400) / 3)
    assert s["p50_ttft_ms"] == pytest.approx(200.0)
    # Linear between ranks (bench_serving's definition): 200 + 0.98 * (400 - 200).
    assert s["p99_ttft_ms"] == pytest.approx(396.0)
    assert s["output_tokens"] == 22
    assert s["output_tok_s"] == pytest.approx(11.0)


def test_burst_stats_all_failed_has_no_latency():
    s = B.burst_stats([0.0, 0.0], ["timeout", "timeout"], [0, 0], 3.0)
    assert (s["completed"], s["failed"]) == (0, 2)
    assert (
        s["mean_ttft_ms"] is None
        and s["p99_ttft_ms"] is None
        and s["output_tok_s"] is None
    )


def test_burst_stats_rejects_ragged_lists():
    with pytest.raises(ValueError, match="one entry per request"):
        B.burst_stats([0.1], ["", ""], [1, 1], 1.0)


def test_summarize_record_without_result_counts_every_prompt_failed():
    s = B.summarize_record(None, 8, 1, "Traceback...\nValueError: Warmup failed\n")
    assert (s["completed"], s["failed"]) == (0, 8)
    assert "Warmup failed" in s["harness_error"]


def test_summarize_record_takes_bench_serving_own_fields():
    """TTFT and tok/s are bench_serving's result fields, not recomputed from
    the per-request lists (absent here, as without --output-details)."""
    rec = {
        "completed": 3,
        "mean_ttft_ms": 123.4,
        "median_ttft_ms": 120.0,
        "p99_ttft_ms": 150.5,
        "total_output_tokens": 30,
        "output_throughput": 15.0,
        "duration": 2.0,
    }
    s = B.summarize_record(rec, 4, 0, "")
    assert s == {
        "completed": 3,
        "failed": 1,
        "mean_ttft_ms": 123.4,
        "p50_ttft_ms": 120.0,
        "p99_ttft_ms": 150.5,
        "output_tokens": 30,
        "duration_s": 2.0,
        "output_tok_s": 15.0,
    }
    # None completed: bench_serving writes 0s, which are no latencies.
    none = B.summarize_record(dict(rec, completed=0, mean_ttft_ms=0.0), 4, 0, "")
    assert (none["failed"], none["mean_ttft_ms"], none["output_tok_s"]) == (
        4,
        None,
        None,
    )
    with pytest.raises(B.BenchError, match="5 completed of 4 prompts"):
        B.summarize_record(dict(rec, completed=5), 4, 0, "")


def test_parse_resolution():
    assert B.parse_resolution("512x384") == (512, 384)
    for bad in ("512", "0x5", "axb", ""):
        with pytest.raises(ValueError, match="HEIGHTxWIDTH"):
            B.parse_resolution(bad)


def test_bench_serving_command_image_and_text():
    cfg = B.BurstConfig(
        num_prompts=3,
        max_concurrency=2,
        image_resolution="224x224",
        input_len=10,
        output_len=4,
        seed=7,
    )
    img = B.bench_serving_command(
        base_url="http://h:1", model="m", tokenizer=None, output_file="o.jsonl", cfg=cfg
    )
    # sglang 0.5.23's module (``sglang.bench_serving`` warns on every run).
    assert img[1:3] == ["-m", "sglang.benchmark.serving"]
    flags = dict(zip(img[3::2], img[4::2]))
    assert img[img.index("--dataset-name") + 1] == "image"
    assert img[img.index("--image-resolution") + 1] == "224x224"
    assert img[img.index("--num-prompts") + 1] == "3"
    assert img[img.index("--seed") + 1] == "7"
    assert img[img.index("--warmup-requests") + 1] == "0"
    assert "--output-details" in img and flags["--backend"] == "sglang-oai-chat"
    txt = B.bench_serving_command(
        base_url="http://h:1",
        model="m",
        tokenizer="t",
        output_file="o.jsonl",
        cfg=cfg,
        text_only=True,
    )
    assert txt[txt.index("--dataset-name") + 1] == "random-ids"
    assert "--image-resolution" not in txt
    assert txt[txt.index("--tokenizer") + 1] == "t"


def _run(build, bursts):
    return {"build": build, "result": {"bursts": [{"stats": s} for s in bursts]}}


def _stats(mean, p99, tok, failed=0, images=None, compiles=()):
    compiles = {} if compiles == () else compiles
    return {
        "completed": 8 - failed,
        "failed": failed,
        "mean_ttft_ms": mean,
        "p99_ttft_ms": p99,
        "output_tok_s": tok,
        "images_per_rank": images,
        "compiles_per_rank": compiles,
    }


def test_ab_aggregate_medians_and_spread():
    runs = [
        _run("base", [_stats(100, 150, 10, compiles={"rank1": 2}), _stats(50, 60, 20)]),
        _run("series", [_stats(90, 120, 12), _stats(40, 50, 22)]),
        _run("base", [_stats(300, 350, 6, failed=1), _stats(70, 80, 18)]),
        _run("series", [_stats(80, 100, 14), _stats(42, 55, 21)]),
        _run("base", [_stats(200, 250, 8), _stats(60, 70, 19)]),
    ]
    rows = AB.aggregate(runs, ["base", "series"])
    assert [(r["build"], r["burst"]) for r in rows] == [
        ("base", 1),
        ("base", 2),
        ("series", 1),
        ("series", 2),
    ]
    b1 = rows[0]
    assert b1["runs"] == 3 and b1["failed"] == 1 and b1["completed"] == 23
    assert b1["mean_ttft_ms"] == {"median": 200, "min": 100, "max": 300, "n": 3}
    assert b1["p99_ttft_ms"]["median"] == 250
    assert b1["output_tok_s"]["median"] == 8
    assert b1["compiles_total"]["median"] == 0 and b1["compiles_total"]["max"] == 2
    s1 = rows[2]
    assert s1["mean_ttft_ms"] == {"median": 85.0, "min": 80, "max": 90, "n": 2}
    text = AB.table(rows, {"base": AB.spread([30.0, 32.0, 31.0])})
    assert (
        "| base | 1 | 200.0 (100.0–300.0) | 250.0 (150.0–350.0) | 8.0 (6.0–10.0) |"
        in text
    )
    assert "| series | 2 | 41.0 (40.0–42.0) |" in text
    assert "23 / 1" in text
    assert "Launch to /health 200, base: 31.0 (30.0–32.0) s" in text


def test_ab_parse_rejects_bad_input(tmp_path):
    with pytest.raises(SystemExit):
        AB.parse(["--model-path", "m", "--runs", "0"])
    with pytest.raises(SystemExit):
        AB.parse(["--model-path", "m", "--a-target", str(tmp_path)])  # no sglang there
    with pytest.raises(SystemExit):
        AB.parse(["--model-path", "m", "--simulate-rocm-gate"])  # a --cpu option


def test_bench_main_bad_input_is_one_line(capsys):
    rc = B.main(
        [
            "--base-url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--image-resolution",
            "big",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "HEIGHTxWIDTH" in err[0]
