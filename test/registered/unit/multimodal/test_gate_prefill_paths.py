"""The platform gate for cross-request ViT batching, against SGLang's real code.

The decision itself is one table (every platform x DP-encoder flag x
attention-TP x encoder row, and its INFO line). Everything else runs the real
``mm_schedule._get_chunked_prefill_embedding`` with SGLang's real Qwen3-VL
(tiny sizes, random weights) on CPU and asserts which path ran: the gate's
INFO line and the encoder calls, with how many images each, observed with a
forward pre-hook on the real vision tower. Platform facts come from
``mm_harness.on_platform`` (``override_platform`` and the gate's own
``mm_schedule`` flags); the attention-TP width and the DP encoder flag from
the runtime context's own scoped overrides.
"""

import contextlib
import logging

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import free_port, run_on_ranks  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402


def expected_gate(platform: str, flag: bool, attn_tp: int, kind: str) -> bool:
    """The rule, as the issues state it (not as the code computes it). A "dp"
    model answers that its encoder spreads images exactly when the flag is
    on; "not-dp" answers False; "ignores-flag" does not answer."""
    if platform in ("CUDA", "CPU"):
        return True
    if platform in ("NPU", "XPU"):
        return False
    return flag and attn_tp > 1 and kind == "dp"


def gate_line(batched: bool, model_class: str, attn_tp: int) -> str:
    return (
        f"cross-request ViT batching on ROCm: {'on' if batched else 'off'} "
        f"({model_class}, attention-TP {attn_tp})"
    )


def gate_lines(platform: str, batched: bool, model_class: str, attn_tp: int) -> list:
    """ROCm, the one platform that asks the model, says what it chose."""
    if platform != "ROCm":
        return []
    return [(logging.INFO, gate_line(batched, model_class, attn_tp))]


DECISION_CLASSES = {
    "dp": "Qwen3VLDecisionModel",
    "not-dp": "Qwen3VLDecisionModel",
    "ignores-flag": "NoAnswerDecisionModel",
}


# ---------------------------------------------------------------------------
# The decision: one table
# ---------------------------------------------------------------------------


def test_gate_decision_table(decision_tables):
    """The scheduler's gate (asked three times, logged once at INFO on ROCm)
    and mm_schedule.hip_dp_encoder_batches_vit(), the server's question (ROCm,
    flag, attention-TP > 1), asked with no model."""
    wrong = []
    for row in H.decision_rows():
        platform, flag, attn_tp, kind = row
        gates, helper, lines, model_class = decision_tables["gate"][row]
        batched = expected_gate(*row)
        got = (gates, helper, lines, model_class)
        want = (
            {batched},
            platform == "ROCm" and flag and attn_tp > 1,
            gate_lines(platform, batched, DECISION_CLASSES[kind], attn_tp),
            DECISION_CLASSES[kind],
        )
        if got != want:
            wrong.append((row, got, want))
    assert wrong == [], "\n".join(f"{r}: got {g}, expected {w}" for r, g, w in wrong)


def test_the_model_fact_is_read_from_the_bound_encoder():
    """On ROCm with the DP encoder at attention-TP 2 (the server's question
    says batch), the gate asks the model behind a bound encoder method; a
    model that answers False or does not answer, and a plain function (no
    model behind it), stay per request."""
    from sglang.srt.managers import mm_schedule
    from sglang.srt.multimodal.modality import Modality
    from sglang.srt.runtime_context import get_mm, get_parallel

    # Attention-TP 2 as a server of that width publishes it, with no group
    # handle in scope (the gate issues no collective); whatever groups an
    # earlier module of this process built stay as they are.
    tp2 = dict(tp_size=2, attn_tp_size=2, moe_tp_size=2, tp_rank=0, attn_tp_rank=0)
    groups = dict(tp_group=None, attn_tp_group=None, moe_tp_group=None)
    T.publish_cpu_context(tp_size=1)
    H.fresh_gate_log()
    try:
        with get_parallel().override(**tp2, **groups), get_mm().override(
            mm_enable_dp_encoder=True
        ), H.on_platform("ROCm"):
            decided = [
                mm_schedule._batch_vit_across_requests(encoder, Modality.IMAGE)
                for encoder in (
                    H.DecisionModel(True).get_image_feature,
                    H.DecisionModel(False).get_image_feature,
                    H.DecisionModel().get_image_feature,
                    lambda items: items,
                )
            ]
    finally:
        H.fresh_gate_log()
    assert decided == [True, False, False, False]


# ---------------------------------------------------------------------------
# The real scheduler path (this process: attention-TP 1)
# ---------------------------------------------------------------------------

# (platform, DP encoder flag) at attention-TP 1 (this process builds TP groups
# of width 1, so the runtime context refuses a wider override here; the ROCm +
# DP encoder + attention-TP 2 case runs on two gloo ranks below).
BATCHED = ("CUDA", False)
PER_REQUEST = ("ROCm", True)


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


