"""The burst table's "encoder calls", "images per call" and "images per rank"
columns, from a real Prometheus exposition of the fork's series (the real
MMEncoderMetricsCollector of each scheduler, ``sglang:mm_encoder_*``, on its
own private registry, fed through its observe methods with the patch count
the series' call sites hand it, ``vit_batching.item_patches``); and "n/a"
from an exposition without them (a control: the parser alone)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import types  # noqa: E402

import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

LABELS = {"model_name": "tiny", "engine_type": "unified", "pp_rank": 0}


def _items(count, modality="IMAGE", patches=64):
    """``count`` items of ``modality``, each one grid of ``patches`` patches
    (audio: that many placeholder tokens)."""
    from sglang.srt.multimodal.modality import Modality

    side = int(patches**0.5)
    grid = {"image_grid_thw": torch.tensor([[1, side, side]])}
    return [
        types.SimpleNamespace(
            modality=Modality[modality],
            model_specific_data=grid if modality == "IMAGE" else {},
            offsets=[(0, patches - 1)],
        )
        for _ in range(count)
    ]


class Server:
    """Two schedulers' collectors (tp_rank 0 records the call series, as
    attention-TP rank 0 does); ``text()`` is a /metrics holding both
    schedulers' series (each registry's exposition in turn)."""

    def __init__(self):
        from cpu_support.ranks.mm_harness import vit_metrics_collector

        self.ranks = [
            vit_metrics_collector({**LABELS, "tp_rank": rank}, rank == 0)
            for rank in (0, 1)
        ]

    def batched(self, images):
        """One cross-request call of ``images`` single-image requests."""
        from sglang.srt.multimodal.vit_batching import item_patches

        metrics = self.ranks[0][0]
        metrics.observe_encoder_call("batched", _items(images), images, item_patches, 0)

    def per_request(self, images, modality="IMAGE"):
        from sglang.srt.multimodal.vit_batching import item_patches

        self.ranks[0][0].observe_encoder_call(
            "per_request", _items(images, modality), 1, item_patches, 0
        )

    def shares(self, *grids):
        for (metrics, _), n in zip(self.ranks, grids):
            metrics.tp_rank_share_total.labels(**metrics.labels).inc(n)

    def text(self):
        from prometheus_client import generate_latest

        return "".join(generate_latest(r).decode() for _, r in self.ranks)


@pytest.fixture
def server():
    return Server()


def test_delta_counts_calls_images_and_max(server):
    server.batched(2)  # before the burst
    before = B.parse_encoder_metrics(server.text())
    for images in (3, 1, 5):
        server.batched(images)
    server.per_request(1)
    # Audio is another modality: not an image call of the burst.
    server.per_request(1, modality="AUDIO")
    server.shares(6, 4)
    d = B.encoder_call_delta(before, B.parse_encoder_metrics(server.text()))
    assert d["encoder_calls"] == 4
    assert d["calls_by_path"] == {"batched": 3, "per_request": 1}
    assert d["images"] == 10
    assert d["images_per_call_mean"] == pytest.approx(10 / 4)
    assert d["images_per_call_max"] == 5
    assert d["rank_grids"] == {"0": 6, "1": 4}
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


def test_rank_grids_alone_are_enough_and_missing_ranks_are_zero(server):
    """A rank that encoded nothing in the interval still gets its column."""
    server.shares(0, 3)
    d = B.encoder_call_delta(None, B.parse_encoder_metrics(server.text()))
    assert B.images_per_rank(d) == [0, 3]


def test_idle_interval_is_zero_calls(server):
    server.batched(1)
    snap = B.parse_encoder_metrics(server.text())
    d = B.encoder_call_delta(snap, B.parse_encoder_metrics(server.text()))
    assert d["encoder_calls"] == 0 and d["images_per_call_mean"] is None
    assert B.fmt_encoder(d) == ("0", "n/a / n/a")
