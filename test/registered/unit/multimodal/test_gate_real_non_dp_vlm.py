"""The ROCm ViT batching gate with a REAL model that is not data-parallel (issue #10).

``--mm-enable-dp-encoder`` on, attention-TP 2 (two gloo ranks), ROCm simulated
with ``override_platform``. SGLang's real ``Gemma3ForConditionalGeneration``
(models/gemma3_mm.py, tiny sizes, random weights) never reads the flag: its
SigLIP tower is TP-sharded, so every rank runs every encoder call and nothing
is spread. The gate must keep it per request on ROCm (two single-image
requests, two encoder calls), while a data-parallel family (the tiny Qwen3-VL
built with the flag) gets one call for both; on CUDA the same Gemma3 batches.

Everything goes through the real ``mm_schedule._get_chunked_prefill_embedding``
with real ``MultimodalDataItem`` / ``MultimodalInputs`` objects, the arguments
laid out as ``mm_utils.embed_mm_inputs`` lays them out. Encoder calls are
counted by a pass-through spy bound to the model (the real
``get_image_feature`` runs; the gate still sees the model behind it), and
tower calls with forward pre-hooks.
"""

import logging
import types

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

from cpu_support.ranks import run_on_ranks  # noqa: E402

ROCM = dict(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False)
CUDA = dict(is_hip=False, is_cuda=True, is_npu=False, is_xpu=False)

# Tiny Gemma3: 32x32 pixels in 8x8 patches (16 patches), pooled to 4 tokens.
GEMMA3_TOKENS_PER_IMAGE = 4
GEMMA3_HIDDEN = 64


