"""The platform gate for cross-request ViT batching, against SGLang's real code.

Everything here runs the real ``mm_schedule._get_chunked_prefill_embedding``
with SGLang's real Qwen3-VL (tiny sizes, random weights) on CPU. Platform
facts come from ``override_platform``; the attention-TP width and the DP
encoder flag from the runtime context's own scoped overrides. Encoder calls
are observed with a forward pre-hook on the real vision tower.
"""

import contextlib
import itertools
import logging

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="stage-a-test-cpu")

from cpu_support import mm_harness as H  # noqa: E402
from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.ranks import free_port, run_on_ranks  # noqa: E402

# ROCm named HIP here, in this order (the test ids follow it).
PLATFORMS = {"HIP": H.ROCM, **{name: H.PLATFORMS[name] for name in ("NPU", "XPU", "CUDA")}}


def expected_batched(platform: str, dp_encoder: bool, attn_tp: int, model_dp: bool = True) -> bool:
    """The rule, as the issues state it (not as the code computes it)."""
    if platform == "CUDA":
        return True
    if platform in ("NPU", "XPU"):
        return False
    return dp_encoder and attn_tp > 1 and model_dp


class _Model:
    """The two facts the gate reads from a loaded model: its class, and the
    DP-encoder choice it made when it was built (SGLang's VLMs store it in
    ``use_data_parallel``; a model that never reads the flag has none)."""

    def __init__(self, use_data_parallel=None):
        if use_data_parallel is not None:
            self.use_data_parallel = use_data_parallel

    def get_image_feature(self, items):
        raise AssertionError("the gate must not encode")


@contextlib.contextmanager
def setting(platform: str, dp_encoder: bool, attn_tp: int):
    """Scoped platform + DP-encoder flag; the attention-TP width must already
    be what the process published (the runtime context validates it against
    the built TP groups, so it cannot be faked in a TP1 process)."""
    from sglang.srt.runtime_context import get_mm, get_parallel, override_platform

    assert get_parallel().attn_tp_size == attn_tp
    with override_platform(**PLATFORMS[platform]), get_mm().override(
        mm_enable_dp_encoder=dp_encoder
    ):
        yield


# In the model's process the TP groups are built at width 1, so the runtime
# context refuses a wider attention-TP override there: the ROCm + DP encoder +
# attention-TP 2 case runs on two real gloo ranks below, and the one-process
# scheduler tests compare CUDA (batched) with ROCm at attention-TP 1.
BATCHED = ("CUDA", False, 1)
PER_REQUEST = ("HIP", True, 1)


@pytest.fixture(scope="module")
def model():
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    torch.manual_seed(0)
    return T.build_tiny_qwen3_vl(seed=1)


@pytest.fixture
def tower_calls(model):
    H.fresh_embedding_cache()
    calls = H.TowerCalls().attach(model.visual)
    yield calls
    calls.detach()


# ---------------------------------------------------------------------------
# The gate itself: every combination
# ---------------------------------------------------------------------------


def _gate_worker(rank, world_size, init_method):
    """Every combination, in a process that builds no TP groups, publishing
    each attention-TP width as a server of that width would."""
    from sglang.srt.multimodal import vit_batching
    from sglang.srt.managers import mm_schedule
    from sglang.srt.multimodal.mm_utils import hip_dp_encoder_batches_vit

    model_dir = T.write_config_dir()
    seen = {}
    records = H.capture_log(vit_batching.logger.name).lines
    for combo in itertools.product(PLATFORMS, (False, True), (1, 2), MODELS):
        platform, dp_encoder, attn_tp, kind = combo
        T.publish_cpu_context(tp_size=attn_tp, dp_encoder=dp_encoder, model_path=model_dir)
        # As the model would be built in this configuration.
        model = _Model({"dp": dp_encoder, "not-dp": False, "ignores-flag": None}[kind])
        vit_batching._logged_decisions.clear()  # as if a fresh process
        with setting(platform, dp_encoder, attn_tp):
            first = len(records)
            decisions = [
                mm_schedule._batch_vit_across_requests(model.get_image_feature)
                for _ in range(3)
            ]
            seen[combo] = (decisions, hip_dp_encoder_batches_vit(model), records[first:])
    return seen


