"""The DP encoder's runners under DP attention: each DP group encodes its own.

Four gloo ranks as a server at ``--tp-size 4 --dp-size 2 --enable-dp-attention
--mm-enable-dp-encoder`` (attention-TP 2), the groups built by SGLang's own
``initialize_model_parallel`` and ``initialize_dp_attention``: DP group 0 is
TP ranks 0 and 1, group 1 ranks 2 and 3. Each group runs its own prefill steps
through the real ``mm_schedule._get_chunked_prefill_embedding`` on ROCm (where
the series batches these families), with SGLang's real tiny models:

* InternVL (``run_dp_sharded_vision_model``, tiles),
* Qwen3-VL (``run_dp_sharded_mrope_vision_model``, images and videos),
* MiniMax-VL (the same runner; its tower has no ``device``),
* Muse Spark (its own ``_run_dp_sharded_encode``: images, videos, audio).

Cases: ``same`` (equal groups: one one-tile image each for InternVL, two
one-image requests each for the others), ``uneven`` (two requests in group 0, one
in group 1), ``idle`` (group 1 has no step: its ranks never enter a runner),
``mixed`` (an image step, then a video step) where the family has video, and
for Muse Spark ``image_audio`` (group 0 an image step and an audio step,
group 1 only the audio step).
Every rank's rows must equal each of its group's items encoded alone, and the
tower calls of a group's ranks must hold that group's items and no other. A
runner that gathers over the TP group instead mixes the groups' rows, or
leaves a group waiting in a collective the other never enters: each step ends
at a fence (a gloo barrier on a group of its own with a short timeout), so a
waiting group fails the run in ``FENCE_S`` seconds instead of hanging it.
InternVL runs on four ranks of its own: on pristine 0.5.23 its run and the
other families' fail each for its own reason.
"""

import datetime
import types

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402

WORLD, ATTN_TP = 4, 2
FENCE_S = 45  # the most one group may wait for the other at a step's end
TOWERS_OF = {  # the modules each family's DP runner hands a rank's share
    "internvl": ("vision_model.encoder",),
    "qwen3_vl": ("visual",),
    "minimax_vl": ("vision_tower",),
    "muse_spark": ("model.vision_tower", "model.audio_tower"),
}
TOLERANCE = {  # MiniMax-VL's tower runs in bf16
    "internvl": dict(rtol=1e-4, atol=1e-5),
    "qwen3_vl": dict(rtol=1e-4, atol=1e-5),
    "minimax_vl": dict(rtol=2e-2, atol=2e-2),
    "muse_spark": dict(rtol=1e-4, atol=1e-5),
}
# Per case and DP group: the steps, each a modality and its requests' items.
# Items are (kind, size); the two groups' sizes differ, so a tower call shows
# whose items it got. InternVL: tiles; Qwen3-VL / MiniMax-VL: (t, h, w)
# patches; Muse Spark: pixel (h, w), frames x (h, w), waveform samples.
CASES = {
    "internvl": {
        "same": ([("image", [[1]])], [("image", [[1]])]),
        "uneven": ([("image", [[1], [2]])], [("image", [[1]])]),
        "idle": ([("image", [[2], [1]])], []),
    },
    "qwen3_vl": {
        "same": (
            [("image", [[(1, 8, 8)], [(1, 4, 4)]])],
            [("image", [[(1, 4, 8)], [(1, 8, 4)]])],
        ),
        "uneven": (
            [("image", [[(1, 8, 8)], [(1, 4, 4), (1, 8, 4)]])],
            [("image", [[(1, 4, 8)]])],
        ),
        "idle": ([("image", [[(1, 8, 8)], [(1, 4, 4)]])], []),
        "mixed": (
            [("image", [[(1, 8, 8)]]), ("video", [[(2, 8, 8)], [(2, 4, 4)]])],
            [("image", [[(1, 4, 8)]]), ("video", [[(2, 4, 8)]])],
        ),
    },
    "minimax_vl": {
        "same": (
            [("image", [[(1, 4, 6)], [(1, 4, 4)]])],
            [("image", [[(1, 6, 4)], [(1, 8, 4)]])],
        ),
        "uneven": (
            [("image", [[(1, 4, 6)], [(1, 6, 8), (1, 4, 4)]])],
            [("image", [[(1, 6, 4)]])],
        ),
        "idle": ([("image", [[(1, 4, 6)], [(1, 4, 4)]])], []),
    },
    "muse_spark": {
        "same": (
            [("image", [[(32, 32)], [(16, 16)]])],
            [("image", [[(32, 48)], [(16, 32)]])],
        ),
        "uneven": (
            [("image", [[(32, 32)], [(48, 32), (16, 16)]])],
            [("image", [[(32, 48)]])],
        ),
        "idle": ([("image", [[(32, 32)], [(16, 16)]])], []),
        "mixed": (
            [("image", [[(32, 32)]]), ("video", [[(2, 32, 32)], [(4, 16, 16)]])],
            [("image", [[(32, 48)]]), ("video", [[(2, 16, 32)]])],
        ),
        # Group 1 has no image step: its ranks only encode their audio.
        "image_audio": (
            [("image", [[(32, 32)], [(16, 16)]]), ("audio", [[64], [96]])],
            [("audio", [[80]])],
        ),
    },
}


