"""CPU-only support for the fork's tests, demo and benchmarks.

Nothing here ships in the patch series. It exists so that SGLang's *real*
multimodal code (scheduler helpers, Qwen3-VL vision tower, DP encoder, the
whole server) can run on a machine without a GPU (docs/cpu.md):

* `standins`: the stand-ins SGLang needs on its generic (non-CPU-engine)
  branch, installed before sglang is imported.
* `tiny_qwen3_vl`, `tiny_vl_family`, `tiny_gemma3_internvl`: SGLang's real
  Qwen3-VL (and Qwen3.5, Qwen4-Exp, GLM-5-Next, Qwen2.5-VL, GLM-4V, Bailing,
  Gemma3, InternVL) with tiny sizes and seeded random weights.
* `tiny_sizes`, `seeded_model`: the tiny sizes, and the seeded weight fill
  and default-dtype helper, with no side effects at import (the GPU check
  uses them too).
* `ranks`: run a function on N gloo ranks; fail fast if one dies.
* `mm_harness`: requests through the real `_get_chunked_prefill_embedding`,
  the tower's real calls observed with a forward pre-hook, encoder-call spy,
  platform table, log capture, the post-load hook and Dynamo's frame count.
* `vit_bench_util`: shared pieces of the CPU ViT benchmarks.
* `make_tiny_model`, `cpu_server`, `served_burst`, `sglang_trees`,
  `rocm_gate_sim/`, `standin_pkgs/`: the real `launch_server` on the CPU (tiny
  model directory, launcher, one served burst for the e2e tests,
  pristine/series trees for A/B, the demo-only ROCm gate hook, the
  `sgl_kernel` stand-in package).
* `fault_injection/`, `vit_profile/`, `post_import`: test- and profiling-only
  start-up hooks for the CPU server (one rank's vision tower fails its first
  call; every tower call timed), and the post-import patching they share.
"""
