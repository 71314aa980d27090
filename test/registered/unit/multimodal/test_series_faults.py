"""Never worse than pristine: each addition of the series fails alone.

Two real gloo ranks at attention-TP 2 with the DP encoder on run SGLang's real
tiny Qwen3-VL through the real post-load hook and the real
``_get_chunked_prefill_embedding``; failures are injected on ONE rank:

* rank 1's vision tower raises ``torch.OutOfMemoryError`` on its first call
  (the warm-up's): both ranks return from the hook, rank 1 logs one WARNING,
  and a later cross-request step through the DP runner works on both ranks;
* rank 1's metrics collector cannot write its DP-encoder share (a full
  disk): the DP runner's call completes on both ranks with the same
  embeddings, and the failure is logged once;
* the ViT CUDA graphs (``SGLANG_VIT_ENABLE_CUDA_GRAPH=1``): only the graph
  capture itself is replaced (the tests run without CUDA), and the
  runner is let to capture the tiny tower's ``sdpa`` (a backend it otherwise
  runs eagerly throughout); the real runner's capture policy, its capacity,
  the counts in ``/metrics`` and what the warm-up leaves are the code under
  test;
* an ``--encoder-only`` server warms in the grad mode it encodes in;
* a model without a vision encoder is silent. (The post-load hook reads only
  the model and the device, as pristine's does: a draft runner's hook is its
  draft model's, which has no vision encoder of its own.)

A non-positive ``--mm-max-encoder-input-tokens-per-batch`` is the cap
patch's own test (``unit/multimodal/test_vit_encoder_input_tokens_per_batch.py``).
"""

import logging
import os

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=35, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.ranks.mm_harness import TowerCalls  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402

GRAPH_ENV = "SGLANG_VIT_ENABLE_CUDA_GRAPH"
GRAPH_CAPACITY = 32  # graphs a tower keeps
DISTINCT_LAYOUTS = 40


def _requests(seed):
    """Two single-image requests of equal size: one cross-request call gives
    each of the two ranks one image."""
    return [
        H.make_request([(1, 8, 8)], seed=seed),
        H.make_request([(1, 8, 8)], seed=seed + 1),
    ]


def _step(model, requests):
    """One prefill step under ROCm (the series' gate batches it), observed."""
    H.fresh_embedding_cache()
    with H.on_platform("ROCm"), torch.no_grad(), TowerCalls() as seen:
        seen.attach(model.visual)
        rows = H.run_prefill_embedding(model, requests)
    return rows, seen.calls


def _reference(model, requests):
    with H.on_platform("ROCm"), torch.no_grad():
        return H.reference_rows(model, requests)


class _FailFirstCall:
    """A forward pre-hook that makes the tower's next call raise what a busy
    GPU raises; later calls run the real forward."""

    def __init__(self, tower):
        self.failed = 0
        self.handle = tower.register_forward_pre_hook(self)

    def __call__(self, module, args):
        if not self.failed:
            self.failed += 1
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB\nsecond line"
            )

    def remove(self):
        self.handle.remove()


def _encoder_only_grad_mode(model):
    """Warm as an --encoder-only server, then encode a grid no warm-up call
    used the way that server does (under torch.inference_mode())."""
    from sglang.srt.runtime_context import get_disagg

    before = H.frames_compiled()
    with get_disagg().override(encoder_only=True), H.on_platform("ROCm"):
        H.post_load_hook(model)
        warmed = H.frames_compiled()
        item = T.image_item((1, 12, 20), seed=99)
        with torch.inference_mode():
            model.get_image_feature([item])
    return {"warm_up_compiles": warmed - before, "after": H.frames_compiled() - warmed}


def _warm_up_fault(rank, model):
    from sglang.srt.runtime_context import get_mm

    log = H.capture_log(H.WARM_UP_LOGGER)
    log.lines.clear()
    fault = _FailFirstCall(model.visual) if rank == 1 else None
    with H.on_platform("ROCm"), get_mm().override(mm_enable_dp_encoder=True):
        with TowerCalls() as seen:
            seen.attach(model.visual)
            H.post_load_hook(model)
    if fault is not None:
        fault.remove()
    hook = {"calls": seen.calls, "lines": list(log.lines), "injected": bool(fault)}
    rows, calls = _step(model, _requests(seed=10))
    return {"hook": hook, "rows": rows, "calls": calls}


