"""Tiny random-weight Qwen3-Omni thinker and Muse Spark: SGLang's real classes, on CPU.

``build_tiny_qwen3_omni_thinker`` runs the real
``Qwen3OmniMoeThinkerForConditionalGeneration.__init__`` (models/qwen3_omni_moe.py)
whole: a one-layer MoE language model, the audio tower and the vision encoder
it builds tensor-parallel. ``build_tiny_muse_spark`` runs the real
``MuseSparkForConditionalGeneration.__init__`` (models/muse_spark_omni.py) in
its encoder-only branch, because its decoder asks for a CUDA stream when it is
built; the NaViT tower, adapter, projection and audio tower are the ones a
full server builds. Both read ``--mm-enable-dp-encoder`` from the published
runtime context, so publish it (and build the gloo groups) first.
"""

from __future__ import annotations

import torch
from cpu_support.tiny_models.tiny_qwen3_vl import build_tiny_qwen3_vl
from cpu_support.tiny_models.tiny_sizes import TINY_VISION

HIDDEN = 64  # both language models' hidden size

# Audio: 16 mel bins; 40 frames (under one 100-frame window) make 5 tokens
# after the three stride-2 convolutions: 40 -> 20 -> 10 -> 5.
MEL_BINS = 16
AUDIO_FRAMES = 40
AUDIO_TOKENS = 5

# Muse Spark images: 32x32 pixels in 8x8 patches = 16 patches, merged 2x2
# into 4 tokens.
MUSE_IMAGE_SIZE = 32
MUSE_TOKENS_PER_IMAGE = 4


def tiny_qwen3_omni_thinker_config():
    from sglang.srt.configs.qwen3_omni import Qwen3OmniMoeThinkerConfig

    config = Qwen3OmniMoeThinkerConfig(
        audio_config=dict(
            num_mel_bins=MEL_BINS,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            d_model=32,
            output_dim=HIDDEN,
            n_window=50,
            n_window_infer=100,
            downsample_hidden_size=8,
            max_source_positions=64,
        ),
        vision_config=dict(TINY_VISION),
        text_config=dict(
            vocab_size=512,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            pad_token_id=0,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            rope_scaling={
                "rope_type": "default",
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        ),
    )
    config.architectures = ["Qwen3OmniMoeThinkerForConditionalGeneration"]
    return config


def build_tiny_qwen3_omni_thinker(*, seed: int = 0):
    from sglang.srt.models.qwen3_omni_moe import (
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    return build_tiny_qwen3_vl(
        tiny_qwen3_omni_thinker_config(),
        model_cls=Qwen3OmniMoeThinkerForConditionalGeneration,
        seed=seed,
    )


def tiny_muse_spark_config():
    from sglang.srt.configs.muse_spark import MuseSparkConfig

    config = MuseSparkConfig(
        text_config=dict(
            vocab_size=512,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            mlp_layer_types=["dense"],
            sliding_window=64,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            patch_size=8,
            patch_temporal=2,
            merge_size=2,
            pos_emb_height=4,
            pos_emb_width=4,
        ),
        audio_config=dict(
            depths=[1],
            hidden_sizes=[16],
            patch_sizes=[4],
            num_hidden_layers=1,
            out_hidden_size=HIDDEN,
        ),
        out_hidden_size=32 * 2 * 2,  # the vision width times the 2x2 merge
        projector_hidden_size=64,
        image_token_id=300,
        video_token_id=301,
        audio_token_id=302,
        dtype="float32",
    )
    config.architectures = ["MuseSparkForConditionalGeneration"]
    return config


def build_tiny_muse_spark(*, seed: int = 0):
    from sglang.srt.models.muse_spark_omni import MuseSparkForConditionalGeneration
    from sglang.srt.runtime_context import get_disagg

    with get_disagg().override(encoder_only=True):
        return build_tiny_qwen3_vl(
            tiny_muse_spark_config(),
            model_cls=MuseSparkForConditionalGeneration,
            seed=seed,
        )


def _hashed(item, key):
    item.set_hash(hash(key) & ((1 << 62) - 1))
    return item


def audio_item(*, seed: int, offset: int):
    """One audio clip as the Qwen3-Omni processor hands it over: ``[1, 16,
    40]`` seeded log-mel features with their attention mask, a placeholder
    span of 5 tokens from ``offset``."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    gen = torch.Generator().manual_seed(seed)
    item = MultimodalDataItem(
        modality=Modality.AUDIO,
        feature=torch.randn((1, MEL_BINS, AUDIO_FRAMES), generator=gen),
    )
    item.feature_attention_mask = torch.ones((1, AUDIO_FRAMES), dtype=torch.long)
    item.offsets = [(offset, offset + AUDIO_TOKENS - 1)]
    return _hashed(item, ("qwen3-omni-audio", seed))


def muse_image_item(*, seed: int, offset: int):
    """One Muse Spark image: ``[3, 32, 32]`` seeded pixels, 4 tokens from ``offset``."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    gen = torch.Generator().manual_seed(seed)
    item = MultimodalDataItem(
        modality=Modality.IMAGE,
        feature=torch.randn((3, MUSE_IMAGE_SIZE, MUSE_IMAGE_SIZE), generator=gen),
    )
    item.offsets = [(offset, offset + MUSE_TOKENS_PER_IMAGE - 1)]
    return _hashed(item, ("muse-spark-image", seed))
