"""Imported once by the forkserver that forks every gloo rank (``gloo.py``).

What every rank would otherwise import on its own: torch, SGLang's
multimodal path, the tiny models' modules and the harness. Nothing here runs
a tensor op or starts a thread, so forking after it is safe.
"""

from cpu_support.standins.prepare import prepare_cpu_process

prepare_cpu_process()

import torch  # noqa: E402,F401
from cpu_support.ranks import mm_harness  # noqa: E402,F401
from cpu_support.tiny_models import tiny_qwen3_vl  # noqa: E402,F401

import sglang.srt.managers.mm_schedule  # noqa: E402,F401
import sglang.srt.models.qwen2_5_vl  # noqa: E402,F401
import sglang.srt.models.qwen3_vl  # noqa: E402,F401
import sglang.srt.multimodal.mm_utils  # noqa: E402,F401
