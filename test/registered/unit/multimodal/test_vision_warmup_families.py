"""The post-load vision warm-up for Qwen2.5-VL, GLM-4V, GLM-4.5V-MoE and the
Bailing families (issue 10), against SGLang's real model classes on CPU.

Each family is SGLang's real class built from a tiny random-weight config
(``cpu_support.tiny_vl_family``). The hook under test is SGLang's real
post-load hook, ``maybe_precompile_model_kernels_after_loading``, with the
series applied. Tower calls are observed with a forward pre-hook on the real
tower (``mm_harness.TowerCalls``); compiles are Dynamo's own counter
(``counters["frames"]["ok"]``).

The condition needs attention-TP 2, so those cases run on two gloo ranks
(DP encoder on; ROCm and the other platforms through ``override_platform``).
Attention-TP 1 runs in this process.

Runtime (2 CPU cores): 30 s wall, 45 s CPU when the cores are free; 4.5 min
wall under load average 18 (most of it the two ranks importing SGLang).
"""

import math
import time

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

from cpu_support import mm_harness as H  # noqa: E402
from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support import tiny_vl_family as F  # noqa: E402
from cpu_support.mm_harness import PLATFORMS, TowerCalls  # noqa: E402
from cpu_support.ranks import free_port, run_on_ranks  # noqa: E402
from vision_warmup_audit import CEILING_CALL, SERVING_SWEEP  # noqa: E402

# (platform, DP encoder) at attention-TP 2.
WARM_AT_TP2 = [("ROCm", True), ("CUDA", True)]
OFF_AT_TP2 = [("NPU", True), ("XPU", True), ("ROCm", False), ("CUDA", False)]

# What each family must run, written out (not read from the code under test).
ROTARY_ONLY_CALLS = [[(1, 32, 32)], [(1, 48, 64)]]
QWEN3_TOWER_CALLS = [[(1, 32, 32)], [(1, 48, 64)], [(1, 8, 8)] * 6]

# name -> (builder, builder kwargs, tower attribute, expected warm-up calls,
#          pixel values per patch: in_channels * temporal_patch * patch**2)
FAMILIES = {
    "qwen2_5_vl": ("build_tiny_qwen2_5_vl", {}, "visual", ROTARY_ONLY_CALLS, 3 * 2 * 14 * 14),
    "glm4v": ("build_tiny_glm4v", {}, "visual", ROTARY_ONLY_CALLS, 3 * 2 * 14 * 14),
    "glm4v_moe": ("build_tiny_glm4v", {"moe": True}, "visual", ROTARY_ONLY_CALLS, 3 * 2 * 14 * 14),
    "bailing_mm": ("build_tiny_bailing_mm", {}, "vision", QWEN3_TOWER_CALLS, 3 * 2 * 16 * 16),
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
    0: ["qwen2_5_vl", "glm4v_moe", "bailing_moe_v3_vl"],
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
    from sglang.srt.runtime_context import get_disagg, get_mm, override_platform

    with H.warm_up_log() as log, override_platform(**PLATFORMS[platform]), get_mm().override(
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
    from sglang.srt.runtime_context import override_platform

    torch._dynamo.reset()
    audit = {"before": H.frames_compiled()}
    with override_platform(**PLATFORMS["ROCm"]), TowerCalls() as seen:
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
        (name, platform, dp): _hook_calls(name, model, platform, dp)
        for name, model in models.items()
        for platform, dp in WARM_AT_TP2 + OFF_AT_TP2
    }
    # A config built encoder-only (no language model; what an --encoder-only
    # server loads), on a platform that never batches across requests.
    out["encoder_only"] = {
        name: _hook_calls(name, model, "NPU", True, encoder_only=True)
        for name, model in models.items()
    }
    out["encoder_only_no_dp"] = _hook_calls(
        "glm4v", models["glm4v"], "CUDA", False, encoder_only=True
    )
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=900)


def test_real_model_classes(ranks):
    for out in ranks:
        assert out["classes"] == MODEL_CLASSES


@pytest.mark.parametrize("setting", WARM_AT_TP2, ids=lambda s: f"{s[0]}-dp{int(s[1])}")
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_rank_warms_before_the_hook_returns(ranks, name, setting):
    expected = FAMILIES[name][3]
    for rank, out in enumerate(ranks):
        calls, lines = out["hook"][(name, *setting)]
        assert calls == expected, (rank, calls)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"vision warm-up (rank {rank}): grids ")


@pytest.mark.parametrize("setting", OFF_AT_TP2, ids=lambda s: f"{s[0]}-dp{int(s[1])}")
@pytest.mark.parametrize("name", list(FAMILIES))
def test_no_tower_call_off_the_condition_at_attention_tp2(ranks, name, setting):
    for out in ranks:
        assert out["hook"][(name, *setting)] == ([], [])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_encoder_only_config_warms_every_rank(ranks, name):
    for rank, out in enumerate(ranks):
        calls, lines = out["encoder_only"][name]
        assert calls == FAMILIES[name][3], rank
        assert len(lines) == 1 and lines[0].startswith(f"vision warm-up (rank {rank})")
        # ...but only when the DP encoder spreads images.
        assert out["encoder_only_no_dp"] == ([], [])


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


# ---------------------------------------------------------------------------
# This process: attention-TP 1
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp1_models():
    from sglang.srt.distributed import parallel_state

    T.publish_cpu_context(tp_size=1, dp_encoder=True)
    if not parallel_state.model_parallel_is_initialized():
        T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    return {name: _build(name) for name in FAMILIES}


@pytest.mark.parametrize("platform", ["ROCm", "CUDA"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_no_tower_call_at_attention_tp1(tp1_models, name, platform):
    from sglang.srt.runtime_context import get_parallel

    assert get_parallel().attn_tp_size == 1
    assert _hook_calls(name, tp1_models[name], platform, True) == ([], [])
