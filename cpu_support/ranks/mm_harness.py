"""Drive SGLang's real multimodal scheduler code with real items on CPU.

``run_prefill_embedding`` feeds a list of requests (each a list of image
grids, or ready-made items) through the real
``mm_schedule._get_chunked_prefill_embedding`` exactly as a prefill step
does, with the real model's ``get_image_feature`` as the embedding function.
``TowerCalls`` observes the vision tower's real forward calls (it wraps
nothing; it is a forward pre-hook) so tests can count encoder calls and the
images each call carried; ``first_dims`` records the first dimension of a
module's input instead, for towers fed pixels or tiles. ``encoder_spy``
counts the encoder calls themselves. ``PLATFORMS`` are the
``override_platform`` settings and ``on_platform`` puts this process on one
of them (``override_platform`` and the gate's own ``mm_schedule`` platform
flags); ``WarmUpLog`` / ``LogRecords`` collect log lines; ``post_load_hook`` is
SGLang's post-load hook (the model's own ``precompile_kernels_after_loading``),
``shipped_warm_up`` reads the warm-up a model's hook asks for, and
``frames_compiled`` Dynamo's count of compiled frames. ``scheduler_vit_metrics`` runs a
scheduler's ``init_metrics_collector`` with ``--enable-metrics`` and publishes
the series' multimodal encoder metrics collector (``MMEncoderMetricsCollector``,
``sglang:mm_encoder_*``) on a private Prometheus registry
(``vit_metrics_collector`` builds one from given labels,
``noting_observations`` notes what the series hands it); ``metric_samples``
and ``metric_total`` read a registry back as a scrape shows it.
"""

from __future__ import annotations

import contextlib
import logging
import types
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
from cpu_support.tiny_models.tiny_qwen3_vl import image_item, tokens_per_image

TEXT_BEFORE = 5  # text tokens before the first image of a request
TEXT_BETWEEN = 2  # text tokens between two images / after the last

# override_platform(**PLATFORMS[name]): the platform facts SGLang reads.
PLATFORMS = {
    "CUDA": dict(is_hip=False, is_cuda=True, is_npu=False, is_xpu=False),
    "NPU": dict(is_hip=False, is_cuda=False, is_npu=True, is_xpu=False),
    "XPU": dict(is_hip=False, is_cuda=False, is_npu=False, is_xpu=True),
    "ROCm": dict(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False),
    # None of the four: a platform that batched before the series (this CPU).
    "CPU": dict(is_hip=False, is_cuda=False, is_npu=False, is_xpu=False),
}
ROCM = PLATFORMS["ROCm"]
CUDA = PLATFORMS["CUDA"]
# The gate (mm_schedule._batch_vit_across_requests) reads these module flags,
# set at import; everything else reads the platform from the runtime context.
GATE_FLAGS = ("is_hip", "is_npu", "is_xpu")


@contextlib.contextmanager
def on_platform(name: str):
    """This process on platform ``name`` (a ``PLATFORMS`` key) while inside:
    ``override_platform`` for every reader of the runtime context, and
    ``mm_schedule``'s ``_is_hip`` / ``_is_npu`` / ``_is_xpu`` for the gate."""
    from sglang.srt.managers import mm_schedule
    from sglang.srt.runtime_context import override_platform

    facts = PLATFORMS[name]
    saved = {flag: getattr(mm_schedule, f"_{flag}") for flag in GATE_FLAGS}
    try:
        for flag in GATE_FLAGS:
            setattr(mm_schedule, f"_{flag}", facts[flag])
        with override_platform(**facts):
            yield
    finally:
        for flag, value in saved.items():
            setattr(mm_schedule, f"_{flag}", value)


@dataclass
class Request:
    items: list
    length: int  # prompt tokens
    prefix: int = 0  # already-prefilled tokens (chunked prefill)
    extend: Optional[int] = None  # tokens in this step (default: the rest)

    @property
    def extend_len(self) -> int:
        return self.length - self.prefix if self.extend is None else self.extend


def make_request(
    grids: Sequence[Tuple[int, int, int]], *, seed: int, config=None
) -> Request:
    """One request: text, then each image's placeholder span, text between."""
    items = []
    pos = TEXT_BEFORE
    for k, grid in enumerate(grids):
        item = image_item(tuple(grid), seed=seed * 1000 + k, offset=pos, config=config)
        items.append(item)
        pos += tokens_per_image(grid) + TEXT_BETWEEN
    return Request(items=items, length=pos)


