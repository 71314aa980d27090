"""Tiny random-weight members of SGLang's DP-encoder VLM families, on CPU.

Each builder constructs SGLang's REAL model class (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``, ``Qwen4ExpForConditionalGeneration``,
``Glm5NextForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``,
``Glm4vForConditionalGeneration``, ``Glm4vMoeForConditionalGeneration``,
``BailingMMNativeForConditionalGeneration``,
``BailingMoeV3VLForConditionalGeneration``) from a tiny config, through
:func:`cpu_support.tiny_models.tiny_qwen3_vl.build_tiny_qwen3_vl` (seeded weights, CPU).
Only the vision towers are ever run; the language models are built because
the hooks under test live on the full model classes. Call after the runtime
context is published and the model-parallel groups exist.
"""

from __future__ import annotations

import torch
from cpu_support.tiny_models.tiny_qwen3_vl import TINY_VISION, build_tiny_qwen3_vl
from cpu_support.tiny_models.tiny_sizes import (
    TINY_QWEN2_5_VISION as _QWEN2_5_SERVER_VISION,
)
from cpu_support.tiny_models.tiny_sizes import TINY_TOWER

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
    TINY_TOWER,
    intermediate_size=96,
    patch_size=14,
    out_hidden_size=64,
    rms_norm_eps=1e-5,
    swiglu_limit=7.0,
    attention_bias=True,
)
TINY_GLM_TEXT = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=1)


def _vision(**overrides) -> dict:
    return dict(TINY_VISION, **overrides)


def build_tiny_family_model(
    config,
    model_cls,
    *,
    seed: int = 0,
    top_level=None,
    dtype: torch.dtype = torch.float32,
):
    """``model_cls`` from ``config`` with seeded random weights on CPU, after
    setting ``top_level`` attributes on the config and naming the class as
    its architecture."""
    for key, value in (top_level or {}).items():
        setattr(config, key, value)
    config.architectures = [model_cls.__name__]
    return build_tiny_qwen3_vl(config, model_cls=model_cls, seed=seed, dtype=dtype)


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
    return build_tiny_family_model(config, model_cls, seed=seed)


def build_tiny_qwen4_exp(*, seed: int = 0, **top_level):
    from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
    from sglang.srt.models.qwen4_exp import Qwen4ExpForConditionalGeneration

    config = Qwen4ExpConfig(
        text_config=dict(TINY_HYBRID_TEXT, hc_count=2, hc_lowrank=8),
        # Qwen4-Exp checkpoints ship no deepstack layers.
        vision_config=_vision(deepstack_visual_indexes=[]),
        **top_level,
    )
    return build_tiny_family_model(config, Qwen4ExpForConditionalGeneration, seed=seed)


def build_tiny_glm5_next(*, seed: int = 0, **top_level):
    from sglang.srt.configs.glm5_next import Glm5NextConfig
    from sglang.srt.models.glm5_next import Glm5NextForConditionalGeneration

    config = Glm5NextConfig(
        text_config=dict(TINY_GLM_TEXT),
        vision_config=dict(TINY_GLM_VISION),
        **top_level,
    )
    return build_tiny_family_model(config, Glm5NextForConditionalGeneration, seed=seed)


# ---------------------------------------------------------------------------
# Qwen2.5-VL, GLM-4V (and GLM-4.5V-MoE), Bailing MM (native and MoE-V3-VL).
#
# Sizes: every width of a compiled piece (hidden, head size, MLP width) is
# kept away from the warm-up's patch counts (1024, 3072, 384) and merged-row
# counts (256, 768, 96), so a dynamic graph never shares a symbol with a
# weight dimension by accident (Dynamo duck sizing). Text stacks are one
# layer (MoE stacks: one dense layer via first_k_dense_replace=1): only the
# towers are run, the language models exist because the post-load hook lives
# on the full model classes.
# ---------------------------------------------------------------------------


def _text_fields_on_top(config, text: dict) -> None:
    """Copy text sizes to the top-level config, as SGLang's loader arranges
    for the Qwen2.5-VL / GLM-4V checkpoints these classes read them from."""
    for key, value in config.text_config.to_dict().items():
        if key in ("model_type", "architectures", "transformers_version"):
            continue
        setattr(config, key, value)
    for key, value in text.items():
        setattr(config, key, value)


# The text stacks of these families: one layer of width 80 (head size 20).
_TEXT_80 = dict(
    vocab_size=1024,
    hidden_size=80,
    intermediate_size=160,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

# Qwen2.5-VL tower: the CPU server's (patch 14, window attention (window
# 112 px = 4x4 merged rows) in block 0, full attention in block 1, gated SiLU
# MLP), with widths kept off the warm-up's counts.
TINY_QWEN2_5_VISION = dict(
    _QWEN2_5_SERVER_VISION, intermediate_size=112, out_hidden_size=80
)
TINY_QWEN2_5_TEXT = dict(
    _TEXT_80,
    rope_theta=1000000.0,
    # head size 20: sections 2+4+4 = head / 2.
    rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 4, 4]},
    hidden_act="silu",
)


