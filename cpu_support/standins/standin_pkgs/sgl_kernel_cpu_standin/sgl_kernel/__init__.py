"""CPU stand-in for ``sgl_kernel`` (the CPU build of sglang-kernel).

Test-and-demo only. SGLang's CPU engine imports a handful of names from
``sgl_kernel`` and looks up a few ``torch.ops.sgl_kernel.*`` ops at import
time; on a CPU without AMX it never calls them for a dense model such as
Qwen3-VL. This package provides exactly those names:

* simple ops are implemented in plain torch (see ``_IMPLEMENTED``) and are
  unit-tested against straightforward formulas;
* every other name raises :class:`StandInKernelNotImplemented`, naming the
  op, if it is ever called.

Every op that is *not* listed stays absent, so SGLang keeps taking its
native-torch fallbacks (for instance the shared-memory all-reduce, which it
only uses on AMX or arm64 CPUs).
"""

from __future__ import annotations

import torch

__version__ = "0.0.1+fork.cpu.standin"
IS_FORK_CPU_STANDIN = True


class StandInKernelNotImplemented(NotImplementedError):
    """An sgl_kernel op that the CPU stand-in only names, never implements."""


def _not_implemented(name: str):
    def op(*args, **kwargs):
        raise StandInKernelNotImplemented(
            f"sgl_kernel.{name} is not implemented by the fork's CPU stand-in "
            "(tests and demo only); this code path needs the real sglang-kernel"
        )

    op.__name__ = name
    op.__qualname__ = name
    return op


# Module-level names SGLang imports from sgl_kernel on the CPU engine
# (KV-cache moves, request-to-token pool, speculative decoding). None is
# called while serving a dense model without speculative decoding.
MODULE_FUNCTIONS = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)
for _name in MODULE_FUNCTIONS:
    globals()[_name] = _not_implemented(_name)
del _name


# ---------------------------------------------------------------------------
# torch.ops.sgl_kernel.*: plain-torch implementations of the simple ops.
# ---------------------------------------------------------------------------


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: ``x / rms(x) * weight`` (computed in fp32)."""
    return (_rms(x, eps) * weight.float()).to(x.dtype)


def fused_sigmoid_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> None:
    """In place: ``x *= sigmoid(gate)``."""
    x.copy_((x.float() * torch.sigmoid(gate.float())).to(x.dtype))


def fused_dual_residual_rmsnorm_ref(x, residual, weight1, weight2, eps):
    """``mid = residual + rmsnorm(x, w1)``; returns ``(rmsnorm(mid, w2), mid)``."""
    mid = residual + rmsnorm_ref(x, weight1, eps).to(residual.dtype)
    return rmsnorm_ref(mid, weight2, eps), mid


def fused_qk_gemma_rmsnorm_ref(q, k, q_weight, k_weight, eps, head_dim):
    """Gemma-style RMSNorm (scale ``1 + w``) of q and k, per head.

    Returns q and k reshaped to ``(-1, head_dim)``.
    """
    qh = q.reshape(-1, head_dim)
    kh = k.reshape(-1, head_dim)
    q_out = (_rms(qh, eps) * (1.0 + q_weight.float())).to(q.dtype)
    k_out = (_rms(kh, eps) * (1.0 + k_weight.float())).to(k.dtype)
    return q_out, k_out


_lib = torch.library.Library("sgl_kernel", "FRAGMENT")

_IMPLEMENTED = {
    "rmsnorm_cpu": (
        "rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor",
        rmsnorm_ref,
    ),
    "fused_sigmoid_mul_cpu": (
        "fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()",
        fused_sigmoid_mul_ref,
    ),
    "fused_dual_residual_rmsnorm_cpu": (
        "fused_dual_residual_rmsnorm_cpu(Tensor x, Tensor residual, Tensor w1, "
        "Tensor w2, float eps) -> (Tensor, Tensor)",
        fused_dual_residual_rmsnorm_ref,
    ),
    "fused_qk_gemma_rmsnorm_cpu": (
        "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, "
        "Tensor k_weight, float eps, int head_dim) -> (Tensor, Tensor)",
        fused_qk_gemma_rmsnorm_ref,
    ),
}

# Named so that SGLang's module-level lookups succeed; raise when called.
_NAMED_ONLY = {
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, "
        "Tensor q_weight, Tensor k_weight, float eps, int head_dim, int num_head)"
        " -> (Tensor, Tensor, Tensor)"
    ),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, "
        "Tensor mixed_ba, int num_heads_qk, int num_heads_v, int head_qk, "
        "int head_v) -> (Tensor, Tensor, Tensor, Tensor)"
    ),
    "fused_moe_router_cpu": (
        "fused_moe_router_cpu(float moe_softcapping, Tensor hidden_states, "
        "Tensor gating_output, int topk, bool renormalize, "
        "Tensor? correction_bias=None) -> (Tensor, Tensor)"
    ),
}

TORCH_OPS = tuple(_IMPLEMENTED) + tuple(_NAMED_ONLY)


def _already_defined(name: str) -> bool:
    try:
        getattr(torch.ops.sgl_kernel, name)
        return True
    except (AttributeError, RuntimeError):
        return False


for _name, (_schema, _fn) in _IMPLEMENTED.items():
    if not _already_defined(_name):
        _lib.define(_schema)
        _lib.impl(_name, _fn, "CompositeExplicitAutograd")
for _name, _schema in _NAMED_ONLY.items():
    if not _already_defined(_name):
        _lib.define(_schema)
        _lib.impl(_name, _not_implemented(_name), "CompositeExplicitAutograd")
del _name