def from_mm_inputs(mm_inputs, length: int) -> Request:
    """A whole prompt of ``length`` tokens from its real ``MultimodalInputs``:
    its image items, picked as ``embed_mm_inputs`` picks them for the image
    modality."""
    from sglang.srt.managers.schedule_batch import Modality

    images = [it for it in mm_inputs.mm_items if it.is_modality(Modality.IMAGE)]
    return Request(items=images, length=length)


def run_prefill_embedding(model, requests: List[Request]) -> Optional[torch.Tensor]:
    """The step's multimodal embedding rows, from the REAL scheduler function."""
    from sglang.srt.managers import mm_schedule

    items, sizes, offsets = [], [0], []
    for req in requests:
        items.extend(req.items)
        sizes.append(len(items))
        offsets.append([span for it in req.items for span in it.offsets])
    total = sum(r.extend_len for r in requests)
    input_ids = torch.zeros(total, dtype=torch.long)
    embedding, _ = mm_schedule._get_chunked_prefill_embedding(
        model.get_image_feature,
        items,
        sizes,
        [r.prefix for r in requests],
        [r.extend_len for r in requests],
        offsets,
        input_ids,
    )
    return embedding


def encoder_spy(model, record):
    """``model.get_image_feature`` as a bound method of ``model`` that hands
    each call's items to ``record`` and then runs the real method."""
    real = type(model).get_image_feature

    def get_image_feature(self, items):
        record(items)
        return real(self, items)

    return types.MethodType(get_image_feature, model)


def first_dims(module: torch.nn.Module, seen: list):
    """A forward pre-hook on ``module`` that appends the first dimension of
    each call's input (the first positional argument, else the first keyword
    one) to ``seen``; returns the hook's handle."""

    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        seen.append(int(x.shape[0]))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


class LogRecords(logging.Handler):
    """Collects ``(level, message)`` of each record it is handed."""

    def __init__(self, level: int = logging.DEBUG):
        super().__init__(level)
        self.lines = []

    def line(self, record):
        return record.levelno, record.getMessage()

    def emit(self, record):
        line = self.line(record)
        if line is not None:
            self.lines.append(line)


# The vision warm-up (mm_utils.warm_up_vision_tower) logs on its module's logger.
WARM_UP_LOGGER = "sglang.srt.multimodal.mm_utils"


class WarmUpLog(LogRecords):
    """Collects the messages that start with "vision warm-up" (INFO and up)."""

    def __init__(self):
        super().__init__(logging.INFO)

    def line(self, record):
        message = record.getMessage()
        return message if message.startswith("vision warm-up") else None


def capture_log(name: str, records: type = LogRecords) -> LogRecords:
    """A ``records`` handler (``LogRecords`` by default) on logger ``name``,
    set to INFO, for the rest of the process."""
    handler = records()
    log = logging.getLogger(name)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


# The gate says what ROCm chose through SGLang's print_info_once, whose
# logger is its own module's.
GATE_LOGGER = "sglang.srt.utils.common"


class GateLines(LogRecords):
    def line(self, record):
        message = record.getMessage()
        if "cross-request ViT batching" in message:
            return record.levelno, message
        return None


def capture_gate_log() -> GateLines:
    """The gate's INFO lines (``cross-request ViT batching on ROCm: ...``) for
    the rest of the process."""
    return capture_log(GATE_LOGGER, GateLines)


def fresh_gate_log() -> None:
    """Forget the gate decisions this process logged, as a fresh server."""
    from sglang.srt.utils import print_info_once

    print_info_once.cache_clear()


@contextlib.contextmanager
def warm_up_log():
    """A ``WarmUpLog`` on the vision warm-up's logger (set to INFO) while inside."""
    handler = WarmUpLog()
    log = logging.getLogger(WARM_UP_LOGGER)
    previous = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(previous)


def post_load_hook(model) -> None:
    """What SGLang runs on every rank after the weights load (and what an
    --encoder-only server runs), with the series applied."""
    from sglang.srt.model_executor.model_runner_components.load_model_utils import (
        maybe_precompile_model_kernels_after_loading,
    )

    maybe_precompile_model_kernels_after_loading(model, "cpu")


