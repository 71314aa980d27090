"""Test-only start-up hook: make one rank's vision tower fail its first call.

NOT part of the patch series. A test puts this directory on the CPU server's
``PYTHONPATH`` and sets ``FORK_FAULT_VISION_OOM_RANK=N``; Python imports this
``sitecustomize`` in every server process. When ``sglang.srt.models.qwen3_vl``
is imported, the forward of its vision tower (``Qwen3VLMoeVisionModel``) is
wrapped: in the process whose TP rank is N, the first call raises
``torch.OutOfMemoryError`` (what a busy GPU does to the vision warm-up);
every later call, and every call on the other ranks, runs the real forward.
Each injected failure is written to stderr, so the server log shows it.

The next ``sitecustomize`` on ``sys.path`` (e.g. the ROCm gate simulation) is
loaded afterwards, so the two hooks combine.
"""

import os
import sys

# scripts/, so that cpu_support imports in this server process.
sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from cpu_support.post_import import chain_next_sitecustomize, patch_after_import  # noqa: E402

_ENV = "FORK_FAULT_VISION_OOM_RANK"
_MODULE = "sglang.srt.models.qwen3_vl"
_TOWER = "Qwen3VLMoeVisionModel"


def _patch(module):
    cls = getattr(module, _TOWER, None)
    if cls is None or getattr(cls.forward, "__fork_fault__", False):
        return
    real = cls.forward
    target = int(os.environ[_ENV])
    state = {"failed": False}

    def forward(self, *args, **kwargs):
        from sglang.srt.runtime_context import get_parallel

        if not state["failed"] and get_parallel().tp_rank == target:
            state["failed"] = True
            sys.stderr.write(
                f"[fork fault injection] pid {os.getpid()}: rank {target} vision "
                "tower raises torch.OutOfMemoryError on its first call\n"
            )
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the "
                "fork's fault test)"
            )
        return real(self, *args, **kwargs)

    forward.__fork_fault__ = True
    forward.__wrapped__ = real
    cls.forward = forward


if os.environ.get(_ENV):
    patch_after_import(_MODULE, _patch)
chain_next_sitecustomize(__file__)