def tiny_gemma3_config():
    from transformers import Gemma3Config

    config = Gemma3Config(
        text_config=dict(
            vocab_size=512,
            hidden_size=GEMMA3_HIDDEN,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            sliding_window=64,
            rope_scaling=None,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            num_channels=3,
        ),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def build_tiny_gemma3(seed=3, dtype=torch.float32):
    from cpu_support import tiny_qwen3_vl as T
    from sglang.srt.models.gemma3_mm import Gemma3ForConditionalGeneration

    return T.build_tiny_qwen3_vl(
        tiny_gemma3_config(),
        model_cls=Gemma3ForConditionalGeneration,
        seed=seed,
        dtype=dtype,
    )


def gemma3_item(seed, offset):
    """One 32x32 image as Gemma3's processor hands it over: [1, 3, H, W]."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    gen = torch.Generator().manual_seed(seed)
    item = MultimodalDataItem(
        modality=Modality.IMAGE, feature=torch.randn((1, 3, 32, 32), generator=gen)
    )
    item.offsets = [(offset, offset + GEMMA3_TOKENS_PER_IMAGE - 1)]
    item.set_hash(hash(("gemma3-gate-image", seed)) & ((1 << 62) - 1))
    return item


TEXT_BEFORE = 5
TEXT_AFTER = 2


def gemma3_request(seed):
    from sglang.srt.managers.schedule_batch import MultimodalInputs

    item = gemma3_item(seed, TEXT_BEFORE)
    return MultimodalInputs(mm_items=[item]), TEXT_BEFORE + GEMMA3_TOKENS_PER_IMAGE + TEXT_AFTER


def qwen3_vl_request(grid, seed):
    from cpu_support.tiny_qwen3_vl import image_item, tokens_per_image
    from sglang.srt.managers.schedule_batch import MultimodalInputs

    item = image_item(grid, seed=seed, offset=TEXT_BEFORE)
    return MultimodalInputs(mm_items=[item]), TEXT_BEFORE + tokens_per_image(grid) + TEXT_AFTER


def prefill_step(encoder, requests):
    """One prefill step of whole prompts through the real scheduler function,
    its arguments built from the requests' MultimodalInputs the way
    ``embed_mm_inputs`` builds them for the image modality."""
    from sglang.srt.managers import mm_schedule
    from sglang.srt.managers.schedule_batch import Modality

    items, sizes, offsets = [], [0], []
    for mm_inputs, _ in requests:
        images = [it for it in mm_inputs.mm_items if it.is_modality(Modality.IMAGE)]
        items.extend(images)
        sizes.append(sizes[-1] + len(images))
        offsets.append([span for it in images for span in it.offsets])
    lengths = [length for _, length in requests]
    embedding, _ = mm_schedule._get_chunked_prefill_embedding(
        encoder,
        items,
        sizes,
        [0] * len(requests),
        lengths,
        offsets,
        torch.zeros(sum(lengths), dtype=torch.long),
    )
    return embedding


def alone(model, requests):
    rows = []
    for mm_inputs, _ in requests:
        for item in mm_inputs.mm_items:
            out = model.get_image_feature([item])
            rows.append(out.reshape(-1, out.shape[-1]))
    return torch.cat(rows)


def encoder_spy(model, calls):
    """``model.get_image_feature`` as a bound method of ``model`` that records
    the item count of each call and runs the real method."""
    real = type(model).get_image_feature

    def get_image_feature(self, items):
        calls.append(len(items))
        return real(self, items)

    return types.MethodType(get_image_feature, model)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


def _capture(name):
    handler = Records()
    log = logging.getLogger(name)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def _tower_calls(tower, sizes):
    def hook(module, args, kwargs):
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        sizes.append(int(pixels.shape[0]))

    return tower.register_forward_pre_hook(hook, with_kwargs=True)


def _rank_worker(rank, world_size, init_method):
    from cpu_support import tiny_qwen3_vl as T
    from cpu_support.mm_harness import TowerCalls, fresh_embedding_cache
    from sglang.srt.model_executor.model_runner_components.load_model_utils import (
        maybe_precompile_model_kernels_after_loading,
    )
    from sglang.srt.multimodal import vit_batching
    from sglang.srt.runtime_context import override_platform

    gate_log = _capture("sglang.srt.multimodal.vit_batching")
    warm_log = _capture("sglang.srt.multimodal.vision_warmup")
    result = {}

    # --- Gemma3: served with --mm-enable-dp-encoder at TP 2; ignores the flag.
    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(tiny_gemma3_config()),
    )
    T.init_gloo(rank, world_size, init_method)
    gemma = build_tiny_gemma3()
    result["gemma_has_dp_attr"] = hasattr(gemma, "use_data_parallel")
    with override_platform(**ROCM):
        # What SGLang runs on every rank after the weights load.
        first = len(warm_log.lines)
        maybe_precompile_model_kernels_after_loading(gemma, "cpu")
        result["hook_lines"] = warm_log.lines[first:]

    requests = [gemma3_request(seed=201), gemma3_request(seed=202)]
    calls, towers = [], []
    gemma.get_image_feature = encoder_spy(gemma, calls)
    handle = _tower_calls(gemma.vision_tower, towers)
    for name, platform in (("rocm", ROCM), ("cuda", CUDA)):
        vit_batching._logged_decisions.clear()  # a fresh server per platform
        fresh_embedding_cache()
        calls.clear()
        towers.clear()
        first = len(gate_log.lines)
        with torch.no_grad(), override_platform(**platform):
            out = prefill_step(gemma.get_image_feature, requests)
        result[f"gemma_{name}"] = {
            "calls": list(calls),
            "towers": list(towers),
            "gate": gate_log.lines[first:],
            "out": out,
        }
    handle.remove()
    with torch.no_grad():
        result["gemma_alone"] = alone(gemma, requests)

    # --- Qwen3-VL built with the DP encoder: its images are spread.
    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    qwen = T.build_tiny_qwen3_vl(seed=1)
    requests = [qwen3_vl_request((1, 8, 8), seed=301), qwen3_vl_request((1, 8, 12), seed=302)]
    calls = []
    qwen.get_image_feature = encoder_spy(qwen, calls)
    vit_batching._logged_decisions.clear()
    fresh_embedding_cache()
    first = len(gate_log.lines)
    with torch.no_grad(), override_platform(**ROCM):
        with TowerCalls().attach(qwen.visual) as towers:
            out = prefill_step(qwen.get_image_feature, requests)
        step_calls = list(calls)
        reference = alone(qwen, requests)
    result["qwen_rocm"] = {
        "calls": step_calls,
        "towers": towers.calls,
        "gate": gate_log.lines[first:],
        "out": out,
        "alone": reference,
    }
    return result


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=500)


def _gate_lines(lines):
    return [line for line in lines if "cross-request ViT batching" in line[1]]


def test_gemma3_is_not_data_parallel(ranks):
    """The model under test really is one that ignores the flag."""
    assert [r["gemma_has_dp_attr"] for r in ranks] == [False, False]


def test_rocm_gemma3_two_requests_take_two_encoder_calls(ranks):
    for r in ranks:
        assert r["gemma_rocm"]["calls"] == [1, 1]
        # The TP-sharded tower runs once per image on every rank.
        assert r["gemma_rocm"]["towers"] == [1, 1]
        assert r["gemma_rocm"]["out"].shape == (2 * GEMMA3_TOKENS_PER_IMAGE, GEMMA3_HIDDEN)
        torch.testing.assert_close(r["gemma_rocm"]["out"], r["gemma_alone"], rtol=1e-5, atol=1e-6)


def test_rocm_gemma3_gate_logs_why_at_info(ranks):
    for r in ranks:
        assert _gate_lines(r["gemma_rocm"]["gate"]) == [
            (logging.INFO, "cross-request ViT batching: off (ROCm, vision encoder not data-parallel)")
        ]


def test_post_load_hook_warns_once_that_the_flag_distributes_nothing(ranks):
    expected = (
        "--mm-enable-dp-encoder distributes nothing for Gemma3ForConditionalGeneration: "
        "its vision encoder is not data-parallel, so every image is encoded as "
        "without the flag"
    )
    warnings = [
        (rank, msg)
        for rank, r in enumerate(ranks)
        for level, msg in r["hook_lines"]
        if level >= logging.WARNING
    ]
    assert warnings == [(0, expected)]  # attention-TP rank 0 only, once
    # Nothing to warm: no "vision warm-up" line on either rank.
    assert not any(msg.startswith("vision warm-up") for r in ranks for _, msg in r["hook_lines"])


def test_cuda_gemma3_batches_the_two_requests(ranks):
    for r in ranks:
        assert r["gemma_cuda"]["calls"] == [2]
        assert r["gemma_cuda"]["towers"] == [1, 1]  # Gemma3 loops per image inside
        assert _gate_lines(r["gemma_cuda"]["gate"]) == [
            (logging.INFO, "cross-request ViT batching: on (CUDA)")
        ]
        torch.testing.assert_close(r["gemma_cuda"]["out"], r["gemma_alone"], rtol=1e-5, atol=1e-6)


def test_rocm_dp_qwen3_vl_two_requests_take_one_call_spread_over_both_ranks(ranks):
    for r in ranks:
        assert r["qwen_rocm"]["calls"] == [2]
        assert _gate_lines(r["qwen_rocm"]["gate"]) == [
            (logging.INFO, "cross-request ViT batching: on (ROCm, DP encoder, attention-TP 2)")
        ]
        torch.testing.assert_close(r["qwen_rocm"]["out"], r["qwen_rocm"]["alone"], rtol=1e-4, atol=1e-5)
    # One tower call per rank, one image each: both ranks work.
    assert sorted(r["qwen_rocm"]["towers"] for r in ranks) == [[[(1, 8, 8)]], [[(1, 8, 12)]]]
