"""Tiny random-weight members of the Qwen3-VL family and GLM-5-Next, on CPU.

Each builder constructs SGLang's REAL model class (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``, ``Qwen4ExpForConditionalGeneration``,
``Glm5NextForConditionalGeneration``) from a tiny config, through
:func:`cpu_support.tiny_qwen3_vl.build_tiny_qwen3_vl` (seeded weights, CPU).
Only the vision towers are ever run; the language models are built because
the hooks under test live on the full model classes. Call after the runtime
context is published and the model-parallel groups exist.
"""

from __future__ import annotations

from cpu_support.tiny_qwen3_vl import TINY_VISION, build_tiny_qwen3_vl

# A hybrid (Qwen3-Next style) text stack: one linear-attention layer, one
# full-attention layer. partial_rotary_factor 1.0 keeps the mrope sections
# (2+3+3 = head_dim / 2) consistent.
TINY_HYBRID_TEXT = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    partial_rotary_factor=1.0,
    rope_scaling={
        "rope_type": "default",
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
    },
    layer_types=["linear_attention", "full_attention"],
    full_attention_interval=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    tie_word_embeddings=False,
)

TINY_MOE_TEXT = dict(
    TINY_HYBRID_TEXT,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)

# GLM-5-Next's vision tower (GLM-OCR layout: patch 14, RMSNorm, swiglu MLP).
# intermediate 96 keeps every width of its compiled pieces distinct from the
# warm-up's patch counts, as in a real checkpoint.
TINY_GLM_VISION = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    in_channels=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=64,
    rms_norm_eps=1e-5,
    swiglu_limit=7.0,
    attention_bias=True,
)
TINY_GLM_TEXT = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=1)


def _vision(**overrides) -> dict:
    return dict(TINY_VISION, **overrides)


def build_tiny_qwen3_5(*, moe: bool = False, seed: int = 0, **top_level):
    from sglang.srt.configs.qwen3_5 import Qwen3_5Config, Qwen3_5MoeConfig
    from sglang.srt.models.qwen3_5 import (
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeForConditionalGeneration,
    )

    config_cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    model_cls = (
        Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration
    )
    config = config_cls(
        text_config=dict(TINY_MOE_TEXT if moe else TINY_HYBRID_TEXT),
        vision_config=_vision(),
        **top_level,
    )
    config.architectures = [model_cls.__name__]
    return build_tiny_qwen3_vl(config, model_cls=model_cls, seed=seed)


def build_tiny_qwen4_exp(*, seed: int = 0, **top_level):
    from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
    from sglang.srt.models.qwen4_exp import Qwen4ExpForConditionalGeneration

    config = Qwen4ExpConfig(
        text_config=dict(TINY_HYBRID_TEXT, hc_count=2, hc_lowrank=8),
        # Qwen4-Exp checkpoints ship no deepstack layers.
        vision_config=_vision(deepstack_visual_indexes=[]),
        **top_level,
    )
    config.architectures = ["Qwen4ExpForConditionalGeneration"]
    return build_tiny_qwen3_vl(config, model_cls=Qwen4ExpForConditionalGeneration, seed=seed)


def build_tiny_glm5_next(*, seed: int = 0, **top_level):
    from sglang.srt.configs.glm5_next import Glm5NextConfig
    from sglang.srt.models.glm5_next import Glm5NextForConditionalGeneration

    config = Glm5NextConfig(
        text_config=dict(TINY_GLM_TEXT),
        vision_config=dict(TINY_GLM_VISION),
        **top_level,
    )
    config.architectures = ["Glm5NextForConditionalGeneration"]
    return build_tiny_qwen3_vl(config, model_cls=Glm5NextForConditionalGeneration, seed=seed)