def build_tiny_qwen2_5_vl(*, seed: int = 0, **top_level):
    """SGLang's ``Qwen2_5_VLForConditionalGeneration``, tiny, tower ``visual``."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig

    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(TINY_QWEN2_5_TEXT),
        vision_config=dict(TINY_QWEN2_5_VISION),
    )
    _text_fields_on_top(config, TINY_QWEN2_5_TEXT)
    config.encoder_only = False
    config.language_only = False
    return build_tiny_family_model(
        config, Qwen2_5_VLForConditionalGeneration, seed=seed, top_level=top_level
    )


# GLM-4V tower: patch 14, learned 12x12 position table interpolated
# (bicubic grid_sample) to each image, RMSNorm, downsample conv, merger.
TINY_GLM4V_VISION = dict(
    TINY_TOWER,
    intermediate_size=112,
    patch_size=14,
    image_size=168,
    out_hidden_size=80,
    rms_norm_eps=1e-5,
    attention_bias=False,
    hidden_act="silu",
)
TINY_GLM4V_TEXT = dict(
    _TEXT_80,
    head_dim=20,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    # rotary on half the head (10): sections 1+2+2.
    partial_rotary_factor=0.5,
    rope_scaling={"rope_type": "default", "mrope_section": [1, 2, 2]},
    attention_bias=True,
    hidden_act="silu",
)
TINY_GLM4V_MOE_TEXT = dict(
    TINY_GLM4V_TEXT,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=48,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    norm_topk_prob=True,
    use_qk_norm=False,
)


def build_tiny_glm4v(*, moe: bool = False, seed: int = 0, **top_level):
    """SGLang's ``Glm4vForConditionalGeneration`` (``moe``:
    ``Glm4vMoeForConditionalGeneration``), tiny, tower ``visual``."""
    if moe:
        from transformers.models.glm4v_moe.configuration_glm4v_moe import (
            Glm4vMoeConfig as config_cls,
        )

        from sglang.srt.models.glm4v_moe import (
            Glm4vMoeForConditionalGeneration as model_cls,
        )
    else:
        from transformers.models.glm4v.configuration_glm4v import (
            Glm4vConfig as config_cls,
        )

        from sglang.srt.models.glm4v import Glm4vForConditionalGeneration as model_cls
    text = TINY_GLM4V_MOE_TEXT if moe else TINY_GLM4V_TEXT
    config = config_cls(text_config=dict(text), vision_config=dict(TINY_GLM4V_VISION))
    _text_fields_on_top(config, text)
    return build_tiny_family_model(config, model_cls, seed=seed, top_level=top_level)


# Bailing's towers are Qwen3-VL's: the tiny Qwen3-VL vision sizes, with a
# one-layer Bailing MoE text model whose only layer is dense
# (first_k_dense_replace=1); Ling-3 VL's MoE block is the same.
_BAILING_MOE = dict(
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    moe_intermediate_size=48,
    first_k_dense_replace=1,
)
TINY_BAILING_V2_TEXT = dict(
    _TEXT_80,
    **_BAILING_MOE,
    head_dim=20,
    partial_rotary_factor=1.0,
    rope_scaling={"rope_type": "default", "mrope_section": [2, 4, 4]},
    use_qkv_bias=False,
    use_bias=False,
)


def build_tiny_bailing_mm(*, seed: int = 0, vision: str = "qwen3", **top_level):
    """SGLang's ``BailingMMNativeForConditionalGeneration``, tiny, tower
    ``vision``: a Qwen3-VL tower (``vision="qwen3"``, Bailing MM2) or a
    Qwen2.5-VL one (``vision="qwen2_5"``), as the checkpoint's vision
    architecture says."""
    from sglang.srt.configs.bailing_moe_v2 import BailingMM2Config
    from sglang.srt.models.bailing_mm import BailingMMNativeForConditionalGeneration

    config = BailingMM2Config(
        llm_config=dict(TINY_BAILING_V2_TEXT),
        vision_config=_vision(out_hidden_size=80),
        mlp_depth=2,
        **top_level,
    )
    if vision == "qwen2_5":
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
            Qwen2_5_VLVisionConfig,
        )

        config.vision_config = Qwen2_5_VLVisionConfig(**TINY_QWEN2_5_VISION)
        config.vision_config.architectures = ["Qwen2_5_VisionTransformer"]
    elif vision != "qwen3":
        raise ValueError(f"unknown Bailing vision tower {vision!r}")
    return build_tiny_family_model(
        config, BailingMMNativeForConditionalGeneration, seed=seed
    )


# Ling-3 VL text: one MLA layer (layer_group_size 1: full attention), dense.
TINY_BAILING_V3_TEXT = dict(
    _TEXT_80,
    **_BAILING_MOE,
    num_key_value_heads=4,
    head_dim=20,
    rope_scaling={"rope_type": "default", "mrope_section": [2, 4, 4]},
    layer_group_size=1,
    kv_lora_rank=40,
    q_lora_rank=None,
    qk_rope_head_dim=20,
    qk_nope_head_dim=20,
    v_head_dim=20,
)


def build_tiny_bailing_moe_v3_vl(*, seed: int = 0, **top_level):
    """SGLang's ``BailingMoeV3VLForConditionalGeneration``, tiny, tower
    ``visual`` (a Qwen3-VL tower; the public checkpoint has no deepstack)."""
    from sglang.srt.configs.bailing_hybrid import BailingMoeV3VLConfig
    from sglang.srt.models.bailing_mm_v3 import BailingMoeV3VLForConditionalGeneration

    config = BailingMoeV3VLConfig(
        text_config=dict(TINY_BAILING_V3_TEXT),
        vision_config=_vision(out_hidden_size=80, deepstack_visual_indexes=[]),
        **top_level,
    )
    return build_tiny_family_model(
        config, BailingMoeV3VLForConditionalGeneration, seed=seed
    )
