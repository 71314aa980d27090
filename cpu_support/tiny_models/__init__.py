"""SGLang's real vision-language models with tiny sizes and seeded weights.

* `tiny_qwen3_vl`, `tiny_vl_family`, `tiny_gemma3_internvl`,
  `tiny_kimi_minimax`, `tiny_omni_muse`: SGLang's real Qwen3-VL (and Qwen3.5,
  Qwen4-Exp, GLM-5-Next, Qwen2.5-VL, GLM-4V, Bailing, Gemma3, InternVL,
  Kimi, MiniMax, Omni/MUSE towers) built on the CPU; importing them installs
  the CPU stand-ins.
* `tiny_sizes`, `seeded_model`: the tiny sizes, and the seeded weight fill
  and default-dtype helper, with no side effects at import (the GPU check
  uses them too).
* `make_tiny_model`: the tiny model directory (config, byte-level tokenizer,
  processors) that the CPU server loads with ``--load-format dummy``.
"""
