"""End to end: a real ``sglang.launch_server`` on the CPU, driven by the burst harness.

The fork's tiny Qwen3-VL (scripts/cpu_support/make_tiny_model.py) is served by
SGLang's CPU engine at ``--tp-size 2 --mm-enable-dp-encoder`` from the series
tree (SGLang 0.5.23 + this repo's patches), with the demo-only hook making the
ViT gate see ROCm, so the series' per-rank vision warm-up runs. One short image
burst and one text request go through ``scripts/bench_image_burst.py`` (and
thus ``sglang.bench_serving``). Checked: every request completed with tokens;
the JSON and the table hold the numbers bench_serving produced; ``/health``
answered 200 only after every rank logged its vision warm-up; the server is
stopped by PID with no process left.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=420, suite="stage-a-test-cpu")

import json  # noqa: E402
import re  # noqa: E402
import urllib.request  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

import bench_image_burst as B  # noqa: E402
from cpu_support.make_tiny_model import make_tiny_model  # noqa: E402
from cpu_support.served_burst import serve_and_burst  # noqa: E402

WARM_UP = re.compile(r"vision warm-up \(rank (\d+)\)")


def _metrics(srv):
    with urllib.request.urlopen(f"{srv.base_url}/metrics", timeout=30) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("cpu-server")
    model = make_tiny_model(str(work / "model"))
    served = serve_and_burst(
        model, work,
        ["--bursts", "1", "--num-prompts", "3", "--max-concurrency", "3",
         "--image-resolution", "224x224", "--input-len", "32", "--output-len", "4",
         "--warmup-text-prompts", "1"],
        timeout=900, server_kwargs={"simulate_rocm_gate": True}, while_up=_metrics,
    )
    yield dict(served, metrics=served["while_up"])


@pytest.mark.slow
def test_every_request_completed_with_tokens(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(served["json"].read_text())
    text = data["warmup"]["bench_serving"]
    image = data["bursts"][0]["bench_serving"]
    for rec, n in ((text, 1), (image, 3)):
        assert rec["completed"] == n
        assert all(e in ("", None) for e in rec["errors"])
        assert all(n_out > 0 for n_out in rec["output_lens"])
        assert all(t for t in rec["generated_texts"])
    # The image requests really carried images: vision tokens were counted.
    assert image["total_input_vision_tokens"] > 0
    assert text["total_input_vision_tokens"] == 0


@pytest.mark.slow
def test_json_and_table_hold_the_run_numbers(served):
    data = json.loads(served["json"].read_text())
    burst = data["bursts"][0]
    # Recompute from bench_serving's own file, written during the run.
    with open(served["work"] / "bench" / "burst1.jsonl") as f:
        raw = json.loads(f.readlines()[-1])
    expected = B.burst_stats(raw["ttfts"], [e or "" for e in raw["errors"]],
                             raw["output_lens"], raw["duration"], num_prompts=3)
    s = burst["stats"]
    for key in ("completed", "failed", "output_tokens"):
        assert s[key] == expected[key]
    for key in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "output_tok_s"):
        assert s[key] == pytest.approx(expected[key])
    # bench_serving's own aggregate agrees with ours.
    assert s["mean_ttft_ms"] == pytest.approx(raw["mean_ttft_ms"], rel=1e-6)
    assert s["p99_ttft_ms"] == pytest.approx(raw["p99_ttft_ms"], rel=1e-6)
    # The DP encoder gave the images to ranks (read from /metrics); the counts
    # add up to the images sent.
    assert s["images_per_rank"] is not None and sum(s["images_per_rank"]) == 3
    assert s["images_per_rank"] == B.images_per_rank(s["encoder"])
    md = served["md"].read_text()
    row = (f"| 1 | 3 | 0 | {s['mean_ttft_ms']:.1f} | {s['p50_ttft_ms']:.1f} | "
           f"{s['p99_ttft_ms']:.1f} | {s['output_tok_s']:.1f} | "
           f"{B.fmt_images(s['images_per_rank'])} | {' | '.join(B.fmt_encoder(s['encoder']))} | "
           f"{B.fmt_compiles(s['compiles_per_rank'])} |")
    assert row in md
    w = data["warmup"]["stats"]
    assert f"| text warm-up | 1 | 0 | {w['mean_ttft_ms']:.1f} |" in md
    assert "sglang: 0.5.23" in md and "--mm-enable-dp-encoder" in md
    assert data["meta"]["series_hash"].split()[0] not in ("none", "unknown")


@pytest.mark.slow
def test_health_ready_only_after_every_rank_warmed_its_vision_tower(served):
    srv = served["srv"]
    with open(srv.log_path, "rb") as f:
        before_ready = f.read(srv.log_bytes_at_ready).decode("utf-8", "replace")
    ranks = sorted({int(m.group(1)) for m in WARM_UP.finditer(before_ready)})
    assert ranks == [0, 1], "vision warm-up lines missing before /health was ready"
    # ...and the series' gate said batching is on (ROCm simulated, DP encoder, TP2).
    assert "cross-request ViT batching: on (ROCm, DP encoder, attention-TP 2)" in open(
        srv.log_path, errors="replace").read()


@pytest.mark.slow
def test_server_stopped_by_pid_without_leftovers(served):
    assert served["leftovers"] == []
    assert len(served["pids"]) >= 3  # launcher, schedulers, detokenizer...
    alive = [p for p in served["pids"] if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@pytest.mark.slow
def test_encoder_call_metrics_moved_by_the_burst(served):
    """3 single-image requests (3 distinct images, all cache misses): the
    /metrics counters moved by exactly that, on the batched path."""
    from prometheus_client.parser import text_string_to_metric_families

    enc = json.loads(served["json"].read_text())["bursts"][0]["stats"]["encoder"]
    assert enc is not None, "the series build exports sglang:mm_encoder_* with --enable-metrics"
    assert enc["images"] == 3
    assert 1 <= enc["encoder_calls"] <= 3
    assert enc["calls_by_path"].get("batched", 0) == enc["encoder_calls"]
    assert enc["calls_by_path"].get("per_request", 0) == 0
    assert enc["images_per_call_mean"] == pytest.approx(3 / enc["encoder_calls"])
    assert 1 <= enc["images_per_call_max"] <= 3
    # Every image was encoded by exactly one of the two DP-encoder ranks, and
    # the burst's metrics agree with the start-up-to-now counters.
    assert sum(enc["rank_images"].values()) == 3
    if enc["encoder_calls"] == 1:  # one batched call: both ranks got images
        assert all(v >= 1 for v in enc["rank_images"].values()), enc
    totals = {}
    for family in text_string_to_metric_families(served["metrics"]):
        for sample in family.samples:
            if sample.name == "sglang:mm_encoder_rank_images_total":
                totals[sample.labels["rank"]] = sample.value
    assert sorted(totals) == ["0", "1"]
    assert all(totals[k] >= v for k, v in enc["rank_images"].items())
