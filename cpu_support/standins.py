"""Make SGLang's generic (GPU-shaped) code path import and run on a CPU.

Why each step exists (details in docs/cpu.md):

* ``SGLANG_USE_CPU_ENGINE`` must stay unset. With it, SGLang switches to its
  native CPU engine, which imports ``sgl_kernel`` CPU ops that PyPI does not
  ship. Unset, the layers take the same branches they take on a GPU build,
  which is what the fork's tests want to exercise.
* On that generic branch, building a rotary embedding imports
  ``vllm._custom_ops.rotary_embedding``. The vision tower only reads the
  rotary cos/sin cache and never calls that kernel, so a stand-in module whose
  ``rotary_embedding`` raises if ever called is enough, and proves the claim.
* With a CUDA build of torch and several processes, SGLang's PyNccl would bind
  to the CPU "device" and fail; pointing ``SGLANG_NCCL_SO_PATH`` at a missing
  file makes SGLang treat NCCL as absent so collectives run on gloo.

Call :func:`prepare_cpu_process` before the first ``import sglang`` in a
process (and in every spawned rank).
"""

from __future__ import annotations

import os
import sys
import types

MISSING_NCCL_PATH = "/nonexistent/fork-cpu-support/libnccl.so"


class StandInKernelCalled(RuntimeError):
    """A GPU kernel stand-in was called: the CPU path reached real kernel code."""


def _raising(name: str):
    def kernel(*args, **kwargs):
        raise StandInKernelCalled(
            f"vllm._custom_ops.{name} is a CPU stand-in and must not be called; "
            "the code under test reached a GPU kernel"
        )

    kernel.__name__ = name
    return kernel


def install_vllm_custom_ops_standin() -> types.ModuleType:
    """Register ``vllm`` / ``vllm._custom_ops`` stand-ins in ``sys.modules``.

    Only names SGLang imports on the generic branch are provided; every one
    raises :class:`StandInKernelCalled` when called.
    """
    existing = sys.modules.get("vllm._custom_ops")
    if existing is not None and getattr(existing, "__fork_cpu_standin__", False):
        return existing
    pkg = sys.modules.get("vllm")
    if pkg is None:
        pkg = types.ModuleType("vllm")
        pkg.__path__ = []  # a namespace-like package
        pkg.__fork_cpu_standin__ = True
        sys.modules["vllm"] = pkg
    ops = types.ModuleType("vllm._custom_ops")
    ops.__fork_cpu_standin__ = True
    for name in ("rotary_embedding", "rms_norm", "fused_add_rms_norm"):
        setattr(ops, name, _raising(name))
    sys.modules["vllm._custom_ops"] = ops
    pkg._custom_ops = ops
    return ops


def prepare_cpu_process() -> None:
    """Environment and stand-ins for running SGLang's GPU-shaped code on CPU."""
    if "sglang.srt.utils.common" in sys.modules and os.environ.get(
        "SGLANG_USE_CPU_ENGINE"
    ):
        raise RuntimeError("prepare_cpu_process() must run before sglang is imported")
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    os.environ["SGLANG_NCCL_SO_PATH"] = MISSING_NCCL_PATH
    install_vllm_custom_ops_standin()
