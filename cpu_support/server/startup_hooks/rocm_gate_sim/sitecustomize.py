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

* both builds: the module global ``_is_hip`` of ``mm_schedule`` is set to
  True. Pristine's inline ``if _is_hip or _is_npu or _is_xpu:`` then takes
  the per-request path; the series' gate ``_batch_vit_across_requests``
  reads the same flag;
* series build (``mm_utils.hip_dp_encoder_batches_vit`` exists): that
  helper (in ``mm_utils`` and where ``mm_schedule`` imported it) and the
  warm-up's ``mm_utils.vision_warm_up_needed`` (which each model's post-load
  hook asks on every rank) are evaluated under
  ``override_platform(is_hip=True)``. The warm-up decision's result is
  written to stderr once per distinct answer (``vision_warm_up_needed ->
  True``), so a server log shows that the warm-up decided as on ROCm; the
  warm-up's tower calls themselves run outside the override.

Nothing else sees ROCm: a process-wide override would send other code down
ROCm-only kernels. The override in the series case is scoped to the helper's
and the warm-up decision's own calls. The wrappers pass every positional and keyword argument through,
so a gate that takes arguments (e.g. the encoder function) keeps them.

Images per rank are not logged here: the burst harness reads them from the
series' metrics on ``/metrics`` (one series per scheduler, by its
``tp_rank`` label).
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
    for name, report in (
        ("hip_dp_encoder_batches_vit", False),
        ("vision_warm_up_needed", True),
    ):
        fn = getattr(mod, name, None)
        if fn is not None and not getattr(fn, "__fork_rocm_sim__", False):
            setattr(mod, name, _under_hip(fn, report=report))
            _log(f"mm_utils.{name} evaluates under override_platform(is_hip=True)")


def _patch_mm_schedule(mod):
    if os.environ.get(_ENV) != "1":
        return
    if not hasattr(mod, "_is_hip"):
        _log("mm_schedule has no _is_hip; nothing patched")
        return
    mod._is_hip = True
    fn = getattr(mod, "hip_dp_encoder_batches_vit", None)
    if fn is None:
        _log("pristine build: mm_schedule._is_hip = True (per-request ViT path)")
        return
    if not getattr(fn, "__fork_rocm_sim__", False):
        mod.hip_dp_encoder_batches_vit = _under_hip(fn)
    _log(
        "series build: mm_schedule._is_hip = True and its "
        "hip_dp_encoder_batches_vit evaluates under override_platform(is_hip=True)"
    )


_PATCHERS = {
    _MM_UTILS: _patch_mm_utils,
    _MM_SCHEDULE: _patch_mm_schedule,
}


if os.environ.get(_ENV) == "1":
    for _name, _patch in _PATCHERS.items():
        patch_after_import(_name, _patch)
chain_next_sitecustomize(__file__)