def shipped_warm_up(model):
    """What the model's own ``precompile_kernels_after_loading`` hands
    ``mm_utils.warm_up_vision_tower``, read by running that hook with the
    warm-up (and ``call_on_dummy_patches``, where the hook builds its call
    with it) replaced, in each module along the model's MRO, by recorders
    that call no tower: a dict with ``tower_name``, ``tower``, ``calls``,
    ``call`` (the hook's own call, None for the default), ``rope_type``,
    ``pass_grid_thw_list`` and ``patch_shape`` (resolved for the tower; the
    last three None for a call of the model's own, which is no rank share of
    ``run_dp_sharded_mrope_vision_model``), or None when the hook warms
    nothing (no hook, or one without a vision warm-up)."""
    import sys

    from sglang.srt.multimodal import mm_utils

    hook = getattr(model, "precompile_kernels_after_loading", None)
    if hook is None:
        return None
    seen, shapes = [], {}

    def record(model_, tower, calls, call=None):
        seen.append(dict(tower=tower, calls=calls, call=call))

    def dummy_patches(tower, patch_shape, rope_type="rope_3d", pass_list=False):
        call = mm_utils.call_on_dummy_patches(tower, patch_shape, rope_type, pass_list)
        shapes[id(call)] = (patch_shape, rope_type, pass_list, call)
        return call

    patched = []
    for cls in type(model).__mro__:
        module = sys.modules.get(cls.__module__)
        for name, stand_in in (
            ("warm_up_vision_tower", record),
            ("call_on_dummy_patches", dummy_patches),
        ):
            if module is not None and hasattr(module, name):
                patched.append((module, name, getattr(module, name)))
                setattr(module, name, stand_in)
    try:
        hook()
    finally:
        for module, name, real in reversed(patched):
            setattr(module, name, real)
    seen = [found for found in seen if found["tower"] is not None]
    if not seen:
        return None
    (found,) = seen  # one warm-up per hook, along the whole MRO
    tower, call = found["tower"], found["call"]
    if call is None:  # the default: rope_3d rank shares of flattened patches
        embed = tower.patch_embed
        patch = embed.in_channels * embed.temporal_patch_size * embed.patch_size**2
        found.update(rope_type="rope_3d", pass_grid_thw_list=False)
        found["patch_shape"] = (patch,)
    elif id(call) in shapes:
        shape, rope_type, pass_list, _ = shapes[id(call)]
        found.update(rope_type=rope_type, pass_grid_thw_list=pass_list)
        found["patch_shape"] = tuple(shape(tower) if callable(shape) else shape)
    else:  # the model's own call (InternVL's tiles, Muse Spark's images)
        found.update(rope_type=None, pass_grid_thw_list=None, patch_shape=None)
    found["tower_name"] = next(
        (name for name, child in model.named_modules() if child is tower), None
    )
    return found


