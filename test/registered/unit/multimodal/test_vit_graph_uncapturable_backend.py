"""ViT CUDA graph flag on, attention backend the runner cannot capture: the
tower computes what it computes with the flag off.

SGLang's real tiny Qwen3-VL and Qwen2.5-VL towers (random weights, CPU, fp32)
attend with ``sdpa``, which ``ViTCudaGraphRunner`` cannot capture. With
``SGLANG_VIT_ENABLE_CUDA_GRAPH=1`` each tower's output equals its output with
the flag off, bitwise; the runner's ``run`` is never called; and the attention
layers see the flag off too: they call SGLang's ``apply_rotary_pos_emb``, not
the eager rotary function the graph path captures (on this CPU the two give the
same bits, so the bitwise check alone would not tell them apart).

Qwen2.5-VL builds its runner only on CUDA; here it is built as CUDA builds it.
A Qwen2.5-VL call made with the flag off (as the vision warm-up makes its
calls) does not reach the runner, even one that could capture its backend.
"""

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=14, suite="stage-a-test-cpu")

from cpu_support.ranks.gloo import free_port  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.tiny_models.tiny_vl_family import build_tiny_qwen2_5_vl  # noqa: E402

# A 4x12 grid alone, then with a 4x4 one: the graph path's own inputs give
# other rows for these (it interpolates Qwen3-VL's position embeddings its way).
CALLS = [[(1, 4, 12)], [(1, 4, 12), (1, 4, 4)], [(1, 8, 8)]]


@pytest.fixture(scope="module")
def towers():
    from sglang.srt.environ import envs
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    with envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.override(True):
        qwen3 = T.build_tiny_qwen3_vl(seed=3).visual
        qwen2_5 = build_tiny_qwen2_5_vl(seed=4).visual
        # What Qwen2_5_VisionTransformer.__init__ does on CUDA.
        qwen2_5.enable_cg = True
        qwen2_5.cuda_graph_runner = ViTCudaGraphRunner(qwen2_5)
    return {"qwen3_vl": qwen3, "qwen2_5_vl": qwen2_5}


def _runner(tower):
    return getattr(tower, "graph_runners", None) or tower.cuda_graph_runner


def _pixels(tower, grids, seed):
    embed = tower.patch_embed
    width = embed.in_channels * embed.temporal_patch_size * embed.patch_size**2
    rows = sum(t * h * w for t, h, w in grids)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=generator), torch.tensor(grids)


@pytest.fixture
def seen(monkeypatch):
    """Which of the runner's ``run`` and VisionAttention's two rotary
    functions each call reached, by name."""
    from sglang.srt.layers.attention import vision
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    names = []

    def spy(owner, name):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            names.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    spy(vision, "apply_rotary_pos_emb")
    spy(vision, "apply_rotary_pos_emb_native_eager")
    spy(ViTCudaGraphRunner, "run")
    return names


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen2_5_vl"])
def test_flag_on_gives_the_flag_off_output_bitwise(towers, seen, name):
    from sglang.srt.environ import envs

    tower = towers[name]
    runner = _runner(tower)
    assert runner._attn_backend == "sdpa" and not runner.can_capture
    for seed, grids in enumerate(CALLS * 2):
        pixels, grid_thw = _pixels(tower, grids, seed % len(CALLS))
        with torch.no_grad():
            off = tower(pixels, grid_thw)
            off_path, seen[:] = sorted(set(seen)), []
            with envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.override(True):
                on = tower(pixels, grid_thw)
            on_path, seen[:] = sorted(set(seen)), []
        assert torch.equal(on, off), (grids, (on - off).abs().max())
        assert on_path == off_path == ["apply_rotary_pos_emb"]
    assert runner.block_graphs == {} and not runner._seen


def test_qwen2_5_vl_flag_off_call_skips_a_runner_that_could_capture(
    towers, seen, monkeypatch
):
    from sglang.srt.environ import envs
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    tower = towers["qwen2_5_vl"]
    monkeypatch.setattr(ViTCudaGraphRunner, "graph_attn_backends", ("sdpa",))
    with envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.override(True):
        monkeypatch.setattr(tower, "cuda_graph_runner", ViTCudaGraphRunner(tower))
    assert tower.cuda_graph_runner.can_capture
    pixels, grid_thw = _pixels(tower, CALLS[1], seed=0)
    with torch.no_grad():
        tower(pixels, grid_thw)
    assert "run" not in seen and not tower.cuda_graph_runner._seen
