"""CPU stand-in for the one part of vLLM SGLang's generic code path imports
(``vllm._custom_ops``); ``cpu_support.standins.prepare`` puts its folder on
``sys.path`` of test processes only. Never next to a real vLLM."""

__fork_cpu_standin__ = True
