"""Who the DP encoder spreads: the seed's helper, and the models that decide
it themselves.

* ``mm_schedule.hip_dp_encoder_batches_vit()`` answers the seed's question:
  ROCm, ``--mm-enable-dp-encoder`` and attention-TP > 1. The gate then asks
  the model behind the encoder (``dp_encoder_spreads_images``).
* Kimi-K3 builds its tower data-parallel whatever the flag: the gate and the
  warm-up decision follow it.

Each attention-TP width is published in a fresh one-rank process (no TP
groups built, so the runtime context takes the width), as a server of that
width would publish it.
"""

import itertools

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=7, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402


def _built_with_the_flag(model_class):
    """An instance of SGLang's real ``model_class`` as built with the flag
    (``use_data_parallel`` True), without building its layers: the facts
    only read its class and that attribute."""
    model = object.__new__(model_class)
    object.__setattr__(model, "use_data_parallel", True)
    return model


def _worker(rank, world_size, init_method):
    from cpu_support.tiny_models.tiny_kimi_minimax import build_tiny_kimi_k3

    from sglang.srt.managers import mm_schedule
    from sglang.srt.models.glm_image_vl import GlmImageForConditionalGeneration
    from sglang.srt.multimodal import mm_utils
    from sglang.srt.multimodal.modality import Modality
    from sglang.srt.runtime_context import get_mm

    torch.distributed.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size
    )
    out = {"helper": {}, "kimi_k3": {}}
    T.publish_cpu_context(tp_size=1, dp_encoder=True)
    kimi_k3 = build_tiny_kimi_k3()
    # GLM-Image's vision MLP stays tensor-parallel under the flag.
    glm_image = _built_with_the_flag(GlmImageForConditionalGeneration)
    for attn_tp, flag in itertools.product((1, 2), (False, True)):
        T.publish_cpu_context(tp_size=attn_tp, dp_encoder=flag)
        with get_mm().override(mm_enable_dp_encoder=flag):
            with H.on_platform("ROCm"):
                H.fresh_gate_log()
                out["helper"][flag, attn_tp] = {
                    "helper": mm_schedule.hip_dp_encoder_batches_vit(),
                    "data-parallel": mm_schedule._batch_vit_across_requests(
                        H.DecisionModel(flag).get_image_feature, Modality.IMAGE
                    ),
                    "not data-parallel": mm_schedule._batch_vit_across_requests(
                        glm_image.get_image_feature, Modality.IMAGE
                    ),
                }
                H.fresh_gate_log()
                out["kimi_k3"][flag, attn_tp] = {
                    "use_data_parallel": kimi_k3.use_data_parallel,
                    "gate": mm_schedule._batch_vit_across_requests(
                        kimi_k3.get_image_feature, Modality.IMAGE
                    ),
                    "warm_up": mm_utils.vision_warm_up_needed(kimi_k3),
                }
    return out


@pytest.fixture(scope="module")
def facts():
    return run_on_ranks(_worker, 1, timeout=300)[0]


def test_the_seed_helper_answers_the_server_and_the_gate_asks_the_model(facts):
    """The helper (no argument) answers for the server; the gate batches only
    the model that says its encoder spreads images, GLM-Image (no answer)
    never."""
    for (flag, attn_tp), answers in facts["helper"].items():
        assert answers == {
            "helper": flag and attn_tp > 1,
            "data-parallel": flag and attn_tp > 1,
            "not data-parallel": False,
        }, (flag, attn_tp)


def test_kimi_k3_is_built_data_parallel_and_spread_only_under_the_flag(facts):
    """Built data-parallel always (use_data_parallel = True), yet on ROCm the
    seed's helper requires --mm-enable-dp-encoder: with the flag at
    attention-TP 2 ROCm batches it and warms it; without the flag, or at
    attention-TP 1, neither."""
    for (flag, attn_tp), decided in facts["kimi_k3"].items():
        spread = flag and attn_tp > 1
        assert decided == {
            "use_data_parallel": True,
            "gate": spread,
            "warm_up": spread,
        }, (flag, attn_tp)