def frames_compiled() -> int:
    """Frames Dynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def fresh_embedding_cache(max_bytes: int = 1 << 30) -> None:
    """A new, empty multimodal embedding cache (what a fresh server has)."""
    from sglang.srt.managers import mm_schedule

    mm_schedule.init_mm_embedding_cache(max_bytes)


@dataclass
class TowerCalls:
    """Records each real forward call of a vision tower: the grids it got
    (``grid_thw``, ``grid_hw`` for 2-D rope towers, else the second positional
    argument) and the names of its keyword arguments."""

    calls: List[List[Tuple[int, ...]]] = field(default_factory=list)
    kwargs: List[Tuple[str, ...]] = field(default_factory=list)
    _handle: object = None

    def attach(self, tower: torch.nn.Module) -> "TowerCalls":
        def hook(module, args, kwargs):
            grid = kwargs.get("grid_thw", kwargs.get("grid_hw"))
            if grid is None and len(args) > 1:
                grid = args[1]
            rows = grid.tolist() if isinstance(grid, torch.Tensor) else list(grid)
            self.calls.append([tuple(int(v) for v in row) for row in rows])
            self.kwargs.append(tuple(sorted(kwargs)))

        self._handle = tower.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()

    @property
    def images(self) -> int:
        return sum(len(c) for c in self.calls)

    def reset(self) -> None:
        self.calls.clear()
        self.kwargs.clear()


def reference_rows(model, requests: List[Request]) -> torch.Tensor:
    """Each image encoded ALONE, assembled in request order, windowed like the
    scheduler windows a chunk: the expected output of a prefill step."""
    rows = []
    for req in requests:
        start, end = req.prefix, req.prefix + req.extend_len
        for item in req.items:
            emb = model.get_image_feature([item])
            emb = emb.reshape(-1, emb.shape[-1])
            base = 0  # a multi-span item's rows are its spans, concatenated
            for s, e in item.offsets:
                lo, hi = max(s, start), min(e + 1, end)
                if lo < hi:
                    rows.append(emb[base + lo - s : base + hi - s])
                base += e - s + 1
    return torch.cat(rows) if rows else None


# ---------------------------------------------------------------------------
# The series' multimodal encoder metrics, as a scheduler with --enable-metrics
# has them
# ---------------------------------------------------------------------------


def vit_metrics_collector(labels: dict, records_calls: bool = True, registry=None):
    """A ``MMEncoderMetricsCollector`` with ``labels`` whose series go to
    ``registry`` (a new private ``CollectorRegistry`` by default), the way the
    Ray wrappers swap its backend; returns ``(collector, registry)``. Not
    published: publish it with
    ``get_resources().override(mm_encoder_metrics=collector)``."""
    import functools

    from prometheus_client import CollectorRegistry, Counter, Histogram

    from sglang.srt.observability.metrics_collector import MMEncoderMetricsCollector

    registry = CollectorRegistry() if registry is None else registry

    class PrivateRegistryCollector(MMEncoderMetricsCollector):
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    return PrivateRegistryCollector(labels, records_calls=records_calls), registry


def noting_observations(collector, note):
    """``collector`` (a ``MMEncoderMetricsCollector``), each encoder call the
    series hands it also passed to ``note`` before the real method runs: as
    ``dict(path, modality, requests, items, patches)`` (the patches by the
    call site's own ``patches_of``), then this rank's DP-encoder share of it
    as ``dict(tp_rank_share=n)``. Noted on every rank, recording or not."""
    observe_call = collector.observe_encoder_call

    def observe_encoder_call(path, items, requests, patches_of, tp_rank_share):
        note(
            dict(
                path=path,
                modality=items[0].modality.name.lower(),
                requests=requests,
                items=len(items),
                patches=sum(patches_of(item) for item in items),
            )
        )
        note(dict(tp_rank_share=tp_rank_share))
        observe_call(path, items, requests, patches_of, tp_rank_share)

    collector.observe_encoder_call = observe_encoder_call
    return collector


class _SchedulerLabels:
    """Stands in for ``SchedulerMetricsCollector``, whose series would go to
    the process-wide registry (a second build in one process fails on
    duplicate names): keeps only the labels ``init_new`` gave it."""

    def __init__(self, labels, **_):
        self.labels = labels


@contextlib.contextmanager
def scheduler_vit_metrics(registry=None, **observability):
    """A scheduler's real ``init_metrics_collector`` under ``--enable-metrics``
    (and any other ``observability`` leaves given, e.g.
    ``enable_metrics_for_all_schedulers``), in the published context: the
    series' collector is built from ``init_new``'s labels and decision into
    ``registry`` (a new private one by default) and published for the encoder
    path while inside. Yields ``(scheduler, registry)``;
    ``scheduler.metrics_collector.labels`` are the labels."""
    from prometheus_client import CollectorRegistry

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.observability.metrics_collector import STAT_LOGGER_ROLE_MM_ENCODER
    from sglang.srt.runtime_context import (
        get_observability,
        get_resources,
        get_server_args,
    )

    registry = CollectorRegistry() if registry is None else registry

    def on_registry(labels, records_calls):
        return vit_metrics_collector(labels, records_calls, registry)[0]

    stat_loggers = {
        "scheduler": _SchedulerLabels,
        STAT_LOGGER_ROLE_MM_ENCODER: on_registry,
    }
    fields = dict(enable_metrics=True, stat_loggers=stat_loggers, **observability)
    with get_observability().override(**fields), get_resources().override(
        mm_encoder_metrics=None
    ):
        scheduler = Scheduler.__new__(Scheduler)
        scheduler.server_args = get_server_args()
        scheduler.enable_priority_scheduling = False
        scheduler.enable_lora = False
        scheduler.enable_hierarchical_cache = False
        scheduler.model_config = types.SimpleNamespace(is_multimodal=True)
        scheduler.init_metrics_collector()
        yield scheduler, registry


def metric_samples(registry, name: str) -> List[Tuple[dict, float]]:
    """``(labels, value)`` of each sample called ``name`` in the registry's
    text exposition (what a ``/metrics`` scrape shows), read back through
    ``prometheus_client.parser``."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def metric_total(registry, name: str, **labels) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        value
        for seen, value in metric_samples(registry, name)
        if all(seen.get(k) == str(v) for k, v in labels.items())
    )


# ---------------------------------------------------------------------------
# The two decisions, tabulated in one process (no TP groups built)
# ---------------------------------------------------------------------------

# How the model behind the encoder answers ``dp_encoder_spreads_images``:
# "dp" answers its DP-encoder choice (use_data_parallel = the flag),
# "not-dp" answers False (built replicated, not split), "ignores-flag" has no
# such method (a model that never reads the flag).
ENCODER_KINDS = ("dp", "not-dp", "ignores-flag")
DECISION_PLATFORMS = ("ROCm", "CUDA", "NPU", "XPU", "CPU")


