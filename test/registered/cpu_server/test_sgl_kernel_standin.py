"""The fork's CPU stand-in for sgl_kernel (cpu_support/standins/standin_pkgs).

Implemented ops are checked against straightforward formulas written here;
named-only ops and module functions must raise an error naming the op; every
op SGLang must not find stays absent.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

sgl_kernel = pytest.importorskip("sgl_kernel")

if not getattr(sgl_kernel, "IS_FORK_CPU_STANDIN", False):  # pragma: no cover
    pytest.skip(
        "a real sgl_kernel is installed, not the fork's stand-in",
        allow_module_level=True,
    )

ops = torch.ops.sgl_kernel

pytestmark = pytest.mark.control(
    reason="harness: the CPU stand-in for sgl_kernel that the CPU server imports"
)


def _rms(x, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def test_rmsnorm_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g)
    w = torch.randn(16, generator=g)
    torch.testing.assert_close(ops.rmsnorm_cpu(x, w, 1e-6), _rms(x, 1e-6) * w)
    xb = x.bfloat16()
    out = ops.rmsnorm_cpu(xb, w.bfloat16(), 1e-6)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _rms(x, 1e-6) * w, atol=0.05, rtol=0.02)


def test_fused_sigmoid_mul_cpu_is_in_place():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, generator=g)
    gate = torch.randn(4, 8, generator=g)
    expected = x * (1 / (1 + torch.exp(-gate)))
    ret = ops.fused_sigmoid_mul_cpu(x, gate)
    assert ret is None
    torch.testing.assert_close(x, expected)


def test_fused_dual_residual_rmsnorm_cpu():
    g = torch.Generator().manual_seed(2)
    x, r = torch.randn(3, 32, generator=g), torch.randn(3, 32, generator=g)
    w1, w2 = torch.randn(32, generator=g), torch.randn(32, generator=g)
    out, mid = ops.fused_dual_residual_rmsnorm_cpu(x, r, w1, w2, 1e-5)
    exp_mid = r + _rms(x, 1e-5) * w1
    torch.testing.assert_close(mid, exp_mid)
    torch.testing.assert_close(out, _rms(exp_mid, 1e-5) * w2)


def test_fused_qk_gemma_rmsnorm_cpu_per_head_with_one_plus_weight():
    g = torch.Generator().manual_seed(3)
    head_dim = 8
    q = torch.randn(2, 4 * head_dim, generator=g)
    k = torch.randn(2, 2 * head_dim, generator=g)
    qw, kw = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    qo, ko = ops.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, 1e-6, head_dim)
    assert qo.shape == (8, head_dim) and ko.shape == (4, head_dim)
    torch.testing.assert_close(qo, _rms(q.reshape(-1, head_dim), 1e-6) * (1 + qw))
    torch.testing.assert_close(ko, _rms(k.reshape(-1, head_dim), 1e-6) * (1 + kw))


@pytest.mark.parametrize(
    "name",
    [
        "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous_cpu",
        "fused_moe_router_cpu",
    ],
)
def test_named_only_ops_raise_naming_the_op(name):
    op = getattr(ops, name)
    t = torch.zeros(2, 4)
    args = {
        "fused_qk_gemma_rmsnorm_with_gate_cpu": (t, t, t[0], t[0], 1e-6, 4, 1),
        "fused_qkvzba_split_reshape_cat_contiguous_cpu": (t, t, 1, 1, 1, 1),
        "fused_moe_router_cpu": (0.0, t, t, 1, True),
    }[name]
    with pytest.raises(Exception, match=name):
        op(*args)


@pytest.mark.parametrize("name", sgl_kernel.MODULE_FUNCTIONS)
def test_module_functions_raise_naming_the_op(name):
    with pytest.raises(
        sgl_kernel.StandInKernelNotImplemented, match=f"sgl_kernel.{name} "
    ):
        getattr(sgl_kernel, name)()


@pytest.mark.parametrize(
    "name",
    [
        "shm_allreduce",
        "fused_add_rmsnorm_cpu",
        "decode_attention_cpu",
        "fused_experts_cpu",
    ],
)
def test_other_ops_stay_absent(name):
    # SGLang picks its native-torch fallbacks only while these are missing.
    assert not hasattr(ops, name)
    assert not hasattr(sgl_kernel, name)