@contextlib.contextmanager
def setting(platform: str, dp_encoder: bool):
    """Scoped platform + DP-encoder flag, as a fresh process (the gate's
    once-per-process log is reset); yields the gate's log lines."""
    from sglang.srt.runtime_context import get_mm, get_parallel

    assert get_parallel().attn_tp_size == 1
    H.fresh_gate_log()
    handler = H.GateLines()
    log = logging.getLogger(H.GATE_LOGGER)
    previous = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with H.on_platform(platform), get_mm().override(
            mm_enable_dp_encoder=dp_encoder
        ):
            yield handler.lines
    finally:
        log.removeHandler(handler)
        log.setLevel(previous)


def decided(gate) -> list:
    """The gate's INFO lines in ``gate`` at attention-TP 1 (ROCm's one)."""
    platform, flag = gate
    batched = expected_gate(platform, flag, 1, "dp")
    return gate_lines(platform, batched, "Qwen3VLForConditionalGeneration", 1)


def per_path(gate, requests_images):
    """Images per encoder call: one call for the step when batching, one per
    request (with images in its window) otherwise."""
    counts = [n for n in requests_images if n]
    if expected_gate(*gate, 1, "dp"):
        return [sum(counts)] if counts else []
    return counts


def one_step(model, tower_calls, gate, requests):
    """Each request's rows encoded alone, then one prefill step under
    ``gate`` with the tower's calls counted from there; checks the gate's
    line and returns (the step's rows, the reference rows)."""
    with torch.no_grad():
        reference = H.reference_rows(model, requests)
        tower_calls.reset()
        with setting(*gate) as lines:
            out = H.run_prefill_embedding(model, requests)
    assert lines == decided(gate)
    return out, reference


def _two_single_image_requests():
    return [H.make_request([(1, 8, 8)], seed=11), H.make_request([(1, 12, 8)], seed=12)]


GATES = [BATCHED, PER_REQUEST, ("NPU", True), ("XPU", True)]


