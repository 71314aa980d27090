"""Demo-only start-up hook: make ONLY the ViT-batching gate and the warm-up decision see ROCm.

NOT part of the patch series and not a product feature. The CPU server
(``cpu_support/server/cpu_server.py``) puts this directory on ``PYTHONPATH`` and sets
``FORK_DEMO_SIMULATE_ROCM_GATE=1`` only when a demo or benchmark asks for it;
Python then imports this ``sitecustomize`` at start-up in every server
process (HTTP server, tokenizer manager, every scheduler rank). The next
``sitecustomize`` on ``sys.path`` is loaded afterwards, so hooks combine.

On a CPU, SGLang batches ViT cache misses across requests like CUDA does. To
show the ROCm decision on the CPU server, this hook sets the module global
``_is_hip`` of ``mm_schedule`` to True right after the module is imported
(``cpu_support/server/startup_hooks/post_import.py``). Pristine's inline
``if _is_hip or _is_npu or _is_xpu:`` then takes the per-request path; the
series decides the platform from the same flag in one place (the gate, its
ROCm helper and the warm-up decision). On the series build the warm-up
decision ``mm_utils.vision_warm_up_needed`` (which each model's post-load
hook asks on every rank) is wrapped to write its answer to stderr once per
distinct answer (``vision_warm_up_needed -> True``), so a server log shows
that the warm-up decided as on ROCm.

Nothing else sees ROCm: the runtime context's platform stays the CPU's, so
no other code goes down ROCm-only kernels.

Images per rank are not logged here: the burst harness reads them from the
series' metrics on ``/metrics``.
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

_ENV = "FORK_DEMO_SIMULATE_ROCM_GATE"
_MM_UTILS = "sglang.srt.multimodal.mm_utils"
_MM_SCHEDULE = "sglang.srt.managers.mm_schedule"
_TAG = "fork demo ROCm gate simulation"


def _log(msg):
    sys.stderr.write(f"[{_TAG}] pid {os.getpid()}: {msg}\n")


def _reporting(fn):
    said = set()

    def decision(*args, **kwargs):
        result = fn(*args, **kwargs)
        if repr(result) not in said:
            said.add(repr(result))
            _log(f"{fn.__name__} -> {result!r}")
        return result

    decision.__name__ = fn.__name__
    decision.__wrapped__ = fn
    decision.__fork_rocm_sim__ = True
    return decision


def _patch_mm_utils(mod):
    if os.environ.get(_ENV) != "1":
        return
    fn = getattr(mod, "vision_warm_up_needed", None)
    if fn is not None and not getattr(fn, "__fork_rocm_sim__", False):
        mod.vision_warm_up_needed = _reporting(fn)
        _log("mm_utils.vision_warm_up_needed reports its answer")


def _patch_mm_schedule(mod):
    if os.environ.get(_ENV) != "1":
        return
    if not hasattr(mod, "_is_hip"):
        _log("mm_schedule has no _is_hip; nothing patched")
        return
    mod._is_hip = True
    build = "series" if hasattr(mod, "hip_dp_encoder_batches_vit") else "pristine"
    _log(f"{build} build: mm_schedule._is_hip = True")


_PATCHERS = {
    _MM_UTILS: _patch_mm_utils,
    _MM_SCHEDULE: _patch_mm_schedule,
}


if os.environ.get(_ENV) == "1":
    for _name, _patch in _PATCHERS.items():
        patch_after_import(_name, _patch)
chain_next_sitecustomize(__file__)
