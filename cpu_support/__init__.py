"""CPU-only support for the fork's tests, demo and benchmarks.

Nothing here ships in the patch series. It exists so that SGLang's *real*
multimodal code (scheduler helpers, Qwen3-VL vision tower, DP encoder, the
whole server) can run on a machine without a GPU (docs/cpu.md). One
subpackage per role (each one's ``__init__`` says what its modules do):

* `standins`: the stand-ins SGLang needs without a GPU, installed before
  sglang is imported (``prepare``), and the stand-in packages they use.
* `tiny_models`: SGLang's real vision-language models with tiny sizes and
  seeded weights, and the tiny model directory the CPU server loads.
* `ranks`: a function on N gloo ranks, and the multimodal harness those ranks
  (and in-process tests) drive.
* `server`: the real ``sglang.launch_server`` on the CPU, the pristine/series
  trees it imports, and its start-up hooks.
* `bench`: what the ViT benchmarks and the GPU check share.

The package and its subpackages import nothing at import time, so the GPU
check can take ``tiny_models.tiny_sizes`` without installing CPU stand-ins.
"""
