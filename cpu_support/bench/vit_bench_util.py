"""Shared pieces of the encoder-call benchmarks (bench_vit_cap,
bench_vit_determinism, bench_vit_cpu, gpu_vit_check).

* ``parse_burst`` / ``burst_grids``: a burst of single-image requests of mixed
  sizes, written ``WxH:count,...`` in pixels, interleaved so that neighbouring
  requests differ in size (a cap then cuts through a mix, not a sorted run).
* ``PeakRss``: growth of the process's peak resident set over a phase.
* ``EncoderCallLog``: the scheduler's calls into ``get_image_feature`` (the
  cross-request encoder calls), recorded by wrapping the bound method of one
  model instance; the model class is untouched.
* ``dense_masked_attention``: for a benchmark process only, the SDPA vision
  attention as SGLang 0.5.23 shipped it (one call over the packed sequences
  under a dense block-diagonal mask), to compare against the series.

Memory method: ``/proc/self/clear_refs`` ("5") resets the kernel's peak-RSS
mark (VmHWM); a phase's peak is VmHWM at its end minus VmRSS at its start.
glibc's malloc keeps freed heap pages and moves its mmap threshold up after
large frees, which would hide a step's activations from RSS; the benchmarks
therefore pin ``MALLOC_MMAP_THRESHOLD_`` (see ``pin_malloc_env``) in every
spawned process so each activation above the threshold is its own mapping,
mapped when allocated and returned when freed. bench_vit_cpu times instead
with glibc keeping freed memory (``keep_heap_malloc_env``, what a GPU
server's caching allocator does), and measures memory in an extra run after
``release_free_heap``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import types
from typing import Dict, List, Sequence, Tuple

Grid = Tuple[int, int, int]

PATCH = 16
MERGE = 2


def parse_burst(spec: str) -> List[Tuple[int, int, int]]:
    """``"224x224:6,448x448:4"`` -> ``[(224, 224, 6), (448, 448, 4)]``.

    Raises ``ValueError`` with a one-line reason (argparse shows it)."""
    kinds = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            size, count = part.split(":") if ":" in part else (part, "1")
            w, h = size.lower().split("x")
            w, h, n = int(w), int(h), int(count)
        except ValueError:
            raise ValueError(
                f"bad burst entry {part!r}: want WIDTHxHEIGHT:COUNT"
            ) from None
        step = PATCH * MERGE
        if w <= 0 or h <= 0 or w % step or h % step:
            raise ValueError(
                f"bad image size {w}x{h}: sides must be positive multiples of {step}"
            )
        if n <= 0:
            raise ValueError(f"bad count in {part!r}: must be positive")
        kinds.append((w, h, n))
    if not kinds:
        raise ValueError("empty burst")
    return kinds


def burst_grids(kinds: Sequence[Tuple[int, int, int]]) -> List[Grid]:
    """One patch grid per request, the kinds interleaved round-robin."""
    queues = [[(1, h // PATCH, w // PATCH)] * n for w, h, n in kinds]
    grids: List[Grid] = []
    while any(queues):
        for q in queues:
            if q:
                grids.append(q.pop())
    return grids


def patches(grid: Sequence[int]) -> int:
    t, h, w = grid
    return int(t) * int(h) * int(w)


def pin_malloc_env(threshold: int = 128 * 1024) -> None:
    """Make later spawned processes map every allocation >= threshold on its own."""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(threshold)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(threshold)


def keep_heap_malloc_env() -> None:
    """Make later spawned processes keep freed memory for reuse.

    Stock glibc maps every tensor over its (dynamic, at most 32 MiB) mmap
    threshold afresh and unmaps it on free, so a batched call's 30-40 MiB
    activations are page-faulted in again on every layer while a one-image
    call's few-MiB tensors are reused from the heap: a tax on the batched
    path only, which a GPU server never pays (PyTorch's caching allocator
    keeps its blocks; PyTorch's CPU tuning guide swaps in jemalloc/tcmalloc
    for the same reason). Large allocations then come from a heap that grows
    in 512 MiB steps and is not trimmed.
    """
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 32)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(1 << 34)
    os.environ["MALLOC_TOP_PAD_"] = str(1 << 29)


def release_free_heap() -> None:
    """Hand glibc's free memory back to the OS (``malloc_trim(0)``), so that
    a following ``PeakRss`` sees a phase's own need even with the heap kept."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024


class PeakRss:
    """``with PeakRss() as m: ...`` then ``m.mib``: peak RSS growth over the block."""

    def __enter__(self):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.start_kib = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        self.mib = max(0, _status_kib("VmHWM") - self.start_kib) / 1024
        return False