# ---------------------------------------------------------------------------
# Items, as each family's processor hands them over
# ---------------------------------------------------------------------------


def _hashed(item, key):
    item.set_hash(hash(key) & ((1 << 62) - 1))
    return item


def _internvl_item(tiles, seed, offset):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G

    tokens = tiles * G.INTERNVL_TOKENS_PER_TILE
    item = G.pixel_item(
        tiles, seed=seed, offset=offset, tokens=tokens, key=("dp-attn", seed)
    )
    return item, tokens


def _patch_item(kind, grid, seed, offset, config=None):
    """A Qwen3-VL-style item of ``grid`` patches: an image or a video."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    image = H.image_item(tuple(grid), seed=seed, offset=offset, config=config)
    tokens = H.tokens_per_image(grid)
    if kind == "image":
        return image, tokens
    video = MultimodalDataItem(modality=Modality.VIDEO, feature=image.feature)
    video.video_grid_thw = image.image_grid_thw
    video.offsets = image.offsets
    return _hashed(video, ("dp-attn-video", seed, tuple(grid))), tokens


def _muse_item(model, kind, size, seed, offset):
    from sglang.srt.layers.muse_spark.muse_spark_navit import (
        get_navit_patch_count,
        get_navit_video_patch_count,
    )
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    navit = model.model.vision_tower
    patch = (navit.patch_height, navit.patch_width, navit.downsample_factor)
    gen = torch.Generator().manual_seed(seed)
    if kind == "image":
        feature = torch.randn((3, *size), generator=gen)
        tokens = get_navit_patch_count(*size, *patch)
    elif kind == "video":
        frames, h, w = size
        feature = torch.randn((frames, 3, h, w), generator=gen)
        tokens = get_navit_video_patch_count(frames, h, w, navit.patch_temporal, *patch)
    else:
        feature = torch.randn(size, generator=gen)
        tokens = -(-size // model.model.audio_tower.patch_size)
    modality = {"image": Modality.IMAGE, "video": Modality.VIDEO}.get(
        kind, Modality.AUDIO
    )
    item = MultimodalDataItem(modality=modality, feature=feature)
    item.offsets = [(offset, offset + tokens - 1)]
    return _hashed(item, ("dp-attn-muse", kind, seed)), tokens


def _requests(family, model, kind, sizes_per_request, seed):
    """Whole prompts: text, each item's placeholder span, text after each."""
    requests = []
    for r, sizes in enumerate(sizes_per_request):
        items, pos = [], H.TEXT_BEFORE
        for k, size in enumerate(sizes):
            s = seed * 100 + r * 10 + k
            if family == "internvl":
                item, tokens = _internvl_item(size, s, pos)
            elif family == "muse_spark":
                item, tokens = _muse_item(model, kind, size, s, pos)
            else:
                facts = _MINIMAX_PATCHES if family == "minimax_vl" else None
                item, tokens = _patch_item(kind, size, s, pos, facts)
            items.append(item)
            pos += tokens + H.TEXT_BETWEEN
        requests.append(H.Request(items=items, length=pos))
    return requests


# MiniMax-VL's patch rows: RGB, two frames, 14-pixel patches, merged 2x2.
_MINIMAX_PATCHES = types.SimpleNamespace(
    vision_config=types.SimpleNamespace(
        in_channels=3, temporal_patch_size=2, patch_size=14, spatial_merge_size=2
    )
)


