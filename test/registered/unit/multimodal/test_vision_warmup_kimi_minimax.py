"""The post-load vision warm-up for Kimi-VL, Kimi-K2.5, Kimi-K3 and MiniMax-VL,
against SGLang's real top-level model classes on CPU.

Each model is SGLang's real class (``KimiVLForConditionalGeneration``,
``KimiK25ForConditionalGeneration``, ``KimiK3ForConditionalGeneration``,
``MiniMaxM3SparseForConditionalGeneration``) built by its real ``__init__``
from a tiny random-weight config carrying ``encoder_only=True``, which builds
the vision tower and projector and no language model
(``cpu_support.tiny_models.tiny_kimi_minimax``; the LMs have no CPU path).
The hook under test is SGLang's real post-load hook,
``maybe_precompile_model_kernels_after_loading``, which runs the model's own
``precompile_kernels_after_loading``.
Tower calls are observed with a forward pre-hook on the real tower (the grids
and the keyword arguments each call got); compiles are Dynamo's own counter
(``counters["frames"]["ok"]``).

Everything runs on two gloo ranks at attention-TP 2 (ROCm through
``mm_harness.on_platform``, DP encoder on: the gate's case). One smoke test per
family: every rank runs the family's plan, with the keyword arguments its
DP runner passes, before the hook returns. When the hook warms at all is one
decision for every family, tabulated in test_vision_warmup.py.

Compile audit, from a reset Dynamo: the real hook warms, then the serving
sweep from the 16-token floor to the 8000-token ceiling, each call handed over
as the DP runner hands a rank its share (``call_tower_on_rank_share``). Only
Kimi-K2.5 (its ``get_rope_shape``) and MiniMax-VL (its rope applier) compile
anything in their towers; Kimi-VL's and Kimi-K3's towers compile nothing, so
"no compile after the warm-up" would hold for them with no warm-up at all and
they are not audited. Rank 0 audits Kimi-K2.5, rank 1 MiniMax-VL.
"""

import math
import time

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.ranks.mm_harness import (  # noqa: E402
    TowerCalls,
    frames_compiled,
    on_platform,
    post_load_hook,
    warm_up_log,
)
from vision_warmup_audit import CEILING_CALL, SERVING_SWEEP  # noqa: E402

# (platform, DP encoder) at attention-TP 2 for the smoke run.
GATE = ("ROCm", True)

# What each family must run, written out (not read from the code under test):
# (model class, expected tower calls, the log line's count of calls, keyword
#  arguments of each tower call, pixels of one patch, pixel dtype).
MOONVIT_PATCH = (3, 14, 14)
MINIMAX_ROWS = (3 * 2 * 14 * 14,)
FAMILIES = {
    "kimi_vl": (
        "KimiVLForConditionalGeneration",
        [[(8, 12)], [(8, 12), (16, 16)], [(40, 40)]],
        "3 tower calls",
        ("grid_hw", "max_seqlen"),
        MOONVIT_PATCH,
        torch.float32,
    ),
    "kimi_k25": (
        "KimiK25ForConditionalGeneration",
        [[(1, 8, 12)], [(1, 8, 12), (1, 16, 16)], [(1, 40, 40)]],
        "3 tower calls",
        (),
        MOONVIT_PATCH,
        torch.float32,
    ),
    "kimi_k3": (
        "KimiK3ForConditionalGeneration",
        [[(1, 8, 12)], [(1, 8, 12), (1, 16, 16)], [(1, 40, 40)]],
        "3 tower calls",
        ("grid_hw", "grid_thw_list", "max_seqlen"),
        MOONVIT_PATCH,
        torch.float32,
    ),
    "minimax_vl": (
        "MiniMaxM3SparseForConditionalGeneration",
        [[(1, 10, 14)], [(1, 10, 14), (2, 8, 8)], [(1, 48, 64)]],
        "3 tower calls",
        (),
        MINIMAX_ROWS,
        torch.bfloat16,
    ),
}
# How the DP runner hands each family's rank share to its tower.
ROPE = {
    "kimi_vl": ("rope_2d", False),
    "kimi_k25": ("rope_2d_packed", False),
    "kimi_k3": ("rope_2d", True),
    "minimax_vl": ("rope_3d", False),
}
# The families whose towers compile something (K2.5's get_rope_shape,
# MiniMax's rope applier), one audited on each rank.
AUDITED_ON_RANK = {0: "kimi_k25", 1: "minimax_vl"}
SWEEP = SERVING_SWEEP + [CEILING_CALL]
assert sum(math.prod(g) for g in CEILING_CALL) == 8000 * 4
assert min(math.prod(g) for call in SWEEP for g in call) == 16 * 4


