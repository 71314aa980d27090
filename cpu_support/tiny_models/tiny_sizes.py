"""The tiny models' sizes, with no side effects at import.

`tiny_qwen3_vl` installs the CPU stand-ins when imported; code that only needs
the sizes (the model-directory generator, the GPU check, which must not
install CPU stand-ins on a GPU box) reads them from here. The family
builders (`tiny_vl_family`) derive their towers from ``TINY_TOWER`` too.
"""

# What every tiny Qwen/GLM-style vision tower shares: two blocks of width 64
# with four heads (divisible at TP2), RGB in, 2x2 merge, two-frame patches.
TINY_TOWER = dict(
    depth=2,
    hidden_size=64,
    num_heads=4,
    in_channels=3,
    spatial_merge_size=2,
    temporal_patch_size=2,
)

# The Qwen3-VL vision sizes: depth 2 keeps tests in seconds; deepstack index 1
# keeps the deepstack merger path alive.
TINY_VISION = dict(
    TINY_TOWER,
    intermediate_size=128,
    patch_size=16,
    out_hidden_size=64,
    num_position_embeddings=256,
    deepstack_visual_indexes=[1],
    hidden_act="gelu_pytorch_tanh",
)

TINY_TEXT = dict(
    vocab_size=152064,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=5000000.0,
    rope_scaling={
        "rope_type": "default",
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
    },
    tie_word_embeddings=False,
    hidden_act="silu",
)

# The tiny Qwen2.5-VL tower. Patch 14 (x temporal 2 x 3 channels = 1176 values
# a patch) is not a free choice: SGLang's Qwen2_5_VLForConditionalGeneration.
# get_image_feature only runs the tower on 2-D pixel rows 1176 wide and hands
# any other width back untouched as if it were embeddings. Window 112 pixels
# = 4x4 merged tokens a window, as in the real checkpoints; depth 2 with the
# last block full-attention keeps both attention kinds alive.
TINY_QWEN2_5_VISION = dict(
    TINY_TOWER,
    intermediate_size=128,
    patch_size=14,
    out_hidden_size=64,
    window_size=112,
    fullatt_block_indexes=[1],
    hidden_act="silu",
)
# Its text stack: the Qwen3-VL one's sizes, with the head size derived and the
# vocabulary and rope left to the checkpoint writer.
TINY_QWEN2_5_TEXT = {
    key: value
    for key, value in TINY_TEXT.items()
    if key not in ("vocab_size", "head_dim", "rope_theta", "rope_scaling")
}