MODELS = ("dp", "not-dp", "ignores-flag")


@pytest.fixture(scope="module")
def gate_matrix():
    return run_on_ranks(_gate_worker, 1, timeout=300)[0]


@pytest.mark.parametrize(
    "platform,dp_encoder,attn_tp,kind",
    list(itertools.product(PLATFORMS, (False, True), (1, 2), MODELS)),
)
def test_gate_every_combination(gate_matrix, platform, dp_encoder, attn_tp, kind):
    decisions, hip_helper, _ = gate_matrix[(platform, dp_encoder, attn_tp, kind)]
    model_dp = kind == "dp" and dp_encoder
    assert decisions == [expected_batched(platform, dp_encoder, attn_tp, model_dp)] * 3
    assert hip_helper is (platform == "HIP" and dp_encoder and attn_tp > 1 and model_dp)


@pytest.mark.parametrize(
    "combo,line",
    [
        (("HIP", True, 2, "dp"), "cross-request ViT batching: on (ROCm, DP encoder, attention-TP 2)"),
        (("HIP", True, 1, "dp"), "cross-request ViT batching: off (ROCm, attention-TP 1)"),
        (("HIP", False, 2, "dp"), "cross-request ViT batching: off (ROCm, no DP encoder)"),
        (("HIP", True, 2, "not-dp"), "cross-request ViT batching: off (ROCm, vision encoder not data-parallel)"),
        (("HIP", True, 2, "ignores-flag"), "cross-request ViT batching: off (ROCm, vision encoder not data-parallel)"),
        (("NPU", True, 2, "dp"), "cross-request ViT batching: off (NPU)"),
        (("XPU", False, 1, "dp"), "cross-request ViT batching: off (XPU)"),
        (("CUDA", False, 1, "dp"), "cross-request ViT batching: on (CUDA)"),
        (("CUDA", True, 2, "ignores-flag"), "cross-request ViT batching: on (CUDA)"),
    ],
)
def test_gate_logs_its_decision_once_at_info(gate_matrix, combo, line):
    _, _, records = gate_matrix[combo]
    logged = [(lvl, msg) for lvl, msg in records if "cross-request ViT" in msg]
    assert logged == [(logging.INFO, line)]


def test_the_model_fact_is_read_from_the_bound_encoder():
    """A bound method, a partial of one and the model itself all name the same
    model; a plain function names none (not known to be data-parallel)."""
    import functools

    from sglang.srt.multimodal.vit_batching import (
        encoder_owner,
        vision_encoder_is_data_parallel,
    )

    model = _Model(True)
    for encoder in (model.get_image_feature, functools.partial(model.get_image_feature), model):
        assert encoder_owner(encoder) is model
        assert vision_encoder_is_data_parallel(encoder) is True
    assert vision_encoder_is_data_parallel(_Model(False).get_image_feature) is False
    assert vision_encoder_is_data_parallel(_Model().get_image_feature) is False
    assert encoder_owner(lambda items: items) is None
    assert vision_encoder_is_data_parallel(lambda items: items) is False
    assert vision_encoder_is_data_parallel(None) is False


# ---------------------------------------------------------------------------
# The real scheduler path
# ---------------------------------------------------------------------------


def _two_single_image_requests():
    return [H.make_request([(1, 8, 8)], seed=11), H.make_request([(1, 12, 8)], seed=12)]


