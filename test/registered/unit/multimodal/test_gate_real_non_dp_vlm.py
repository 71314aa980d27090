"""The ROCm ViT batching gate with a REAL model that is not data-parallel.

``--mm-enable-dp-encoder`` on, attention-TP 2 (two gloo ranks), ROCm simulated
with ``mm_harness.on_platform``. SGLang's real ``Gemma3ForConditionalGeneration``
(models/gemma3_mm.py, tiny sizes, random weights) never reads the flag: its
SigLIP tower is TP-sharded, so every rank runs every encoder call and nothing
is spread, and it does not answer ``dp_encoder_spreads_images``. The gate
must keep it per request on ROCm (two single-image requests, two encoder
calls) and say so; on CUDA the same Gemma3 batches. (A
data-parallel family on the same setting, one call spread over both ranks, is
test_gate_prefill_paths.py's two-rank test.)

SGLang's real post-load hook is checked on the same ranks for Gemma3 (the
flag distributes nothing) and a tiny real GLM-Image (spread, deliberately not
warmed): neither has a vision warm-up in its ``precompile_kernels_after_loading``
(the warm-up lives on the families that have one), so the hook calls no tower
and logs nothing on any rank.

Everything goes through the real ``mm_schedule._get_chunked_prefill_embedding``
with real ``MultimodalDataItem`` / ``MultimodalInputs`` objects, the arguments
laid out as ``mm_utils.embed_mm_inputs`` lays them out. Encoder calls are
counted by a pass-through spy bound to the model (the real
``get_image_feature`` runs; the gate still sees the model behind it), and
tower calls with forward pre-hooks.
"""

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
    gemma3_request,
)


def tiny_glm_image_config():
    """SGLang's GLM-Image (models/glm_image_vl.py) at tiny sizes."""
    from transformers.models.glm_image.configuration_glm_image import GlmImageConfig

    return GlmImageConfig(
        text_config=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vision_vocab_size=256,
            pad_token_id=0,
            eos_token_id=1,
            max_position_embeddings=512,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "partial_rotary_factor": 0.5,
            },
        ),
        vision_config=dict(
            depth=1,
            hidden_size=64,
            num_heads=4,
            intermediate_size=128,
            image_size=64,
            patch_size=16,
        ),
        vq_config=dict(embed_dim=16, num_embeddings=32, latent_channels=16),
        image_token_id=300,
        image_start_token_id=301,
        image_end_token_id=302,
        architectures=["GlmImageForConditionalGeneration"],
    )


def _hook_warnings(model, warm_log, tower):
    """The post-load hook under ROCm (the gate's case at attention-TP 2):
    its log lines and the tower calls it made."""
    seen = []
    handle = H.first_dims(tower, seen)
    first = len(warm_log.lines)
    try:
        with H.on_platform("ROCm"):
            H.post_load_hook(model)
    finally:
        handle.remove()
    return {
        "lines": warm_log.lines[first:],
        "tower_calls": seen,
        "dp": getattr(model, "use_data_parallel", None),
        "answers": hasattr(model, "dp_encoder_spreads_images"),
    }


def count_items(calls):
    """An ``H.encoder_spy`` recorder: the item count of each call."""
    return lambda items: calls.append(len(items))


def _rank_worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    gate_log = H.capture_gate_log()
    warm_log = H.capture_log(H.WARM_UP_LOGGER)
    result = {}

    # --- Gemma3: served with --mm-enable-dp-encoder at TP 2; ignores the flag.
    G.publish_dp_encoder_server(G.tiny_gemma3_config(), rank, world_size)
    T.init_gloo(rank, world_size, init_method)
    gemma = G.build_tiny_gemma3(seed=3)
    result["gemma_has_dp_attr"] = hasattr(gemma, "use_data_parallel")
    result["gemma_answers"] = hasattr(gemma, "dp_encoder_spreads_images")
    with H.on_platform("ROCm"):
        # What SGLang runs on every rank after the weights load.
        first = len(warm_log.lines)
        H.post_load_hook(gemma)
        result["hook_lines"] = warm_log.lines[first:]

    requests = [gemma3_request(seed=201), gemma3_request(seed=202)]
    calls, towers = [], []
    gemma.get_image_feature = H.encoder_spy(gemma, count_items(calls))
    handle = H.first_dims(gemma.vision_tower, towers)
    for name, platform in (("rocm", "ROCm"), ("cuda", "CUDA")):
        H.fresh_gate_log()  # a fresh server per platform
        H.fresh_embedding_cache()
        calls.clear()
        towers.clear()
        first = len(gate_log.lines)
        with torch.no_grad(), H.on_platform(platform):
            out = H.run_prefill_embedding(gemma, requests)
        result[f"gemma_{name}"] = {
            "calls": list(calls),
            "towers": list(towers),
            "gate": gate_log.lines[first:],
            "out": out,
        }
    handle.remove()
    with torch.no_grad():
        result["gemma_alone"] = H.reference_rows(gemma, requests)

    # --- A model the DP encoder spreads but the warm-up leaves out on
    # purpose, under the gate: GLM-Image (serving it with the DP encoder is
    # broken upstream).
    from cpu_support.tiny_models.tiny_vl_family import build_tiny_family_model

    from sglang.srt.models.glm_image_vl import GlmImageForConditionalGeneration

    config = tiny_glm_image_config()
    G.publish_dp_encoder_server(config, rank, world_size)
    glm_image = build_tiny_family_model(config, GlmImageForConditionalGeneration)
    result["glm_image_hook"] = _hook_warnings(glm_image, warm_log, glm_image.visual)
    return result


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=500)


