"""Tiny random-weight Gemma3 and InternVL: SGLang's real classes, on CPU.

``Gemma3ForConditionalGeneration`` (models/gemma3_mm.py) never reads
``--mm-enable-dp-encoder``: its SigLIP tower is TP-sharded. ``InternVLChatModel``
(models/internvl.py) does, and then runs its tower through
``run_dp_sharded_vision_model`` (tiles, not images, split over ranks). Both
take an image as ``[tiles, 3, 32, 32]`` pixels in 8x8 patches (16 patches, 4
tokens a tile), with the same tiny vision sizes and a one-layer language
model 64 wide.

Build after the runtime context is published (``publish_dp_encoder_server``)
and the model-parallel groups exist.
"""

from __future__ import annotations

import torch
from cpu_support.ranks.mm_harness import (
    TEXT_BEFORE,
    TEXT_BETWEEN,
    Request,
    from_mm_inputs,
)
from cpu_support.tiny_models.tiny_vl_family import build_tiny_family_model

HIDDEN = 64  # both language models' hidden size
IMAGE_SIZE = 32
GEMMA3_TOKENS_PER_IMAGE = 4  # 16 patches, pooled to 4 tokens
INTERNVL_TOKENS_PER_TILE = 4  # 16 patches a tile, pixel-shuffled by 0.5

# SigLIP (Gemma3) and InternViT (InternVL) alike.
TINY_PIXEL_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=IMAGE_SIZE,
    patch_size=8,
)
TINY_SMALL_TEXT = dict(
    vocab_size=512,
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def tiny_gemma3_config():
    from transformers import Gemma3Config

    config = Gemma3Config(
        text_config=dict(
            TINY_SMALL_TEXT, head_dim=16, sliding_window=64, rope_scaling=None
        ),
        vision_config=dict(TINY_PIXEL_VISION, num_channels=3),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def tiny_internvl_config():
    from sglang.srt.configs.internvl import InternVLChatConfig

    config = InternVLChatConfig(
        vision_config=dict(
            TINY_PIXEL_VISION,
            architectures=["InternVisionModel"],
            qkv_bias=True,
            qk_normalization=False,
            norm_type="layer_norm",
            layer_norm_eps=1e-6,
            hidden_act="gelu",
            initializer_factor=1.0,
        ),
        llm_config=dict(TINY_SMALL_TEXT, architectures=["Qwen2ForCausalLM"]),
        force_image_size=IMAGE_SIZE,
        downsample_ratio=0.5,
        template="internvl2_5",
        ps_version="v2",
        select_layer=-1,
    )
    config.architectures = ["InternVLChatModel"]
    return config


def publish_dp_encoder_server(config, rank: int, world_size: int) -> None:
    """Publish the runtime context of a server of ``config`` (written to a
    model directory) at attention-TP ``world_size`` with
    ``--mm-enable-dp-encoder``, as rank ``rank``."""
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    T.publish_cpu_context(
        tp_size=world_size,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(config),
    )


def build_tiny_gemma3(*, seed: int = 0, dtype: torch.dtype = torch.float32):
    from sglang.srt.models.gemma3_mm import Gemma3ForConditionalGeneration

    return build_tiny_family_model(
        tiny_gemma3_config(), Gemma3ForConditionalGeneration, seed=seed, dtype=dtype
    )


def build_tiny_internvl(*, seed: int = 0, dtype: torch.dtype = torch.float32):
    from sglang.srt.models.internvl import InternVLChatModel

    return build_tiny_family_model(
        tiny_internvl_config(), InternVLChatModel, seed=seed, dtype=dtype
    )


def pixel_item(tiles: int, *, seed: int, offset: int, tokens: int, key: tuple):
    """One image as these models' processors hand it over: ``[tiles, 3, 32, 32]``
    seeded pixels, a placeholder span of ``tokens`` from ``offset``, its hash
    from ``key``."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    gen = torch.Generator().manual_seed(seed)
    item = MultimodalDataItem(
        modality=Modality.IMAGE,
        feature=torch.randn((tiles, 3, IMAGE_SIZE, IMAGE_SIZE), generator=gen),
    )
    item.offsets = [(offset, offset + tokens - 1)]
    item.set_hash(hash(key) & ((1 << 62) - 1))
    return item


def pixel_requests(tiles_per_image, tokens_per_tile: int, *, seed: int, key: str):
    """One whole-prompt request per entry of ``tiles_per_image`` (the tiles of
    each of its images), each built from a real ``MultimodalInputs``: text,
    then each image's placeholder span, text after each."""
    from sglang.srt.managers.schedule_batch import MultimodalInputs

    requests = []
    for r, tiles in enumerate(tiles_per_image):
        items, pos = [], TEXT_BEFORE
        for k, n in enumerate(tiles):
            span = n * tokens_per_tile
            items.append(
                pixel_item(
                    n,
                    seed=seed * 100 + r * 10 + k,
                    offset=pos,
                    tokens=span,
                    key=(key, seed, r, k),
                )
            )
            pos += span + TEXT_BETWEEN
        requests.append(from_mm_inputs(MultimodalInputs(mm_items=items), pos))
    return requests


def gemma3_request(seed: int) -> Request:
    """A one-image Gemma3 request (image seed ``seed``)."""
    from sglang.srt.managers.schedule_batch import MultimodalInputs

    item = pixel_item(
        1,
        seed=seed,
        offset=TEXT_BEFORE,
        tokens=GEMMA3_TOKENS_PER_IMAGE,
        key=("gemma3-gate-image", seed),
    )
    length = TEXT_BEFORE + GEMMA3_TOKENS_PER_IMAGE + TEXT_BETWEEN
    return from_mm_inputs(MultimodalInputs(mm_items=[item]), length)