def _family_grid(name, grid):
    """Kimi-VL's grids are (h, w): the sweep's (1, h, w) without the t."""
    if name == "kimi_vl":
        assert grid[0] == 1
        return list(grid[1:])
    return list(grid)


def _hook_calls(model, platform, dp_encoder, encoder_only=False):
    """Tower calls (grids, keyword names) made before the hook returned, and
    the warm-up log lines."""
    from sglang.srt.runtime_context import get_disagg, get_mm

    with warm_up_log() as handler, on_platform(platform), get_mm().override(
        mm_enable_dp_encoder=dp_encoder
    ), get_disagg().override(encoder_only=encoder_only), TowerCalls().attach(
        model.vision_tower
    ) as seen:
        post_load_hook(model)
    return seen.calls, seen.kwargs, handler.lines


def _sweep(name, tower):
    """Each sweep call as the DP runner hands a rank its share, under the
    event loop's grad mode. Returns the frames compiled by each call."""
    from sglang.srt.multimodal.mm_utils import call_tower_on_rank_share
    from sglang.srt.utils.common import DynamicGradMode

    rope_type, pass_list = ROPE[name]
    patch, dtype = FAMILIES[name][4], FAMILIES[name][5]
    generator = torch.Generator().manual_seed(1)
    per_call = []
    with DynamicGradMode():
        for call in SWEEP:
            grids = [_family_grid(name, g) for g in call]
            n = sum(math.prod(g) for g in grids)
            pixels = torch.randn((n, *patch), generator=generator).to(dtype)
            before = frames_compiled()
            call_tower_on_rank_share(tower, pixels, grids, rope_type, pass_list)
            per_call.append(frames_compiled() - before)
    return per_call


def _compile_audit(name, model):
    """From a reset Dynamo: the real hook warms (ROCm, DP encoder on), then
    the serving sweep up to the 8000-token ceiling."""
    from sglang.srt.runtime_context import get_mm

    torch._dynamo.reset()
    audit = {"before": frames_compiled()}
    with on_platform("ROCm"), get_mm().override(
        mm_enable_dp_encoder=True
    ), TowerCalls().attach(model.vision_tower) as seen:
        start = time.perf_counter()
        post_load_hook(model)
        audit["hook_s"] = time.perf_counter() - start
    audit["warm_calls"] = seen.calls
    audit["after_warm_up"] = frames_compiled()
    start = time.perf_counter()
    audit["per_call"] = _sweep(name, model.vision_tower)
    audit["sweep_s"] = time.perf_counter() - start
    audit["after_sweep"] = frames_compiled()
    return audit


def _rank_worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_kimi_minimax as K

    K.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    K.init_gloo(rank, world_size, init_method)
    models = {name: K.FULL_MODEL_BUILDERS[name]() for name in FAMILIES}
    out = {
        "classes": {name: type(m).__name__ for name, m in models.items()},
        "language_models": {
            name: getattr(m, "language_model", getattr(m, "model", None))
            for name, m in models.items()
        },
    }
    # The audit first, from a reset Dynamo.
    name = AUDITED_ON_RANK[rank]
    out["audit"] = _compile_audit(name, models[name])
    out["hook"] = {name: _hook_calls(model, *GATE) for name, model in models.items()}
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=1500)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_rank_warms_before_the_hook_returns(ranks, name):
    model_class, expected, calls_text, kwarg_names, *_ = FAMILIES[name]
    for rank, out in enumerate(ranks):
        # SGLang's real class, built encoder-only (no language model).
        assert out["classes"][name] == model_class
        assert out["language_models"][name] is None
        calls, kwargs, lines = out["hook"][name]
        assert calls == expected, (rank, calls)
        assert kwargs == [kwarg_names] * len(expected), (rank, kwargs)
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"vision warm-up (rank {rank}, {model_class}): {calls_text} in "
        ), lines[0]


@pytest.mark.parametrize("rank,name", sorted(AUDITED_ON_RANK.items()))
def test_compile_audit_no_compile_after_warm_up(ranks, rank, name):
    audit = ranks[rank]["audit"]
    print(f"\ncompile audit ({name}, rank {rank}): {audit}")
    assert audit["warm_calls"] == FAMILIES[name][1]
    # From a reset Dynamo the warm-up compiles (the counter sees the tower)...
    assert audit["after_warm_up"] > audit["before"]
    # ...and nothing compiles from the 16-token floor to the 8000-token call.
    assert audit["per_call"] == [0] * len(SWEEP)
    assert audit["after_sweep"] == audit["after_warm_up"]