class EncoderCallLog:
    """Records each ``model.get_image_feature(items)`` call: the items' grids."""

    def __init__(self, model):
        self.model = model
        self.calls: List[List[Grid]] = []

    def __enter__(self):
        original = self.model.get_image_feature
        calls = self.calls

        def get_image_feature(model, items):
            calls.append(
                [
                    tuple(int(v) for v in it.image_grid_thw.reshape(-1).tolist())
                    for it in items
                ]
            )
            return original(items)

        # A bound method of the same model under the same name, so that
        # SGLang's checks on the embedding function (its __self__ class and
        # __name__, e.g. whether the encoder moves features itself) still hold.
        self.model.get_image_feature = types.MethodType(get_image_feature, self.model)
        return self

    def __exit__(self, *exc):
        del self.model.get_image_feature  # back to the class's bound method
        return False


# ---------------------------------------------------------------------------
# SGLang 0.5.23's dense-masked SDPA vision attention, for comparison only
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)  # as 0.5.23's mask cache
def _block_diagonal(total: int, bounds: Tuple[int, ...]):
    import torch

    allowed = torch.zeros(1, total, total, dtype=torch.bool)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        allowed[:, lo:hi, lo:hi] = True
    return allowed


def _dense_masked_forward(
    self, q, k, v, bsz, cu_seqlens=None, attention_mask=None, **kwargs
):
    """All packed sequences in one SDPA call under a block-diagonal mask."""
    import torch.nn.functional as F

    total, heads, dim = q.shape
    mask = attention_mask
    if mask is None and cu_seqlens is not None:
        mask = _block_diagonal(total, tuple(int(x) for x in cu_seqlens.tolist()))
    q4, k4, v4 = (x.reshape(1, total, heads, dim).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(
        q4, k4, v4, attn_mask=mask, dropout_p=self.dropout, scale=self.scale
    )
    return out.transpose(1, 2).reshape(total, heads, dim)


class dense_masked_attention:
    """``with dense_masked_attention(on):`` swaps the SDPA vision attention's
    forward for the 0.5.23 behaviour in THIS process while active."""

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self):
        from sglang.srt.layers.attention.vision import VisionSdpaAttention

        self._saved = VisionSdpaAttention.forward
        if self.on:
            VisionSdpaAttention.forward = _dense_masked_forward
        return self

    def __exit__(self, *exc):
        from sglang.srt.layers.attention.vision import VisionSdpaAttention

        VisionSdpaAttention.forward = self._saved
        forget_dense_masks()
        return False


def forget_dense_masks() -> None:
    """Empty the dense-mask cache, so the next batched call builds its mask."""
    _block_diagonal.cache_clear()


def caps_arg(text: str) -> List[object]:
    """argparse type: a comma list of patch caps per call; ``none`` (or ``off``,
    ``unset``) stands for no cap."""
    caps: List[object] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("none", "off", "unset"):
            caps.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad cap {part!r}: want a positive integer or 'none'"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"bad cap {value}: must be positive")
        caps.append(value)
    return caps


def burst_arg(text: str) -> List[Tuple[int, int, int]]:
    """argparse type for ``--burst`` (see ``parse_burst``)."""
    try:
        return parse_burst(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_run_args(
    parser: argparse.ArgumentParser, args, *, tower: bool = True
) -> None:
    """The checks every ViT benchmark makes on its common flags; with
    ``tower``, also on the tower-size flags of ``bench_vision``."""
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if tower:
        if args.hidden % args.heads:
            parser.error("--hidden must be a multiple of --heads")
        if args.depth < 2:
            parser.error(
                "--depth must be at least 2 (the deepstack merger sits at depth // 2)"
            )


def bench_vision(depth: int, hidden: int, heads: int) -> Dict[str, object]:
    """Vision sizes of the CPU benchmarks' tower (a bigger tiny Qwen3-VL):
    MLP 4x wide, the deepstack merger half-way, Qwen3-VL's position table."""
    return dict(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_heads=heads,
        out_hidden_size=hidden,
        num_position_embeddings=2304,
        deepstack_visual_indexes=[depth // 2],
    )


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = ""
) -> str:
    """A markdown table; ``align`` is one char per column, 'l' or 'r' (default r)."""
    align = (align or "l" + "r" * (len(headers) - 1)).ljust(len(headers), "r")
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(sep) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def summarize_calls(calls: List[List[Grid]]) -> Dict[str, float]:
    per_call = [len(c) for c in calls]
    return {
        "calls": len(calls),
        "images": sum(per_call),
        "images_mean": (sum(per_call) / len(per_call)) if per_call else 0.0,
        "images_max": max(per_call, default=0),
        "patches_max": max((sum(patches(g) for g in c) for c in calls), default=0),
        "call_patches": [[patches(g) for g in c] for c in calls],
    }