def _clean_warm_up(model):
    """The warm-up where nothing fails: the calls of this rank's plan."""
    from sglang.srt.runtime_context import get_mm

    with H.on_platform("ROCm"), get_mm().override(mm_enable_dp_encoder=True):
        with TowerCalls() as seen:
            seen.attach(model.visual)
            H.post_load_hook(model)
    return seen.calls


def _metrics_fault(rank, model):
    """Each rank's scheduler collector (``--enable-metrics``) over two steps:
    the DP runner only adds to a plain count, which mm_schedule takes and
    records once the encoder call returned."""
    log = H.capture_log("sglang.srt.observability.metrics_collector")
    log.lines.clear()
    with H.scheduler_vit_metrics() as (_, registry):
        steps = [_step(model, _requests(seed=s)) for s in (20, 30)]
    return {
        "steps": steps,
        "warnings": [m for level, m in log.lines if level == logging.WARNING],
        "grids": H.metric_total(registry, "sglang:mm_encoder_tp_rank_share_total"),
    }


class _NoCapture:
    """Stands in for ``torch.cuda.CUDAGraph`` (no CUDA here): replay does
    nothing."""

    def replay(self):
        pass


def _without_capture(runner_cls, captured):
    """Replace only the graph capture of ``ViTCudaGraphRunner``; each capture
    is appended to ``captured``."""
    real = runner_cls._create_graph

    def capture(self, graph_key, **kwargs):
        captured.append(graph_key)
        self.block_graphs[graph_key] = _NoCapture()

    runner_cls._create_graph = capture
    return real


def _graph_policy(model):
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner
    from sglang.srt.runtime_context import get_mm

    out = {}
    runner_log = H.capture_log("sglang.srt.multimodal.vit_cuda_graph_runner")
    captured = []
    real = _without_capture(ViTCudaGraphRunner, captured)
    real_backends = ViTCudaGraphRunner.graph_attn_backends
    real_runner = model.visual.graph_runners
    os.environ[GRAPH_ENV] = "1"
    # The tiny tower attends with sdpa, which the runner never captures (it
    # decides so when built): let the stand-in capture it, and build the
    # tower's runner as a server started with graphs on builds it.
    ViTCudaGraphRunner.graph_attn_backends = ("sdpa",)
    model.visual.graph_runners = ViTCudaGraphRunner(model.visual)
    width = model.visual.patch_embed.proj.weight[0].numel()

    def call(grid):
        n = grid[0] * grid[1] * grid[2]
        model.visual(torch.randn(n, width), torch.tensor([grid]))

    try:
        with H.on_platform("ROCm"), get_mm().override(mm_enable_dp_encoder=True):
            with TowerCalls() as seen:
                seen.attach(model.visual)
                H.post_load_hook(model)
        out["plan_calls"] = seen.calls
        out["left_by_warm_up"] = len(captured)
        with torch.no_grad():
            # The warm-up's first grid once more: had the warm-up counted it,
            # this sighting would capture.
            call(seen.calls[0][0])
            out["after_warm_up_grid"] = len(captured)
            grids = [(1, 2, 2 * (k + 1)) for k in range(DISTINCT_LAYOUTS)]
            for _ in range(3):
                for grid in grids:
                    call(grid)
            out["after_stream"] = len(captured)
        out["runner_lines"] = [m for _, m in runner_log.lines]
    finally:
        os.environ.pop(GRAPH_ENV, None)
        ViTCudaGraphRunner._create_graph = real
        ViTCudaGraphRunner.graph_attn_backends = real_backends
        model.visual.graph_runners = real_runner
    return out