# ---------------------------------------------------------------------------
# The ranks
# ---------------------------------------------------------------------------


def _config(family):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G
    from cpu_support.tiny_models import tiny_omni_muse as O
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    return {
        "internvl": G.tiny_internvl_config,
        "qwen3_vl": T.tiny_qwen3_vl_config,
        "muse_spark": O.tiny_muse_spark_config,
    }.get(family, T.tiny_qwen3_vl_config)()


def _publish(family, rank):
    """This rank's runtime context: the served model ``family``, TP 4, DP 2,
    DP attention, the DP encoder."""
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    return T.publish_cpu_context(
        tp_size=WORLD,
        rank=rank,
        dp_encoder=True,
        model_path=T.write_config_dir(_config(family)),
        dp_size=WORLD // ATTN_TP,
        enable_dp_attention=True,
    )


def _build(family):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G
    from cpu_support.tiny_models import tiny_kimi_minimax as K
    from cpu_support.tiny_models import tiny_omni_muse as O
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    return {
        "internvl": lambda: G.build_tiny_internvl(seed=4),
        "qwen3_vl": lambda: T.build_tiny_qwen3_vl(seed=5),
        "minimax_vl": lambda: K.build_tiny_minimax_vl(seed=6),
        "muse_spark": lambda: O.build_tiny_muse_spark(seed=7),
    }[family]()


def _encoder(model, kind, calls=None):
    """The model's own ``get_<kind>_feature``, bound to it (the gate reads the
    model from it); with ``calls``, appending each call's item count first."""
    real = getattr(type(model), f"get_{kind}_feature")

    def encode(self, items):
        if calls is not None:
            calls.append(len(items))
        return real(self, items)

    encode.__name__ = real.__name__
    return types.MethodType(encode, model)


def _data_parallel_flag(family, model):
    """The object and attribute that put ``family``'s encoder on its DP runner."""
    if family == "internvl":
        return model.vision_model, "use_data_parallel"
    if family == "muse_spark":
        return model, "use_data_parallel_encoder"
    return model, "use_data_parallel"


def _alone(family, model, kind, requests):
    """Each item encoded alone by this rank, its tower called without the DP
    runner: the rows a step must give, windowed as the scheduler windows them."""
    owner, flag = _data_parallel_flag(family, model)
    setattr(owner, flag, False)
    try:
        encode = types.SimpleNamespace(get_image_feature=_encoder(model, kind))
        return H.reference_rows(encode, requests)
    finally:
        setattr(owner, flag, True)


def _tower_inputs(module, seen):
    """What each call of the tower got: tiles (InternViT), grids (a
    ``grid_thw`` tower), or each input's shape (Muse Spark's NaViT)."""

    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        if isinstance(x, list):
            seen.append(tuple(tuple(v.shape) for v in x))
            return
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if grid is not None:
            rows = grid.tolist() if isinstance(grid, torch.Tensor) else list(grid)
            seen.append(tuple(tuple(int(v) for v in row) for row in rows))
        else:
            seen.append(int(x.shape[0]))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def _worker(rank, world_size, init_method, families):
    """One rank of the server: every case of ``families``, its DP group's steps
    only, each rank's rows, its group's items alone, its tower calls and its
    encoder calls."""
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.runtime_context import get_parallel

    args = _publish("internvl", rank)
    T.init_gloo(rank, world_size, init_method)
    initialize_dp_attention(args)
    fence = torch.distributed.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=FENCE_S)
    )
    parallel = get_parallel()
    group = parallel.attn_dp_rank
    out = {
        "topology": (
            parallel.tp_size,
            parallel.attn_tp_size,
            parallel.attn_tp_rank,
            group,
            tuple(parallel.attn_tp_group.ranks),
        )
    }
    for family in families:
        cases = CASES[family]
        _publish(family, rank)
        model = _build(family)
        towers = [model.get_submodule(name) for name in TOWERS_OF[family]]
        for case, steps_of in cases.items():
            rows, alone, seen, calls = [], [], [], []
            for s, (kind, sizes) in enumerate(steps_of[group]):
                requests = _requests(
                    family, model, kind, sizes, seed=1000 * group + 10 * s
                )
                H.fresh_embedding_cache()
                handles = [_tower_inputs(tower, seen) for tower in towers]
                try:
                    with H.on_platform("ROCm"), torch.no_grad():
                        encode = types.SimpleNamespace(
                            get_image_feature=_encoder(model, kind, calls)
                        )
                        rows.append(H.run_prefill_embedding(encode, requests))
                finally:
                    for handle in handles:
                        handle.remove()
                with torch.no_grad():
                    alone.append(_alone(family, model, kind, requests))
            try:
                # Both groups end the case here; a group left inside a
                # collective its peers never entered fails the run.
                torch.distributed.barrier(group=fence)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{family} {case}: DP group {group} waited {FENCE_S}s at the "
                    f"step's end for the other group ({exc})"
                ) from None
            out[family, case] = dict(rows=rows, alone=alone, tower=seen, calls=calls)
    return out


