"""Who the DP encoder spreads: the seed's helper, and the models that decide
it themselves.

* ``mm_utils.hip_dp_encoder_batches_vit()`` with no argument answers the seed's
  question: ROCm, ``--mm-enable-dp-encoder`` and attention-TP > 1. Given the
  model's encoder it also asks the model fact.
* Kimi-K3 builds its tower data-parallel whatever the flag: the gate, the
  warm-up decision and the cap follow it.
* GLM-5-Next hands the DP runner a video's frames one by one, so the cap
  balances the frames as that runner does.

Each attention-TP width is published in a fresh one-rank process (no TP
groups built, so the runtime context takes the width), as a server of that
width would publish it.
"""

import itertools

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402

CAP = 200  # patches a rank


def _built_with_the_flag(model_class):
    """An instance of SGLang's real ``model_class`` as built with the flag
    (``use_data_parallel`` True), without building its layers: the facts
    only read its class and that attribute."""
    model = object.__new__(model_class)
    object.__setattr__(model, "use_data_parallel", True)
    return model


def _video_item(t, h, w):
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    item = MultimodalDataItem(modality=Modality.VIDEO, feature=torch.zeros(1))
    item.video_grid_thw = torch.tensor([[t, h, w]])
    return item


def _worker(rank, world_size, init_method):
    from cpu_support.tiny_models.tiny_kimi_minimax import build_tiny_kimi_k3

    from sglang.srt.managers import mm_schedule
    from sglang.srt.models.glm5_next import Glm5NextForConditionalGeneration
    from sglang.srt.models.glm_image_vl import GlmImageForConditionalGeneration
    from sglang.srt.multimodal import vision_warmup, vit_batching
    from sglang.srt.multimodal.mm_utils import (
        get_dp_encoder_lb_assignment,
        hip_dp_encoder_batches_vit,
    )
    from sglang.srt.multimodal.modality import Modality
    from sglang.srt.runtime_context import get_mm, override_platform

    torch.distributed.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size
    )
    out = {"with_encoder": {}, "kimi_k3": {}}
    T.publish_cpu_context(tp_size=1, dp_encoder=True)
    kimi_k3 = build_tiny_kimi_k3()
    # GLM-Image's vision MLP stays tensor-parallel under the flag.
    glm_image = _built_with_the_flag(GlmImageForConditionalGeneration)
    glm = _built_with_the_flag(Glm5NextForConditionalGeneration)
    for attn_tp, flag in itertools.product((1, 2), (False, True)):
        T.publish_cpu_context(tp_size=attn_tp, dp_encoder=flag)
        with get_mm().override(mm_enable_dp_encoder=flag):
            with override_platform(**H.ROCM):
                out["with_encoder"][flag, attn_tp] = {
                    "data-parallel": hip_dp_encoder_batches_vit(
                        H.DecisionModel(flag).get_image_feature, Modality.IMAGE
                    ),
                    "not data-parallel": hip_dp_encoder_batches_vit(
                        glm_image, Modality.IMAGE
                    ),
                }
                H.fresh_gate_log()
                out["kimi_k3"][flag, attn_tp] = {
                    "gate": mm_schedule._batch_vit_across_requests(
                        kimi_k3.get_image_feature, Modality.IMAGE
                    ),
                    "warm_up": vision_warmup.vision_warm_up_decision(kimi_k3),
                    "cap_ranks": vit_batching.encoder_call_cap(
                        kimi_k3.get_image_feature, Modality.IMAGE
                    )[1],
                }
    # GLM-5-Next video, DP encoder at attention-TP 2: one video of 2 frames
    # of 10x10 patches and one of 3 frames of 8x8, under a cap of CAP a rank.
    T.publish_cpu_context(tp_size=2, dp_encoder=True)
    with get_mm().override(mm_max_encoder_patches_per_call=CAP):
        videos = [_video_item(2, 10, 10), _video_item(3, 8, 8)]
        dp = vit_batching.dp_encoder_of(glm, Modality.VIDEO)
        units = [vit_batching.item_balancer_units(v, 0, dp, glm) for v in videos]
        frames = [piece for item in units for piece in item]
        _, _, one_call_shares = get_dp_encoder_lb_assignment(frames, 2)
        out["glm_video"] = {
            "units": units,
            "one_call_shares": sorted(one_call_shares),
            "groups": vit_batching.encoder_call_groups(units, CAP, 2),
        }
    return out


@pytest.fixture(scope="module")
def facts():
    return run_on_ranks(_worker, 1, timeout=300)[0]


def test_the_seed_helper_given_the_encoder_also_asks_the_model_fact(facts):
    for (flag, attn_tp), answers in facts["with_encoder"].items():
        assert answers == {
            "data-parallel": flag and attn_tp > 1,
            "not data-parallel": False,
        }, (flag, attn_tp)


def test_kimi_k3_spreads_whatever_the_flag(facts):
    """Built data-parallel always (use_data_parallel = True): at attention-TP 2
    ROCm batches it, warms it and caps it per rank, flag or not."""
    for (flag, attn_tp), decided in facts["kimi_k3"].items():
        spread = attn_tp > 1
        assert decided == {
            "gate": spread,
            "warm_up": spread,
            "cap_ranks": attn_tp if spread else 1,
        }, (flag, attn_tp)


def test_glm5_next_video_is_capped_frame_by_frame(facts):
    glm = facts["glm_video"]
    assert glm["units"] == [[100, 100], [64, 64, 64]]
    # In one call the runner's balancer would give a rank more than the cap
    # (228 of 392 patches), though the videos' totals, 200 and 192, fit two
    # ranks of CAP: the cap splits them.
    assert max(glm["one_call_shares"]) > CAP
    assert glm["groups"] == [[0], [1]]


def test_a_warm_up_written_against_the_seed_runs_one_call_per_grid():
    """Seed 001's GLM branch runs the vision tower on two dummy grids through
    mm_utils.warm_up_vision_tower when hip_dp_encoder_batches_vit() holds; a
    flat list of grids is one one-image call per grid."""
    from cpu_support.ranks.gloo import free_port

    from sglang.srt.multimodal.mm_utils import warm_up_vision_tower

    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    model = T.build_tiny_qwen3_vl(seed=2)
    with H.TowerCalls() as seen:
        seen.attach(model.visual)
        warm_up_vision_tower(model.visual, [(1, 32, 32), (1, 48, 64)])
    assert seen.calls == [[(1, 32, 32)], [(1, 48, 64)]]
