"""The encoder-call series carry the scheduler's labels and count once per group.

In one spawned process with ``--enable-metrics``: SGLang's own
``SchedulerMetricsCollector.init_new`` builds the scheduler's labels, and the
series' ``scheduler_metric_labels`` must equal them (priority scheduling and
``--extra-metric-labels`` on, so the optional labels are there). Then the real
recording functions run at attention-CP rank 0 and 1, with and without
``--enable-metrics-for-all-schedulers``, and ``/metrics``' text (the registry's
exposition) is read back through ``prometheus_client.parser``.
"""

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="stage-a-test-cpu")

from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.ranks import run_on_ranks  # noqa: E402

EXTRA = {"deployment": "fork-test"}


def _calls(text):
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sglang:mm_encoder_calls_total"
    )


def _worker(rank, world_size, init_method):
    import json

    from prometheus_client import REGISTRY, generate_latest

    from sglang.srt.observability import vit_batch_metrics as M
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.runtime_context import (
        get_observability,
        get_parallel,
        get_server_args,
    )

    T.publish_cpu_context(
        enable_metrics=True,
        enable_priority_scheduling=True,
        extra_metric_labels=EXTRA,
    )
    context = SchedulerMetricsCollector.init_new(
        server_args=get_server_args(),
        enable_priority_scheduling=True,
        enable_lora=False,
        enable_hierarchical_cache=False,
    )
    out = {
        "scheduler": {k: str(v) for k, v in context.collector.labels.items()},
        "series": {k: str(v) for k, v in M.scheduler_metric_labels().items()},
    }

    def calls_after_one_record(cp_rank, all_schedulers):
        before = _calls(generate_latest(REGISTRY).decode())
        # Attention-CP 2 at attention-TP 1: TP rank r is CP rank r.
        cp = dict(
            tp_size=2,
            tp_rank=cp_rank,
            attn_cp_size=2,
            attn_cp_rank=cp_rank,
            moe_tp_size=2,
            moe_tp_rank=cp_rank,
        )
        with get_parallel().override(**cp), get_observability().override(
            enable_metrics_for_all_schedulers=all_schedulers
        ):
            M.record_vit_encoder_call(path="batched", requests=2, images=2, patches=128)
        return _calls(generate_latest(REGISTRY).decode()) - before

    out["recorded"] = {
        f"cp{cp}-all{int(every)}": calls_after_one_record(cp, every)
        for cp in (0, 1)
        for every in (False, True)
    }
    out["label_names"] = sorted(json.loads(json.dumps(list(M._collector().labels))))
    return out


@pytest.fixture(scope="module")
def result():
    return run_on_ranks(_worker, 1, timeout=180)[0]


def test_series_labels_are_the_schedulers(result):
    assert result["series"] == result["scheduler"]
    # The optional labels are really there (not both sides missing them).
    assert result["series"]["priority"] == ""
    assert result["series"]["deployment"] == "fork-test"
    assert "moe_ep_rank" in result["series"]


def test_calls_counted_once_per_group_unless_every_scheduler_reports(result):
    assert result["recorded"] == {
        "cp0-all0": 1,  # attention-TP rank 0 of CP rank 0 records
        "cp0-all1": 1,
        "cp1-all0": 0,  # another CP rank of the same group: already counted
        "cp1-all1": 1,  # --enable-metrics-for-all-schedulers: every scheduler
    }
