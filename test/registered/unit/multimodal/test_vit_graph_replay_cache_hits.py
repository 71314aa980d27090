"""ViT CUDA graph replays and the scheduler's embedding cache, end to end.

The series' first patch makes every ViT graph runner return a copy of a
replay's output; its carried test shows that on the runners with a stand-in
graph. Here the real tiny Qwen3-VL and Kimi-K3 towers run through their own
graph paths, and a cache hit after a later same-layout prefill step returns
the cached image's own rows. Only the capture is stood in
(``ViTCudaGraphRunner._create_graph``, ``KimiK3ViTCudaGraphRunner._capture``):
like a captured graph, the stand-in owns one static output per layout and
each replay recomputes the tower into that same tensor.
"""

import socket

import pytest
import torch

from sglang.srt.configs.kimi_k3 import KimiK3VisionConfig
from sglang.srt.configs.qwen3_vl import Qwen3VLConfig
from sglang.srt.distributed.parallel_state import (
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
)
from sglang.srt.environ import envs
from sglang.srt.managers import mm_schedule
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem
from sglang.srt.models.kimi_k3_vl import KimiK3VisionTower
from sglang.srt.models.qwen3_vl import (
    Qwen3VLForConditionalGeneration,
    prepare_vision_attention_metadata,
)
from sglang.srt.multimodal.kimi_k3_vit_cuda_graph_runner import (
    KimiK3ViTCudaGraphRunner,
    _CapturedVisionGraph,
)
from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner
from sglang.srt.runtime_context import SpawnRanks, override_platform, publish
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

GRID = (1, 8, 8)  # every image of this size has the same sequence layout
PATCH_VALUES = 3 * 2 * 16 * 16  # channels x temporal patch x patch x patch
TOKENS = GRID[0] * GRID[1] * GRID[2] // 4  # patches merged 2x2
TEXT_BEFORE = 3  # text tokens before a request's image


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fill_random_weights(module, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("bias"):
                noise = 0.02 * noise
            elif param.dim() == 1:
                noise = 1.0 + 0.05 * noise
            else:
                noise = noise / param.shape[-1] ** 0.5
            param.copy_(noise.to(param.dtype))


def _tiny_qwen3_vl_config():
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            patch_size=16,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=64,
            num_position_embeddings=256,
            deepstack_visual_indexes=[1],
        ),
    )
    # SGLang's Qwen3-VL reads the text sizes from the top-level config.
    for key, value in config.text_config.to_dict().items():
        if key not in ("model_type", "architectures", "transformers_version"):
            setattr(config, key, value)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """This process as a one-rank server of a tiny Qwen3-VL, on gloo."""
    config = _tiny_qwen3_vl_config()
    model_dir = tmp_path_factory.mktemp("tiny-qwen3-vl")
    config.save_pretrained(model_dir)
    server_args = ServerArgs(
        model_path=str(model_dir),
        device="cpu",
        mm_attention_backend="sdpa",
        disable_custom_all_reduce=True,
    )
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    if not torch.distributed.is_initialized():
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            local_rank=0,
            backend="gloo",
        )
    if not model_parallel_is_initialized():
        initialize_model_parallel(backend="gloo")
    return config


@pytest.fixture(scope="module")
def model(server):
    model = Qwen3VLForConditionalGeneration(server)
    _fill_random_weights(model, seed=0)
    return model.eval()


class _StandInGraph:
    """What replaying a captured graph does: recompute into its outputs."""

    def __init__(self, replay):
        self.replay = replay


def _stand_in_create_graph(
    self,
    graph_key,
    position_embeddings=None,
    rotary_pos_emb_cos=None,
    rotary_pos_emb_sin=None,
):
    """Stands in for ``ViTCudaGraphRunner._create_graph`` (CUDA only)."""
    vit = self.vit

    def blocks_and_mergers():
        hidden = self.block_input[graph_key]
        cu_seqlens = self.cu_full_len[graph_key]
        metadata = prepare_vision_attention_metadata(cu_seqlens, device=hidden.device)
        deepstack = []
        for layer, block in enumerate(vit.blocks):
            hidden = block(
                hidden,
                cu_seqlens=cu_seqlens,
                rotary_pos_emb_cos=rotary_pos_emb_cos,
                rotary_pos_emb_sin=rotary_pos_emb_sin,
                forward_metadata=metadata,
            )
            if layer in vit.deepstack_visual_indexes:
                deepstack.append(vit.deepstack_merger_list[len(deepstack)](hidden))
        return torch.cat([vit.merger(hidden)] + deepstack, dim=1)

    with self._capture_context(), torch.no_grad():
        static_output = blocks_and_mergers()
    self.block_output[graph_key] = static_output
    self.replays = getattr(self, "replays", 0)

    def replay():
        self.replays += 1
        with torch.no_grad():
            static_output.copy_(blocks_and_mergers())

    self.block_graphs[graph_key] = _StandInGraph(replay)


@pytest.fixture
def graph_runner(model, monkeypatch):
    """The ViT CUDA graph path on a fresh runner, its capture stood in."""
    monkeypatch.setattr(ViTCudaGraphRunner, "_create_graph", _stand_in_create_graph)
    # The stand-in captures sdpa, on a layout's first call: these tests are
    # about what a replay returns.
    monkeypatch.setattr(ViTCudaGraphRunner, "graph_attn_backends", ("sdpa",))
    with envs.SGLANG_VIT_CUDA_GRAPH_MIN_HITS.override(1):
        model.visual.graph_runners = ViTCudaGraphRunner(model.visual)
    with envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.override(True), torch.no_grad():
        yield model.visual.graph_runners


