"""End to end: a real ``sglang.launch_server`` on the CPU, driven by the burst harness.

The shared TP2 server of ``conftest.py`` (tiny Qwen2.5-VL, series tree,
``--tp-size 2 --mm-enable-dp-encoder --enable-metrics``, the ViT gate and the
warm-up decision simulated as on ROCm), one text request and two bursts of
two-image requests, one request at a time, through
``benchmark/image_burst/bench_image_burst.py`` (and thus ``sglang.bench_serving``).
Checked: both ranks decided to warm up as on ROCm and logged their warm-up
before ``/health`` answered 200; the gate batched (ROCm, DP encoder,
attention-TP 2); each request was one encoder call on the batched path with
one image on each rank, read from ``/metrics``; the JSON and the table hold
the numbers bench_serving produced; every request completed; the server is
stopped by PID with no process left.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=105, suite="stage-a-test-cpu")

import json  # noqa: E402
import re  # noqa: E402

import bench_image_burst as B  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402

# The shared server's workload (conftest.py): bursts, requests a burst,
# images a request, image tokens an image.
BURSTS, PROMPTS, IMAGES, IMAGE_TOKENS = 2, 2, 2, 64

WARM_UP = re.compile(
    r"vision warm-up \(rank (\d+), Qwen2_5_VLForConditionalGeneration\): "
    r"\d+ tower calls in "
)
GATE_ON = (
    "cross-request ViT batching on ROCm: on "
    "(Qwen2_5_VLForConditionalGeneration, attention-TP 2)"
)
# The ROCm simulation's report of the warm-up decision (one per scheduler process).
SIM_WARM_UP = re.compile(
    r"\[fork demo ROCm gate simulation\] pid (\d+): "
    r"vision_warm_up_needed -> (True|False)"
)


@pytest.fixture(scope="module", autouse=True)
def _same_workload(shared_tp2_server):
    assert shared_tp2_server["workload"] == (BURSTS, PROMPTS, IMAGES, IMAGE_TOKENS)


def _data(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(served["json"].read_text())


def _before_ready(served):
    srv = served["srv"]
    with open(srv.log_path, "rb") as f:
        return f.read(srv.log_bytes_at_ready).decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.control(
    reason="upstream behaviour the series keeps: the server answers every text and image request"
)
def test_every_request_completed_with_tokens(shared_tp2_server):
    data = _data(shared_tp2_server)
    text = data["warmup"]["bench_serving"]
    assert text["completed"] == 1 and text["total_input_vision_tokens"] == 0
    assert len(data["bursts"]) == BURSTS
    for rec in [text] + [b["bench_serving"] for b in data["bursts"]]:
        assert all(e in ("", None) for e in rec["errors"])
        assert all(n_out > 0 for n_out in rec["output_lens"])
        assert all(t for t in rec["generated_texts"])
    for burst in data["bursts"]:
        rec = burst["bench_serving"]
        assert rec["completed"] == PROMPTS and burst["stats"]["failed"] == 0
        # The requests carried their images (vision start and end counted too).
        assert rec["total_input_vision_tokens"] == PROMPTS * IMAGES * (IMAGE_TOKENS + 2)


@pytest.mark.slow
def test_both_ranks_decided_as_rocm_and_warmed_before_ready(shared_tp2_server):
    before_ready = _before_ready(shared_tp2_server)
    # The warm-up's own decision, on each scheduler process, under the simulation.
    decisions = {pid: d for pid, d in SIM_WARM_UP.findall(before_ready)}
    assert sorted(decisions.values()) == ["True"] * 2, decisions
    ranks = sorted({int(m.group(1)) for m in WARM_UP.finditer(before_ready)})
    assert ranks == [0, 1], "vision warm-up lines missing before /health was ready"
    # ...and the scheduler's gate batched for the same reason.
    assert GATE_ON in shared_tp2_server["log"]


@pytest.mark.slow
def test_each_request_was_one_batched_call_with_one_image_per_rank(shared_tp2_server):
    """One request at a time: one encoder call per request, on the gate's
    batched path, its two equal images one on each DP-encoder rank."""
    from prometheus_client.parser import text_string_to_metric_families

    for burst in _data(shared_tp2_server)["bursts"]:
        enc = burst["stats"]["encoder"]
        assert (
            enc is not None
        ), "the series build exports sglang:mm_encoder_* with --enable-metrics"
        assert enc["images"] == PROMPTS * IMAGES
        assert enc["encoder_calls"] == PROMPTS
        assert {k: v for k, v in enc["calls_by_path"].items() if v} == {
            "batched": PROMPTS
        }, enc
        assert enc["images_per_call_mean"] == IMAGES
        assert enc["images_per_call_max"] == IMAGES
        assert enc["rank_grids"] == {"0": PROMPTS, "1": PROMPTS}, enc
    # The start-up-to-now counters hold at least every burst's images: one
    # series per scheduler, told apart by its tp_rank label.
    totals = {}
    for family in text_string_to_metric_families(shared_tp2_server["metrics"]):
        for sample in family.samples:
            if sample.name == "sglang:mm_encoder_tp_rank_share_total":
                assert sample.labels["tp_rank"] not in totals, sample.labels
                totals[sample.labels["tp_rank"]] = sample.value
    assert sorted(totals) == ["0", "1"]
    assert all(totals[k] >= BURSTS * PROMPTS for k in totals), totals


@pytest.mark.slow
def test_json_and_table_hold_the_run_numbers(shared_tp2_server):
    data = _data(shared_tp2_server)
    md = shared_tp2_server["md"].read_text()
    for i, burst in enumerate(data["bursts"], start=1):
        # Recompute from bench_serving's own file, written during the run.
        with open(shared_tp2_server["work"] / "bench" / f"burst{i}.jsonl") as f:
            raw = json.loads(f.readlines()[-1])
        expected = B.burst_stats(
            raw["ttfts"],
            [e or "" for e in raw["errors"]],
            raw["output_lens"],
            raw["duration"],
            num_prompts=PROMPTS,
        )
        s = burst["stats"]
        for key in ("completed", "failed", "output_tokens"):
            assert s[key] == expected[key]
        for key in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "output_tok_s"):
            assert s[key] == pytest.approx(expected[key])
        # bench_serving's own aggregate agrees with ours.
        assert s["mean_ttft_ms"] == pytest.approx(raw["mean_ttft_ms"], rel=1e-6)
        assert s["p99_ttft_ms"] == pytest.approx(raw["p99_ttft_ms"], rel=1e-6)
        # Images per rank come from /metrics: one image per rank per request.
        assert s["images_per_rank"] == [PROMPTS, PROMPTS]
        assert s["images_per_rank"] == B.images_per_rank(s["encoder"])
        row = (
            f"| {i} | {PROMPTS} | 0 | {s['mean_ttft_ms']:.1f} | {s['p50_ttft_ms']:.1f} | "
            f"{s['p99_ttft_ms']:.1f} | {s['output_tok_s']:.1f} | "
            f"{B.fmt_images(s['images_per_rank'])} | {' | '.join(B.fmt_encoder(s['encoder']))} | "
            f"{B.fmt_compiles(s['compiles_per_rank'])} |"
        )
        assert row in md
    w = data["warmup"]["stats"]
    assert f"| text warm-up | 1 | 0 | {w['mean_ttft_ms']:.1f} |" in md
    assert "sglang: 0.5.23" in md and "--mm-enable-dp-encoder" in md
    assert data["meta"]["series_hash"].split()[0] not in ("none", "unknown")


@pytest.mark.slow
@pytest.mark.control(
    reason="harness: the CPU server stops every process it started, whatever sglang it runs"
)
def test_server_stopped_by_pid_without_leftovers(shared_tp2_server):
    assert shared_tp2_server["leftovers"] == []
    assert len(shared_tp2_server["pids"]) >= 3  # launcher, schedulers, detokenizer...
    alive = [
        p
        for p in shared_tp2_server["pids"]
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
    # The SIGTERM took SGLang's exit path without its GPU crash diagnostics
    # (a 5 s sleep, then py-spy on the schedulers).
    assert "before crash diagnostics" not in shared_tp2_server["log"]
