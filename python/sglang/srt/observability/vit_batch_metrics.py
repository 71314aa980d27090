"""How big are cross-request ViT batches really? Metrics of encoder calls.

Cross-request batching only pays when a prefill step actually holds several
requests' images; a front end that tokenizes images one at a time can feed
the encoder slower than it drains, and then every "batch" holds one image.
Nobody can see that without instrumenting by hand, so every vision-encoder
call made by the scheduler's multimodal path is described here:

* a DEBUG log line per call: path (``batched`` = the cross-request path,
  ``per_request`` = one request's images), requests, images, patches, rank;
* with ``--enable-metrics``, Prometheus series in SGLang's naming style:

  - ``sglang:mm_encoder_calls_total{path}``            encoder calls
  - ``sglang:mm_encoder_call_requests{path}``          histogram, requests per call
  - ``sglang:mm_encoder_call_images{path}``            histogram, images per call
  - ``sglang:mm_encoder_call_patches{path}``           histogram, patches per call
  - ``sglang:mm_encoder_rank_images_total{rank}``      images each attention-TP
    rank encoded through the DP encoder (``--mm-enable-dp-encoder``)

Every attention-TP rank runs the same call, so call-level series are recorded
by attention-TP rank 0 only (one series per attention-DP group); the per-rank
image counter is recorded by every rank, for its own share.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

logger = logging.getLogger(__name__)

# Fine at the small end so that "images per call" reads exactly for bursts
# that matter; coarse beyond.
COUNT_BUCKETS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 256, 512]
PATCH_BUCKETS = [64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]


class ViTEncoderCallMetrics:
    """The Prometheus series; built once per process, when metrics are on."""

    def __init__(self, labels: Dict[str, str]) -> None:
        # Imported late: prometheus_client reads PROMETHEUS_MULTIPROC_DIR at import.
        from prometheus_client import Counter, Histogram

        self.labels = dict(labels)
        names = list(self.labels) + ["path"]
        self.calls = Counter(
            name="sglang:mm_encoder_calls_total",
            documentation="Vision-encoder calls made by the multimodal scheduler path.",
            labelnames=names,
        )
        self.requests = Histogram(
            name="sglang:mm_encoder_call_requests",
            documentation="Requests whose images one vision-encoder call encoded.",
            labelnames=names,
            buckets=COUNT_BUCKETS,
        )
        self.images = Histogram(
            name="sglang:mm_encoder_call_images",
            documentation="Images (multimodal items) one vision-encoder call encoded.",
            labelnames=names,
            buckets=COUNT_BUCKETS,
        )
        self.patches = Histogram(
            name="sglang:mm_encoder_call_patches",
            documentation="Vision patches one vision-encoder call encoded.",
            labelnames=names,
            buckets=PATCH_BUCKETS,
        )
        self.rank_images = Counter(
            name="sglang:mm_encoder_rank_images_total",
            documentation="Images each attention-TP rank encoded through the DP encoder.",
            labelnames=list(self.labels) + ["rank"],
        )

    def observe_call(self, path: str, requests: int, images: int, patches: int) -> None:
        labels = dict(self.labels, path=path)
        self.calls.labels(**labels).inc()
        self.requests.labels(**labels).observe(requests)
        self.images.labels(**labels).observe(images)
        self.patches.labels(**labels).observe(patches)

    def observe_rank_images(self, rank: int, images: int) -> None:
        self.rank_images.labels(**dict(self.labels, rank=str(rank))).inc(images)


_metrics: Optional[ViTEncoderCallMetrics] = None


def _collector() -> Optional[ViTEncoderCallMetrics]:
    """The process's collector (built on first use), or None when
    ``--enable-metrics`` is off. Reading the flag costs a config lookup,
    nothing next to an encoder call."""
    global _metrics
    from sglang.srt.runtime_context import get_observability, get_serving

    if not get_observability().enable_metrics:
        return None
    if _metrics is None:
        labels = {"model_name": str(get_serving().served_model_name)}
        labels.update(get_observability().extra_metric_labels or {})
        _metrics = ViTEncoderCallMetrics(labels)
    return _metrics


def _attn_tp_rank() -> int:
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().attn_tp_rank)
    except Exception:  # ranks are unpublished outside a server/worker
        return 0


def record_vit_encoder_call(*, path: str, requests: int, images: int, patches: int) -> None:
    """One vision-encoder call of the scheduler's multimodal path."""
    rank = _attn_tp_rank()
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "ViT encoder call: path=%s requests=%d images=%d patches=%d rank=%d",
            path, requests, images, patches, rank,
        )
    if rank == 0:
        collector = _collector()
        if collector is not None:
            collector.observe_call(path, requests, images, patches)


def record_dp_encoder_rank_images(images: int) -> None:
    """This rank's share of one DP-encoder call (recorded on every rank)."""
    rank = _attn_tp_rank()
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("ViT DP encoder: rank=%d images=%d", rank, images)
    collector = _collector()
    if collector is not None:
        collector.observe_rank_images(rank, images)
