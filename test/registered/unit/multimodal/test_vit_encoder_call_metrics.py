"""Encoder-call metrics beyond one scheduler's single call: capped calls, two
attention-DP groups and which schedulers of a group record.

Each scheduler's collector is built by SGLang's own
``Scheduler.init_metrics_collector`` with ``--enable-metrics``
(``mm_harness.scheduler_vit_metrics``, a private Prometheus registry per
scheduler), and values are read back from the registry's text exposition:
what a ``/metrics`` scrape shows. One call's counts, labels and modality, each
DP runner's share on a rank that records no calls and metrics off are the
in-patch test's (``unit/observability/test_mm_encoder_metrics.py``); the
WARNING of a collector that cannot be built is worded here. The series are
``sglang:mm_encoder_*`` (``MMEncoderMetricsCollector``).
"""

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=6, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import free_port, run_on_ranks  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402

N = 5


def _burst():
    return [H.make_request([(1, 8, 8)], seed=300 + i) for i in range(N)]


def _batched(registry, name):
    return H.metric_total(registry, name, path="batched", modality="image")


def test_capped_calls_are_counted_per_call():
    """Five 64-patch images under a 128-patch cap (one rank): three
    cross-request calls (2 + 2 + 1 images), each its own observation."""
    from sglang.srt.runtime_context import get_mm, override_platform

    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    model = T.build_tiny_qwen3_vl(seed=9)
    H.fresh_embedding_cache()
    with torch.no_grad(), override_platform(**H.CUDA), get_mm().override(
        mm_max_encoder_input_tokens_per_batch=128
    ), H.scheduler_vit_metrics() as (_, registry):
        H.run_prefill_embedding(model, _burst())
    assert _batched(registry, "sglang:mm_encoder_calls_total") == 3
    assert _batched(registry, "sglang:mm_encoder_items_per_call_sum") == N
    assert _batched(registry, "sglang:mm_encoder_requests_per_call_sum") == N
    assert _batched(registry, "sglang:mm_encoder_patches_per_call_sum") == N * 64
    # No call went over the cap: every call's patches in the bucket <= 128.
    assert _batched(registry, "sglang:mm_encoder_patches_per_call_count") == 3
    assert (
        H.metric_total(
            registry,
            "sglang:mm_encoder_patches_per_call_bucket",
            path="batched",
            le="128.0",
        )
        == 3
    )


def _attention_dp_group(rank, world_size, init_method):
    """One scheduler process of attention-DP group ``rank``: its own gloo world
    of one (attention-DP groups share no encoder collective), dp_rank = rank."""
    from prometheus_client import generate_latest

    from sglang.srt.runtime_context import get_parallel, override_platform

    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    model = T.build_tiny_qwen3_vl(seed=9)
    H.fresh_embedding_cache()
    with get_parallel().override(dp_rank=rank), torch.no_grad(), override_platform(
        **H.CUDA
    ), H.scheduler_vit_metrics() as (_, registry):
        # Group 0 serves one request, group 1 three.
        requests = [
            H.make_request([(1, 8, 8)], seed=500 + 10 * rank + i)
            for i in range(1 + 2 * rank)
        ]
        H.run_prefill_embedding(model, requests)
    return generate_latest(registry).decode()


def test_two_attention_dp_groups_keep_separate_series():
    """What a Prometheus server scraping both groups' schedulers sees: one
    series per group, told apart by dp_rank, each with its own counts."""
    from prometheus_client.parser import text_string_to_metric_families

    scrapes = run_on_ranks(_attention_dp_group, 2, timeout=400)
    seen = {}
    for text in scrapes:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name == "sglang:mm_encoder_items_per_call_sum"
                    and s.labels["path"] == "batched"
                ):
                    key = tuple(sorted(s.labels.items()))
                    assert key not in seen, "two groups wrote the same series"
                    seen[key] = s.value
    by_group = {dict(k)["dp_rank"]: v for k, v in seen.items()}
    assert by_group == {"0": 1.0, "1": 3.0}


