"""Demo-only start-up hook: make ONLY the ViT-batching gate and the warm-up decision see ROCm.

NOT part of the patch series and not a product feature. The CPU server
(``cpu_support/server/cpu_server.py``) puts this directory on ``PYTHONPATH`` and sets
``FORK_DEMO_SIMULATE_ROCM_GATE=1`` only when a demo or benchmark asks for it;
Python then imports this ``sitecustomize`` at start-up in every server
process (HTTP server, tokenizer manager, every scheduler rank). The next
``sitecustomize`` on ``sys.path`` is loaded afterwards, so hooks combine.

On a CPU, SGLang batches ViT cache misses across requests like CUDA does. To
show the ROCm decision on the CPU server, this hook patches sglang's modules
right after they are imported (``cpu_support/server/startup_hooks/post_import.py``):

* series build (``mm_schedule._batch_vit_across_requests`` exists): that
  gate, ``mm_utils.hip_dp_encoder_batches_vit`` and the vision warm-up's
  ``vision_warmup.vision_warm_up_decision`` (which the post-load hook asks on
  every rank) are evaluated under ``override_platform(is_hip=True)``. The
  warm-up decision's result is written to stderr once per distinct answer
  (``vision_warm_up_decision -> True``),
  so a server log shows that the warm-up decided as on ROCm; the warm-up's
  tower calls themselves run outside the override;
* pristine build (no such attribute): the module global ``_is_hip`` that its
  inline ``if _is_hip or _is_npu or _is_xpu:`` reads is set to True, which
  forces the old per-request path.

Nothing else sees ROCm: a process-wide override would send other code down
ROCm-only kernels. The override in the series case is scoped to the gate's
own call (the gate's, the warm-up decision's). The wrappers pass every positional and keyword argument through,
so a gate that takes arguments (e.g. the encoder function) keeps them.

Images per rank are not logged here: the burst harness reads them from the
series' ``sglang:encoder_dp_rank_grids_total`` on ``/metrics`` (one series
per scheduler, by its ``tp_rank`` label).
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
_VISION_WARMUP = "sglang.srt.multimodal.vision_warmup"
_TAG = "fork demo ROCm gate simulation"


def _log(msg):
    sys.stderr.write(f"[{_TAG}] pid {os.getpid()}: {msg}\n")


def _under_hip(fn, report=False):
    said = set()

    def gate(*args, **kwargs):
        from sglang.srt.runtime_context import override_platform

        with override_platform(is_hip=True):
            result = fn(*args, **kwargs)
        if report and repr(result) not in said:
            said.add(repr(result))
            _log(f"{getattr(fn, '__name__', 'gate')} -> {result!r}")
        return result

    gate.__name__ = getattr(fn, "__name__", "gate")
    gate.__wrapped__ = fn
    gate.__fork_rocm_sim__ = True
    return gate


def _patch_mm_utils(mod):
    if os.environ.get(_ENV) != "1":
        return
    fn = getattr(mod, "hip_dp_encoder_batches_vit", None)
    if fn is not None and not getattr(fn, "__fork_rocm_sim__", False):
        mod.hip_dp_encoder_batches_vit = _under_hip(fn)
        _log(
            "mm_utils.hip_dp_encoder_batches_vit evaluates under override_platform(is_hip=True)"
        )


def _patch_mm_schedule(mod):
    if os.environ.get(_ENV) != "1":
        return
    fn = getattr(mod, "_batch_vit_across_requests", None)
    if fn is not None:
        if not getattr(fn, "__fork_rocm_sim__", False):
            mod._batch_vit_across_requests = _under_hip(fn)
            _log(
                "series build: mm_schedule._batch_vit_across_requests evaluates "
                "under override_platform(is_hip=True)"
            )
    elif hasattr(mod, "_is_hip"):
        mod._is_hip = True
        _log("pristine build: mm_schedule._is_hip = True (per-request ViT path)")
    else:
        _log(
            "mm_schedule has neither _batch_vit_across_requests nor _is_hip; "
            "nothing patched"
        )


def _patch_vision_warmup(mod):
    if os.environ.get(_ENV) != "1":
        return
    fn = getattr(mod, "vision_warm_up_decision", None)
    if fn is not None and not getattr(fn, "__fork_rocm_sim__", False):
        mod.vision_warm_up_decision = _under_hip(fn, report=True)
        _log(
            "vision_warmup.vision_warm_up_decision evaluates under override_platform(is_hip=True)"
        )


_PATCHERS = {
    _MM_UTILS: _patch_mm_utils,
    _MM_SCHEDULE: _patch_mm_schedule,
    _VISION_WARMUP: _patch_vision_warmup,
}


if os.environ.get(_ENV) == "1":
    for _name, _patch in _PATCHERS.items():
        patch_after_import(_name, _patch)
chain_next_sitecustomize(__file__)
