"""Drive SGLang's real multimodal scheduler code with real items on CPU.

``run_prefill_embedding`` feeds a list of requests (each a list of image
grids, or ready-made items) through the real
``mm_schedule._get_chunked_prefill_embedding`` exactly as a prefill step
does, with the real model's ``get_image_feature`` as the embedding function.
``TowerCalls`` observes the vision tower's real forward calls (it wraps
nothing; it is a forward pre-hook) so tests can count encoder calls and the
images each call carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from cpu_support.tiny_qwen3_vl import image_item, tokens_per_image

TEXT_BEFORE = 5  # text tokens before the first image of a request
TEXT_BETWEEN = 2  # text tokens between two images / after the last


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


def fresh_embedding_cache(max_bytes: int = 1 << 30) -> None:
    """A new, empty multimodal embedding cache (what a fresh server has)."""
    from sglang.srt.managers import mm_schedule

    mm_schedule.init_mm_embedding_cache(max_bytes)


@dataclass
class TowerCalls:
    """Records each real forward call of a vision tower: the grids it got."""

    calls: List[List[Tuple[int, int, int]]] = field(default_factory=list)
    _handle: object = None

    def attach(self, tower: torch.nn.Module) -> "TowerCalls":
        def hook(module, args, kwargs):
            grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
            rows = grid.tolist() if isinstance(grid, torch.Tensor) else list(grid)
            self.calls.append([tuple(int(v) for v in row) for row in rows])

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
