"""benchmark/vit/bench_vit_cap.py's splitter table, and the shipped splitter
(``vit_batching.split_encoder_calls``) on random steps: calls consecutive,
each at most the cap unless one item is larger, each as long as the cap
allows, items it cannot count (None) staying where they fall.

The bench's per-rank accounting (a reference the series does not ship) is a
control: it runs on either build."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import random

import bench_vit_cap as B
import pytest


def test_splitter_only_prints_whole_call_and_per_rank_rows(capsys):
    rows = B.main(["--splitter-only"])["splitter"]
    out = capsys.readouterr().out
    cap = B.SPLITTER_CAP
    assert [r["ranks"] for r in rows] == [2, 4, 8]
    # 784-patch images under 8192: 10 images a call, 7 calls, at any width.
    assert [r["whole"]["calls"] for r in rows] == [7, 7, 7]
    assert all(r["whole"]["call_max"] == 7840 for r in rows)
    # Per-rank accounting fills every rank to the cap: calls of ~k x cap.
    assert [r["per_rank"]["calls"] for r in rows] == [4, 2, 1]
    assert all(r["per_rank"]["share_max"] <= cap for r in rows)
    assert rows[1]["per_rank"]["call_max"] == 31360  # 3.8 x the cap at TP4
    table = [ln for ln in out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split("|")[1].strip() for ln in table] == ["2", "4", "8"]


def test_shipped_splitter_is_consecutive_bounded_and_maximal():
    from sglang.srt.multimodal.vit_batching import split_encoder_calls

    rng = random.Random(0)
    for _ in range(500):
        sizes = [rng.choice([None, 16, 196, 784, 4096]) for _ in range(12)]
        cap = rng.choice([16, 200, 1024, 5000])
        calls = split_encoder_calls(sizes, cap)
        assert [i for call in calls for i in call] == list(range(len(sizes)))
        for call, following in zip(calls, calls[1:] + [None]):
            counted = [sizes[i] for i in call if sizes[i] is not None]
            # An item larger than the cap goes alone (with uncounted ones).
            assert len(counted) <= 1 or sum(counted) <= cap
            if following is not None:  # the next item did not fit
                assert sizes[following[0]] is not None
                assert sum(counted) + sizes[following[0]] > cap


@pytest.mark.control(reason="harness: the bench's per-rank accounting reference")
@pytest.mark.parametrize("ranks", [2, 4])
def test_per_rank_reference_keeps_each_share_under_the_cap(ranks):
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    rng = random.Random(ranks)
    sizes = [rng.choice([64, 196, 784, 1024]) for _ in range(40)]
    groups = B.per_rank_call_groups(sizes, 2048, ranks)
    assert [i for g in groups for i in g] == list(range(40))
    for g in groups:
        shares = get_dp_encoder_lb_assignment([sizes[i] for i in g], ranks)[2]
        assert max(shares) <= 2048