def _pixels(seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(GRID[0] * GRID[1] * GRID[2], PATCH_VALUES, generator=generator)


def test_a_later_replay_does_not_rewrite_an_earlier_output(model, graph_runner):
    grid = torch.tensor([GRID])
    first = model.visual(_pixels(seed=1), grid)
    first_at_return = first.clone()
    second = model.visual(_pixels(seed=2), grid)

    # Both calls replayed the one graph of this layout.
    assert len(graph_runner.block_graphs) == 1 and graph_runner.replays == 2
    assert not torch.equal(second, first_at_return)
    assert torch.equal(first, first_at_return)
    (static_output,) = graph_runner.block_output.values()
    for output in (first, second):
        assert (
            output.untyped_storage().data_ptr()
            != static_output.untyped_storage().data_ptr()
        )


def _request(seed):
    """One request with one image of ``GRID``: its item and its length."""
    item = MultimodalDataItem(modality=Modality.IMAGE, feature=_pixels(seed))
    item.image_grid_thw = torch.tensor([GRID])
    item.offsets = [(TEXT_BEFORE, TEXT_BEFORE + TOKENS - 1)]
    item.set_hash(1000 + seed)
    return item, TEXT_BEFORE + TOKENS + 1


def _prefill_step(model, requests):
    """One prefill step of the scheduler's multimodal path: the step's image
    rows, and the grids of each tower call."""
    calls = []
    hook = model.visual.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["grid_thw"].tolist()),
        with_kwargs=True,
    )
    items = [item for item, _ in requests]
    lengths = [length for _, length in requests]
    try:
        rows, _ = mm_schedule._get_chunked_prefill_embedding(
            model.get_image_feature,
            items,
            list(range(len(items) + 1)),
            [0] * len(items),
            lengths,
            [item.offsets for item in items],
            torch.zeros(sum(lengths), dtype=torch.long),
        )
    finally:
        hook.remove()
    return rows, calls


def test_a_cache_hit_after_a_later_same_layout_call_keeps_its_embedding(
    model, graph_runner
):
    first, second = _request(seed=11), _request(seed=12)
    mm_schedule.init_mm_embedding_cache(1 << 30)
    with override_platform(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False):
        first_rows, first_calls = _prefill_step(model, [first])
        first_rows = first_rows.clone()
        second_rows, second_calls = _prefill_step(model, [second])
        hit_rows, hit_calls = _prefill_step(model, [first])

    assert first_calls == second_calls == [[list(GRID)]]
    assert hit_calls == []  # served from the embedding cache
    assert graph_runner.replays == 2
    assert not torch.equal(second_rows, first_rows)
    assert torch.equal(hit_rows, first_rows)


# ---------------------------------------------------------------------------
# Kimi-K3's runner
# ---------------------------------------------------------------------------


def _stand_in_kimi_k3_capture(
    self, key, pixel_values, grid_thws, grid_thw_list, metadata
):
    """Stands in for ``KimiK3ViTCudaGraphRunner._capture`` (CUDA only)."""
    input_buffer = pixel_values.clone()

    def tower():
        return self.tower._forward_eager(
            input_buffer,
            grid_thws,
            grid_thw_list=grid_thw_list,
            forward_metadata=metadata,
        )

    with torch.no_grad():
        outputs = tuple(tower())
    self.replays = getattr(self, "replays", 0)

    def replay():
        self.replays += 1
        with torch.no_grad():
            for static_output, output in zip(outputs, tower()):
                static_output.copy_(output)

    return _CapturedVisionGraph(
        graph=_StandInGraph(replay),
        input_buffer=input_buffer,
        outputs=outputs,
        metadata=metadata,
    )


def test_kimi_k3_replays_do_not_rewrite_earlier_outputs(server, monkeypatch):
    monkeypatch.setattr(KimiK3ViTCudaGraphRunner, "_capture", _stand_in_kimi_k3_capture)
    tower = KimiK3VisionTower(
        KimiK3VisionConfig(
            patch_size=14,
            init_pos_emb_height=16,
            init_pos_emb_width=16,
            vt_num_attention_heads=4,
            vt_num_hidden_layers=2,
            vt_hidden_size=64,
            vt_intermediate_size=128,
            qkv_hidden_size=64,
            text_hidden_size=64,
        )
    )
    _fill_random_weights(tower, seed=1)
    runner = KimiK3ViTCudaGraphRunner(tower.eval(), capacity=4, min_hits=1)
    grid_list = ((1, 8, 8),)
    grid = torch.tensor(grid_list)
    generator = torch.Generator().manual_seed(3)
    first_pixels, second_pixels = (
        torch.randn(64, 3, 14, 14, generator=generator) for _ in range(2)
    )
    with torch.no_grad():
        first = runner.run(first_pixels, grid, grid_list)
        first_at_return = [output.clone() for output in first]
        second = runner.run(second_pixels, grid, grid_list)

    # Both calls replayed the one graph captured for this grid.
    assert len(runner.graphs) == 1 and runner.replays == 2
    assert not torch.equal(second[0], first_at_return[0])
    for output, at_return in zip(first, first_at_return):
        assert torch.equal(output, at_return)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
