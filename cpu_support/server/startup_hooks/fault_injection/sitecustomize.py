"""Test-only start-up hook: make one rank's vision warm-up fail.

NOT part of the patch series. A test puts this directory on the CPU server's
``PYTHONPATH`` and sets ``FORK_FAULT_WARM_UP_RANK=N``; Python imports this
``sitecustomize`` in every server process. When
``sglang.srt.multimodal.mm_utils`` is imported, its
``call_tower_on_rank_share`` (the per-rank tower call the warm-up makes before
the server serves) is wrapped: in the process whose TP rank is N, the first
call, the warm-up's, raises ``RuntimeError`` (what a
device fault in the warm-up does); every later call, and every call on the
other ranks, runs the real function. Each injected failure is written to
stderr, so the server log shows it.

The next ``sitecustomize`` on ``sys.path`` (e.g. the ROCm gate simulation) is
loaded afterwards, so the two hooks combine.
"""

import os
import sys

# The repository root (four folders up from this hook's own), so that
# cpu_support imports in this server process.
sys.path.append(
    os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4)
    )
)
from cpu_support.server.startup_hooks.post_import import (  # noqa: E402
    chain_next_sitecustomize,
    patch_after_import,
)

ENV = "FORK_FAULT_WARM_UP_RANK"
_MODULE = "sglang.srt.multimodal.mm_utils"
_TARGET = "call_tower_on_rank_share"
MESSAGE = "device fault in the warm-up (injected by the fork's fault test)"


def _patch(module):
    real = getattr(module, _TARGET, None)
    if real is None or getattr(real, "__fork_fault__", False):
        return
    target = int(os.environ[ENV])
    state = {"failed": False}

    def call_tower_on_rank_share(*args, **kwargs):
        from sglang.srt.runtime_context import get_parallel

        if not state["failed"] and get_parallel().tp_rank == target:
            state["failed"] = True
            sys.stderr.write(
                f"[fork fault injection] pid {os.getpid()}: rank {target} vision "
                f"warm-up call raises RuntimeError\n"
            )
            raise RuntimeError(MESSAGE)
        return real(*args, **kwargs)

    call_tower_on_rank_share.__fork_fault__ = True
    call_tower_on_rank_share.__wrapped__ = real
    setattr(module, _TARGET, call_tower_on_rank_share)


if os.environ.get(ENV):
    patch_after_import(_MODULE, _patch)
chain_next_sitecustomize(__file__)
