"""--mm-max-encoder-patches-per-call: bounded cross-request encoder calls.

The splitter is checked against its contract on many random inputs (using
SGLang's real DP-encoder load balancer for the per-rank share), and the whole
path against SGLang's real scheduler and tiny Qwen3-VL tower on CPU. A step
whose items all hit the cache never reaches the cap (the scheduler asks for
encoder calls only when something missed; its test is
test_hip_dp_encoder_vit_batching.py's cache-hit test); the splitter given no
miss makes no call (``test_groups_without_cap_and_edge_cases``).
"""

import random

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

from cpu_support import mm_harness as H  # noqa: E402
from cpu_support import tiny_qwen3_vl as T  # noqa: E402
from cpu_support.ranks import free_port  # noqa: E402

# ---------------------------------------------------------------------------
# The splitter
# ---------------------------------------------------------------------------


def _rank_loads(sizes, ranks):
    """Per-rank patches of one call, by SGLang's own DP-encoder balancer."""
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    if ranks == 1:
        return [sum(sizes)]
    return get_dp_encoder_lb_assignment(sizes, ranks)[2]


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_groups_are_consecutive_bounded_and_maximal(ranks):
    from sglang.srt.multimodal.vit_batching import encoder_call_groups

    rng = random.Random(1234 + ranks)
    for _ in range(300):
        sizes = [
            rng.choice([16, 64, 196, 256, 784, 1024, 4096])
            for _ in range(rng.randint(1, 12))
        ]
        cap = rng.choice([16, 200, 1024, 2048, 5000])
        groups = encoder_call_groups(sizes, cap, ranks)
        assert [i for g in groups for i in g] == list(range(len(sizes)))
        for k, group in enumerate(groups):
            load = max(_rank_loads([sizes[i] for i in group], ranks))
            assert len(group) == 1 or load <= cap, (sizes, cap, groups)
            if k + 1 < len(groups):  # greedy: the next image did not fit
                grown = [sizes[i] for i in group] + [sizes[groups[k + 1][0]]]
                assert max(_rank_loads(grown, ranks)) > cap, (sizes, cap, groups)


def test_groups_without_cap_and_edge_cases():
    from sglang.srt.multimodal.vit_batching import encoder_call_groups

    assert encoder_call_groups([], None) == []
    assert encoder_call_groups([], 100) == []
    assert encoder_call_groups([5, 6, 7], None) == [[0, 1, 2]]
    assert encoder_call_groups([500, 10, 10], 100) == [[0], [1, 2]]  # too large: alone
    assert encoder_call_groups([64, 64, 64], 64) == [[0], [1], [2]]  # one image a call
    # The DP encoder at width 2 holds twice the patches per call at the same cap.
    assert encoder_call_groups([64, 64, 64, 64], 64, ranks=2) == [[0, 1], [2, 3]]


def test_cli_parses_a_cap_and_rejects_a_non_positive_one(capsys):
    from sglang.srt.server_args import prepare_server_args

    model_dir = T.write_config_dir()
    args = prepare_server_args(
        ["--model-path", model_dir, "--mm-max-encoder-patches-per-call", "4096"]
    )
    assert args.mm_max_encoder_patches_per_call == 4096
    for bad in ("0", "-5"):
        with pytest.raises(SystemExit) as exit_info:
            prepare_server_args(
                ["--model-path", model_dir, "--mm-max-encoder-patches-per-call", bad]
            )
        assert exit_info.value.code == 2
        # argparse's usage, then one error line naming the option and the value.
        errors = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
        assert len(errors) == 1, errors
        assert errors[0].endswith(
            "error: argument --mm-max-encoder-patches-per-call: "
            f"must be a positive integer, got '{bad}'"
        ), errors


# ---------------------------------------------------------------------------
# The real scheduler path, with the real tiny tower
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    return T.build_tiny_qwen3_vl(seed=3)


def _run(model, requests, cap):
    from sglang.srt.runtime_context import get_mm

    H.fresh_embedding_cache()
    with get_mm().override(mm_max_encoder_patches_per_call=cap), H.TowerCalls().attach(
        model.visual
    ) as calls:
        out = H.run_prefill_embedding(model, requests)
    return out, calls.calls


def _requests():
    # request 0: three images (64, 96, 64 patches); request 1: one (128)
    return [
        H.make_request([(1, 8, 8), (1, 8, 12), (1, 8, 8)], seed=61),
        H.make_request([(1, 16, 8)], seed=62),
    ]


def test_call_boundary_inside_a_request_changes_nothing(model):
    requests = _requests()
    with torch.no_grad():
        uncapped, uncapped_calls = _run(model, requests, None)
        capped, capped_calls = _run(model, requests, 200)
        alone = H.reference_rows(model, requests)
    assert [len(c) for c in uncapped_calls] == [4]
    # 64+96 fit under 200, the third image of request 0 opens a new call
    # together with request 1's image: a boundary inside request 0.
    assert capped_calls == [[(1, 8, 8), (1, 8, 12)], [(1, 8, 8), (1, 16, 8)]]
    assert all(sum(t * h * w for t, h, w in c) <= 200 for c in capped_calls)
    # With per-sequence vision attention (the SDPA patch of this series) an
    # image's rows do not depend on what else is in its call: bitwise equal.
    assert torch.equal(capped, uncapped)
    assert torch.equal(capped, alone)


def test_image_larger_than_the_cap_goes_alone(model):
    requests = [
        H.make_request([(1, 8, 8)], seed=71),
        H.make_request([(1, 24, 16)], seed=72),
        H.make_request([(1, 8, 4)], seed=73),
    ]
    with torch.no_grad():
        out, calls = _run(model, requests, 100)
        alone = H.reference_rows(model, requests)
    assert calls == [[(1, 8, 8)], [(1, 24, 16)], [(1, 8, 4)]]
    assert torch.equal(out, alone)


def test_cap_of_one_image(model):
    requests = _requests()
    with torch.no_grad():
        out, calls = _run(model, requests, 1)
        alone = H.reference_rows(model, requests)
    assert [len(c) for c in calls] == [1, 1, 1, 1]
    assert torch.equal(out, alone)


def test_splitter_refuses_the_cap_the_cli_refuses():
    """No internal sentinel: a cap below 1 is an error here as on the CLI."""
    from sglang.srt.multimodal.vit_batching import encoder_call_groups

    for cap in (0, -5):
        with pytest.raises(ValueError):
            encoder_call_groups([64, 64], cap)
