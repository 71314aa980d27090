"""A second model family on the CPU server: the tiny Qwen2.5-VL at TP2 with the DP encoder.

``make_tiny_model(..., family="qwen2_5_vl")`` writes a tiny
``Qwen2_5_VLForConditionalGeneration`` checkpoint (local tokenizer, Qwen2-VL
image processor, no weights) that SGLang serves with its real
``models/qwen2_5_vl.py``. The server runs from the series tree at
``--tp-size 2 --mm-enable-dp-encoder``.

No ROCm simulation: the CPU platform batches image cache misses across
requests as CUDA does, which is all the series' warm-up condition asks of the
platform, so this is the plain (CUDA-like) path. The ROCm gate is the e2e
test's subject (test_cpu_server_e2e.py); here the subject is the family:
the warm-up plan for Qwen2.5-VL, its tower and its DP runner.

Two small image bursts (two requests of two images each; different images
in each burst, so both run the encoder) go through
``scripts/bench_image_burst.py``. Checked: every request completed with
tokens; both ranks logged their vision warm-up before ``/health`` answered
200; both DP-encoder ranks encoded images in each burst; no torch compile
event (``TORCH_LOGS=recompiles,dynamo``, counted by
the burst harness) falls after the server reported ready, while the same
counter does see the start-up compiles on both ranks.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=300, suite="stage-a-test-cpu")

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

import bench_image_burst as B  # noqa: E402
from cpu_support.make_tiny_model import make_tiny_model  # noqa: E402
from cpu_support.served_burst import serve_and_burst  # noqa: E402

WARM_UP = re.compile(r"vision warm-up \(rank (\d+)\): grids (.*) in [\d.]+ s")
# Two images a request: requests of a burst may reach the scheduler in
# different prefill steps (each its own encoder call), and a one-image call
# gives every image to one rank; two images a call give each rank one, so
# rank 1 runs its tower after ready in every burst.
BURSTS, PROMPTS, IMAGES = 2, 2, 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("cpu-server-qwen2-5-vl")
    model = make_tiny_model(str(work / "model"), family="qwen2_5_vl")
    with open(os.path.join(model, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    # --seed-step 1: the second burst's images differ from the first's, so
    # the embedding cache cannot serve it and the encoder runs again.
    served = serve_and_burst(
        model, work,
        ["--bursts", str(BURSTS), "--seed-step", "1",
         "--num-prompts", str(PROMPTS), "--max-concurrency", str(PROMPTS),
         "--image-count", str(IMAGES),
         "--image-resolution", "224x224", "--input-len", "16", "--output-len", "2"],
        timeout=1500,
    )
    with open(served["srv"].log_path, errors="replace") as f:
        log = f.read()
    yield dict(served, log=log)


def _data(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(served["json"].read_text())


@pytest.mark.slow
def test_served_by_sglangs_qwen2_5_vl(served):
    # The scheduler loaded SGLang's own Qwen2.5-VL class for this directory.
    assert "Qwen2_5_VLForConditionalGeneration" in served["log"]


@pytest.mark.slow
def test_every_request_of_both_bursts_completed_with_tokens(served):
    data = _data(served)
    assert data["warmup"] is None
    assert len(data["bursts"]) == BURSTS
    for burst in data["bursts"]:
        rec = burst["bench_serving"]
        assert rec["completed"] == PROMPTS and burst["stats"]["failed"] == 0
        assert all(e in ("", None) for e in rec["errors"])
        assert all(n > 0 for n in rec["output_lens"])
        assert all(t for t in rec["generated_texts"])
        # The requests carried their images: 224x224, patch 14, merge 2 -> 64
        # image tokens, which bench_serving counts with vision start and end.
        assert rec["total_input_vision_tokens"] == PROMPTS * IMAGES * (64 + 2)


@pytest.mark.slow
def test_health_ready_only_after_every_rank_warmed_its_vision_tower(served):
    srv = served["srv"]
    with open(srv.log_path, "rb") as f:
        before_ready = f.read(srv.log_bytes_at_ready).decode("utf-8", "replace")
    found = {int(m.group(1)): m.group(2) for m in WARM_UP.finditer(before_ready)}
    assert sorted(found) == [0, 1], "vision warm-up lines missing before /health was ready"
    # Each rank ran the Qwen2.5-VL plan (two grids, rotary-only compile).
    assert all(g.split() == ["[[1,32,32]]", "[[1,48,64]]"] for g in found.values()), found
    # Nothing was simulated: the CPU platform batches as CUDA does.
    assert "cross-request ViT batching: on (batching platform)" in served["log"]
    assert "FORK_DEMO_SIMULATE_ROCM_GATE" not in served["srv"].env


@pytest.mark.slow
def test_both_bursts_ran_the_encoder_on_the_dp_ranks(served):
    data = _data(served)
    for burst in data["bursts"]:
        enc = burst["stats"]["encoder"]
        assert enc is not None, "the series build exports sglang:mm_encoder_* with --enable-metrics"
        assert enc["images"] == PROMPTS * IMAGES
        assert enc["calls_by_path"].get("batched", 0) == enc["encoder_calls"] >= 1
        assert enc["calls_by_path"].get("per_request", 0) == 0
        assert sum(enc["rank_images"].values()) == PROMPTS * IMAGES
        # Both ranks encoded images in this burst (each call has >= 2 images,
        # equal in size, and the DP runner puts one on each rank first), so the
        # compile check below covers the rank the start-up request never reaches.
        assert sorted(enc["rank_images"]) == ["0", "1"], enc
        assert all(v >= 1 for v in enc["rank_images"].values()), enc


@pytest.mark.slow
def test_no_dynamo_compile_after_ready(served):
    data = _data(served)
    counted = data["server_log"]
    assert counted["ready_marker_seen"]
    assert counted["compiles_after_ready_per_rank"] == {}, counted["compile_events_after_ready"]
    assert all(b["stats"]["compiles_per_rank"] == {} for b in data["bursts"])
    # The counter is alive: it sees the start-up compiles (the vision rotary
    # apply among them) on both ranks in the same log.
    lines = served["log"].splitlines(keepends=True)
    ready = B.ready_line_index(lines)
    assert ready is not None
    before = B.parse_compile_events(lines[:ready])
    assert {"rank0", "rank1"} <= set(B.compiles_per_rank(before)), B.compiles_per_rank(before)
    for rank in ("rank0", "rank1"):
        assert any("rotary" in e.function for e in before if e.rank == rank), before


@pytest.mark.slow
def test_server_stopped_by_pid_without_leftovers(served):
    assert served["leftovers"] == []
    assert len(served["pids"]) >= 3
    alive = [p for p in served["pids"] if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