def _tiny_text_model():
    """SGLang's real Qwen3 language model (no vision encoder), tiny."""
    from transformers import Qwen3Config

    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    text = dict(T.TINY_TEXT)
    config = Qwen3Config(
        **{k: v for k, v in text.items() if k not in ("rope_scaling",)}
    )
    config.architectures = ["Qwen3ForCausalLM"]
    with T.default_dtype(torch.float32):
        return Qwen3ForCausalLM(config).eval()


def _silent_hooks():
    from sglang.srt.runtime_context import get_mm

    log = H.capture_log(H.WARM_UP_LOGGER)
    out = {}
    with H.on_platform("ROCm"), get_mm().override(mm_enable_dp_encoder=True):
        log.lines.clear()
        H.post_load_hook(_tiny_text_model())
        out["text_model"] = list(log.lines)
    return out


def _rank_worker(rank, world_size, init_method):
    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    torch.manual_seed(0)
    model = T.build_tiny_qwen3_vl()
    out = {}
    # First, in a process that has compiled nothing under inference mode yet.
    out["encoder_only"] = _encoder_only_grad_mode(model)
    out["warm_up_fault"] = _warm_up_fault(rank, model)
    out["reference"] = _reference(model, _requests(seed=10))
    out["clean_warm_up"] = _clean_warm_up(model)
    out["metrics_fault"] = _metrics_fault(rank, model)
    out["metrics_reference"] = [_reference(model, _requests(seed=s)) for s in (20, 30)]
    out["graph"] = _graph_policy(model)
    out["silent"] = _silent_hooks()
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=480)


# --- warm-up faults stay on their rank --------------------------------------


def test_both_ranks_return_from_the_hook_and_only_rank_1_warns(ranks):
    for rank, out in enumerate(ranks):
        hook = out["warm_up_fault"]["hook"]
        warnings = [m for level, m in hook["lines"] if level == logging.WARNING]
        if rank == 0:
            assert warnings == []
            # Rank 0's plan ran whole beside rank 1's fault: the calls of its
            # later warm-up, where nothing fails (test_vision_warmup.py
            # checks the plan itself).
            assert hook["calls"] == out["clean_warm_up"] != []
        else:
            assert len(warnings) == 1, hook["lines"]
            (line,) = warnings
            assert line.startswith(
                "vision warm-up failed on rank 1 (Qwen3VLForConditionalGeneration, "
                "after 0 of 3 tower calls): OutOfMemoryError: CUDA out of memory. "
                "Tried to allocate 2.00 GiB;"
            ), line
            assert "second line" not in line
            assert hook["calls"] == []  # the first call failed; no later call ran


def test_a_later_cross_request_step_works_on_both_ranks(ranks):
    for rank, out in enumerate(ranks):
        fault = out["warm_up_fault"]
        # One cross-request call; the DP runner gives each rank one image.
        assert fault["calls"] == [[(1, 8, 8)]], (rank, fault["calls"])
        assert torch.allclose(fault["rows"], out["reference"], atol=1e-5)
    assert torch.equal(
        ranks[0]["warm_up_fault"]["rows"], ranks[1]["warm_up_fault"]["rows"]
    )


# --- metrics: recorded after the encoder call, outside its collective region --


def test_metrics_on_leave_the_encoder_call_whole(ranks):
    for rank, out in enumerate(ranks):
        fault = out["metrics_fault"]
        for (rows, calls), reference in zip(fault["steps"], out["metrics_reference"]):
            assert calls == [[(1, 8, 8)]]
            assert torch.allclose(rows, reference, atol=1e-5)
    for (rows0, _), (rows1, _) in zip(
        ranks[0]["metrics_fault"]["steps"], ranks[1]["metrics_fault"]["steps"]
    ):
        assert torch.equal(rows0, rows1)


def test_each_rank_records_its_dp_encoder_share(ranks):
    # Each step's call gives each rank one image: two steps, two grids each.
    assert [out["metrics_fault"]["grids"] for out in ranks] == [2, 2]
    assert [out["metrics_fault"]["warnings"] for out in ranks] == [[], []]


