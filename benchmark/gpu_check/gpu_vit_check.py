#!/usr/bin/env python
"""One prepared GPU check of cross-request ViT batching with a Qwen3-VL-8B-sized tower.

SGLang's real ``Qwen3VLForConditionalGeneration`` with the vision sizes of
Qwen/Qwen3-VL-8B-Instruct (random weights, nothing downloaded; the text part
is tiny, only the tower matters) encodes a burst of single-image requests of
mixed sizes through SGLang's real prefill-step function
(``mm_schedule._get_chunked_prefill_embedding``), on one device:

1. per-request vs batched vision step: the same step with the platform gate
   (``mm_schedule._batch_vit_across_requests``) pinned off (one encoder call
   per request, upstream's per-request path) or on (one cross-request call);
   first call (unseen shapes) vs warmed calls (median of --repeats);
2. peak memory of the batched step vs ``--mm-max-encoder-input-tokens-per-batch``
   (set with ``get_mm().override``; one rank here, so each call holds at most
   that many input patches), read after the embedding cache was
   emptied (the previous step's cached embeddings are freed first): on CUDA
   torch.cuda.max_memory_allocated over the step minus what was allocated
   before it; on CPU the process's
   peak RSS growth (VmHWM after /proc/self/clear_refs, glibc's mmap threshold
   pinned so freed activations leave the RSS);
3. batched vs each image alone (``get_image_feature([item])``) in the model
   dtype (bf16 by default): max |diff|, mean and minimum per-token cosine,
   bitwise equality, and the batched step's time (the series promises no
   bitwise equality: it has no deterministic-inference path of its own);
4. the ``sdpa`` vision backend with --sdpa-images requests in one call, laid
   out as one size, two sizes alternating and all sizes distinct: SDPA
   launches per layer (counted at ``F.scaled_dot_product_attention``; the
   series attends each distinct length with its own call, copying non-adjacent
   images of one size together) and the batched vs per-request step time; when
   the device's backend is another one, a second model with the same seeded
   weights is built for ``sdpa`` and the other backend gets the distinct-sizes
   row as the reference;
5. bursts of one size, of the check's mixed sizes and of new sizes, each
   twice, as batched steps in calls of at most 8,192 patches with SGLang's ViT
   CUDA graphs on (``SGLANG_VIT_ENABLE_CUDA_GRAPH=1``, set in this process
   only) and off: per burst the calls that captured a graph, replayed one or
   ran eagerly, the step time on and off, and the largest difference between
   them. CUDA only; on the CPU the section says it was skipped and why.

After the process-level warm-up (the check's "ready"), each section records
what it compiled (``built_after_ready`` in the JSON, one line under each
section's table, and a column per burst of section 5): Dynamo graphs (torch's
``unique_graphs`` counter) and the entries the Triton and Inductor cache
folders gained (TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR, else their
default folders; ``vit_bench_util.new_cache_entries``).

With ``--out``, every section writes ``NN-<name>.json`` and ``NN-<name>.md``
there as soon as it ends, and ``gpu_vit_check.json`` / ``.md`` are rewritten
with every finished section (``"complete": false`` until the last one). On
SIGTERM (e.g. from ``timeout``) the check stops, marks the report
``"stopped"`` and exits 143: what finished is already on disk.

The gate is pinned inside this process only (SGLang batches on CUDA anyway;
on ROCm at TP1 it would not, so "batched" is what the series does with the DP
encoder). Exit status 0 once every section is written.

GPU (one device; ROCm builds of torch also answer to "cuda"):
    python benchmark/gpu_check/gpu_vit_check.py --device cuda --out /tmp/gpu_vit_check
CPU, the same code path with tiny sizes in seconds (what the tests run):
    .venv/bin/python benchmark/gpu_check/gpu_vit_check.py --tiny --out /tmp/gpu_vit_check_tiny
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import signal
import statistics
import sys
import time
from typing import NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
# cpu_support: beside this file in the bare-GPU archive (pack_gpu_check.py),
# at the repository root (two folders up) in the repository.
sys.path.insert(
    0,
    (
        HERE
        if os.path.isdir(os.path.join(HERE, "cpu_support"))
        else os.path.dirname(os.path.dirname(HERE))
    ),
)

# Both without side effects at import (stdlib only; the sizes).
from cpu_support.bench import vit_bench_util as U  # noqa: E402
from cpu_support.tiny_models.tiny_sizes import TINY_TEXT  # noqa: E402

# Vision config of Qwen/Qwen3-VL-8B-Instruct (config.json, "vision_config").
QWEN3_VL_8B_VISION = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=4096,
    num_position_embeddings=2304,
    deepstack_visual_indexes=[8, 16, 24],
    hidden_act="gelu_pytorch_tanh",
)
# Head dim 48: no tiny image's patch count equals it, so torch.compile's duck
# sizing (SGLang compiles the native rotary helper) does not specialise on a
# coincidence and recompile mid-run.
TINY_VISION = dict(
    QWEN3_VL_8B_VISION,
    depth=3,
    hidden_size=96,
    intermediate_size=192,
    num_heads=2,
    out_hidden_size=64,
    num_position_embeddings=256,
    deepstack_visual_indexes=[1],
)
BURST = "224x224:6,448x448:4,128x448:4,672x672:2"  # 16 requests, 8736 patches
TINY_BURST = "64x64:6,128x128:4,64x128:4,192x192:2"  # 16 requests, 768 patches
CAPS = "1024,2048,4096,none"
TINY_CAPS = "1,64,256,none"
TEXT_BEFORE, TEXT_AFTER = 5, 2  # text tokens around each request's image
# The SDPA rows: this many single-image requests in one call, laid out as one
# size, two sizes alternating, and all sizes distinct (widths base + 32 k).
SDPA_IMAGES, SDPA_BASE = 8, 224
TINY_SDPA_IMAGES, TINY_SDPA_BASE = 4, 64


# ---------------------------------------------------------------------------
# Process set-up: CPU stand-ins only on the CPU path
# ---------------------------------------------------------------------------


def _prepare_process(device: str) -> None:
    if device != "cpu":
        return  # a CUDA/ROCm install has SGLang's kernels; no stand-ins
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # Peak RSS must see freed activations leave: re-exec with glibc's
        # mmap threshold pinned (it cannot change after start-up).
        U.pin_malloc_env()
        os.execv(sys.executable, [sys.executable] + sys.argv)
    from cpu_support.standins.prepare import prepare_cpu_process

    prepare_cpu_process()


def make_config(vision: dict, text_fields: Optional[dict] = None, name="gpu-vit-check"):
    """The Qwen3-VL config with ``vision`` and a one-layer text part (plus
    ``text_fields``), written to a folder named after ``name``."""
    from sglang.srt.configs.qwen3_vl import Qwen3VLConfig

    # The text side only has to build: the tiny model's one small layer, at the
    # tower's out_hidden_size.
    text = dict(TINY_TEXT, hidden_size=vision["out_hidden_size"], **(text_fields or {}))
    config = Qwen3VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False
    )
    for key, value in config.text_config.to_dict().items():  # as SGLang's loader does
        if key not in ("model_type", "architectures", "transformers_version"):
            setattr(config, key, value)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config, U.config_dir(config, name)


def init_ranks(
    device: str,
    model_dir: str,
    attention_backend,
    *,
    tp_size: int = 1,
    rank: int = 0,
    local_rank: int = 0,
    init_method: Optional[str] = None,
    dp_encoder: bool = False,
    backend: Optional[str] = None,
) -> None:
    """SGLang's runtime context and model-parallel groups for rank ``rank`` of ``tp_size``
    (``backend``, default nccl on cuda, gloo on cpu)."""
    import torch

    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=model_dir,
        device=device,
        tp_size=tp_size,
        mm_attention_backend=attention_backend,
        mm_enable_dp_encoder=dp_encoder,
        disable_custom_all_reduce=True,
    )
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank))
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    init_distributed_environment(
        world_size=tp_size,
        rank=rank,
        distributed_init_method=init_method or f"tcp://127.0.0.1:{U.free_port()}",
        local_rank=local_rank,
        backend=backend,
    )
    initialize_model_parallel(backend=backend)


def build_dp_encoder_rank(config, model_dir, opts: dict, rank, world_size, init_method):
    """Rank ``rank`` of ``world_size`` with the DP encoder: SGLang's runtime
    context and groups, then the model (``opts``: device, dtype,
    attention_backend, and optionally local_rank and dist_backend)."""
    import torch

    device = opts["device"]
    init_ranks(
        device,
        model_dir,
        opts["attention_backend"],
        tp_size=world_size,
        rank=rank,
        local_rank=opts.get("local_rank", rank),
        init_method=init_method,
        dp_encoder=True,
        backend=opts.get("dist_backend"),
    )
    return build_model(config, device, getattr(torch, opts["dtype"]), seed=0)


def timed_prefill_step(model, requests, device: str, dev, group) -> float:
    """One prefill step between two barriers of ``group``, the device synced
    around it: its seconds, the same on every rank."""
    import torch

    torch.distributed.barrier(group)
    dev.sync()
    start = time.perf_counter()
    prefill_step(model, requests, device)
    dev.sync()
    torch.distributed.barrier(group)
    return time.perf_counter() - start


def build(device: str, vision: dict, dtype, attention_backend, seed: int = 0):
    """SGLang's runtime context, one-rank groups and the model, on ``device``."""
    config, model_dir = make_config(vision)
    init_ranks(device, model_dir, attention_backend)
    return build_model(config, device, dtype, seed=seed), config