@pytest.fixture(scope="module")
def ranks():
    """The families whose runners use the attention-TP group in 0.5.23."""
    return run_on_ranks(_worker, WORLD, [f for f in CASES if f != "internvl"])


@pytest.fixture(scope="module")
def internvl_ranks():
    """InternVL on ranks of their own: pristine's tile runner leaves a group
    waiting, which ends that run and must not end the other families'."""
    return run_on_ranks(_worker, WORLD, ["internvl"], timeout=300)


TOPOLOGY = [  # (tp_size, attn_tp_size, attn_tp_rank, DP group, attention-TP ranks)
    (4, 2, 0, 0, (0, 1)),
    (4, 2, 1, 0, (0, 1)),
    (4, 2, 0, 1, (2, 3)),
    (4, 2, 1, 1, (2, 3)),
]


def _tiles_a_rank(steps):
    """InternVL: one call a step, ceil(tiles / attention-TP) tiles a rank."""
    return [-(-sum(sum(r) for r in sizes) // ATTN_TP) for _, sizes in steps]


def _calls(steps):
    """The encoder calls a group's ranks each make: on ROCm the series batches
    a step's images or videos into one call; audio stays one a request."""
    return [
        n
        for kind, sizes in steps
        for n in (
            [len(r) for r in sizes] if kind == "audio" else [sum(map(len, sizes))]
        )
    ]


PARAMS = [
    pytest.param(family, case, id=f"{family}-{case}")
    for family, cases in CASES.items()
    for case in cases
]


@pytest.mark.parametrize("family,case", PARAMS)
def test_each_dp_group_gets_its_own_items_rows(request, family, case):
    """Per rank: the step's encoder calls (one batched call a step), and rows
    equal to each of its group's items alone; the idle group's ranks call no
    encoder. Per group: its ranks hold the same rows, and their towers
    encoded its items, each once, and none of the other group's."""
    ranks = request.getfixturevalue(
        "internvl_ranks" if family == "internvl" else "ranks"
    )
    # SGLang's own group builders: TP 4, attention-TP 2, groups {0,1} {2,3}.
    assert [r["topology"] for r in ranks] == TOPOLOGY
    for rank, r in enumerate(ranks):
        steps = CASES[family][case][rank // ATTN_TP]
        got = r[family, case]
        assert got["calls"] == _calls(steps)
        assert len(got["rows"]) == len(steps)
        for rows, alone in zip(got["rows"], got["alone"]):
            assert rows.shape == alone.shape
            torch.testing.assert_close(rows, alone, **TOLERANCE[family])
        if not steps:
            assert got["tower"] == []
    for group in range(WORLD // ATTN_TP):
        steps = CASES[family][case][group]
        members = ranks[ATTN_TP * group : ATTN_TP * (group + 1)]
        first = members[0][family, case]["rows"]
        for other in members[1:]:
            for a, b in zip(first, other[family, case]["rows"]):
                assert torch.equal(a, b)
        seen = [m[family, case]["tower"] for m in members]
        if family == "internvl":
            assert seen == [_tiles_a_rank(steps)] * ATTN_TP
        else:
            want = [
                _shape_key(family, kind, size)
                for kind, sizes in steps
                for request in sizes
                for size in request
            ]
            got = [x for calls in seen for call in calls for x in call]
            assert sorted(got) == sorted(want), seen


def _shape_key(family, kind, size):
    """How the tower hook records one item."""
    if family == "muse_spark":
        if kind == "image":
            return (3, *size)
        if kind == "video":
            frames, h, w = size
            return (frames, 3, h, w)
        return (size,)
    return tuple(size)
