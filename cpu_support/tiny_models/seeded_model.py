"""Seeded random weights for SGLang's real model classes, with no side effects
at import.

SGLang allocates parameters with ``torch.empty``, so a model built without a
checkpoint must be filled. `tiny_qwen3_vl` (CPU, installs the CPU stand-ins)
and `gpu_vit_check.py` (which must not install them on a GPU box) both build
their towers with these two pieces.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build parameters in ``dtype`` (SGLang's layers take the default dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def fill_weights_(
    module: torch.nn.Module, seed: int = 0, device: Optional[str] = None
) -> None:
    """Deterministic, well-scaled random weights for every parameter.

    Norm weights get ~1, biases are small, everything else ~N(0, 1/fan_in) so
    activations stay in range through the tower. The same seed gives the same
    weights in every process, so ranks of a DP encoder hold identical towers.
    ``device`` is where the generator runs and the noise is drawn (the
    parameters' device on a GPU); by default the CPU.
    """
    gen = torch.Generator(device=device or "cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            data = torch.randn(
                param.shape, generator=gen, device=gen.device, dtype=torch.float32
            )
            if "norm" in name and name.endswith("weight"):
                data = 1.0 + 0.05 * data
            elif name.endswith("bias"):
                data = 0.02 * data
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else param.shape[0]
                data = data / math.sqrt(max(fan_in, 1))
            param.copy_(data.to(param.dtype))