@pytest.mark.parametrize(
    "gate,expected_calls",
    [(BATCHED, [2]), (PER_REQUEST, [1, 1]), (("CUDA", False, 1), [2]), (("NPU", True, 1), [1, 1]), (("XPU", True, 1), [1, 1])],
)
def test_two_single_image_requests_one_call_only_under_gate(model, tower_calls, gate, expected_calls):
    requests = _two_single_image_requests()
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        tower_calls.reset()
        with setting(*gate):
            out = H.run_prefill_embedding(model, requests)
    assert [len(c) for c in tower_calls.calls] == expected_calls
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


def test_batched_and_per_request_give_the_same_embeddings(model):
    requests = [H.make_request(g, seed=20 + i) for i, g in enumerate([[(1, 8, 8)], [(1, 8, 12), (1, 4, 8)], [(1, 16, 8)]])]
    with torch.no_grad():
        H.fresh_embedding_cache()
        with setting(*BATCHED):
            batched = H.run_prefill_embedding(model, requests)
        H.fresh_embedding_cache()
        with setting(*PER_REQUEST):
            per_request = H.run_prefill_embedding(model, requests)
    torch.testing.assert_close(batched, per_request, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Per-request behaviours that must not change, on both paths
# ---------------------------------------------------------------------------

BOTH_PATHS = pytest.mark.parametrize("gate", [BATCHED, PER_REQUEST], ids=["batched", "per-request"])


@BOTH_PATHS
def test_cache_hits_skip_the_encoder(model, tower_calls, gate):
    requests = _two_single_image_requests()
    with torch.no_grad(), setting(*gate):
        first = H.run_prefill_embedding(model, requests)
        assert tower_calls.images == 2
        tower_calls.reset()
        second = H.run_prefill_embedding(model, requests)
    assert tower_calls.calls == []
    assert torch.equal(first, second)


@BOTH_PATHS
def test_cached_entry_with_wrong_token_count_is_reencoded(model, tower_calls, gate):
    from sglang.srt.managers import mm_schedule
    from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

    requests = _two_single_image_requests()
    stale = requests[0].items[0]
    mm_schedule.embedding_cache.set(stale.hash, EmbeddingResult(embedding=torch.zeros(3, 128)))
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        tower_calls.reset()
        with setting(*gate):
            out = H.run_prefill_embedding(model, requests)
    assert tower_calls.images == 2  # the stale entry was not served
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


@BOTH_PATHS
def test_multi_span_items_take_the_full_path(model, tower_calls, gate):
    """A two-span item (video-like) is encoded with its own request's items,
    never folded into the cross-request batch."""
    single = H.make_request([(1, 8, 8)], seed=31)
    other = H.make_request([(1, 8, 12)], seed=33)
    video_req = H.make_request([(1, 8, 8)], seed=32)
    item = video_req.items[0]
    (start, end) = item.offsets[0]
    half = (end - start + 1) // 2
    item.offsets = [(start, start + half - 1), (start + half + 3, end + 3)]
    video_req.length += 3
    requests = [single, video_req, other]
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        tower_calls.reset()
        with setting(*gate):
            out = H.run_prefill_embedding(model, requests)
    assert [(1, 8, 8)] in tower_calls.calls  # the video request's own call
    assert tower_calls.images == 3
    if gate == BATCHED:
        assert sorted(tower_calls.calls, key=len) == [[(1, 8, 8)], [(1, 8, 8), (1, 8, 12)]]
    else:
        assert [len(c) for c in tower_calls.calls] == [1, 1, 1]
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


@BOTH_PATHS
def test_colliding_hashes_with_different_lengths_are_not_deduplicated(model, tower_calls, gate):
    a = H.make_request([(1, 8, 8)], seed=41)
    b = H.make_request([(1, 8, 12)], seed=42)
    b.items[0].hash = a.items[0].hash  # same hash, different token count
    requests = [a, b]
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        tower_calls.reset()
        with setting(*gate):
            out = H.run_prefill_embedding(model, requests)
    assert tower_calls.images == 2
    assert out.shape[0] == 16 + 24
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


@BOTH_PATHS
@pytest.mark.parametrize("cut", [(0, 9), (9, 10), (14, 40)])
def test_chunk_windows_that_cut_an_image_return_the_right_rows(model, tower_calls, gate, cut):
    """Chunked prefill: [prefix, prefix + extend) cuts through image spans."""
    prefix, extend = cut
    requests = [H.make_request([(1, 8, 8), (1, 8, 12)], seed=51), H.make_request([(1, 12, 8)], seed=52)]
    requests[0].prefix, requests[0].extend = prefix, extend
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        with setting(*gate):
            out = H.run_prefill_embedding(model, requests)
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Two gloo ranks: where the images of a step land with the DP encoder
# ---------------------------------------------------------------------------


def _rank_worker(rank, world_size, init_method, grids_per_request, batched, model_dp=True):
    from cpu_support import mm_harness as H
    from cpu_support import tiny_qwen3_vl as T
    from sglang.srt.runtime_context import get_mm, override_platform

    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=model_dp)
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(seed=1)
    H.fresh_embedding_cache()
    requests = [H.make_request(g, seed=100 + i) for i, g in enumerate(grids_per_request)]
    rocm = dict(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False)
    with torch.no_grad(), override_platform(**rocm):
        if not model_dp:
            # A model whose encoder is not data-parallel (here Qwen3-VL built
            # without the DP encoder: its tower is TP-sharded) served with the
            # flag on: the flag distributes nothing, so ROCm stays per-request.
            gate_ctx = get_mm().override(mm_enable_dp_encoder=True)
        elif batched:
            gate_ctx = contextlib.nullcontext()
        else:
            # Upstream 0.5.23 on ROCm: the gate says per-request while the model
            # (built with the DP encoder) still shards each call over both ranks.
            gate_ctx = get_mm().override(mm_enable_dp_encoder=False)
        with gate_ctx, H.TowerCalls().attach(model.visual) as calls:
            out = H.run_prefill_embedding(model, requests)
        alone = H.reference_rows(model, requests)
    return {"calls": calls.calls, "out": out, "alone": alone}