def test_batched_and_per_request_give_the_same_embeddings(model, tower_calls):
    grids = [[(1, 8, 8)], [(1, 8, 12), (1, 4, 8)], [(1, 16, 8)]]
    requests = [H.make_request(g, seed=20 + i) for i, g in enumerate(grids)]
    out, calls = {}, {}
    with torch.no_grad():
        for gate in (BATCHED, PER_REQUEST):
            H.fresh_embedding_cache()
            tower_calls.reset()
            with setting(*gate) as lines:
                out[gate] = H.run_prefill_embedding(model, requests)
            assert lines == decided(gate)
            calls[gate] = [len(c) for c in tower_calls.calls]
    assert calls == {BATCHED: [4], PER_REQUEST: [1, 2, 1]}
    torch.testing.assert_close(out[BATCHED], out[PER_REQUEST], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Per-request behaviours that must not change, on both paths
# ---------------------------------------------------------------------------

BOTH_PATHS = pytest.mark.parametrize(
    "gate", [BATCHED, PER_REQUEST], ids=["batched", "per-request"]
)
# Where a test reads no series output, its batched case (CUDA, which logs no
# gate decision) is an upstream behaviour the series keeps: it passes on
# pristine too.
BOTH_PATHS_KEPT = pytest.mark.parametrize(
    "gate",
    [
        pytest.param(
            BATCHED,
            id="batched",
            marks=pytest.mark.control(
                reason="CUDA's batched path: an upstream behaviour the series keeps"
            ),
        ),
        pytest.param(PER_REQUEST, id="per-request"),
    ],
)


@pytest.mark.control(
    reason="upstream behaviour the series keeps: a cache hit skips the encoder"
)
@BOTH_PATHS
def test_cache_hits_skip_the_encoder(model, tower_calls, gate):
    """The one test of a step whose every item hits the cache: no encoder
    call."""
    requests = _two_single_image_requests()
    with torch.no_grad(), setting(*gate) as lines:
        first = H.run_prefill_embedding(model, requests)
        assert [len(c) for c in tower_calls.calls] == per_path(gate, [1, 1])
        tower_calls.reset()
        second = H.run_prefill_embedding(model, requests)
    assert lines == decided(gate)
    assert tower_calls.calls == []
    assert torch.equal(first, second)


@BOTH_PATHS_KEPT
def test_cached_entry_with_wrong_token_count_is_reencoded(model, tower_calls, gate):
    from sglang.srt.managers import mm_schedule
    from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

    requests = _two_single_image_requests()
    stale = requests[0].items[0]
    mm_schedule.embedding_cache.set(
        stale.hash, EmbeddingResult(embedding=torch.zeros(3, 128))
    )
    out, reference = one_step(model, tower_calls, gate, requests)
    # The stale entry was not served: both images went to the encoder.
    assert [len(c) for c in tower_calls.calls] == per_path(gate, [1, 1])
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.control(
    reason="upstream behaviour the series keeps: multi-span items take the full path"
)
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
    out, reference = one_step(model, tower_calls, gate, requests)
    if gate == BATCHED:
        # The two single-span images in one call, the video in its own.
        assert sorted(tower_calls.calls, key=len) == [
            [(1, 8, 8)],
            [(1, 8, 8), (1, 8, 12)],
        ]
    else:
        # One call per request, the video's included.
        assert sorted(tower_calls.calls) == [[(1, 8, 8)], [(1, 8, 8)], [(1, 8, 12)]]
    # The video's call (the full path's) comes after the step's others.
    assert tower_calls.calls[-1] == [(1, 8, 8)]
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


@BOTH_PATHS_KEPT
def test_colliding_hashes_with_different_lengths_are_not_deduplicated(
    model, tower_calls, gate
):
    a = H.make_request([(1, 8, 8)], seed=41)
    b = H.make_request([(1, 8, 12)], seed=42)
    b.items[0].hash = a.items[0].hash  # same hash, different token count
    requests = [a, b]
    out, reference = one_step(model, tower_calls, gate, requests)
    assert [len(c) for c in tower_calls.calls] == per_path(gate, [1, 1])
    assert out.shape[0] == 16 + 24
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


def _images_in_window(request):
    """Images whose placeholder span meets the request's chunk window."""
    lo, hi = request.prefix, request.prefix + request.extend_len
    return sum(1 for it in request.items for s, e in it.offsets if s < hi and e >= lo)


@BOTH_PATHS_KEPT
@pytest.mark.parametrize("cut", [(0, 9), (9, 10), (14, 40)])
def test_chunk_windows_that_cut_an_image_return_the_right_rows(
    model, tower_calls, gate, cut
):
    """Chunked prefill: [prefix, prefix + extend) cuts through image spans."""
    prefix, extend = cut
    requests = [
        H.make_request([(1, 8, 8), (1, 8, 12)], seed=51),
        H.make_request([(1, 12, 8)], seed=52),
    ]
    requests[0].prefix, requests[0].extend = prefix, extend
    out, reference = one_step(model, tower_calls, gate, requests)
    expected = per_path(gate, [_images_in_window(r) for r in requests])
    assert [len(c) for c in tower_calls.calls] == expected
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Two gloo ranks: where the images of a step land with the DP encoder
# ---------------------------------------------------------------------------


def _rank_worker(rank, world_size, init_method, grids_per_request):
    """A server at attention-TP 2 with --mm-enable-dp-encoder (the model is
    built data-parallel), ROCm. Upstream 0.5.23 on ROCm takes the per-request
    path whatever the flag: ``_get_chunked_embedding_by_item`` once per
    request, called here exactly as its ROCm branch calls it. The series' gate
    is the whole scheduler step."""
    from cpu_support.ranks import mm_harness as H
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.managers import mm_schedule

    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    model = T.build_tiny_qwen3_vl(seed=1)
    gate_log = H.capture_gate_log()
    requests = [
        H.make_request(g, seed=100 + i) for i, g in enumerate(grids_per_request)
    ]
    out = {}
    with torch.no_grad(), H.on_platform("ROCm"):
        H.fresh_embedding_cache()
        with H.TowerCalls().attach(model.visual) as calls:
            rows = []
            for req in requests:
                rows += mm_schedule._get_chunked_embedding_by_item(
                    model.get_image_feature,
                    req.items,
                    req.prefix,
                    req.extend_len,
                    torch.device("cpu"),
                )
        out["per_request"] = {"calls": calls.calls, "out": torch.cat(rows)}
        H.fresh_embedding_cache()
        first = len(gate_log.lines)
        with H.TowerCalls().attach(model.visual) as calls:
            emb = H.run_prefill_embedding(model, requests)
        out["series"] = {
            "calls": calls.calls,
            "out": emb,
            "gate": gate_log.lines[first:],
        }
        out["alone"] = H.reference_rows(model, requests)
    return out


def test_two_ranks_per_request_idles_a_rank_batching_feeds_both():
    grids = [[(1, 8, 8)], [(1, 8, 8)], [(1, 8, 12)], [(1, 8, 8)]]
    ranks = run_on_ranks(_rank_worker, 2, grids, timeout=300)
    for rank, r in enumerate(ranks):  # logged once per server, by TP rank 0
        assert (
            r["series"]["gate"]
            == [
                (
                    logging.INFO,
                    "cross-request ViT batching on ROCm: on "
                    "(Qwen3VLForConditionalGeneration, attention-TP 2)",
                )
            ][: 1 - rank]
        )
    per_request = [sum(len(c) for c in r["per_request"]["calls"]) for r in ranks]
    batched = [sum(len(c) for c in r["series"]["calls"]) for r in ranks]
    assert sorted(per_request) == [0, 4], per_request  # one rank does all the work
    assert min(batched) >= 1 and sum(batched) == 4, batched  # both ranks work
    assert [len(r["series"]["calls"]) for r in ranks] == [1, 1]  # one call per rank
    for r in ranks:
        for path in ("per_request", "series"):
            torch.testing.assert_close(r[path]["out"], r["alone"], rtol=1e-4, atol=1e-5)
