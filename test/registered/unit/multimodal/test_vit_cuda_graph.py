"""The ViT CUDA graph path under the series: owned outputs, and a bound that
does not use up custom all-reduce's registrations.

With ``SGLANG_VIT_ENABLE_CUDA_GRAPH=1`` the Qwen3-VL tower returns what
``ViTCudaGraphRunner.replay`` returns. The runner's ``run`` / ``replay`` and the
real ``_get_chunked_prefill_embedding`` run here; only the capture is stood in
(there is no CUDA): the stand-in graph computes the tower's blocks and merger
from the runner's static input buffer and writes the result into the runner's
static output buffer on every replay, as a captured graph does. Two images of
one size share a sequence layout, so they share that buffer. The tower's
runner is built to capture its ``sdpa`` attention (the series runs that
backend eagerly) on a layout's first call (``SGLANG_VIT_CUDA_GRAPH_MIN_HITS``
1): every call here is a capture or a replay.

Every embedding the scheduler keeps owns its storage. Covered: same-layout
calls under ``--mm-max-encoder-input-tokens-per-batch``, the DP encoder on two
gloo ranks, and a cache hit after a later same-layout call. Each image must
come back with the embedding the graph path
gives it when it is encoded alone (the graph path interpolates position
embeddings its own way, so that is the reference, not the eager tower's).
"""

import contextlib
import os

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=7, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import free_port, run_on_ranks  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402

GRAPH_ENV = "SGLANG_VIT_ENABLE_CUDA_GRAPH"
GRID = (1, 8, 8)  # one size: every single-image call has the same layout


class _StandInGraph:
    def __init__(self, replay):
        self.replay = replay


def _blocks_and_merger(runner, graph_key, cos, sin):
    """What the captured graph computes: the tower's blocks (and deepstack
    mergers) and merger on the runner's static input buffer."""
    from sglang.srt.models.qwen3_vl import prepare_vision_attention_metadata

    vit = runner.vit
    x = runner.block_input[graph_key]
    cu_seqlens = runner.cu_full_len[graph_key]
    metadata = prepare_vision_attention_metadata(cu_seqlens, device=x.device)
    deepstack = []
    for layer, block in enumerate(vit.blocks):
        x = block(
            x,
            cu_seqlens=cu_seqlens,
            rotary_pos_emb_cos=cos,
            rotary_pos_emb_sin=sin,
            forward_metadata=metadata,
        )
        if layer in vit.deepstack_visual_indexes:
            deepstack.append(vit.deepstack_merger_list[len(deepstack)](x))
    return torch.cat([vit.merger(x)] + deepstack, dim=1)


def _capture(
    self,
    graph_key,
    position_embeddings=None,
    rotary_pos_emb_cos=None,
    rotary_pos_emb_sin=None,
):
    """Stands in for ``ViTCudaGraphRunner._create_graph``: inside the runner's
    own capture context, allocate the static output; each replay writes the
    tower's result for the current input buffer into it."""

    def compute():
        with torch.no_grad():
            return _blocks_and_merger(
                self, graph_key, rotary_pos_emb_cos, rotary_pos_emb_sin
            )

    with self._capture_context():
        self.block_output[graph_key] = compute()
    static_output = self.block_output[graph_key]
    self.block_graphs[graph_key] = _StandInGraph(lambda: static_output.copy_(compute()))


def with_graph_runner(model):
    """``model`` with a fresh runner for its tower that captures ``sdpa`` (the
    stand-in can) on a layout's first call: what replays return is tested."""
    from sglang.srt.environ import envs
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    real = ViTCudaGraphRunner.graph_attn_backends
    ViTCudaGraphRunner.graph_attn_backends = ("sdpa",)
    try:
        with envs.SGLANG_VIT_CUDA_GRAPH_MIN_HITS.override(1):
            runner = ViTCudaGraphRunner(model.visual)
    finally:
        ViTCudaGraphRunner.graph_attn_backends = real
    assert runner.can_capture and runner.min_hits == 1
    model.visual.graph_runners = runner
    return model


