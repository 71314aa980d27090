"""Deterministic inference on the batched ViT paths other than Qwen3-VL's.

Under ``--enable-deterministic-inference`` an image's embedding must be
bitwise what it is when the image is encoded alone, on every path the series
batches across requests, or that path must not batch. Two paths beyond the
mrope DP runner (covered by the deterministic patch's own test_vit_deterministic_encoding.py):

(a) a non-mrope DP runner: SGLang's real ``InternVLChatModel``
    (models/internvl.py) built with ``--mm-enable-dp-encoder`` at
    attention-TP 2 on two gloo ranks, whose tower goes through
    ``run_dp_sharded_vision_model`` (tiles, not images, split over ranks);
(b) a model that ignores the DP flag: SGLang's real
    ``Gemma3ForConditionalGeneration`` on (simulated) CUDA, where the
    scheduler batches its requests' images into one call.

Both are driven through the real ``mm_schedule._get_chunked_prefill_embedding``
with real ``MultimodalDataItem`` / ``MultimodalInputs`` objects, tiny sizes,
random weights, fp32 and bf16. Encoder calls are counted by a pass-through spy
bound to the model (the real ``get_image_feature`` runs), tower calls with
forward pre-hooks, and each step's gate decision read from its INFO line.

The contrast, InternVL's step without deterministic inference, is one
cross-request call: on CUDA upstream's (a control), on ROCm the series' gate
batching it because the DP encoder spreads its tiles. (Gemma3's CUDA step
without deterministic inference is test_gate_real_non_dp_vlm.py's.)
"""

import contextlib
import importlib.util
import logging

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.tiny_models.tiny_gemma3_internvl import (  # noqa: E402
    GEMMA3_TOKENS_PER_IMAGE,
    HIDDEN,
)
from cpu_support.tiny_models.tiny_gemma3_internvl import (  # noqa: E402
    INTERNVL_TOKENS_PER_TILE as TOKENS_PER_TILE,
)

DTYPES = ["float32", "bfloat16"]

# InternVL requests, as tiles per image: one request with two images.
INTERNVL_TILES = [[3], [1, 2], [1]]
GEMMA3_IMAGES = [1, 2, 1]  # images per request
VIT_BATCHING = "sglang.srt.multimodal.vit_batching"


@contextlib.contextmanager
def deterministic(on):
    from sglang.srt.runtime_context import get_exec

    with get_exec().deterministic.override(enable_deterministic_inference=on):
        yield


def record_first_dims(calls):
    """An ``H.encoder_spy`` recorder: each call's items, as their first dimension."""
    return lambda items: calls.append([int(it.feature.shape[0]) for it in items])


def _fresh_server():
    """An empty embedding cache and, with the series, its gate's once-per-server
    log memory emptied (pristine has no gate and logs no decision)."""
    H.fresh_embedding_cache()
    if importlib.util.find_spec(VIT_BATCHING) is not None:
        H.fresh_gate_log()


def _steps(model, requests, platforms, tower, modes=(True, False)):
    """Each (platform, deterministic) step as on a fresh server: its encoder
    and tower calls, rows and the gate's INFO lines."""
    from sglang.srt.runtime_context import override_platform

    calls, towers, out = [], [], {}
    gate_log = H.capture_gate_log()
    model.get_image_feature = H.encoder_spy(model, record_first_dims(calls))
    handle = H.first_dims(tower, towers)
    try:
        for platform in platforms:
            for on in modes:
                calls.clear()
                towers.clear()
                _fresh_server()
                first = len(gate_log.lines)
                with torch.no_grad(), override_platform(
                    **H.PLATFORMS[platform]
                ), deterministic(on):
                    emb = H.run_prefill_embedding(model, requests)
                out[(platform, on)] = {
                    "calls": list(calls),
                    "towers": list(towers),
                    "out": emb,
                    "gate": gate_log.lines[first:],
                }
        with torch.no_grad(), deterministic(True):
            reference = H.reference_rows(model, requests)
    finally:
        handle.remove()
    return out, reference


