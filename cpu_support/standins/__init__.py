"""Stand-ins SGLang needs on its generic (GPU-shaped) path without a GPU.

* `prepare`: ``prepare_cpu_process()``, run before sglang is imported (by
  ``conftest.py``, every gloo rank, the benchmarks), and the pytest plugin
  that runs it (``standin_pkgs/cpu_standins`` registers it in the venv).
* ``vllm_standin/``: the ``vllm._custom_ops`` stand-in ``prepare`` puts on
  ``sys.path``.
* ``standin_pkgs/``: the packages ``make setup`` installs in the venv: the
  ``sgl_kernel`` stand-in the CPU server imports, and the pytest plugin entry.
"""
