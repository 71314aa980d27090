"""The TP2 CPU servers the server tests share (session-scoped).

A real ``sglang.launch_server`` from the series tree serves the tiny Qwen2.5-VL
(``make_tiny_model(..., family="qwen2_5_vl")``, SGLang's own
``models/qwen2_5_vl.py``) at ``--tp-size 2 --mm-enable-dp-encoder
--enable-metrics``, with the demo-only ROCm simulation
(``cpu_support/server/startup_hooks/rocm_gate_sim``: the ViT batching gate and
the warm-up decision decide as on ROCm).
``benchmark/image_burst/bench_image_burst.py`` then sends one text request and
BURSTS bursts of PROMPTS requests of IMAGES 224x224 images each, one request at
a time (``--max-concurrency 1``: each request is one prefill step, so one
encoder call, whose two equal images the DP encoder gives one to each rank),
each burst with new images (``--seed-step 1``). test_cpu_server_e2e.py checks
the gate, the warm-up, the metrics and the harness on it;
test_cpu_server_second_family.py the family's warm-up plan and the compiles
after ready. ``faulty_tp2_server`` is the same server with rank 1's first
vision warm-up call made to raise
(``cpu_support/server/startup_hooks/fault_injection``), and one burst with no
text request: it has to get ready and serve with one rank's failure;
test_cpu_server_faults.py checks it.
"""

import os
import urllib.request

import pytest
from cpu_support.server.cpu_server import scheduler_titles

BURSTS, PROMPTS, IMAGES = 2, 2, 2
# 224x224, patch 14, merge 2: a 16x16 patch grid, 64 image tokens.
IMAGE_TOKENS = 64
ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
FAULT_DIR = os.path.join(
    ROOT, "cpu_support", "server", "startup_hooks", "fault_injection"
)
FAULT_ENV = "FORK_FAULT_WARM_UP_RANK"
FAULT_RANK = 1


def _while_up(srv):
    with urllib.request.urlopen(f"{srv.base_url}/metrics", timeout=30) as r:
        metrics = r.read().decode()
    return {"metrics": metrics, "schedulers": scheduler_titles(srv.pids())}


def _serve_tp2(work, fault_rank=None, bursts=BURSTS, text_prompts=1):
    from cpu_support.server.served_burst import serve_and_burst
    from cpu_support.tiny_models.make_tiny_model import make_tiny_model

    model = make_tiny_model(str(work / "model"), family="qwen2_5_vl")
    with pytest.MonkeyPatch.context() as mp:
        if fault_rank is not None:
            mp.setenv(FAULT_ENV, str(fault_rank))
            old = os.environ.get("PYTHONPATH")
            mp.setenv(
                "PYTHONPATH", os.pathsep.join([FAULT_DIR] + ([old] if old else []))
            )
        served = serve_and_burst(
            model,
            work,
            [
                "--bursts",
                str(bursts),
                "--seed-step",
                "1",
                "--num-prompts",
                str(PROMPTS),
                "--max-concurrency",
                "1",
                "--image-count",
                str(IMAGES),
                "--image-resolution",
                "224x224",
                "--input-len",
                "16",
                "--output-len",
                "2",
                "--warmup-text-prompts",
                str(text_prompts),
            ],
            timeout=1500,
            server_kwargs={"simulate_rocm_gate": True},
            while_up=_while_up,
        )
    with open(served["srv"].log_path, errors="replace") as f:
        log = f.read()
    up = served["while_up"]
    yield dict(
        served,
        log=log,
        metrics=up["metrics"],
        schedulers=up["schedulers"],
        fault_rank=fault_rank,
        workload=(bursts, PROMPTS, IMAGES, IMAGE_TOKENS),
    )


@pytest.fixture(scope="session")
def shared_tp2_server(tmp_path_factory):
    yield from _serve_tp2(tmp_path_factory.mktemp("cpu-server-tp2"))


@pytest.fixture(scope="session")
def faulty_tp2_server(tmp_path_factory):
    # One image burst, no text request: what the fault tests read (each run
    # of bench_serving costs seconds of imports).
    yield from _serve_tp2(
        tmp_path_factory.mktemp("cpu-server-tp2-fault"),
        FAULT_RANK,
        bursts=1,
        text_prompts=0,
    )
