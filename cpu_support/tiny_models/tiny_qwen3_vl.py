"""A tiny random-weight Qwen3-VL built from SGLang's real model code, on CPU.

The model is SGLang's own ``Qwen3VLForConditionalGeneration`` (and its vision
tower ``Qwen3VLMoeVisionModel``); only the sizes are small. Weights are filled
from a seeded generator because SGLang allocates parameters with
``torch.empty``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from cpu_support.standins.prepare import prepare_cpu_process

prepare_cpu_process()

import torch  # noqa: E402
from cpu_support.tiny_models.seeded_model import (  # noqa: E402,F401
    default_dtype,
    fill_weights_,
)
from cpu_support.tiny_models.tiny_sizes import TINY_TEXT, TINY_VISION  # noqa: E402,F401


def tiny_qwen3_vl_config(
    vision: Optional[dict] = None,
    text: Optional[dict] = None,
    **top_level,
):
    """A ``Qwen3VLConfig`` with tiny sizes, text fields also copied to the top.

    SGLang's ``Qwen3VLForConditionalGeneration`` reads the text sizes from the
    top-level config (``config.hidden_size``, ``config.rope_scaling``...), as
    its own config loader arranges for real checkpoints.
    """
    from sglang.srt.configs.qwen3_vl import Qwen3VLConfig

    vision_cfg = dict(TINY_VISION, **(vision or {}))
    text_cfg = dict(TINY_TEXT, **(text or {}))
    config = Qwen3VLConfig(
        text_config=text_cfg,
        vision_config=vision_cfg,
        tie_word_embeddings=text_cfg["tie_word_embeddings"],
        **top_level,
    )
    for key, value in config.text_config.to_dict().items():
        if key in ("model_type", "architectures", "transformers_version"):
            continue
        setattr(config, key, value)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def write_config_dir(config=None, path: Optional[str] = None) -> str:
    """Save ``config`` as a model directory (``config.json`` only): at ``path``,
    else the one folder kept for this config (``vit_bench_util.config_dir``).

    ServerArgs resolves the model's HF config from ``model_path``; a local
    directory keeps that offline.
    """
    from cpu_support.bench.vit_bench_util import config_dir

    config = config if config is not None else tiny_qwen3_vl_config()
    if not path:
        return config_dir(config, "tiny-qwen3-vl")
    config.save_pretrained(path)
    return path


def publish_cpu_context(
    *,
    tp_size: int = 1,
    rank: int = 0,
    dp_encoder: bool = False,
    model_path: Optional[str] = None,
    **server_args_fields,
):
    """Publish SGLang's runtime context for a CPU process (rank ``rank``)."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    model_path = model_path or write_config_dir()
    args = ServerArgs(
        model_path=model_path,
        device="cpu",
        tp_size=tp_size,
        mm_attention_backend=server_args_fields.pop("mm_attention_backend", "sdpa"),
        mm_enable_dp_encoder=dp_encoder,
        disable_custom_all_reduce=True,
        **server_args_fields,
    )
    return publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank))


def init_gloo(rank: int, world_size: int, init_method: str) -> None:
    """SGLang's distributed environment and model-parallel groups, on gloo.

    Idempotent within a process (several test modules share one pytest
    process): a second call with the same world size keeps the groups.
    """
    if torch.distributed.is_initialized():
        if torch.distributed.get_world_size() != world_size:
            raise RuntimeError(
                f"gloo already initialized with world size "
                f"{torch.distributed.get_world_size()}, asked for {world_size}"
            )
        return
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_distributed_environment(
        world_size=world_size,
        rank=rank,
        distributed_init_method=init_method,
        local_rank=rank,
        backend="gloo",
    )
    initialize_model_parallel(backend="gloo")


def build_tiny_qwen3_vl(
    config=None,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    model_cls=None,
):
    """SGLang's ``Qwen3VLForConditionalGeneration`` with tiny random weights."""
    if model_cls is None:
        from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration

        model_cls = Qwen3VLForConditionalGeneration
    config = config if config is not None else tiny_qwen3_vl_config()
    with default_dtype(dtype):
        model = model_cls(config)
    fill_weights_(model, seed)
    return model.eval()


def patches_per_image(grid: Sequence[int]) -> int:
    t, h, w = grid
    return t * h * w


def tokens_per_image(grid: Sequence[int], merge: int = 2) -> int:
    return patches_per_image(grid) // (merge * merge)


def image_item(
    grid: Tuple[int, int, int],
    *,
    seed: int,
    offset: int = 0,
    config=None,
):
    """A real ``MultimodalDataItem`` for one image of patch grid ``grid``.

    ``offset`` is where the image's placeholder tokens start in its request;
    the item spans ``tokens_per_image(grid)`` tokens from there.
    """
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    vision = config.vision_config if config is not None else None
    in_ch = getattr(vision, "in_channels", TINY_VISION["in_channels"])
    tps = getattr(vision, "temporal_patch_size", TINY_VISION["temporal_patch_size"])
    ps = getattr(vision, "patch_size", TINY_VISION["patch_size"])
    merge = getattr(vision, "spatial_merge_size", TINY_VISION["spatial_merge_size"])
    gen = torch.Generator().manual_seed(seed)
    n = patches_per_image(grid)
    pixels = torch.randn((n, in_ch * tps * ps * ps), generator=gen)
    item = MultimodalDataItem(modality=Modality.IMAGE, feature=pixels)
    item.image_grid_thw = torch.tensor([list(grid)], dtype=torch.long)
    ntok = tokens_per_image(grid, merge)
    item.offsets = [(offset, offset + ntok - 1)]
    item.hash = hash(("fork-test-image", seed, tuple(grid))) & ((1 << 62) - 1)
    return item
