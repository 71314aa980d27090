"""The post-load vision warm-up for Qwen2.5-VL, GLM-4V, GLM-4.5V-MoE and the
Bailing families, against SGLang's real model classes on CPU.

Each family is SGLang's real class built from a tiny random-weight config
(``cpu_support.tiny_models.tiny_vl_family``). The hook under test is SGLang's real
post-load hook, ``maybe_precompile_model_kernels_after_loading``, which runs
the model's own ``precompile_kernels_after_loading``. Tower calls are observed with a forward pre-hook on the real
tower (``mm_harness.TowerCalls``); compiles are Dynamo's own counter
(``counters["frames"]["ok"]``).

One smoke test per family on two gloo ranks (attention-TP 2, DP encoder on,
ROCm through ``mm_harness.on_platform``: the gate's case): every rank runs the
family's plan before the hook returns. When the hook warms at all is one
decision for every family, tabulated in test_vision_warmup.py. The compile
audit (no compile after the warm-up from the 16-token floor to the
8000-token ceiling) runs here for every family but Qwen2.5-VL, whose audit
is test_vision_warmup_audit.py's run of the audit script.
"""

import math
import time

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.ranks.mm_harness import TowerCalls  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.tiny_models import tiny_vl_family as F  # noqa: E402
from vision_warmup_audit import CEILING_CALL, SERVING_SWEEP  # noqa: E402

# (platform, DP encoder) at attention-TP 2 for the smoke run.
GATE = ("ROCm", True)

# What each family must run, written out (not read from the code under test).
ROTARY_ONLY_CALLS = [[(1, 32, 32)], [(1, 48, 64)]]
QWEN3_TOWER_CALLS = [[(1, 32, 32)], [(1, 48, 64)], [(1, 8, 8)] * 6]

# name -> (builder, builder kwargs, tower attribute, expected warm-up calls,
#          pixel values per patch: in_channels * temporal_patch * patch**2)
FAMILIES = {
    "qwen2_5_vl": (
        "build_tiny_qwen2_5_vl",
        {},
        "visual",
        ROTARY_ONLY_CALLS,
        3 * 2 * 14 * 14,
    ),
    "glm4v": ("build_tiny_glm4v", {}, "visual", ROTARY_ONLY_CALLS, 3 * 2 * 14 * 14),
    "glm4v_moe": (
        "build_tiny_glm4v",
        {"moe": True},
        "visual",
        ROTARY_ONLY_CALLS,
        3 * 2 * 14 * 14,
    ),
    "bailing_mm": (
        "build_tiny_bailing_mm",
        {},
        "vision",
        QWEN3_TOWER_CALLS,
        3 * 2 * 16 * 16,
    ),
    "bailing_mm_qwen2_5_tower": (
        "build_tiny_bailing_mm",
        {"vision": "qwen2_5"},
        "vision",
        QWEN3_TOWER_CALLS,
        3 * 2 * 14 * 14,
    ),
    "bailing_moe_v3_vl": (
        "build_tiny_bailing_moe_v3_vl",
        {},
        "visual",
        QWEN3_TOWER_CALLS,
        3 * 2 * 16 * 16,
    ),
}
MODEL_CLASSES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "glm4v": "Glm4vForConditionalGeneration",
    "glm4v_moe": "Glm4vMoeForConditionalGeneration",
    "bailing_mm": "BailingMMNativeForConditionalGeneration",
    "bailing_mm_qwen2_5_tower": "BailingMMNativeForConditionalGeneration",
    "bailing_moe_v3_vl": "BailingMoeV3VLForConditionalGeneration",
}
# The compile audit is split over the two ranks (each in its own process).
AUDITED_ON_RANK = {
    0: ["glm4v_moe", "bailing_moe_v3_vl"],
    1: ["glm4v", "bailing_mm", "bailing_mm_qwen2_5_tower"],
}
SWEEP = SERVING_SWEEP + [CEILING_CALL]
assert sum(math.prod(g) for g in CEILING_CALL) == 8000 * 4