def _gate_lines(lines):
    return [line for line in lines if "cross-request ViT batching" in line[1]]


@pytest.mark.control(
    reason="upstream behaviour the series keeps: ROCm encodes Gemma3 per request"
)
def test_rocm_gemma3_two_requests_take_two_encoder_calls(ranks):
    for r in ranks:
        assert r["gemma_rocm"]["calls"] == [1, 1]
        # The TP-sharded tower runs once per image on every rank.
        assert r["gemma_rocm"]["towers"] == [1, 1]
        assert r["gemma_rocm"]["out"].shape == (2 * GEMMA3_TOKENS_PER_IMAGE, HIDDEN)
        torch.testing.assert_close(
            r["gemma_rocm"]["out"], r["gemma_alone"], rtol=1e-5, atol=1e-6
        )


def test_rocm_gemma3_is_not_data_parallel_and_the_gate_logs_why_at_info(ranks):
    """Gemma3 ignores the flag (its real class sets no ``use_data_parallel``
    and does not answer ``dp_encoder_spreads_images``), and the series' gate
    reads it so: off, naming the model and the attention-TP width. Once per
    server: TP rank 0 logs the decision, rank 1 stays quiet."""
    assert [r["gemma_has_dp_attr"] for r in ranks] == [False, False]
    assert [r["gemma_answers"] for r in ranks] == [False, False]
    for rank, r in enumerate(ranks):
        assert (
            _gate_lines(r["gemma_rocm"]["gate"])
            == [
                (
                    logging.INFO,
                    "cross-request ViT batching on ROCm: off "
                    "(Gemma3ForConditionalGeneration, attention-TP 2)",
                )
            ][: 1 - rank]
        )


@pytest.mark.control(
    reason="Gemma3 has no warm-up: the series adds nothing to its hook"
)
def test_post_load_hook_is_silent_for_a_model_the_flag_does_not_spread(ranks):
    """Gemma3 has no warm-up hook: nothing is warmed and nothing is logged;
    the gate's INFO line (above) is where ROCm says why it stays per request."""
    assert [r["hook_lines"] for r in ranks] == [[], []]


@pytest.mark.control(reason="upstream behaviour the series keeps: CUDA batches Gemma3")
def test_cuda_gemma3_batches_the_two_requests(ranks):
    for r in ranks:
        assert r["gemma_cuda"]["calls"] == [2]
        assert r["gemma_cuda"]["towers"] == [1, 1]  # Gemma3 loops per image inside
        # CUDA batches every model and logs no decision.
        assert _gate_lines(r["gemma_cuda"]["gate"]) == []
        torch.testing.assert_close(
            r["gemma_cuda"]["out"], r["gemma_alone"], rtol=1e-5, atol=1e-6
        )


@pytest.mark.control(reason="GLM-Image is left unwarmed on purpose, as upstream")
def test_post_load_hook_warms_nothing_for_glm_image(ranks):
    """GLM-Image reads the flag but its vision MLP stays tensor-parallel
    (it does not answer ``dp_encoder_spreads_images``, so ROCm keeps it per
    request): built with use_data_parallel, it defines no vision warm-up, so
    no tower call and no line on any rank."""
    for r in ranks:
        hook = r["glm_image_hook"]
        assert hook["dp"] is True
        assert hook["answers"] is False
        assert hook["tower_calls"] == []
        assert hook["lines"] == []