class DecisionModel:
    """The facts the decisions read from a loaded model, and nothing else:
    its class (a subclass of SGLang's ``Qwen3VLForConditionalGeneration``, a
    data-parallel family that answers ``dp_encoder_spreads_images`` with the
    DP-encoder choice it made when it was built, ``use_data_parallel``, built
    without its layers), and a vision tower attribute. Without a choice
    (``use_data_parallel=None``) it is a model of no such family: a module
    with a tower and ``get_image_feature`` that does not answer. Its encoder
    must never run."""

    def __new__(cls, use_data_parallel=None):
        if use_data_parallel is None:
            return _decision_model_classes()[1]()
        return _decision_model_classes()[0](use_data_parallel)


_DECISION_MODEL_CLASSES = None


def _decision_model_classes():
    global _DECISION_MODEL_CLASSES
    if _DECISION_MODEL_CLASSES is None:
        from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration

        def get_image_feature(self, items):
            raise AssertionError("a decision must not encode")

        class Qwen3VLDecisionModel(Qwen3VLForConditionalGeneration):
            def __init__(self, use_data_parallel):
                torch.nn.Module.__init__(self)
                self.visual = torch.nn.Identity()
                self.use_data_parallel = use_data_parallel

        class NoAnswerDecisionModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.visual = torch.nn.Identity()

        for model_class in (Qwen3VLDecisionModel, NoAnswerDecisionModel):
            model_class.get_image_feature = get_image_feature
        _DECISION_MODEL_CLASSES = (Qwen3VLDecisionModel, NoAnswerDecisionModel)
    return _DECISION_MODEL_CLASSES


def decision_rows():
    import itertools

    return list(
        itertools.product(DECISION_PLATFORMS, (False, True), (1, 2), ENCODER_KINDS)
    )


def decision_tables(rank, world_size, init_method):
    """Run on one spawned process (``run_on_ranks(decision_tables, 1)``): each
    attention-TP width is published as a server of that width would publish
    it (the process builds no TP groups, so the runtime context accepts it).

    Returns ``{"gate": {row: (decisions, helper, INFO lines, model class)},
    "warm_up": {row + (encoder_only,): warm}, "warm_up_guards": {name: warm}}``
    for every row of ``decision_rows()`` (platform, flag, attention-TP,
    encoder kind); ``helper`` is ``mm_schedule.hip_dp_encoder_batches_vit()``.
    """
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.managers import mm_schedule
    from sglang.srt.multimodal import mm_utils
    from sglang.srt.multimodal.modality import Modality
    from sglang.srt.runtime_context import get_disagg, get_mm, get_parallel

    # A one-rank process group, as a server's rank 0 has (no TP groups are
    # built).
    torch.distributed.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size
    )
    model_dir = T.write_config_dir()
    records = capture_gate_log().lines
    tables = {"gate": {}, "warm_up": {}, "warm_up_guards": {}}
    for row in decision_rows():
        platform, flag, attn_tp, kind = row
        T.publish_cpu_context(tp_size=attn_tp, dp_encoder=flag, model_path=model_dir)
        model = DecisionModel({"dp": flag, "not-dp": False, "ignores-flag": None}[kind])
        fresh_gate_log()  # as if a fresh process
        with on_platform(platform), get_mm().override(mm_enable_dp_encoder=flag):
            first = len(records)
            # The scheduler's own gate, three times: one INFO line.
            gates = {
                mm_schedule._batch_vit_across_requests(
                    model.get_image_feature, Modality.IMAGE
                )
                for _ in range(3)
            }
            tables["gate"][row] = (
                gates,
                mm_schedule.hip_dp_encoder_batches_vit(),
                records[first:],
                type(model).__name__,
            )
            for encoder_only in (False, True):
                with get_disagg().override(encoder_only=encoder_only):
                    tables["warm_up"][row + (encoder_only,)] = (
                        mm_utils.vision_warm_up_needed(model)
                    )
    # The guards after the condition, where everything else says warm.
    T.publish_cpu_context(tp_size=2, dp_encoder=True, model_path=model_dir)
    model = DecisionModel(True)
    guards = tables["warm_up_guards"]
    with on_platform("ROCm"):
        guards["warm"] = mm_utils.vision_warm_up_needed(model)
        with get_disagg().override(language_only=True):
            guards["language_only"] = mm_utils.vision_warm_up_needed(model)
        with get_disagg().override(language_model_only=True):
            guards["language_model_only"] = mm_utils.vision_warm_up_needed(model)
        with get_parallel().override(pp_size=2, pp_rank=1):
            guards["pp_rank_1"] = mm_utils.vision_warm_up_needed(model)
    return tables
