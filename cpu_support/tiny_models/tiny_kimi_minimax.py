"""Tiny random-weight Kimi-VL, Kimi K2.5, Kimi K3 and MiniMax-VL, on CPU.

The ``build_tiny_<family>`` functions build SGLang's REAL top-level classes
(``KimiVLForConditionalGeneration``, ``KimiK25ForConditionalGeneration``,
``KimiK3ForConditionalGeneration``, ``MiniMaxM3SparseForConditionalGeneration``)
from their REAL config classes with tiny sizes and seeded weights, from
encoder-only configs: the real ``__init__`` builds the vision tower and
projector (the DP encoder flag read from the published runtime context, where
the model reads it) and no language model (DeepSeek-V2/V3, Kimi-Linear,
MiniMax-M3 MoE), for the post-load hook tests and
scripts/vision_warmup_audit.py.

Widths are picked so that no width equals another or a warm-up patch count
(Dynamo duck-sizes equal sizes into one symbol): hidden 80, 4 heads of 20,
MLP 112; the learnable position embedding keeps the real 64x64 grid.

Call :func:`publish_cpu_context` (and :func:`init_gloo`) before building.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict

from cpu_support.standins.prepare import prepare_cpu_process

prepare_cpu_process()

import torch  # noqa: E402
from cpu_support.tiny_models.seeded_model import (  # noqa: E402
    default_dtype,
    fill_weights_,
)
from cpu_support.tiny_models.tiny_qwen3_vl import (  # noqa: E402,F401
    init_gloo,
    publish_cpu_context,
)

# Shared tiny sizes (head dim 20 is a multiple of 4, as MoonViT's 2D RoPE needs).
TINY_HIDDEN = 80
TINY_HEADS = 4
TINY_MLP = 112
TINY_LAYERS = 2
POS_EMB = 64  # the real checkpoints' init_pos_emb_height/width

TINY_MOONVIT = dict(
    patch_size=14,
    init_pos_emb_height=POS_EMB,
    init_pos_emb_width=POS_EMB,
    num_attention_heads=TINY_HEADS,
    num_hidden_layers=TINY_LAYERS,
    hidden_size=TINY_HIDDEN,
    intermediate_size=TINY_MLP,
    merge_kernel_size=(2, 2),
)

TINY_K25_VISION = dict(TINY_MOONVIT, init_pos_emb_time=4, text_hidden_size=96)

# K3: attention width (qkv_hidden_size) differs from the residual width, as in
# the real config (1536 vs 1024); 4 heads of 24.
TINY_K3_VISION = dict(
    patch_size=14,
    init_pos_emb_height=POS_EMB,
    init_pos_emb_width=POS_EMB,
    init_pos_emb_time=4,
    vt_num_attention_heads=TINY_HEADS,
    vt_num_hidden_layers=TINY_LAYERS,
    vt_hidden_size=TINY_HIDDEN,
    vt_intermediate_size=TINY_MLP,
    qkv_hidden_size=96,
    text_hidden_size=88,
)

# MiniMax-VL's CLIP tower: patch 14, Conv3d over 2 frames, 3D RoPE over
# 3 * 2 * ((head_dim // 3) // 2) = 18 of the head's 20 dims (the real tower
# rotates 78 of 80, trailing dims pass through).
TINY_MINIMAX_VISION = dict(
    hidden_size=TINY_HIDDEN,
    intermediate_size=TINY_MLP,
    num_hidden_layers=TINY_LAYERS,
    num_attention_heads=TINY_HEADS,
    num_channels=3,
    image_size=336,
    patch_size=14,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    img_token_compression_config={"temporal_patch_size": 2, "spatial_merge_size": 2},
    position_embedding_type="rope",
    rope_mode="3d",
    rope_theta=10000.0,
    vision_segment_max_frames=None,
)
TINY_MINIMAX_TEXT_HIDDEN = 96


# ---------------------------------------------------------------------------
# Full models: SGLang's REAL top-level classes, built encoder-only.
#
# The warm-up hook (``maybe_precompile_model_kernels_after_loading`` -> the
# class's ``precompile_kernels_after_loading`` -> ``warm_up_vision_tower``)
# lives on the top-level class and reads its ``use_data_parallel`` (through
# ``dp_encoder_spreads_images``) and its tower attribute, both set by the real
# ``__init__`` from the published runtime context. The language models
# (DeepSeek-V2 / V3 MLA + MoE, Kimi-Linear, MiniMax-M3 MoE with index
# attention) are not built, and never run in these checks; each config
# carries ``encoder_only=True``, the
# flag ``ModelConfig`` sets on an ``--encoder-only`` server's HF config, so
# the real ``__init__`` builds the tower and projector and skips the LM. The
# process-wide ``get_disagg().encoder_only`` is left as the caller set it:
# the config flag only decides what is built, the runtime flag decides
# whether the hook warms.
#
# Text configs carry a tiny hidden size (the projectors' output width), and
# ``language_only=False`` as ``ModelConfig`` sets it.

TINY_TEXT_HIDDEN = 96


@contextlib.contextmanager
def _moonvit_on_cpu():
    """Kimi-VL's ``Rope2DPosEmb`` reads its device from ``get_device()`` at
    build time, which off the CPU engine branch asks CUDA; point it at "cpu"
    for the build only."""
    from sglang.srt.models import kimi_vl_moonvit

    previous = kimi_vl_moonvit.get_device
    kimi_vl_moonvit.get_device = lambda *a, **k: "cpu"
    try:
        yield
    finally:
        kimi_vl_moonvit.get_device = previous


def _finish_model(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    fill_weights_(model, seed)
    return model.eval()


def _encoder_only_flags(config) -> None:
    config.encoder_only = True
    config.language_only = False


def build_tiny_kimi_vl(*, seed: int = 0, dtype=torch.float32):
    """SGLang's ``KimiVLForConditionalGeneration``, tiny, encoder-only config
    (tower ``vision_tower``: ``MoonVitPretrainedModel``)."""
    from sglang.srt.configs.kimi_vl import KimiVLConfig
    from sglang.srt.models.kimi_vl import KimiVLForConditionalGeneration

    config = KimiVLConfig(
        vision_config=dict(TINY_MOONVIT),
        text_config=dict(hidden_size=TINY_TEXT_HIDDEN, vocab_size=1024),
    )
    _encoder_only_flags(config)
    with default_dtype(dtype), _moonvit_on_cpu():
        model = KimiVLForConditionalGeneration(config)
    return _finish_model(model, seed)


def build_tiny_kimi_k25(*, seed: int = 0, dtype=torch.float32):
    """SGLang's ``KimiK25ForConditionalGeneration``, tiny, encoder-only config
    (tower ``vision_tower``: ``MoonViT3dPretrainedModel``)."""
    from sglang.srt.configs.kimi_k25 import KimiK25Config
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    config = KimiK25Config(
        # The projector reads vt_hidden_size, as in the published checkpoints'
        # vision_config (the tower reads hidden_size; both are the tower width).
        vision_config=dict(
            TINY_K25_VISION,
            vt_hidden_size=TINY_HIDDEN,
            text_hidden_size=TINY_TEXT_HIDDEN,
        ),
        text_config=dict(hidden_size=TINY_TEXT_HIDDEN, vocab_size=1024),
    )
    _encoder_only_flags(config)
    with default_dtype(dtype):
        model = KimiK25ForConditionalGeneration(config)
    return _finish_model(model, seed)


def build_tiny_kimi_k3(*, seed: int = 0, dtype=torch.float32):
    """SGLang's ``KimiK3ForConditionalGeneration``, tiny, encoder-only config
    (tower ``vision_tower``: ``KimiK3VisionTower``; the class always sets
    ``use_data_parallel = True``)."""
    from sglang.srt.configs.kimi_k3 import KimiK3Config
    from sglang.srt.models.kimi_k3 import KimiK3ForConditionalGeneration

    config = KimiK3Config(
        vision_config=dict(TINY_K3_VISION),
        text_config=dict(
            hidden_size=TINY_K3_VISION["text_hidden_size"], vocab_size=1024
        ),
    )
    _encoder_only_flags(config)
    with default_dtype(dtype):
        model = KimiK3ForConditionalGeneration(config)
    return _finish_model(model, seed)


@contextlib.contextmanager
def _no_encoder_processor():
    """The encoder-only branch of MiniMax-VL's ``__init__`` loads the HF
    processor (``tokenizer_manager.get_processor_wrapper``, from the served
    model path) for ``preprocess_mm_for_encoder``; nothing else reads it and
    the tiny model has no processor files. Stand in ``None`` for the build."""
    from sglang.srt.managers import tokenizer_manager

    previous = tokenizer_manager.get_processor_wrapper
    tokenizer_manager.get_processor_wrapper = lambda: None
    try:
        yield
    finally:
        tokenizer_manager.get_processor_wrapper = previous


def build_tiny_minimax_vl(*, seed: int = 0, dtype=torch.bfloat16):
    """SGLang's ``MiniMaxM3SparseForConditionalGeneration``, tiny, encoder-only
    config (tower ``vision_tower``: ``MiniMaxVLVisionModel``), bf16 as the
    tower asserts. Its real ``__init__`` runs to the encoder-only return (the
    tower, ``use_data_parallel``; no MiniMax-M3 text model, LM head or logits
    processor); only the processor load is stood in (``_no_encoder_processor``)."""
    from transformers import PretrainedConfig

    from sglang.srt.configs.minimax_vl import MiniMaxM3VLConfig
    from sglang.srt.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration

    # The text config goes in as a config object: under transformers 5 a
    # sub-config passed as a dict is kept as a dict (MiniMaxM3VLConfig declares
    # no sub_configs), where the model reads text_config.hidden_size as an
    # attribute. The vision config may stay a dict (the model reads either).
    config = MiniMaxM3VLConfig(
        vision_config=dict(TINY_MINIMAX_VISION),
        text_config=PretrainedConfig(
            hidden_size=TINY_MINIMAX_TEXT_HIDDEN, vocab_size=1024
        ),
    )
    _encoder_only_flags(config)
    with default_dtype(dtype), _no_encoder_processor():
        model = MiniMaxM3SparseForConditionalGeneration(config)
    return _finish_model(model, seed)


FULL_MODEL_BUILDERS: Dict[str, Callable[..., torch.nn.Module]] = {
    "kimi_vl": build_tiny_kimi_vl,
    "kimi_k25": build_tiny_kimi_k25,
    "kimi_k3": build_tiny_kimi_k3,
    "minimax_vl": build_tiny_minimax_vl,
}
