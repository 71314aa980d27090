"""Encoder-call metrics and DEBUG lines, through the real scheduler path.

Values are read back from prometheus_client's real registry: what a
``/metrics`` scrape of this process would show. A step whose items all hit
the cache, and a multi-span item's ``full`` path, are tested once, in
test_hip_dp_encoder_vit_batching.py, through the same records' DEBUG lines.
"""

import contextlib
import logging

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

from cpu_support import mm_harness as H  # noqa: E402
from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.ranks import free_port  # noqa: E402

ROCM = dict(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False)
CUDA = dict(is_hip=False, is_cuda=True, is_npu=False, is_xpu=False)


@pytest.fixture(scope="module")
def model():
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    return T.build_tiny_qwen3_vl(seed=9)


@contextlib.contextmanager
def metrics_on(platform):
    from sglang.srt.runtime_context import get_observability, override_platform

    with get_observability().override(enable_metrics=True), override_platform(
        **platform
    ):
        yield


def sample(name, **labels):
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def snapshot(path):
    from sglang.srt.observability.vit_batch_metrics import scheduler_metric_labels

    # The labels SGLang's scheduler metrics carry (tp_rank, pp_rank, ...).
    labels = {k: str(v) for k, v in scheduler_metric_labels().items()}
    assert {"model_name", "engine_type", "tp_rank", "pp_rank"} <= set(labels)
    labels["path"] = path
    return {
        "calls": sample("sglang:mm_encoder_calls_total", **labels),
        "images_sum": sample("sglang:mm_encoder_call_images_sum", **labels),
        "images_count": sample("sglang:mm_encoder_call_images_count", **labels),
        "requests_sum": sample("sglang:mm_encoder_call_requests_sum", **labels),
        "patches_sum": sample("sglang:mm_encoder_call_patches_sum", **labels),
        "images_le_1": sample(
            "sglang:mm_encoder_call_images_bucket", le="1.0", **labels
        ),
    }


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


N = 5


def _burst():
    return [H.make_request([(1, 8, 8)], seed=300 + i) for i in range(N)]


def test_batched_burst_counts_one_call_of_n_images(model, caplog):
    H.fresh_embedding_cache()
    before = snapshot("batched")
    with torch.no_grad(), metrics_on(CUDA), caplog.at_level(
        logging.DEBUG, logger="sglang.srt.observability.vit_batch_metrics"
    ):
        H.run_prefill_embedding(model, _burst())
    d = delta(snapshot("batched"), before)
    assert d == {
        "calls": 1,
        "images_sum": N,
        "images_count": 1,
        "requests_sum": N,
        "patches_sum": N * 64,
        "images_le_1": 0,
    }
    lines = [
        r.getMessage() for r in caplog.records if "ViT encoder call" in r.getMessage()
    ]
    assert lines == [
        f"ViT encoder call: path=batched requests={N} images={N} patches={N * 64} rank=0"
    ]


def test_per_request_burst_counts_n_calls_of_one_image(model, caplog):
    from sglang.srt.multimodal import vit_batching
    from sglang.srt.runtime_context import get_mm

    H.fresh_embedding_cache()
    vit_batching._logged_decisions.clear()  # the gate logs once per server: a fresh one
    before = {p: snapshot(p) for p in ("per_request", "batched")}
    with torch.no_grad(), metrics_on(ROCM), get_mm().override(
        mm_enable_dp_encoder=False
    ), caplog.at_level(logging.INFO, logger="sglang.srt.multimodal.vit_batching"):
        H.run_prefill_embedding(model, _burst())
    d = {p: delta(snapshot(p), before[p]) for p in before}
    assert d["per_request"]["calls"] == N and d["per_request"]["images_sum"] == N
    assert d["per_request"]["images_count"] == N
    assert (
        d["per_request"]["requests_sum"] == N and d["per_request"]["images_le_1"] == N
    )
    # Not one of them on the batched path, and the gate said why.
    assert d["batched"]["calls"] == 0 and d["batched"]["images_sum"] == 0
    gate = [
        r.getMessage()
        for r in caplog.records
        if r.name == "sglang.srt.multimodal.vit_batching"
    ]
    assert gate == ["cross-request ViT batching: off (ROCm, no DP encoder)"]


def test_capped_calls_are_counted_per_call(model):
    from sglang.srt.runtime_context import get_mm

    H.fresh_embedding_cache()
    before = snapshot("batched")
    with torch.no_grad(), metrics_on(CUDA), get_mm().override(
        mm_max_encoder_patches_per_call=128
    ):
        H.run_prefill_embedding(model, _burst())  # 5 x 64 patches -> 2 + 2 + 1
    d = delta(snapshot("batched"), before)
    assert d["calls"] == 3 and d["images_sum"] == N and d["requests_sum"] == N


def test_metrics_off_records_nothing(model):
    from sglang.srt.runtime_context import override_platform

    H.fresh_embedding_cache()
    before = snapshot("batched")
    with torch.no_grad(), override_platform(**CUDA):
        H.run_prefill_embedding(model, _burst())
    assert delta(snapshot("batched"), before)["calls"] == 0
    # The same burst with --enable-metrics is one sample.
    H.fresh_embedding_cache()
    with torch.no_grad(), metrics_on(CUDA):
        H.run_prefill_embedding(model, _burst())
    assert delta(snapshot("batched"), before)["calls"] == 1


def _attention_dp_group(rank, world_size, init_method):
    """One scheduler process of attention-DP group ``rank``: its own gloo world
    of one (attention-DP groups share no encoder collective), dp_rank = rank."""
    from prometheus_client import REGISTRY, generate_latest

    from sglang.srt.runtime_context import get_parallel

    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    model = T.build_tiny_qwen3_vl(seed=9)
    H.fresh_embedding_cache()
    with get_parallel().override(dp_rank=rank), torch.no_grad(), metrics_on(CUDA):
        # Group 0 serves one request, group 1 three.
        requests = [
            H.make_request([(1, 8, 8)], seed=500 + 10 * rank + i)
            for i in range(1 + 2 * rank)
        ]
        H.run_prefill_embedding(model, requests)
    return generate_latest(REGISTRY).decode()


def test_two_attention_dp_groups_keep_separate_series():
    """What a Prometheus server scraping both groups' schedulers sees: one
    series per group, told apart by dp_rank, each with its own counts."""
    from cpu_support.ranks import run_on_ranks
    from prometheus_client.parser import text_string_to_metric_families

    scrapes = run_on_ranks(_attention_dp_group, 2, timeout=400)
    seen = {}
    for text in scrapes:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name == "sglang:mm_encoder_call_images_sum"
                    and s.labels["path"] == "batched"
                ):
                    key = tuple(sorted(s.labels.items()))
                    assert key not in seen, "two groups wrote the same series"
                    seen[key] = s.value
    by_group = {dict(k)["dp_rank"]: v for k, v in seen.items()}
    assert by_group == {"0": 1.0, "1": 3.0}