def _attention_cp_schedulers(rank, world_size, init_method):
    """The schedulers of one group at attention-CP 2 (attention-TP 1: TP rank
    r is CP rank r), with and without --enable-metrics-for-all-schedulers,
    each after one per-request encoder call and one DP-encoder share of 3
    grids: what each one's registry holds. The share is added as the DP
    runners add it; mm_schedule's own call-site helper observes both."""
    from sglang.srt.managers.mm_schedule import _observe_encoder_call
    from sglang.srt.managers.schedule_batch import MultimodalDataItem
    from sglang.srt.multimodal.mm_utils import count_dp_encoder_share
    from sglang.srt.multimodal.modality import Modality
    from sglang.srt.runtime_context import get_parallel

    T.publish_cpu_context()
    item = MultimodalDataItem(
        modality=Modality.IMAGE,
        hash=7,
        pad_value=7,
        offsets=[(2, 17)],
        model_specific_data={"image_grid_thw": torch.tensor([[1, 8, 8]])},
    )
    out = {}
    for cp_rank in (0, 1):
        for every in (False, True):
            cp = dict(
                tp_size=2,
                tp_rank=cp_rank,
                attn_cp_size=2,
                attn_cp_rank=cp_rank,
                moe_tp_size=2,
                moe_tp_rank=cp_rank,
            )
            with get_parallel().override(**cp), H.scheduler_vit_metrics(
                enable_metrics_for_all_schedulers=every
            ) as (_, registry):
                count_dp_encoder_share(3)
                _observe_encoder_call("per_request", [item], 1)
            out[f"cp{cp_rank}-all{int(every)}"] = {
                "calls": H.metric_total(registry, "sglang:mm_encoder_calls_total"),
                "grids": H.metric_samples(
                    registry, "sglang:mm_encoder_tp_rank_share_total"
                ),
            }
    return out


@pytest.fixture(scope="module")
def cp_schedulers():
    return run_on_ranks(_attention_cp_schedulers, 1, timeout=180)[0]


def test_calls_counted_once_per_group_unless_every_scheduler_reports(cp_schedulers):
    assert {k: v["calls"] for k, v in cp_schedulers.items()} == {
        "cp0-all0": 1,  # attention-TP rank 0 of CP rank 0 records
        "cp0-all1": 1,
        "cp1-all0": 0,  # another CP rank of the same group: already counted
        "cp1-all1": 1,  # --enable-metrics-for-all-schedulers: every scheduler
    }


def test_every_scheduler_counts_its_dp_encoder_share(cp_schedulers):
    """CP rank 1 records no calls, but its share is its own, under its tp_rank."""
    for key, got in cp_schedulers.items():
        ((labels, grids),) = got["grids"]
        assert grids == 3, key
        assert labels["tp_rank"] == key[2] and "rank" not in labels, (key, labels)


def test_a_collector_that_cannot_be_built_names_its_error_in_one_warning(caplog):
    """What an operator reads when the encoder metrics could not be registered:
    the error, and that the scheduler serves without them."""
    import logging
    import types

    from sglang.srt.observability import metrics_collector as M
    from sglang.srt.runtime_context import get_observability

    def cannot_register(**_):
        raise OSError(28, "No space left on device")

    T.publish_cpu_context(tp_size=1)
    scheduler_metrics = types.SimpleNamespace(
        collector=types.SimpleNamespace(labels={"tp_rank": 0}),
        current_scheduler_metrics_enabled=True,
    )
    loggers = {M.STAT_LOGGER_ROLE_MM_ENCODER: cannot_register}
    with get_observability().override(stat_loggers=loggers), caplog.at_level(
        logging.WARNING, logger=M.__name__
    ):
        assert M.MMEncoderMetricsCollector.init_new(scheduler_metrics) is None
    assert [r.getMessage() for r in caplog.records if r.name == M.__name__] == [
        "multimodal encoder metrics: not created, this scheduler serves without "
        "them: OSError: [Errno 28] No space left on device"
    ]
