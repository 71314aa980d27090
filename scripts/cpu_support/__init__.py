"""CPU-only support for the fork's tests, demo and benchmarks.

Nothing here ships in the patch series. It exists so that SGLang's *real*
multimodal code (scheduler helpers, Qwen3-VL vision tower, DP encoder) can run
on a machine without a GPU:

* `standins` installs the few stand-ins SGLang needs on its generic
  (non-CPU-engine) branch, see docs/cpu.md.
* `tiny_qwen3_vl` builds a tiny random-weight Qwen3-VL in-process, on one
  process or on several gloo ranks.
* `ranks` runs a function on N gloo ranks and fails fast if one dies.
"""
