"""The one TP2 CPU server the server tests share (session-scoped).

A real ``sglang.launch_server`` from the series tree serves the tiny
Qwen2.5-VL (``make_tiny_model(..., family="qwen2_5_vl")``, SGLang's own
``models/qwen2_5_vl.py``) at ``--tp-size 2 --mm-enable-dp-encoder
--enable-metrics``, with the demo-only ROCm simulation
(``cpu_support/rocm_gate_sim``: the ViT batching gate and the warm-up
decision decide as on ROCm). ``scripts/bench_image_burst.py`` then sends one
text request and BURSTS bursts of PROMPTS requests of IMAGES 224x224 images
each, one request at a time (``--max-concurrency 1``: each request is one
prefill step, so one encoder call, whose two equal images the DP encoder
gives one to each rank), each burst with new images (``--seed-step 1``).
test_cpu_server_e2e.py checks the gate, the warm-up, the metrics and the
harness on it; test_cpu_server_second_family.py the family's warm-up plan and
the compiles after ready.
"""

import urllib.request

import pytest

BURSTS, PROMPTS, IMAGES = 2, 2, 2
# 224x224, patch 14, merge 2: a 16x16 patch grid, 64 image tokens.
IMAGE_TOKENS = 64


def _metrics(srv):
    with urllib.request.urlopen(f"{srv.base_url}/metrics", timeout=30) as r:
        return r.read().decode()


@pytest.fixture(scope="session")
def shared_tp2_server(tmp_path_factory):
    from cpu_support.make_tiny_model import make_tiny_model
    from cpu_support.served_burst import serve_and_burst

    work = tmp_path_factory.mktemp("cpu-server-tp2")
    model = make_tiny_model(str(work / "model"), family="qwen2_5_vl")
    served = serve_and_burst(
        model, work,
        ["--bursts", str(BURSTS), "--seed-step", "1",
         "--num-prompts", str(PROMPTS), "--max-concurrency", "1",
         "--image-count", str(IMAGES), "--image-resolution", "224x224",
         "--input-len", "16", "--output-len", "2", "--warmup-text-prompts", "1"],
        timeout=1500, server_kwargs={"simulate_rocm_gate": True}, while_up=_metrics,
    )
    with open(served["srv"].log_path, errors="replace") as f:
        log = f.read()
    yield dict(served, log=log, metrics=served["while_up"],
               workload=(BURSTS, PROMPTS, IMAGES, IMAGE_TOKENS))
