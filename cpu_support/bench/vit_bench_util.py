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

The repository's one copy of four small helpers (stdlib only, so the bare-GPU
archive, which packs this file, has them too): ``free_port``,
``markdown_table``, ``config_dir`` (a tiny model's config folder, one per
config) and the compile-cache entry counting (``cache_snapshot``,
``new_cache_entries``, ``fmt_cache_entries``).

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
import socket
import types
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_dir(config, prefix: str) -> str:
    """A model folder holding ``config`` (a transformers config) as config.json:
    ``<prefix>-<uid>-<hash of the config>`` in the temporary folder, written once
    and shared by every process that builds the same config. Ranks exit without
    running cleanup, so a new folder per call would pile up there."""
    import hashlib
    import shutil
    import tempfile

    key = hashlib.sha256(config.to_json_string().encode()).hexdigest()[:16]
    root = tempfile.gettempdir()
    path = os.path.join(root, f"{prefix}-{os.getuid()}-{key}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        tmp = tempfile.mkdtemp(prefix=f".{prefix}-", dir=root)
        config.save_pretrained(tmp)
        try:
            os.rename(tmp, path)  # atomic: no process reads a half-written one
        except OSError:  # another process wrote it first (or a stale one is there)
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.isfile(os.path.join(path, "config.json")):
                config.save_pretrained(path)
    return path


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = ""
) -> str:
    """A markdown table; ``align`` is one char per column, 'l' or 'r' (default:
    the first column 'l', the others 'r'; a short ``align`` is padded with 'r')."""
    if any(a not in "lr" for a in align):
        raise ValueError(f"align takes only 'l' and 'r', got {align!r}")
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


# ---------------------------------------------------------------------------
# Compile-cache entries: kernels built after a point (the server's ready)
# ---------------------------------------------------------------------------

# The folders a process builds kernels into, by the variable that moves them:
# Triton's (one folder per compiled kernel, named by its hash) and Inductor's
# (generated code, FX-graph and AOT-autograd entries; with TRITON_CACHE_DIR
# unset, Inductor also puts Triton's kernels under triton/<device index>/).
COMPILE_CACHE_VARS = {
    "triton": "TRITON_CACHE_DIR",
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
}


def _scratch(name: str) -> bool:
    """A writer's temporary or lock file, not an entry (Triton writes into
    ``tmp.pid_*`` folders and renames; FileLock leaves ``*.lock``)."""
    return name.startswith("tmp.pid_") or name.endswith(".lock")


def cache_entries(root: Optional[str], kind: str) -> Set[str]:
    """The entries of one compile-cache folder, as ``/``-joined paths relative
    to it. ``kind`` "triton": each top-level folder is one kernel (its files
    are not counted apart), a top-level file one entry. ``kind`` "inductor":
    every file is one entry, except under ``triton/<device>/``, where each
    folder is one kernel, as in Triton's own folder. A missing folder has none."""
    if kind not in COMPILE_CACHE_VARS:
        raise ValueError(f"unknown compile cache {kind!r}")
    if not root or not os.path.isdir(root):
        return set()
    out: Set[str] = set()
    for dirpath, dirnames, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        dirnames[:] = [d for d in dirnames if not _scratch(d)]
        kernels_here = (
            parts == []
            if kind == "triton"
            else (len(parts) == 2 and parts[0] == "triton")
        )
        if kernels_here:
            out.update("/".join(parts + [d]) for d in dirnames)
            dirnames[:] = []
        out.update("/".join(parts + [f]) for f in files if not _scratch(f))
    return out


def cache_snapshot(dirs: Mapping[str, Optional[str]]) -> Dict[str, Set[str]]:
    """``{kind: entries}`` of each folder in ``dirs`` (``{kind: path}``)."""
    return {kind: cache_entries(path, kind) for kind, path in dirs.items()}


def cache_device(entry: str) -> Optional[str]:
    """The device index an Inductor entry is filed under (``triton/<N>/...``), else None."""
    parts = entry.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "triton" else None


def new_cache_entries(
    before: Mapping[str, Set[str]], after: Mapping[str, Set[str]]
) -> Dict[str, dict]:
    """Per cache: how many entries ``after`` has that ``before`` had not, the
    entries themselves, and (Inductor) the count per device index where its
    layout files them by device."""
    out = {}
    for kind, entries in after.items():
        new = sorted(entries - before.get(kind, set()))
        per_device: Dict[str, int] = {}
        for e in new:
            dev = cache_device(e) if kind == "inductor" else None
            if dev is not None:
                per_device[dev] = per_device.get(dev, 0) + 1
        out[kind] = {
            "new": len(new),
            "per_device": dict(sorted(per_device.items())),
            "entries": new,
        }
    return out


def fmt_cache_entries(counts: Optional[Mapping[str, dict]]) -> str:
    """A table cell: ``Triton 2 / Inductor 5 (triton/0: 1, triton/1: 1)``;
    "not counted" without the folders."""
    if not counts:
        return "not counted"
    cells = []
    for kind, c in counts.items():
        cell = f"{'Triton' if kind == 'triton' else 'Inductor'} {c['new']}"
        if c.get("per_device"):
            cell += (
                " ("
                + ", ".join(f"triton/{d}: {n}" for d, n in c["per_device"].items())
                + ")"
            )
        cells.append(cell)
    return " / ".join(cells)