@contextlib.contextmanager
def graph_on():
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    real = ViTCudaGraphRunner._create_graph
    ViTCudaGraphRunner._create_graph = _capture
    os.environ[GRAPH_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(GRAPH_ENV, None)
        ViTCudaGraphRunner._create_graph = real


@contextlib.contextmanager
def serving(*, cap=None):
    """CUDA's platform facts (cross-request batching on); the cap only when
    asked for."""
    from sglang.srt.runtime_context import get_mm

    with contextlib.ExitStack() as stack:
        stack.enter_context(H.on_platform("CUDA"))
        stack.enter_context(torch.no_grad())
        if cap is not None:
            cap_args = dict(mm_max_encoder_input_tokens_per_batch=cap)
            stack.enter_context(get_mm().override(**cap_args))
        yield


def _requests(seed):
    """Two single-image requests, both images of one size."""
    return [H.make_request([GRID], seed=seed), H.make_request([GRID], seed=seed + 1)]


def _step(model, requests, **serve):
    """One prefill step of the real scheduler path, graph on; the tower's
    calls as the images each carried."""
    with graph_on(), serving(**serve), H.TowerCalls() as seen:
        seen.attach(model.visual)
        rows = H.run_prefill_embedding(model, requests)
    # Copied now: rows that still alias a graph buffer must not be refreshed
    # by the reference's own calls before they are compared.
    return rows.clone(), [len(call) for call in seen.calls]


def _alone(model, requests):
    """Each image encoded alone through the graph path, its rows copied
    before the next call (``torch.cat`` of one request's rows copies)."""
    with graph_on(), serving():
        return torch.cat([H.reference_rows(model, [req]) for req in requests])


@pytest.fixture(scope="module")
def model():
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    return with_graph_runner(T.build_tiny_qwen3_vl(seed=3))


@pytest.mark.control(
    reason="precondition of this module: two images of one size, encoded alone through the graph path, differ"
)
def test_two_images_of_one_size_have_different_embeddings(model):
    """So an image that comes back with the other's embedding is seen."""
    first, second = _alone(model, _requests(seed=5)).chunk(2)
    assert not torch.allclose(first, second, atol=1e-2)


def test_same_layout_calls_under_the_cap_keep_their_own_embeddings(model):
    requests = _requests(seed=10)
    H.fresh_embedding_cache()
    # A cap of one patch puts each image in its own call of the step.
    rows, calls = _step(model, requests, cap=1)
    assert calls == [1, 1]
    assert torch.equal(rows, _alone(model, requests))


def test_a_cache_hit_after_a_later_same_layout_call_returns_its_own_embedding(model):
    first, second = _requests(seed=30)
    H.fresh_embedding_cache()
    _step(model, [first])  # encoded alone, cached
    _step(model, [second])  # same layout: the graph's next replay
    rows, calls = _step(model, [first])
    assert calls == []  # a cache hit
    assert torch.equal(rows, _alone(model, [first]))


def _dp_rank_worker(rank, world_size, init_method):
    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    model = with_graph_runner(T.build_tiny_qwen3_vl(seed=3))
    requests = _requests(seed=40)
    alone = _alone(model, requests)
    H.fresh_embedding_cache()
    rows, calls = _step(model, requests, cap=1)
    return {"rows": rows, "alone": alone, "calls": calls}


@pytest.fixture(scope="module")
def dp_ranks():
    return run_on_ranks(_dp_rank_worker, 2, timeout=300)


def test_dp_encoder_ranks_agree_with_each_other_and_with_each_image_alone(dp_ranks):
    rank0, rank1 = dp_ranks
    # Two calls of one image each: the owner rank encodes, the peer receives.
    assert sorted(rank0["calls"] + rank1["calls"]) == [1, 1]
    assert torch.equal(rank0["alone"], rank1["alone"])
    for out in dp_ranks:
        assert torch.equal(out["rows"], out["alone"])
    assert torch.equal(rank0["rows"], rank1["rows"])