def build_model(
    config,
    device: str,
    dtype,
    *,
    seed: int = 0,
    attention_backend: Optional[str] = None,
):
    """The model on ``device`` with seeded weights (the same seed, the same
    weights); ``attention_backend`` overrides the published vision attention
    backend for this build only."""
    import torch
    from cpu_support.tiny_models.seeded_model import default_dtype, fill_weights_

    from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration
    from sglang.srt.runtime_context import get_mm

    backend = (
        contextlib.nullcontext()
        if attention_backend is None
        else get_mm().override(mm_attention_backend=attention_backend)
    )
    with backend, default_dtype(dtype), torch.device(device):
        model = Qwen3VLForConditionalGeneration(config)
    # SGLang allocates parameters with torch.empty: fill them, seeded, on the device.
    fill_weights_(model, seed, device=device)
    return model.to(device).eval()


# ---------------------------------------------------------------------------
# Requests and the real scheduler step
# ---------------------------------------------------------------------------


def make_requests(grids, config, seed: int = 0):
    """One single-image request per grid; pixels on the host, as the scheduler gets them."""
    import torch

    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    v = config.vision_config
    row = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    merge = v.spatial_merge_size**2
    requests = []
    for i, grid in enumerate(grids):
        gen = torch.Generator().manual_seed(seed * 100003 + i)
        item = MultimodalDataItem(
            modality=Modality.IMAGE,
            feature=torch.randn((U.patches(grid), row), generator=gen),
        )
        item.image_grid_thw = torch.tensor([list(grid)], dtype=torch.long)
        tokens = U.patches(grid) // merge
        item.offsets = [(TEXT_BEFORE, TEXT_BEFORE + tokens - 1)]
        item.hash = (seed * 100003 + i) * 7919 + 17
        requests.append(
            {
                "item": item,
                "tokens": tokens,
                "length": TEXT_BEFORE + tokens + TEXT_AFTER,
            }
        )
    return requests


