"""Deterministic inference under cross-request ViT batching.

With ``--enable-deterministic-inference`` an image's embedding must be bitwise
identical whether it is encoded alone or with other requests' images, in fp32
and bf16. The mechanism (encode each image on its own; with the DP encoder
keep spreading images over the ranks) is checked through the real scheduler
path, the real tiny Qwen3-VL tower, and two real gloo ranks.
"""

import contextlib

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

from cpu_support import mm_harness as H  # noqa: E402
from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.ranks import free_port, run_on_ranks  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
GRIDS = [[(1, 8, 8)], [(1, 8, 12), (1, 12, 8)], [(1, 16, 8)], [(1, 8, 8)]]


@contextlib.contextmanager
def deterministic(on: bool):
    from sglang.srt.runtime_context import get_exec

    with get_exec().deterministic.override(enable_deterministic_inference=on):
        yield


@pytest.fixture(scope="module")
def models():
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    return {dt: T.build_tiny_qwen3_vl(seed=5, dtype=dt) for dt in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_one_process_each_image_alone_and_bitwise(models, dtype):
    model = models[dtype]
    requests = [H.make_request(g, seed=80 + i) for i, g in enumerate(GRIDS)]
    with torch.no_grad():
        alone = H.reference_rows(model, requests)
        H.fresh_embedding_cache()
        with deterministic(True), H.TowerCalls().attach(model.visual) as calls:
            out = H.run_prefill_embedding(model, requests)
    assert [len(c) for c in calls.calls] == [1] * 5  # one image per call
    assert torch.equal(out, alone)


@pytest.mark.control(
    reason="upstream behaviour the series keeps: without deterministic inference the step's images go in one call"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_one_process_without_deterministic_inference_batches(models, dtype):
    model = models[dtype]
    requests = [H.make_request(g, seed=80 + i) for i, g in enumerate(GRIDS)]
    with torch.no_grad():
        H.fresh_embedding_cache()
        with deterministic(False), H.TowerCalls().attach(model.visual) as calls:
            H.run_prefill_embedding(model, requests)
    assert [len(c) for c in calls.calls] == [5]


def _dp_worker(rank, world_size, init_method):
    from cpu_support import mm_harness as H
    from cpu_support import tiny_qwen3_vl as T

    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    out = {}
    for dtype in DTYPES:
        model = T.build_tiny_qwen3_vl(seed=5, dtype=dtype)
        requests = [H.make_request(g, seed=80 + i) for i, g in enumerate(GRIDS)]
        with torch.no_grad(), deterministic(True):
            H.fresh_embedding_cache()
            with H.TowerCalls().attach(model.visual) as calls:
                emb = H.run_prefill_embedding(model, requests)
            alone = H.reference_rows(model, requests)
        out[str(dtype)] = {"calls": calls.calls, "out": emb, "alone": alone}
    return out


@pytest.fixture(scope="module")
def dp_ranks():
    return run_on_ranks(_dp_worker, 2, timeout=400)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_dp_encoder_still_spreads_images_and_is_bitwise(dp_ranks, dtype):
    results = [r[str(dtype)] for r in dp_ranks]
    per_rank_images = [sum(len(c) for c in r["calls"]) for r in results]
    assert sum(per_rank_images) == 5 and min(per_rank_images) >= 1, per_rank_images
    for r in results:
        assert all(len(c) == 1 for c in r["calls"])  # each image on its own
        assert torch.equal(r["out"], r["alone"])
    assert torch.equal(results[0]["out"], results[1]["out"])
