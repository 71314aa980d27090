"""The burst table's "encoder calls" and "images per call" columns, from a real
Prometheus exposition of the fork's series (the real ViTEncoderCallMetrics,
on a private registry); and "n/a" from an exposition without them (a control:
the parser alone)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import bench_image_burst as B  # noqa: E402
import prometheus_client  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def exposition(monkeypatch):
    """Series built by the real class, registered on a fresh registry."""
    from sglang.srt.observability import vit_batch_metrics as M

    registry = prometheus_client.CollectorRegistry()
    for cls in (prometheus_client.Counter, prometheus_client.Histogram):
        monkeypatch.setattr(prometheus_client, cls.__name__, _on(cls, registry))
    metrics = M.ViTEncoderCallMetrics({"model_name": "tiny"})
    return metrics, lambda: prometheus_client.generate_latest(registry).decode()


def _on(cls, registry):
    def make(*args, **kwargs):
        return cls(*args, registry=registry, **kwargs)

    return make


def test_delta_counts_calls_images_and_max(exposition):
    metrics, text = exposition
    metrics.observe_call("batched", 2, 2, 128)  # before the burst
    before = B.parse_encoder_metrics(text())
    for images in (3, 1, 5):
        metrics.observe_call("batched", images, images, 64 * images)
    metrics.observe_call("per_request", 1, 1, 64)
    metrics.observe_rank_images(0, 6)
    metrics.observe_rank_images(1, 4)
    d = B.encoder_call_delta(before, B.parse_encoder_metrics(text()))
    assert d["encoder_calls"] == 4
    assert d["calls_by_path"] == {"batched": 3, "per_request": 1}
    assert d["images"] == 10
    assert d["images_per_call_mean"] == pytest.approx(10 / 4)
    assert d["images_per_call_max"] == 5
    assert d["rank_images"] == {"0": 6, "1": 4}
    assert B.fmt_encoder(d) == ("4", "2.50 / 5")
    # The table's "Images per rank" column comes from these counters.
    assert B.images_per_rank(d) == [6, 4]
    assert B.fmt_images(B.images_per_rank(d)) == "6 / 4"


@pytest.mark.control(
    reason="harness: the burst table reads n/a from a /metrics without the fork's series "
    "(what a pristine server exports); no SGLang code involved"
)
def test_no_series_means_not_available():
    assert B.parse_encoder_metrics("# nothing here\n") is None
    assert B.encoder_call_delta(None, None) is None
    assert B.fmt_encoder(None) == ("n/a", "n/a")
    assert B.images_per_rank(None) is None and B.fmt_images(None) == "n/a"


def test_rank_images_alone_are_enough_and_missing_ranks_are_zero(exposition):
    """A rank that encoded nothing in the interval still gets its column."""
    metrics, text = exposition
    metrics.observe_rank_images(1, 3)
    d = B.encoder_call_delta(None, B.parse_encoder_metrics(text()))
    assert B.images_per_rank(d) == [0, 3]


def test_idle_interval_is_zero_calls(exposition):
    metrics, text = exposition
    metrics.observe_call("batched", 1, 1, 64)
    snap = B.parse_encoder_metrics(text())
    d = B.encoder_call_delta(snap, B.parse_encoder_metrics(text()))
    assert d["encoder_calls"] == 0 and d["images_per_call_mean"] is None
    assert B.fmt_encoder(d) == ("0", "n/a / n/a")