def test_two_ranks_per_request_idles_a_rank_batching_feeds_both():
    grids = [[(1, 8, 8)], [(1, 8, 8)], [(1, 8, 12)], [(1, 8, 8)]]
    per_request = run_on_ranks(_rank_worker, 2, grids, False, timeout=300)
    batched = run_on_ranks(_rank_worker, 2, grids, True, timeout=300)

    pr_images = [sum(len(c) for c in r["calls"]) for r in per_request]
    b_images = [sum(len(c) for c in r["calls"]) for r in batched]
    assert sorted(pr_images) == [0, 4], pr_images  # one rank does all the work
    assert min(b_images) >= 1 and sum(b_images) == 4, b_images  # both ranks work
    assert [len(r["calls"]) for r in batched] == [1, 1]  # one call per rank
    for r in per_request + batched:
        torch.testing.assert_close(r["out"], r["alone"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(per_request[0]["out"], batched[0]["out"], rtol=1e-4, atol=1e-5)


def test_two_ranks_rocm_keeps_a_non_data_parallel_encoder_per_request():
    """ROCm, --mm-enable-dp-encoder, attention-TP 2: two single-image requests
    of a model whose encoder is not data-parallel take two calls on each rank
    (every rank runs every call of a TP-sharded tower); a DP model's take one."""
    grids = [[(1, 8, 8)], [(1, 8, 12)]]
    not_dp = run_on_ranks(_rank_worker, 2, grids, True, False, timeout=300)
    dp = run_on_ranks(_rank_worker, 2, grids, True, True, timeout=300)
    assert [[len(c) for c in r["calls"]] for r in not_dp] == [[1, 1], [1, 1]]
    assert [len(r["calls"]) for r in dp] == [1, 1]
    for r in not_dp + dp:
        torch.testing.assert_close(r["out"], r["alone"], rtol=1e-4, atol=1e-5)