def _build(name, **top_level):
    builder, kwargs, *_ = FAMILIES[name]
    return getattr(F, builder)(**kwargs, **top_level)


def _tower(name, model):
    return getattr(model, FAMILIES[name][2])


def _hook_calls(name, model, platform, dp_encoder, encoder_only=False):
    """Tower calls made before the hook returned, and the warm-up log lines."""
    from sglang.srt.runtime_context import get_disagg, get_mm

    with H.warm_up_log() as log, H.on_platform(platform), get_mm().override(
        mm_enable_dp_encoder=dp_encoder
    ), get_disagg().override(encoder_only=encoder_only), TowerCalls() as seen:
        seen.attach(_tower(name, model))
        H.post_load_hook(model)
    return seen.calls, log.lines


def _sweep(tower, width, calls):
    """Each call as the DP runner hands a rank its share at attention-TP > 1
    (rope_3d: pixel rows and the grids as a CPU tensor), under the event
    loop's grad mode. Returns the frames compiled by each call."""
    from sglang.srt.utils.common import DynamicGradMode

    per_call = []
    with DynamicGradMode():
        for call in calls:
            before = H.frames_compiled()
            n = sum(math.prod(g) for g in call)
            tower(torch.randn(n, width), torch.tensor([list(g) for g in call]))
            per_call.append(H.frames_compiled() - before)
    return per_call


def _compile_audit(name, model):
    """From a clean Dynamo state: the real hook warms (ROCm, gate on), then
    the serving sweep and the 8000-token ceiling call."""
    torch._dynamo.reset()
    audit = {"before": H.frames_compiled()}
    with H.on_platform("ROCm"), TowerCalls() as seen:
        seen.attach(_tower(name, model))
        start = time.perf_counter()
        H.post_load_hook(model)
        audit["hook_s"] = time.perf_counter() - start
    audit["warm_calls"] = seen.calls
    audit["after_warm_up"] = H.frames_compiled()
    start = time.perf_counter()
    audit["per_call"] = _sweep(_tower(name, model), FAMILIES[name][4], SWEEP)
    audit["sweep_s"] = time.perf_counter() - start
    audit["after_sweep"] = H.frames_compiled()
    return audit


def _rank_worker(rank, world_size, init_method):
    T.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    torch.manual_seed(0)
    models = {name: _build(name) for name in FAMILIES}
    out = {"classes": {name: type(m).__name__ for name, m in models.items()}}
    out["audit"] = {
        name: _compile_audit(name, models[name]) for name in AUDITED_ON_RANK[rank]
    }
    out["hook"] = {
        name: _hook_calls(name, model, *GATE) for name, model in models.items()
    }
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=900)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_rank_warms_before_the_hook_returns(ranks, name):
    expected = FAMILIES[name][3]
    for rank, out in enumerate(ranks):
        assert out["classes"][name] == MODEL_CLASSES[name]
        calls, lines = out["hook"][name]
        assert calls == expected, (rank, calls)
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"vision warm-up (rank {rank}, {MODEL_CLASSES[name]}): "
            f"{len(expected)} tower calls in "
        )


@pytest.mark.parametrize(
    "rank,name", [(r, n) for r, names in AUDITED_ON_RANK.items() for n in names]
)
def test_compile_audit_no_compile_after_warm_up(ranks, rank, name):
    audit = ranks[rank]["audit"][name]
    print(f"\ncompile audit ({name}, rank {rank}): {audit}")
    assert audit["warm_calls"] == FAMILIES[name][3]
    # From a reset Dynamo, the warm-up compiles (the counter sees the tower)...
    assert audit["after_warm_up"] > audit["before"]
    # ...and nothing compiles from the 16-token floor to the 8000-token call.
    assert audit["per_call"] == [0] * len(SWEEP)
    assert audit["after_sweep"] == audit["after_warm_up"]