def _worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    result = {}
    # (a) InternVL with the DP encoder at attention-TP 2.
    G.publish_dp_encoder_server(G.tiny_internvl_config(), rank, world_size)
    T.init_gloo(rank, world_size, init_method)
    requests = G.pixel_requests(
        INTERNVL_TILES, TOKENS_PER_TILE, seed=7, key="det-other-paths"
    )
    for dtype in DTYPES:
        model = G.build_tiny_internvl(seed=4, dtype=getattr(torch, dtype))
        result[("internvl", dtype, "dp")] = model.use_data_parallel
        # Tiles per rank of each DP-runner call: the encoder inside the tile runner.
        result[("internvl", dtype)] = _steps(
            model, requests, ("CUDA", "ROCm"), model.vision_model.encoder
        )

    # (b) Gemma3 (ignores the flag; TP-sharded tower) on CUDA, flag on.
    G.publish_dp_encoder_server(G.tiny_gemma3_config(), rank, world_size)
    requests = G.pixel_requests(
        [[1] * n for n in GEMMA3_IMAGES],
        GEMMA3_TOKENS_PER_IMAGE,
        seed=9,
        key="det-other-paths",
    )
    for dtype in DTYPES:
        model = G.build_tiny_gemma3(seed=6, dtype=getattr(torch, dtype))
        result[("gemma3", dtype, "dp")] = hasattr(model, "use_data_parallel")
        result[("gemma3", dtype)] = _steps(
            model, requests, ("CUDA",), model.vision_tower, modes=(True,)
        )
    return result


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_worker, 2, timeout=500)


# ---------------------------------------------------------------------------
# (a) InternVL: run_dp_sharded_vision_model
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["CUDA", "ROCm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_internvl_dp_tile_runner_each_image_alone_and_bitwise(ranks, dtype, platform):
    for r in ranks:
        assert r[("internvl", dtype, "dp")] is True  # really the DP tile runner
        steps, reference = r[("internvl", dtype)]
        step = steps[(platform, True)]
        # One image per encoder call, in request order (tiles 3 | 1, 2 | 1).
        assert step["calls"] == [[3], [1], [2], [1]]
        # Each call's tiles split over the two ranks, padded: ceil(tiles / 2).
        assert step["towers"] == [2, 1, 1, 1]
        assert step["out"].shape == (7 * TOKENS_PER_TILE, HIDDEN)
        assert torch.equal(step["out"], reference)
    assert torch.equal(
        ranks[0][("internvl", dtype)][0][(platform, True)]["out"],
        ranks[1][("internvl", dtype)][0][(platform, True)]["out"],
    )


def _one_cross_request_call(step):
    """The step without deterministic inference: one call of all 7 tiles, 4 a rank."""
    assert step["calls"] == [[3, 1, 2, 1]]
    assert step["towers"] == [4]


@pytest.mark.control(
    reason="upstream behaviour the series keeps: on CUDA, without deterministic "
    "inference, InternVL's step is one cross-request call"
)
def test_internvl_on_cuda_without_deterministic_inference_batches(ranks):
    for r in ranks:
        _one_cross_request_call(r[("internvl", "float32")][0][("CUDA", False)])


def test_internvl_on_rocm_without_deterministic_inference_batches_under_the_gate(ranks):
    """On ROCm it is the series' gate that batches the step: the DP encoder
    spreads InternVL's tiles at attention-TP 2 (its INFO line, on TP rank 0)."""
    for rank, r in enumerate(ranks):
        step = r[("internvl", "float32")][0][("ROCm", False)]
        assert (
            step["gate"]
            == [
                (
                    logging.INFO,
                    "cross-request ViT batching: on (ROCm, DP encoder, attention-TP 2)",
                )
            ][: 1 - rank]
        )
        _one_cross_request_call(step)


# ---------------------------------------------------------------------------
# (b) Gemma3, which ignores the DP flag, on CUDA
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma3_on_cuda_each_image_alone_and_bitwise(ranks, dtype):
    for r in ranks:
        assert r[("gemma3", dtype, "dp")] is False  # ignores the flag
        steps, reference = r[("gemma3", dtype)]
        step = steps[("CUDA", True)]
        assert step["calls"] == [[1], [1], [1], [1]]
        assert step["towers"] == [1, 1, 1, 1]
        assert step["out"].shape == (4 * GEMMA3_TOKENS_PER_IMAGE, HIDDEN)
        assert torch.equal(step["out"], reference)
