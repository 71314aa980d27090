"""The names SGLang imports from ``vllm._custom_ops`` on its generic branch;
each raises if called: the CPU tests must never reach a GPU kernel."""

__fork_cpu_standin__ = True


class StandInKernelCalled(RuntimeError):
    """A GPU kernel stand-in was called: the CPU path reached real kernel code."""


def _raising(name: str):
    def kernel(*args, **kwargs):
        raise StandInKernelCalled(
            f"vllm._custom_ops.{name} is a CPU stand-in and must not be called; "
            "the code under test reached a GPU kernel"
        )

    kernel.__name__ = name
    return kernel


rotary_embedding = _raising("rotary_embedding")
rms_norm = _raising("rms_norm")
fused_add_rms_norm = _raising("fused_add_rms_norm")
