"""Repository-wide pytest set-up.

`scripts/` goes on sys.path so tests import `cpu_support` (CPU stand-ins, the
tiny Qwen3-VL) and the fork's scripts. The stand-ins are installed before any
test module imports sglang (see scripts/cpu_support/standins.py).
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One BLAS/OpenMP thread: several tests assert *bitwise* equality of
# embeddings, and the CPU matmul library may split work differently with more
# threads for some shapes. Spawned gloo ranks use one thread each as well.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from cpu_support.standins import prepare_cpu_process  # noqa: E402

prepare_cpu_process()
