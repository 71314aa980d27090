"""The tiny Qwen3-VL's sizes, with no side effects at import.

`tiny_qwen3_vl` installs the CPU stand-ins when imported; code that only needs
the sizes (the model-directory generator, the GPU check, which must not
install CPU stand-ins on a GPU box) reads them from here.
"""

# The vision sizes: depth 2 keeps tests in seconds; deepstack index 1 keeps
# the deepstack merger path alive.
TINY_VISION = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
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
    rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    tie_word_embeddings=False,
    hidden_act="silu",
)