def prefill_step(model, requests, device):
    """The multimodal embedding rows of one prefill step, by SGLang's function."""
    import torch

    from sglang.srt.managers import mm_schedule

    items = [r["item"] for r in requests]
    sizes = list(range(len(requests) + 1))
    input_ids = torch.zeros(
        sum(r["length"] for r in requests), dtype=torch.long, device=device
    )
    embedding, _ = mm_schedule._get_chunked_prefill_embedding(
        model.get_image_feature,
        items,
        sizes,
        [0] * len(requests),
        [r["length"] for r in requests],
        [list(it.offsets) for it in items],
        input_ids,
    )
    return embedding


def alone_rows(model, requests):
    """Each image through the encoder on its own, in request order."""
    import torch

    rows = []
    for r in requests:
        emb = model.get_image_feature([r["item"]])
        rows.append(emb.reshape(-1, emb.shape[-1]))
    return torch.cat(rows)


@contextlib.contextmanager
def pinned_gate(batched: bool):
    """Pin SGLang's cross-request ViT batching gate, in this process only."""
    from sglang.srt.managers import mm_schedule

    saved = mm_schedule._batch_vit_across_requests
    # Whatever arguments the gate takes (the series may pass the embedding
    # function), the answer is pinned.
    mm_schedule._batch_vit_across_requests = lambda *args, **kwargs: batched
    try:
        yield
    finally:
        mm_schedule._batch_vit_across_requests = saved


class Device:
    def __init__(self, name: str):
        import torch

        self.name = name
        self.torch = torch

    def sync(self):
        if self.name == "cuda":
            self.torch.cuda.synchronize()

    def describe(self) -> str:
        if self.name == "cuda":
            t = self.torch
            hip = getattr(t.version, "hip", None)
            return f"{t.cuda.get_device_name(0)} (torch {t.__version__}, {'ROCm ' + hip if hip else 'CUDA ' + str(t.version.cuda)})"
        return f"CPU ({os.cpu_count()} cores, torch {self.torch.__version__}, {self.torch.get_num_threads()} thread(s))"

    @contextlib.contextmanager
    def peak(self):
        """``with dev.peak() as m:`` then ``m["mib"]``: the block's peak memory growth."""
        out = {}
        if self.name == "cuda":
            t = self.torch
            self.sync()
            start = t.cuda.memory_allocated()
            t.cuda.reset_peak_memory_stats()
            yield out
            self.sync()
            out["mib"] = (t.cuda.max_memory_allocated() - start) / 2**20
        else:
            with U.PeakRss() as m:
                yield out
            out["mib"] = m.mib


def empty_embedding_cache() -> None:
    """A fresh, empty embedding cache: every request of the next step misses."""
    from sglang.srt.managers import mm_schedule

    mm_schedule.init_mm_embedding_cache(4 << 30)


class Step(NamedTuple):
    out: object  # the step's embedding rows
    seconds: float
    calls: list  # the grids of each encoder call
    peak_mib: Optional[float]  # with measure_peak, else None


def timed_step(
    model,
    requests,
    dev,
    *,
    cap=None,
    batched=True,
    measure_peak=False,
):
    """One step from an empty embedding cache.

    The cache is emptied first, so the previous step's cached embeddings are
    freed before anything is read; with ``measure_peak`` the memory start value
    is read after that, and the peak covers the step alone.
    """
    from sglang.srt.runtime_context import get_mm

    empty_embedding_cache()
    with pinned_gate(batched), get_mm().override(
        mm_max_encoder_input_tokens_per_batch=cap
    ), U.EncoderCallLog(model) as log, (
        dev.peak() if measure_peak else contextlib.nullcontext({})
    ) as mem:
        dev.sync()
        t0 = time.perf_counter()
        out = prefill_step(model, requests, dev.name)
        dev.sync()
        seconds = time.perf_counter() - t0
    return Step(out, seconds, log.calls, mem.get("mib"))


