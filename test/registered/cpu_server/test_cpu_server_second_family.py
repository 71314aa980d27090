"""A second model family on the CPU server: the tiny Qwen2.5-VL at TP2 with the DP encoder.

The shared TP2 server of ``conftest.py`` serves
``make_tiny_model(..., family="qwen2_5_vl")`` (a tiny
``Qwen2_5_VLForConditionalGeneration``: local tokenizer, Qwen2-VL image
processor, no weights) with SGLang's real ``models/qwen2_5_vl.py``, from the
series tree at ``--tp-size 2 --mm-enable-dp-encoder``. The gate, the
requests and the metrics are test_cpu_server_e2e.py's subject; here the
subject is the family: the warm-up plan for Qwen2.5-VL on both ranks before
``/health`` answers 200, and no torch compile event
(``TORCH_LOGS=recompiles,dynamo``, counted by the burst harness) after the
server reported ready, although every burst gives rank 1 (which the start-up
request never reaches) images, while the same counter does see the start-up
compiles on both ranks.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import json  # noqa: E402
import re  # noqa: E402

import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402

WARM_UP = re.compile(
    r"vision warm-up \(rank (\d+), (\w+)\): (\d+) tower calls in [\d.]+ s"
)


def _data(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(served["json"].read_text())


@pytest.mark.slow
def test_every_rank_ran_the_qwen2_5_vl_plan_before_ready(shared_tp2_server):
    srv = shared_tp2_server["srv"]
    with open(srv.model_path + "/config.json") as f:
        assert json.load(f)["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    # The scheduler loaded SGLang's own Qwen2.5-VL class for this directory.
    assert "Qwen2_5_VLForConditionalGeneration" in shared_tp2_server["log"]
    with open(srv.log_path, "rb") as f:
        before_ready = f.read(srv.log_bytes_at_ready).decode("utf-8", "replace")
    found = {
        int(m.group(1)): (m.group(2), int(m.group(3)))
        for m in WARM_UP.finditer(before_ready)
    }
    assert sorted(found) == [
        0,
        1,
    ], "vision warm-up lines missing before /health was ready"
    # Each rank ran the Qwen2.5-VL plan: its two calls ([[1,32,32]] and
    # [[1,48,64]], rotary-only compile; the line gives the count, the plan's
    # grids are test_vision_warmup_families.py's).
    assert all(
        plan == ("Qwen2_5_VLForConditionalGeneration", 2) for plan in found.values()
    ), found


@pytest.mark.slow
def test_no_dynamo_compile_after_ready(shared_tp2_server):
    data = _data(shared_tp2_server)
    # Every burst gave both ranks images (so rank 1 ran its tower after ready).
    for burst in data["bursts"]:
        enc = burst["stats"]["encoder"]
        assert enc is not None and sorted(enc["rank_grids"]) == ["0", "1"], enc
        assert all(v >= 1 for v in enc["rank_grids"].values()), enc
    counted = data["server_log"]
    assert counted["ready_marker_seen"]
    assert counted["compiles_after_ready_per_rank"] == {}, counted[
        "compile_events_after_ready"
    ]
    assert all(b["stats"]["compiles_per_rank"] == {} for b in data["bursts"])
    # The counter is alive: it sees the start-up compiles (the vision rotary
    # apply among them) on both ranks in the same log.
    lines = shared_tp2_server["log"].splitlines(keepends=True)
    ready = B.ready_line_index(lines)
    assert ready is not None
    before = B.parse_compile_events(lines[:ready])
    assert {"rank0", "rank1"} <= set(B.compiles_per_rank(before)), B.compiles_per_rank(
        before
    )
    for rank in ("rank0", "rank1"):
        assert any("rotary" in e.function for e in before if e.rank == rank), before
