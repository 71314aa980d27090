"""MiniMax-VL's DP encoder serves steps with fewer images than ranks.

Two gloo ranks, attention-TP 2, ``--mm-enable-dp-encoder`` on: SGLang's real
tiny ``MiniMaxM3SparseForConditionalGeneration`` (tower
``MiniMaxVLVisionModel``, which has no ``device`` attribute) behind the real
``mm_schedule._get_chunked_prefill_embedding``, on CUDA and on ROCm (where the
gate batches this family):

* a one-image step: rank 0 encodes the image, rank 1 gets none and receives
  the rows by broadcast. Pristine 0.5.23 raises ``AttributeError`` on rank 1
  (the empty share's device) and leaves rank 0 in the broadcast;
* a mixed step (a one-image request beside a two-image request): every rank
  gets images, the all-gather path.

Each rank's rows must equal the tower run alone on each image on that rank.
"""

import types

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402

# MiniMax-VL's patch rows: RGB, two frames, 14-pixel patches, merged 2x2.
PATCH_FACTS = types.SimpleNamespace(
    vision_config=types.SimpleNamespace(
        in_channels=3, temporal_patch_size=2, patch_size=14, spatial_merge_size=2
    )
)
STEPS = {
    "one_image": [[(1, 4, 6)]],
    "mixed": [[(1, 4, 6)], [(1, 6, 8), (1, 4, 4)]],
}
PLATFORMS = ("CUDA", "ROCm")


def _worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_kimi_minimax as K

    K.publish_cpu_context(tp_size=world_size, rank=rank, dp_encoder=True)
    K.init_gloo(rank, world_size, init_method)
    model = K.build_tiny_minimax_vl()
    out = {}
    for platform in PLATFORMS:
        for name, step in STEPS.items():
            requests = [
                H.make_request(grids, seed=10 * k, config=PATCH_FACTS)
                for k, grids in enumerate(step)
            ]
            H.fresh_embedding_cache()
            with H.on_platform(platform), torch.no_grad():
                rows = H.run_prefill_embedding(model, requests)
                alone = [
                    model.vision_tower(
                        item.feature.to(torch.bfloat16), item.image_grid_thw
                    )
                    for req in requests
                    for item in req.items
                ]
            out[platform, name] = (rows, torch.cat(alone))
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_worker, 2, timeout=600)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("step", list(STEPS))
def test_every_rank_returns_each_images_rows(ranks, platform, step):
    (rows0, alone0), (rows1, alone1) = (r[platform, step] for r in ranks)
    # A step with one image hands it whole to rank 0: its rows are the tower's
    # on that image, bit for bit, and rank 1 receives them.
    if step == "one_image":
        assert torch.equal(rows0, alone0) and torch.equal(rows1, rows0)
    for rows, alone in ((rows0, alone0), (rows1, alone1)):
        assert rows.shape == alone.shape
        torch.testing.assert_close(rows, alone, rtol=2e-2, atol=2e-2)