def sdpa_layouts(images: int, base: int):
    """``(layout, grids)``: ``images`` single-image requests of height ``base``.

    "one size": all ``base`` x ``base``; "2 sizes alternating": every other
    image 32 px wider, so neither size's images sit next to each other in the
    packed call; "N distinct sizes": widths ``base + 32 k``.
    """
    step = U.PATCH * U.MERGE

    def grid(width):
        return (1, base // U.PATCH, width // U.PATCH)

    return [
        ("one size", [grid(base)] * images),
        ("2 sizes alternating", [grid(base + step * (i % 2)) for i in range(images)]),
        (f"{images} distinct sizes", [grid(base + step * i) for i in range(images)]),
    ]


@contextlib.contextmanager
def counting_sdpa():
    """Count ``torch.nn.functional.scaled_dot_product_attention`` calls, the
    way SGLang's SDPA vision backend reaches it (``F.<name>`` at call time)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    box = {"calls": 0}

    def counted(*args, **kwargs):
        box["calls"] += 1
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = counted
    try:
        yield box
    finally:
        F.scaled_dot_product_attention = original


def sdpa_rows(models, config, dev, args):
    """Batched and per-request steps of the SDPA layouts, per backend."""
    rows = []
    depth = config.vision_config.depth
    for layout, grids in sdpa_layouts(args.sdpa_images, args.sdpa_base):
        requests = make_requests(grids, config, seed=7)
        for backend, model in models:
            if backend != "sdpa" and layout != f"{args.sdpa_images} distinct sizes":
                continue  # the other backend only as the reference for the distinct case
            row = dict(
                backend=backend,
                layout=layout,
                images=len(grids),
                distinct_sizes=len(set(grids)),
                patches=sum(U.patches(g) for g in grids),
            )
            for batched in (True, False):
                timed_step(
                    model, requests, dev, batched=batched
                )  # first call: compiles, caches
                with counting_sdpa() as sdpa:
                    _, _, calls, _ = timed_step(model, requests, dev, batched=batched)
                times = [
                    timed_step(model, requests, dev, batched=batched).seconds
                    for _ in range(args.repeats)
                ]
                key = "batched" if batched else "per_request"
                row[f"{key}_calls"] = len(calls)
                row[f"{key}_ms"] = 1000 * statistics.median(times)
                # SDPA launches per layer of each encoder call (0 for other backends).
                row[f"{key}_sdpa_per_layer"] = sdpa["calls"] / (depth * len(calls))
            rows.append(row)
    return rows


def compare(batched, alone, tokens):
    import torch
    import torch.nn.functional as F

    equal, max_abs, cos = 0, 0.0, []
    for b, a in zip(torch.split(batched, tokens), torch.split(alone, tokens)):
        equal += bool(torch.equal(b, a))
        max_abs = max(max_abs, float((b.double() - a.double()).abs().max()))
        cos.append(F.cosine_similarity(b.double(), a.double(), dim=-1))
    cos = torch.cat(cos)
    return dict(
        images=len(tokens),
        bitwise_equal_images=equal,
        max_abs_diff=max_abs,
        mean_token_cosine=float(cos.mean()),
        min_token_cosine=float(cos.min()),
        bitwise=equal == len(tokens),
    )


# Calls a graph burst's step is split into: at most this many patches each.
GRAPH_BURST_CALL_PATCHES = 8192


def graph_bursts(args, config):
    """Section 5's bursts, each run twice: one size (the first kind's, as
    many requests as the burst), the check's mixed burst, and a mixed burst
    of new sizes (every kind 32 px wider and taller)."""
    kinds = list(args.burst)
    width, height, _ = kinds[0]
    same = [(width, height, sum(n for _, _, n in kinds))]
    new_sizes = [(w + 32, h + 32, n) for w, h, n in kinds]
    bursts = []
    for name, burst in (("one size", same), ("mixed", kinds), ("new sizes", new_sizes)):
        requests = make_requests(U.burst_grids(burst), config, seed=len(bursts))
        bursts += [(f"{name}, 1st", requests), (f"{name}, 2nd", requests)]
    return bursts


def graph_rows(model, config, dev, args, after_burst=None):
    """Section 5: batched steps with SGLang's ViT CUDA graphs on and off.

    ``SGLANG_VIT_ENABLE_CUDA_GRAPH`` is read by SGLang at every tower call
    (``envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get()``), so it is set around these
    steps only. Each burst is one prefill step split into calls of at most
    GRAPH_BURST_CALL_PATCHES patches; per burst: the calls that captured a
    graph, replayed one or ran eagerly, and the step's time with the graph on
    and then off. ``after_burst`` (e.g. ``KernelBuilds.take``), called after
    each burst, gives the row's ``built``: what that burst compiled.
    """
    if dev.name != "cuda":
        return {"skipped": "CUDA graphs need a GPU (--device cuda)", "rows": []}

    from sglang.srt.environ import envs

    rows = []
    try:
        for name, requests in graph_bursts(args, config):
            rows.append(_graph_burst(model, requests, dev, envs, name))
            # Nothing is freed: the graphs kept are every capture so far.
            rows[-1]["graphs_total"] = sum(row["captures"] for row in rows)
            if after_burst is not None:
                rows[-1]["built"] = after_burst()
    except Exception as e:  # noqa: BLE001 - recorded: the first GPU run must show why
        import traceback

        traceback.print_exc()
        return {
            "skipped": None,
            "rows": rows,
            "error": f"{type(e).__name__}: {str(e).strip()[:300]}",
        }
    return {"skipped": None, "rows": rows, "error": None}


def _graph_burst(model, requests, dev, envs, name):
    # Counted at the runner's public methods: create_graph captures (nothing
    # is ever freed), replay serves a call from a graph.
    runner = model.visual.graph_runners
    captures, replays = [], []

    def counting(method, seen):
        def counted(*args, **kwargs):
            seen.append(1)
            return method(*args, **kwargs)

        return counted

    runner.create_graph = counting(runner.create_graph, captures)
    runner.replay = counting(runner.replay, replays)
    try:
        with envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.override(True):
            on = timed_step(model, requests, dev, cap=GRAPH_BURST_CALL_PATCHES)
    finally:
        del runner.create_graph, runner.replay
    off = timed_step(model, requests, dev, cap=GRAPH_BURST_CALL_PATCHES)
    return dict(
        burst=name,
        captures=len(captures),
        replays=len(replays),
        eager_calls=len(on.calls) - len(replays),
        graph_on_ms=1000 * on.seconds,
        graph_off_ms=1000 * off.seconds,
        max_abs_diff_on_vs_off=float((on.out.double() - off.out.double()).abs().max()),
        **U.summarize_calls(on.calls),
    )


# The check's sections, in the order they run: (report key, title).
def compile_cache_dirs() -> dict:
    """This process's Triton and Inductor cache folders: TRITON_CACHE_DIR and
    TORCHINDUCTOR_CACHE_DIR when set, else where Triton (``knobs.cache.dir``;
    ``~/.triton/cache`` without Triton) and Inductor (its default folder) put
    them."""
    triton_dir = os.environ.get("TRITON_CACHE_DIR")
    if not triton_dir:
        try:
            from triton import knobs

            triton_dir = knobs.cache.dir
        except Exception:  # noqa: BLE001 - no Triton, or one without knobs
            triton_dir = os.path.join(os.path.expanduser("~"), ".triton", "cache")
    inductor_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not inductor_dir:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        inductor_dir = default_cache_dir()
    return {"triton": triton_dir, "inductor": inductor_dir}


class KernelBuilds:
    """What the check compiled after it was ready (model built and warmed up):
    Dynamo graphs (torch's ``unique_graphs`` counter, every first compile and
    recompile of this process) and the entries the Triton and Inductor cache
    folders gained (``vit_bench_util.new_cache_entries``), since the last
    ``take``."""

    def __init__(self, dirs: Optional[dict] = None):
        self.dirs = dirs if dirs is not None else compile_cache_dirs()
        self.at_ready = U.cache_snapshot(self.dirs)
        self._last = self.at_ready
        self._graphs = self.at_ready_graphs = self._dynamo_graphs()

    @staticmethod
    def _dynamo_graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def take(self) -> dict:
        now, graphs = U.cache_snapshot(self.dirs), self._dynamo_graphs()
        out = {
            "dynamo_graphs": graphs - self._graphs,
            "cache_entries": U.new_cache_entries(self._last, now),
        }
        self._last, self._graphs = now, graphs
        return out

    def summary(self) -> dict:
        """For the report: the folders and their entry counts at ready."""
        return {
            "dirs": self.dirs,
            "entries_at_ready": {k: len(v) for k, v in self.at_ready.items()},
            "sections": {},
        }


def fmt_built(b: Optional[dict]) -> str:
    """``Dynamo graphs 0; Triton 0 / Inductor 0`` (a table cell)."""
    if not b:
        return "not counted"
    return f"Dynamo graphs {b['dynamo_graphs']}; " + U.fmt_cache_entries(
        b["cache_entries"]
    )


SECTIONS = [
    ("steps", "per-request vs batched vision step"),
    ("caps", "batched step vs --mm-max-encoder-input-tokens-per-batch"),
    ("diffs", "batched vs each image alone"),
    ("sdpa", "SDPA vision backend launches"),
    ("graphs", "ViT CUDA graphs on (SGLANG_VIT_ENABLE_CUDA_GRAPH=1)"),
]


class CheckStopped(BaseException):
    """SIGTERM arrived: stop, keep what finished. A BaseException, so that no
    ``except Exception`` in the check (the graph section's) swallows it."""


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class SectionFiles:
    """Writes each finished section, and the report so far, under ``out``."""

    def __init__(self, out: Optional[str]):
        self.out = out
        if out:
            os.makedirs(out, exist_ok=True)

    def section_done(self, name: str, report: dict) -> None:
        report.setdefault("sections_done", []).append(name)
        if os.environ.get("GPU_VIT_CHECK_TEST_PAUSE_AFTER") == name:
            # Test hook (test_pack_gpu_check.py): hold here so a SIGTERM lands
            # between sections deterministically.
            print(
                f"gpu_vit_check: section {name} written; pausing (GPU_VIT_CHECK_TEST_PAUSE_AFTER)",
                flush=True,
            )
            self._write(name, report)
            time.sleep(600)
            return
        self._write(name, report)

    def _write(self, name: str, report: dict) -> None:
        if not self.out:
            return
        n = [k for k, _ in SECTIONS].index(name) + 1
        data = {
            k: report[k]
            for k in (
                "device",
                "tiny",
                "dtype",
                "attention_backend",
                "requests",
                "patches",
            )
            if k in report
        }
        data[name] = report[name]
        stem = os.path.join(self.out, f"{n:02d}-{name}")
        write_atomic(stem + ".json", json.dumps(data, indent=1))
        write_atomic(stem + ".md", section_markdown(name, report) + "\n")
        self.report(report)

    def report(self, report: dict) -> None:
        """The whole report so far: gpu_vit_check.json and gpu_vit_check.md."""
        if not self.out:
            return
        write_atomic(
            os.path.join(self.out, "gpu_vit_check.json"), json.dumps(report, indent=1)
        )
        write_atomic(
            os.path.join(self.out, "gpu_vit_check.md"), to_markdown(report) + "\n"
        )


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------


def run(args, files: Optional[SectionFiles] = None):
    """Every section in order; ``files`` (if given) writes each as it ends."""
    import torch

    files = files or SectionFiles(None)
    dev = Device(args.device)
    dtype = getattr(torch, args.dtype)
    vision = TINY_VISION if args.tiny else QWEN3_VL_8B_VISION
    t_start = time.perf_counter()
    model, config = build(args.device, vision, dtype, args.mm_attention_backend)
    build_s = time.perf_counter() - t_start
    grids = U.burst_grids(args.burst)
    requests = make_requests(grids, config)
    tokens = [r["tokens"] for r in requests]
    backend = _attention_backend(model)

    report = dict(
        device=dev.describe(),
        tiny=args.tiny,
        dtype=args.dtype,
        vision=vision,
        attention_backend=backend,
        requests=len(grids),
        grids=[list(g) for g in grids],
        patches=sum(U.patches(g) for g in grids),
        build_s=build_s,
        complete=False,
        sections_done=[],
    )
    args.report = report  # what main() writes if a SIGTERM stops the run
    files.report(report)
    with torch.no_grad():
        # Process-level warm-up on an unrelated shape (context, library handles).
        warm = make_requests(
            [
                (
                    1,
                    2 * config.vision_config.spatial_merge_size,
                    2 * config.vision_config.spatial_merge_size,
                )
            ],
            config,
            seed=99,
        )
        timed_step(model, warm, dev)
        # Ready: built and warmed up. What each section compiles from here.
        builds = KernelBuilds()
        report["built_after_ready"] = builds.summary()

        def built(name: str) -> None:
            report["built_after_ready"]["sections"][name] = builds.take()

        # 1. per-request vs batched, first (unseen shapes) vs warmed
        modes = []
        for batched in (False, True):
            _, first, calls, _ = timed_step(model, requests, dev, batched=batched)
            warmed = [
                timed_step(model, requests, dev, batched=batched).seconds
                for _ in range(args.repeats)
            ]
            modes.append(
                dict(
                    path="batched" if batched else "per-request",
                    first_ms=1000 * first,
                    warm_ms=[1000 * s for s in warmed],
                    warm_median_ms=1000 * statistics.median(warmed),
                    **U.summarize_calls(calls),
                )
            )
        report["steps"] = modes
        built("steps")
        files.section_done("steps", report)

        # 2. peak memory and time vs cap (batched step)
        caps = []
        for cap in args.caps:
            timed_step(model, requests, dev, cap=cap)  # warm these call shapes
            _, seconds, calls, peak_mib = timed_step(
                model, requests, dev, cap=cap, measure_peak=True
            )
            more = [
                timed_step(model, requests, dev, cap=cap).seconds
                for _ in range(args.repeats - 1)
            ]
            caps.append(
                dict(
                    cap=cap,
                    peak_mib=peak_mib,
                    step_ms=1000 * statistics.median([seconds] + more),
                    **U.summarize_calls(calls),
                )
            )
        report["caps"] = caps
        built("caps")
        files.section_done("caps", report)

        # 3. batched vs alone
        alone = alone_rows(model, requests)
        out, _, calls, _ = timed_step(model, requests, dev)
        times = [timed_step(model, requests, dev).seconds for _ in range(args.repeats)]
        report["diffs"] = [
            dict(
                dtype=args.dtype,
                step_ms=1000 * statistics.median(times),
                calls=len(calls),
                **compare(out, alone, tokens),
            )
        ]
        built("diffs")
        files.section_done("diffs", report)

        # 4. The SDPA vision backend: per-layer launches with distinct sizes in one call
        models = [
            (
                "sdpa",
                (
                    model
                    if backend.startswith("sdpa ")
                    else build_model(
                        config, args.device, dtype, attention_backend="sdpa"
                    )
                ),
            )
        ]
        if not backend.startswith("sdpa "):
            models.append((backend.split(" ")[0], model))
        report["sdpa"] = sdpa_rows(models, config, dev, args)
        del models
        built("sdpa")
        files.section_done("sdpa", report)

        # 5. ViT CUDA graphs on
        report["graphs"] = graph_rows(model, config, dev, args, builds.take)
        built("graphs")
        files.section_done("graphs", report)
    report["total_s"] = time.perf_counter() - t_start
    report["complete"] = True
    return report


def _attention_backend(model) -> str:
    """The vision attention SGLang chose, e.g. ``sdpa (VisionSdpaAttention)``."""
    attn = model.visual.blocks[0].attn
    impl = getattr(attn, "qkv_backend", None)
    return f"{getattr(attn, 'qkv_backend_name', '?')} ({type(impl).__name__})"


def _fmt_cos(c: float, bitwise: bool) -> str:
    """A cosine as ``1 − x``; "1 (bitwise)" when every row compared was equal."""
    if bitwise:
        return "1 (bitwise)"
    return f"1 − {1.0 - c:.1e}" if 1.0 - c >= 1e-15 else "1 − <1e-15"


def header_markdown(r) -> str:
    v = r["vision"]
    total = (
        f"whole check {r['total_s']:.1f} s" if "total_s" in r else "check not finished"
    )
    return (
        f"Device: {r['device']}. Qwen3-VL vision tower{' (TINY sizes)' if r['tiny'] else ' (Qwen3-VL-8B sizes)'}: "
        f"depth {v['depth']}, hidden {v['hidden_size']}, MLP {v['intermediate_size']}, {v['num_heads']} heads, "
        f"out {v['out_hidden_size']}; random weights, {r['dtype']}, vision attention {r['attention_backend']}. "
        f"{r['requests']} single-image requests, {r['patches']} patches, through SGLang's prefill-step function. "
        f"Build {r['build_s']:.1f} s, {total}."
    )


def section_markdown(name: str, r) -> str:
    """One section's title and table, and what it compiled after ready."""
    text = _section_table(name, r)
    b = (r.get("built_after_ready") or {}).get("sections", {}).get(name)
    if b is not None:
        text += f"\n\nCompiled in this section (after ready): {fmt_built(b)}."
    return text


def _section_table(name: str, r) -> str:
    if name == "steps":
        return "\n".join(
            [
                "Vision step, per-request vs batched:",
                "",
                U.markdown_table(
                    [
                        "path",
                        "encoder calls",
                        "images per call mean / max",
                        "first call (ms)",
                        "warmed median (ms)",
                    ],
                    [
                        [
                            s["path"],
                            s["calls"],
                            f"{s['images_mean']:.1f} / {s['images_max']}",
                            f"{s['first_ms']:.1f}",
                            f"{s['warm_median_ms']:.1f}",
                        ]
                        for s in r["steps"]
                    ],
                ),
            ]
        )
    if name == "caps":
        return "\n".join(
            [
                "Batched step vs --mm-max-encoder-input-tokens-per-batch (one rank):",
                "",
                U.markdown_table(
                    [
                        "cap",
                        "encoder calls",
                        "images per call mean / max",
                        "max patches per call",
                        "step median (ms)",
                        "peak step memory (MiB)",
                    ],
                    [
                        [
                            "none" if c["cap"] is None else c["cap"],
                            c["calls"],
                            f"{c['images_mean']:.1f} / {c['images_max']}",
                            c["patches_max"],
                            f"{c['step_ms']:.1f}",
                            f"{c['peak_mib']:.1f}",
                        ]
                        for c in r["caps"]
                    ],
                ),
            ]
        )
    if name == "diffs":
        return "\n".join(
            [
                "Batched vs each image alone:",
                "",
                U.markdown_table(
                    [
                        "dtype",
                        "encoder calls",
                        "step median (ms)",
                        "images bitwise equal",
                        "max abs diff",
                        "mean token cosine",
                        "min token cosine",
                    ],
                    [
                        [
                            d["dtype"],
                            d["calls"],
                            f"{d['step_ms']:.1f}",
                            f"{d['bitwise_equal_images']} / {d['images']}",
                            f"{d['max_abs_diff']:.3g}",
                            _fmt_cos(d["mean_token_cosine"], d["bitwise"]),
                            _fmt_cos(d["min_token_cosine"], d["bitwise"]),
                        ]
                        for d in r["diffs"]
                    ],
                    align="lrrrrrr",
                ),
            ]
        )
    if name == "sdpa":
        return "\n".join(
            [
                f"SDPA vision backend: {r['sdpa'][0]['images']} single-image requests in one call vs one call per "
                "request (SDPA launches per layer of one encoder call):",
                "",
                U.markdown_table(
                    [
                        "backend",
                        "layout",
                        "patches",
                        "SDPA launches per layer, batched / per-request call",
                        "batched step median (ms)",
                        "per-request step median (ms)",
                    ],
                    [
                        [
                            s["backend"],
                            s["layout"],
                            s["patches"],
                            f"{s['batched_sdpa_per_layer']:g} / {s['per_request_sdpa_per_layer']:g}",
                            f"{s['batched_ms']:.1f}",
                            f"{s['per_request_ms']:.1f}",
                        ]
                        for s in r["sdpa"]
                    ],
                    align="llrrrr",
                ),
            ]
        )
    if name == "graphs":
        g = r["graphs"]
        title = (
            "ViT CUDA graphs on (SGLANG_VIT_ENABLE_CUDA_GRAPH=1) and off, batched "
            f"steps in calls of at most {GRAPH_BURST_CALL_PATCHES} patches:"
        )
        if g["skipped"]:
            return f"{title} skipped: {g['skipped']}."
        return "\n".join(
            [
                title,
                "",
                U.markdown_table(
                    [
                        "burst",
                        "encoder calls",
                        "captures",
                        "replays",
                        "eager calls",
                        "graph on (ms)",
                        "graph off (ms)",
                        "graphs kept",
                        "max abs diff on vs off",
                        "compiled in the burst",
                    ],
                    [
                        [
                            x["burst"],
                            x["calls"],
                            x["captures"],
                            x["replays"],
                            x["eager_calls"],
                            f"{x['graph_on_ms']:.1f}",
                            f"{x['graph_off_ms']:.1f}",
                            x["graphs_total"],
                            f"{x['max_abs_diff_on_vs_off']:.3g}",
                            fmt_built(x.get("built")),
                        ]
                        for x in g["rows"]
                    ],
                ),
            ]
            + (
                [f"ERROR (the rows above finished before it): {g['error']}"]
                if g.get("error")
                else []
            )
        )
    raise ValueError(name)


def to_markdown(r) -> str:
    """The header and every finished section (all of them once the check is done)."""
    parts = [header_markdown(r)]
    for name, title in SECTIONS:
        if name in r:
            parts.append(section_markdown(name, r))
    if not r.get("complete"):
        missing = [t for n, t in SECTIONS if n not in r]
        note = (
            f"INCOMPLETE ({r['stopped']})"
            if r.get("stopped")
            else "INCOMPLETE (running)"
        )
        parts.append(
            f"{note}; not measured: " + ("; ".join(missing) or "nothing") + "."
        )
    return "\n\n".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default=None,
        help="cuda (also ROCm builds) or cpu; --tiny defaults to cpu, otherwise cuda",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny tower and burst: the same path in seconds",
    )
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument(
        "--burst",
        type=U.burst_arg,
        default=None,
        help=f"WxH:count,... single-image requests (default {BURST}; --tiny {TINY_BURST})",
    )
    p.add_argument(
        "--caps",
        type=U.caps_arg,
        default=None,
        help=f"--mm-max-encoder-input-tokens-per-batch values to measure, 'none' = uncapped (default {CAPS}; --tiny {TINY_CAPS})",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="warmed steps per measurement (>= 1)"
    )
    p.add_argument(
        "--mm-attention-backend",
        default=None,
        help="vision attention backend (default: sdpa on cpu, SGLang's choice on cuda)",
    )
    p.add_argument(
        "--sdpa-images",
        type=int,
        default=None,
        help=f"requests in the SDPA rows' call (default {SDPA_IMAGES}; --tiny {TINY_SDPA_IMAGES})",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads on the CPU path"
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory (created if missing) for each section's NN-<name>.json/.md as it ends "
        "and gpu_vit_check.json/.md",
    )
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cpu" if args.tiny else "cuda"
    U.check_run_args(p, args, tower=False)
    if args.burst is None:
        args.burst = U.parse_burst(TINY_BURST if args.tiny else BURST)
    if args.caps is None:
        args.caps = U.caps_arg(TINY_CAPS if args.tiny else CAPS)
    if args.sdpa_images is None:
        args.sdpa_images = TINY_SDPA_IMAGES if args.tiny else SDPA_IMAGES
    if args.sdpa_images < 2:
        p.error("--sdpa-images must be at least 2")
    args.sdpa_base = TINY_SDPA_BASE if args.tiny else SDPA_BASE
    if args.device == "cpu" and args.mm_attention_backend is None:
        args.mm_attention_backend = "sdpa"
    return args


