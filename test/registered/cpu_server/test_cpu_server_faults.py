"""A failure of the series on one rank of a real server.

``faulty_tp2_server`` of ``conftest.py`` (tiny Qwen2.5-VL, series tree,
``--tp-size 2 --mm-enable-dp-encoder --enable-metrics``, the ROCm simulation)
starts with the test-only start-up hook
``cpu_support/server/startup_hooks/fault_injection``, which makes rank 1's
first vision warm-up call raise (the first call of
``mm_utils.call_tower_on_rank_share`` there). Checked: the fault was
injected on rank 1 only and rank 1 logged, before ``/health`` answered 200,
the warm-up's one WARNING; rank 0 warmed; after it the gate still batches
(its INFO line, logged after the fault's) and every request of the bursts
answers, each one call on the batched path (``/metrics``' ``path`` label)
that reaches both DP-encoder ranks; both scheduler processes that were up at
ready are still alive after them.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=59, suite="stage-a-test-cpu")

import json  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

# The faulty server's fault and workload (conftest.py).
FAULT_RANK, PROMPTS, IMAGES = 1, 2, 2

WARMED = re.compile(
    r"vision warm-up \(rank (\d+), Qwen2_5_VLForConditionalGeneration\): "
    r"\d+ tower calls in "
)
INJECTED = re.compile(
    r"\[fork fault injection\] pid \d+: rank (\d+) vision warm-up call raises"
)
FAILED = re.compile(
    r"vision warm-up failed on rank (\d+) \(Qwen2_5_VLForConditionalGeneration, "
    r"after 0 of \d+ tower calls\): RuntimeError: device fault in the warm-up "
    r"\(injected by the fork's fault test\); this rank compiles inside its "
    r"first image burst instead"
)


@pytest.fixture(scope="module", autouse=True)
def _same_server(faulty_tp2_server):
    assert faulty_tp2_server["workload"][1:3] == (PROMPTS, IMAGES)
    assert faulty_tp2_server["fault_rank"] == FAULT_RANK


def _before_ready(served):
    srv = served["srv"]
    with open(srv.log_path, "rb") as f:
        return f.read(srv.log_bytes_at_ready).decode("utf-8", "replace")


def _data(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(served["json"].read_text())


@pytest.mark.slow
def test_rank_1_warm_up_failed_before_ready_and_rank_0_warmed(faulty_tp2_server):
    before = _before_ready(faulty_tp2_server)
    assert [int(r) for r in INJECTED.findall(before)] == [FAULT_RANK], before[-3000:]
    assert [int(r) for r in FAILED.findall(before)] == [FAULT_RANK], before[-3000:]
    assert [int(r) for r in WARMED.findall(before)] == [0]
    assert faulty_tp2_server["srv"].ready_seconds is not None  # /health answered 200


GATE_ON = (
    "cross-request ViT batching on ROCm: on "
    "(Qwen2_5_VLForConditionalGeneration, attention-TP 2)"
)


@pytest.mark.slow
def test_after_the_fault_the_gate_batches_and_every_request_answers(faulty_tp2_server):
    # The per-request path would spread each two-image request over both
    # ranks too: the gate's line and the path label say which one ran. The
    # gate decides at the first image step (SGLang's own start-up request),
    # after rank 1's warm-up, and so its fault, is over.
    log = faulty_tp2_server["log"]
    fault = FAILED.search(log)
    assert fault is not None and log.count(GATE_ON) == 1, log[-3000:]
    assert log.index(GATE_ON) > fault.end()
    data = _data(faulty_tp2_server)
    assert data["bursts"]
    for burst in data["bursts"]:
        rec = burst["bench_serving"]
        assert rec["completed"] == PROMPTS and burst["stats"]["failed"] == 0
        assert all(e in ("", None) for e in rec["errors"])
        enc = burst["stats"]["encoder"]
        assert enc is not None, "no sglang:mm_encoder_* series in /metrics"
        assert {k: v for k, v in enc["calls_by_path"].items() if v} == {
            "batched": PROMPTS
        }, enc
        assert sum(enc["rank_grids"].values()) == PROMPTS * IMAGES
        assert sorted(enc["rank_grids"]) == ["0", "1"], enc
        assert all(v >= 1 for v in enc["rank_grids"].values()), enc


@pytest.mark.slow
def test_both_scheduler_processes_live_on(faulty_tp2_server):
    # Both scheduler processes (one per TP rank), alive after the bursts, are
    # the ones that were up when /health first answered, rank 1's fault
    # notwithstanding.
    assert [int(r) for r in INJECTED.findall(_before_ready(faulty_tp2_server))] == [
        FAULT_RANK
    ]
    after = faulty_tp2_server["schedulers"]
    assert len(after) == 2, after
    assert set(after) <= set(faulty_tp2_server["pids"])
    assert sorted("TP0" in t for t in after.values()) == [False, True], after
    assert faulty_tp2_server["leftovers"] == []
