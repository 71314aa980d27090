"""Deterministic inference on the batched ViT paths other than Qwen3-VL's (issue #12).

Under ``--enable-deterministic-inference`` an image's embedding must be
bitwise what it is when the image is encoded alone, on every path the series
batches across requests, or that path must not batch. Two paths beyond the
mrope DP runner (covered by test_vit_deterministic_batching.py):

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
forward pre-hooks.
"""

import contextlib
import types

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

from cpu_support.ranks import run_on_ranks  # noqa: E402

ROCM = dict(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False)
CUDA = dict(is_hip=False, is_cuda=True, is_npu=False, is_xpu=False)
PLATFORMS = {"CUDA": CUDA, "ROCm": ROCM}
DTYPES = ["float32", "bfloat16"]

TEXT_BEFORE = 5
TEXT_AFTER = 2
HIDDEN = 64  # both language models' hidden size
TOKENS_PER_TILE = 4  # InternVL: (32 / 8)^2 patches, pixel-shuffled by 0.5
GEMMA3_TOKENS_PER_IMAGE = 4

# InternVL requests, as tiles per image: one request with two images.
INTERNVL_TILES = [[3], [1, 2], [1]]
GEMMA3_IMAGES = [1, 2, 1]  # images per request


@contextlib.contextmanager
def deterministic(on):
    from sglang.srt.runtime_context import get_exec

    with get_exec().deterministic.override(enable_deterministic_inference=on):
        yield


def tiny_internvl_config():
    from sglang.srt.configs.internvl import InternVLChatConfig

    config = InternVLChatConfig(
        vision_config=dict(
            architectures=["InternVisionModel"],
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            qkv_bias=True,
            qk_normalization=False,
            norm_type="layer_norm",
            layer_norm_eps=1e-6,
            hidden_act="gelu",
            initializer_factor=1.0,
        ),
        llm_config=dict(
            architectures=["Qwen2ForCausalLM"],
            vocab_size=512,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
        force_image_size=32,
        downsample_ratio=0.5,
        template="internvl2_5",
        ps_version="v2",
        select_layer=-1,
    )
    config.architectures = ["InternVLChatModel"]
    return config


def tiny_gemma3_config():
    from transformers import Gemma3Config

    config = Gemma3Config(
        text_config=dict(
            vocab_size=512,
            hidden_size=HIDDEN,
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


def make_requests(tiles_per_image, tokens_per_tile, seed):
    """One MultimodalInputs per request; each image a [tiles, 3, 32, 32] item
    whose placeholder span follows the previous one after a little text."""
    from sglang.srt.managers.schedule_batch import (
        Modality,
        MultimodalDataItem,
        MultimodalInputs,
    )

    requests = []
    for r, tiles in enumerate(tiles_per_image):
        items, pos = [], TEXT_BEFORE
        for k, n in enumerate(tiles):
            gen = torch.Generator().manual_seed(seed * 100 + r * 10 + k)
            item = MultimodalDataItem(
                modality=Modality.IMAGE,
                feature=torch.randn((n, 3, 32, 32), generator=gen),
            )
            span = n * tokens_per_tile
            item.offsets = [(pos, pos + span - 1)]
            item.set_hash(hash(("det-other-paths", seed, r, k)) & ((1 << 62) - 1))
            items.append(item)
            pos += span + TEXT_AFTER
        requests.append((MultimodalInputs(mm_items=items), pos))
    return requests


def prefill_step(encoder, requests):
    """One prefill step of whole prompts through the real scheduler function,
    its arguments laid out as ``embed_mm_inputs`` lays them out."""
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
    """Each image through the model's encoder on its own, in request order."""
    rows = []
    for mm_inputs, _ in requests:
        for item in mm_inputs.mm_items:
            out = type(model).get_image_feature(model, [item])
            rows.append(out.reshape(-1, out.shape[-1]))
    return torch.cat(rows)


def spy(model, calls):
    """``get_image_feature`` bound to ``model``: records the items of each call
    (as their first dimension) and runs the real method."""
    real = type(model).get_image_feature

    def get_image_feature(self, items):
        calls.append([int(it.feature.shape[0]) for it in items])
        return real(self, items)

    return types.MethodType(get_image_feature, model)


def _first_dims(module, seen):
    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        seen.append(int(x.shape[0]))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def _steps(model, requests, platforms, tower):
    """Each (platform, deterministic) step from a fresh embedding cache."""
    from cpu_support.mm_harness import fresh_embedding_cache
    from sglang.srt.runtime_context import override_platform

    calls, towers, out = [], [], {}
    model.get_image_feature = spy(model, calls)
    handle = _first_dims(tower, towers)
    try:
        for platform in platforms:
            for on in (True, False):
                calls.clear()
                towers.clear()
                fresh_embedding_cache()
                with torch.no_grad(), override_platform(**PLATFORMS[platform]), deterministic(on):
                    emb = prefill_step(model.get_image_feature, requests)
                out[(platform, on)] = {"calls": list(calls), "towers": list(towers), "out": emb}
        with torch.no_grad(), deterministic(True):
            reference = alone(model, requests)
    finally:
        handle.remove()
    return out, reference


def _worker(rank, world_size, init_method):
    from cpu_support import tiny_qwen3_vl as T
    from sglang.srt.models.gemma3_mm import Gemma3ForConditionalGeneration
    from sglang.srt.models.internvl import InternVLChatModel

    result = {}
    # (a) InternVL with the DP encoder at attention-TP 2.
    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(tiny_internvl_config()),
    )
    T.init_gloo(rank, world_size, init_method)
    requests = make_requests(INTERNVL_TILES, TOKENS_PER_TILE, seed=7)
    for dtype in DTYPES:
        model = T.build_tiny_qwen3_vl(
            tiny_internvl_config(), model_cls=InternVLChatModel, seed=4, dtype=getattr(torch, dtype)
        )
        result[("internvl", dtype, "dp")] = model.use_data_parallel
        # Tiles per rank of each DP-runner call: the encoder inside the tile runner.
        result[("internvl", dtype)] = _steps(model, requests, ("CUDA", "ROCm"), model.vision_model.encoder)

    # (b) Gemma3 (ignores the flag; TP-sharded tower) on CUDA, flag on.
    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(tiny_gemma3_config()),
    )
    requests = make_requests([[1] * n for n in GEMMA3_IMAGES], GEMMA3_TOKENS_PER_IMAGE, seed=9)
    for dtype in DTYPES:
        model = T.build_tiny_qwen3_vl(
            tiny_gemma3_config(), model_cls=Gemma3ForConditionalGeneration, seed=6, dtype=getattr(torch, dtype)
        )
        result[("gemma3", dtype, "dp")] = hasattr(model, "use_data_parallel")
        result[("gemma3", dtype)] = _steps(model, requests, ("CUDA",), model.vision_tower)
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
    assert torch.equal(ranks[0][("internvl", dtype)][0][(platform, True)]["out"],
                       ranks[1][("internvl", dtype)][0][(platform, True)]["out"])


@pytest.mark.parametrize("platform", ["CUDA", "ROCm"])
def test_internvl_without_deterministic_inference_batches(ranks, platform):
    """The contrast: the same step is one cross-request call (7 tiles, 4 a rank)."""
    for r in ranks:
        step = r[("internvl", "float32")][0][(platform, False)]
        assert step["calls"] == [[3, 1, 2, 1]]
        assert step["towers"] == [4]


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


def test_gemma3_on_cuda_without_deterministic_inference_batches(ranks):
    for r in ranks:
        step = r[("gemma3", "float32")][0][("CUDA", False)]
        assert step["calls"] == [[1, 1, 1, 1]]