def _stop_on_sigterm(signum, frame):
    raise CheckStopped(f"stopped by signal {signum} (SIGTERM)")


def main(argv=None) -> int:
    args = parse_args(argv)
    _prepare_process(args.device)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no GPU (use --tiny for the CPU path)",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    command = shlex.join(
        ["python", "benchmark/gpu_check/gpu_vit_check.py"]
        + (sys.argv[1:] if argv is None else list(argv))
    )
    date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"
    files = SectionFiles(args.out)
    args.report = None
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        report = run(args, files)
    except CheckStopped as e:
        report = args.report
        if report is None:  # before the model was built: nothing measured
            print(f"gpu_vit_check: {e} before the first section", file=sys.stderr)
            return 143
        report.update(command=command, date=date, stopped=str(e))
        files.report(report)
        print(to_markdown(report))
        print(
            f"gpu_vit_check: {e}; finished sections: {', '.join(report['sections_done']) or 'none'}"
            + (f" (in {args.out})" if args.out else ""),
            file=sys.stderr,
        )
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    report["command"], report["date"] = command, date
    text = (
        to_markdown(report)
        + f"\n\nCommand: {report['command']}\nDate: {report['date']}\n"
    )
    files.report(report)
    if args.out:
        write_atomic(os.path.join(args.out, "gpu_vit_check.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
