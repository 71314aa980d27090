"""A warm-up that fails on one rank of a real server (issue 17).

A real ``sglang.launch_server`` from the series tree serves the tiny Qwen3-VL
at ``--tp-size 2 --mm-enable-dp-encoder --enable-metrics``. The test-only
start-up hook ``cpu_support/fault_injection`` makes rank 1's vision tower
raise ``torch.OutOfMemoryError`` on its first call, which is the vision
warm-up's. Checked: ``/health`` answers; rank 0 warmed and rank 1 logged,
before ready, that its warm-up failed; two bursts of one two-image request each reach
both DP-encoder ranks and all answer; both scheduler processes that were up at
ready are still alive after them.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="stage-a-test-cpu")

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

from cpu_support.make_tiny_model import make_tiny_model  # noqa: E402
from cpu_support.served_burst import serve_and_burst  # noqa: E402

FAULT_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))),
    "scripts", "cpu_support", "fault_injection",
)
FAULT_ENV = "FORK_FAULT_VISION_OOM_RANK"
BURSTS, PROMPTS, IMAGES = 2, 1, 2
WARMED = re.compile(r"vision warm-up \(rank (\d+)\): grids ")
FAILED = re.compile(
    r"vision warm-up failed on rank (\d+) \(Qwen3VLForConditionalGeneration, "
    r"call \[\[1,32,32\]\]\): OutOfMemoryError: CUDA out of memory\. "
)


def _schedulers(pids):
    """PID -> title of each live scheduler process (SGLang titles them
    ``sglang::scheduler...``)."""
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            title = " ".join(proc.cmdline()) or proc.name()
            if proc.status() != psutil.STATUS_ZOMBIE and "sglang::scheduler" in title:
                found[pid] = title
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("cpu-server-fault")
    model = make_tiny_model(str(work / "model"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULT_ENV, "1")
        old = os.environ.get("PYTHONPATH")
        mp.setenv("PYTHONPATH", os.pathsep.join([FAULT_DIR] + ([old] if old else [])))
        served = serve_and_burst(
            model, work,
            ["--bursts", str(BURSTS), "--seed-step", "1",
             "--num-prompts", str(PROMPTS), "--max-concurrency", "1",
             "--image-count", str(IMAGES), "--image-resolution", "256x256",
             "--input-len", "16", "--output-len", "2"],
            timeout=1200, while_up=lambda srv: _schedulers(srv.pids()),
        )
    srv = served["srv"]
    with open(srv.log_path, "rb") as f:
        raw = f.read()
    served["before_ready"] = raw[: srv.log_bytes_at_ready].decode("utf-8", "replace")
    served["log"] = raw.decode("utf-8", "replace")
    yield served


def _data(served):
    run = served["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(served["json"].read_text())


@pytest.mark.slow
def test_rank_1_warm_up_failed_before_ready_and_rank_0_warmed(served):
    before = served["before_ready"]
    assert "[fork fault injection]" in before  # the fault was really injected
    assert [int(r) for r in FAILED.findall(before)] == [1], before[-3000:]
    assert [int(r) for r in WARMED.findall(before)] == [0]
    assert served["srv"].ready_seconds is not None  # /health answered 200


@pytest.mark.slow
def test_bursts_reach_both_ranks_and_every_request_answers(served):
    data = _data(served)
    assert len(data["bursts"]) == BURSTS
    for burst in data["bursts"]:
        rec = burst["bench_serving"]
        assert rec["completed"] == PROMPTS and burst["stats"]["failed"] == 0
        assert all(e in ("", None) for e in rec["errors"])
        enc = burst["stats"]["encoder"]
        assert sum(enc["rank_images"].values()) == PROMPTS * IMAGES
        assert sorted(enc["rank_images"]) == ["0", "1"], enc
        assert all(v >= 1 for v in enc["rank_images"].values()), enc


@pytest.mark.slow
def test_both_scheduler_processes_live_on(served):
    # Both scheduler processes (one per TP rank), alive after the bursts, are
    # the ones that were up when /health first answered.
    after = served["while_up"]
    assert len(after) == 2, after
    assert set(after) <= set(served["pids"])
    assert sorted("TP0" in t for t in after.values()) == [False, True], after
    assert served["leftovers"] == []