# --- the ViT CUDA graphs: captured when a layout recurs, at most 32 --------------


def test_warm_up_leaves_no_graph_and_no_sighting(ranks):
    for out in ranks:
        graph = out["graph"]
        # With graphs on, the warm-up made its plan's calls (those of this
        # rank's warm-up without graphs), eagerly.
        assert graph["plan_calls"] == out["clean_warm_up"] != []
        assert graph["left_by_warm_up"] == 0
        assert graph["after_warm_up_grid"] == 0


def test_graphs_stay_within_the_capacity_over_distinct_layouts(ranks):
    for out in ranks:
        graph = out["graph"]
        # 40 layouts three times: the first 32 to recur are captured and then
        # replayed, the other 8 stay eager; plus the one warm-up grid.
        assert graph["after_stream"] == GRAPH_CAPACITY
        capacity_lines = [m for m in graph["runner_lines"] if "capacity of 32" in m]
        assert len(capacity_lines) == 1, graph["runner_lines"]


# --- the encoder-only server warms in its serving grad mode -----------------------


def test_encoder_only_warm_up_covers_its_inference_mode_encode(ranks):
    for out in ranks:
        enc = out["encoder_only"]
        assert enc["warm_up_compiles"] > 0  # the warm-up did compile, cold process
        assert enc["after"] == 0, enc


# --- only the target model warms and warns ------------------------------------------


def test_model_without_a_vision_encoder_gets_no_warning(ranks):
    for out in ranks:
        assert out["silent"]["text_model"] == []


# --- rank consistency: what a rank-local cache hit does ------------------------

# How long a rank waits for its step before the test calls it hung.
HANG_SECONDS = 10


def _diverging_caches_worker(rank, world_size, init_method):
    """The same batch on both ranks; rank 1's embedding cache alone holds the
    first image. Returns each rank's encoder calls (items per call) and
    whether its step finished within HANG_SECONDS."""
    import threading

    from sglang.srt.managers import mm_schedule
    from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    gate_log = H.capture_gate_log()
    model = T.build_tiny_qwen3_vl()
    requests = _requests(seed=40)
    H.fresh_embedding_cache()
    with H.on_platform("ROCm"), torch.no_grad():
        first = model.get_image_feature(requests[0].items)  # both ranks: a collective
    if rank == 1:
        mm_schedule.embedding_cache.set(
            requests[0].items[0].hash,
            EmbeddingResult(embedding=first.reshape(-1, first.shape[-1])),
        )
    calls = []
    model.get_image_feature = H.encoder_spy(
        model, lambda items: calls.append(len(items))
    )
    done = threading.Event()

    def step():
        with H.on_platform("ROCm"), torch.no_grad():
            H.run_prefill_embedding(model, requests)
        done.set()

    threading.Thread(target=step, daemon=True).start()
    finished = done.wait(HANG_SECONDS)
    return {"calls": list(calls), "finished": finished, "gate": list(gate_log.lines)}


def test_a_rank_local_cache_hit_desynchronises_the_dp_encoder():
    """Not carried (docs/design.md, "Rank consistency"): the miss decision reads
    each rank's own embedding cache, as upstream does, and the series' ROCm
    batching inherits it. Under the gate (its INFO line on TP rank 0), rank 0
    misses both images and enters the DP runner's all-gather with two; rank 1
    hits the first, misses the second, and enters the single-image broadcast.
    Neither returns: the step hangs, here bounded by HANG_SECONDS. (Upstream
    hangs the same way on the platforms it batches on; on ROCm it makes one
    call per request.)"""
    out = run_on_ranks(_diverging_caches_worker, 2, timeout=300)
    assert (
        out[0]["gate"]
        == [
            (
                logging.INFO,
                "cross-request ViT batching on ROCm: on "
                "(Qwen3VLForConditionalGeneration, attention-TP 2)",
            )
        ]
        and out[1]["gate"] == []
    ), out
    assert out[0]["calls"] == [2] and out[1]["calls"] == [1], out
    assert not out[0]["finished"] and not out[1]["finished"], out
