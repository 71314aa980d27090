"""Make SGLang's generic (GPU-shaped) code path import and run on a CPU.

Why each step exists (details in docs/cpu.md):

* ``SGLANG_USE_CPU_ENGINE`` must stay unset. With it, SGLang switches to its
  native CPU engine, which imports ``sgl_kernel`` CPU ops that PyPI does not
  ship. Unset, the layers take the same branches they take on a GPU build,
  which is what the fork's tests want to exercise.
* On that generic branch, building a rotary embedding imports
  ``vllm._custom_ops.rotary_embedding``. The vision tower only reads the
  rotary cos/sin cache and never calls that kernel, so a stand-in module whose
  ``rotary_embedding`` raises if ever called is enough, and proves the claim
  (``vllm_standin/``, put on ``sys.path``, so that ranks a test spawns find it
  too).
* With a CUDA build of torch and several processes, SGLang's PyNccl would bind
  to the CPU "device" and fail; pointing ``SGLANG_NCCL_SO_PATH`` at a missing
  file makes SGLang treat NCCL as absent so collectives run on gloo.

Call :func:`prepare_cpu_process` before the first ``import sglang`` in a
process (and in every spawned rank). Installed in the venv as a pytest plugin
(``make setup``: ``standin_pkgs/cpu_standins`` names this module as a
``pytest11`` entry point, and a ``.pth`` puts this repository on the venv's
path), it does so itself when pytest starts, so the tests the patches carry
run with this environment's Python in an SGLang checkout too.
"""

from __future__ import annotations

import os
import sys

MISSING_NCCL_PATH = "/nonexistent/fork-cpu-support/libnccl.so"
# A folder holding the ``vllm`` stand-in package. On ``sys.path`` (not in
# ``PYTHONPATH``): processes this one spawns inherit it, servers it starts do
# not.
VLLM_STANDIN_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "vllm_standin"
)


def install_vllm_custom_ops_standin():
    """Make ``vllm._custom_ops`` importable as the stand-in (every name it
    provides raises ``StandInKernelCalled`` when called)."""
    if VLLM_STANDIN_DIR not in sys.path:
        sys.path.insert(0, VLLM_STANDIN_DIR)
    import vllm._custom_ops as ops

    if not getattr(ops, "__fork_cpu_standin__", False):
        raise RuntimeError(f"a real vllm ({ops.__file__}) shadows the CPU stand-in")
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


def pytest_configure(config) -> None:
    # Before collection imports the first test module (and with it sglang).
    prepare_cpu_process()
