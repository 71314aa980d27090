"""The real ``sglang.launch_server`` on the CPU.

* `cpu_server`: ``CpuServer`` launches it on a tiny model directory, waits
  for ``/health`` and stops every process it started.
* `served_burst`: one served burst of the image-burst harness, for the e2e
  tests.
* `sglang_trees`: the pristine and series ``--target`` trees of SGLang 0.5.23
  (A/B runs, the pristine run, the series' own tests).
* ``startup_hooks/``: ``sitecustomize.py`` folders the server puts on
  ``PYTHONPATH``: the demo's ROCm gate simulation (``rocm_gate_sim/``), a
  test-only fault (``fault_injection/``), per-call ViT timing
  (``vit_profile/``), and the post-import patching they share
  (`startup_hooks.post_import`).
"""
