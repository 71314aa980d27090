"""The DP encoder's exact gather at attention-TP 4, ranks with no share included.

Four gloo ranks run SGLang's three padding DP runners on tiny towers with
random weights, over their real attention-TP group: the mrope runner (a
Qwen3-VL vision tower), the pre-sharded video runner (the same tower) and
InternVL's tile runner (an InternViT encoder). Each call runs twice: on gloo
as it is (one broadcast per rank with rows), and with a PyNccl communicator
whose variable-size all-gather is gloo broadcasts (through SGLang's
``GroupCoordinator.all_gatherv``). A third run forces the padded all-gather:
every rank's rows must be bitwise equal to it. A one-image call keeps its
single broadcast.
"""

import contextlib
import hashlib

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402

RANKS = 4
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64) | dict(
    in_channels=3, patch_size=4, temporal_patch_size=2, spatial_merge_size=2
)
VISION |= dict(out_hidden_size=16, num_position_embeddings=64)
VISION |= dict(deepstack_visual_indexes=[])
PATCH = 3 * 2 * 4 * 4
INTERN_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1) | dict(
    num_attention_heads=2, image_size=32, patch_size=8, qkv_bias=True
)
INTERN_VIT |= dict(qk_normalization=False, norm_type="layer_norm", hidden_act="gelu")
# Three images on four ranks: 16, 4 and 2 rows on ranks 0-2, none on rank 3.
THREE = [[1, 4, 4], [1, 8, 8], [1, 2, 4]]
ONE = [[1, 8, 8]]
# Pre-sharded frames: two on rank 0, one on ranks 1 and 2, none on rank 3.
FRAMES, COUNTS = [[1, 4, 4]] * 4, [2, 1, 1, 0]
TILES = 5  # two a rank: 2, 2, 1 and a padding tile, 0


class GlooPyNccl:
    """PyNccl's variable-size all-gather contract, as gloo broadcasts."""

    available = True

    def __init__(self, group):
        self.group, self.disabled, self.sizes = group, True, []

    @contextlib.contextmanager
    def change_state(self, enable=None):
        before, self.disabled = self.disabled, not enable
        try:
            yield
        finally:
            self.disabled = before

    def group_start(self):
        pass

    def group_end(self):
        pass

    def all_gather(self, output, input_, sizes=None):
        self.sizes.append(sizes)
        start = 0
        for root, rows in enumerate(sizes or [input_.shape[0]] * len(self.group.ranks)):
            piece = output[start : start + rows]
            if root == self.group.rank_in_group:
                piece.copy_(input_)
            if rows:
                torch.distributed.broadcast(
                    piece, src=self.group.ranks[root], group=self.group.device_group
                )
            start += rows


def _fill(model):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_qwen3_vl as Q

    from sglang.srt.configs.internvl import InternVisionConfig
    from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig
    from sglang.srt.models.internvl import InternVisionModel
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel
    from sglang.srt.multimodal import mm_utils
    from sglang.srt.runtime_context import get_parallel

    Q.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    Q.init_gloo(rank, world_size, init_method)
    tower = _fill(
        Qwen3VLMoeVisionModel(Qwen3VLVisionConfig(**VISION), use_data_parallel=True)
    )
    intern_vit = _fill(
        InternVisionModel(InternVisionConfig(**INTERN_VIT), use_data_parallel=True)
    )
    group = get_parallel().attn_tp_group

    def mrope(grids):
        pixels = _randn(sum(t * h * w for t, h, w in grids), PATCH, seed=1)
        return mm_utils.run_dp_sharded_mrope_vision_model(
            tower, pixels, grids, rope_type="rope_3d"
        )

    def presharded():
        mine = FRAMES[sum(COUNTS[:rank]) :][: COUNTS[rank]]
        pixels = _randn(16 * len(mine), PATCH, seed=2 + rank)
        return mm_utils.run_dp_presharded_mrope_vision_model(
            tower, pixels, mine, FRAMES, COUNTS
        )

    def tiles():
        embeddings = _randn(TILES, 17, 32, seed=3)
        return mm_utils.run_dp_sharded_vision_model(embeddings, intern_vit.encoder)

    def collectives(call, pynccl):
        seen, real = [], {}
        for name in ("all_gather", "all_gatherv", "broadcast"):
            real[name] = getattr(group, name)

            def wrapped(tensor, *args, _name=name, **kwargs):
                seen.append((_name, tensor.shape[0], kwargs.get("sizes")))
                return real[_name](tensor, *args, **kwargs)

            setattr(group, name, wrapped)
        group.pynccl_comm, comm = pynccl, group.pynccl_comm
        try:
            rows = call()
        finally:
            group.pynccl_comm = comm
            for name in real:
                delattr(group, name)
        return rows, seen

    chosen = mm_utils.dp_encoder_gather_path
    out = {}
    with torch.no_grad():
        for name, call in (
            ("three", lambda: mrope(THREE)),
            ("one", lambda: mrope(ONE)),
            ("presharded", presharded),
            ("tiles", tiles),
        ):
            gloo_rows, gloo_seen = collectives(call, None)
            pynccl = GlooPyNccl(group)
            v_rows, v_seen = collectives(call, pynccl)
            mm_utils.dp_encoder_gather_path = lambda *a: "padded"
            try:
                padded_rows, padded_seen = collectives(call, None)
            finally:
                mm_utils.dp_encoder_gather_path = chosen
            out[name] = dict(
                gloo=gloo_seen,
                gatherv=v_seen,
                padded=padded_seen,
                sizes=pynccl.sizes,
                rows=(
                    len(padded_rows),
                    hashlib.sha256(padded_rows.numpy().tobytes()).hexdigest(),
                ),
                equal=torch.equal(gloo_rows, padded_rows)
                and torch.equal(v_rows, padded_rows),
            )
    return out


@pytest.fixture(scope="module")
def by_rank():
    return run_on_ranks(_worker, RANKS, timeout=600)


def test_zero_share_rank_included_in_all_gatherv_and_rows_equal_padded(by_rank):
    for rank, r in enumerate(by_rank):
        three = r["three"]
        rows = [16, 4, 2, 0][rank]
        assert three["gatherv"] == [("all_gatherv", rows, [16, 4, 2, 0])]
        assert three["sizes"] == [[16, 4, 2, 0]]
        # gloo: one broadcast per rank with rows, none for the empty rank.
        assert three["gloo"] == [("broadcast", n, None) for n in (16, 4, 2)]
        assert three["padded"] == [("all_gather", 16, None)]
        assert three["equal"]
    assert all(r["three"]["rows"] == by_rank[0]["three"]["rows"] for r in by_rank)


def test_one_image_keeps_its_single_broadcast(by_rank):
    for r in by_rank:
        one = r["one"]
        assert one["gloo"] == one["gatherv"] == [("broadcast", 16, None)]
        assert one["sizes"] == [] and one["equal"]


def test_presharded_frames_with_an_empty_rank(by_rank):
    for rank, r in enumerate(by_rank):
        pre = r["presharded"]
        assert pre["sizes"] == [[8, 4, 4, 0]]
        assert pre["gloo"] == [("broadcast", n, None) for n in (8, 4, 4)]
        assert pre["equal"] and pre["rows"][0] == 16


def test_internvl_tiles_skip_the_padding_tile(by_rank):
    for rank, r in enumerate(by_rank):
        t = r["tiles"]
        assert t["gatherv"] == [("all_gatherv", [2, 2, 1, 0][rank], [2, 2, 1, 0])]
        assert t["padded"] == [("all_gather", 2, None)]
        assert t["equal"] and t["rows"][0] == TILES
