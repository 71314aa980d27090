"""benchmark/vit/bench_vit_cap.py's splitter row: it runs, and the splitter the
series ships (``vit_batching.split_encoder_calls``) gives the same calls as
the pre-fix algorithm the bench keeps as its reference.

The bench's own pieces are controls: its reference splitter (upstream's DP
load balancer only) and its stop when a splitter disagrees with that
reference (shown with a stand-in splitter put where the bench imports the
series' one), so they run on either build."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import math
import random
import sys
import types

import bench_vit_cap as B
import pytest

SPLITTER_MODULE = "sglang.srt.multimodal.vit_batching"


def test_splitter_only_prints_the_three_rows_with_equal_calls(capsys):
    result = B.main(["--splitter-only"])
    out = capsys.readouterr().out
    rows = result["splitter"]
    assert [r["images"] for r in rows] == [64, 512, 1024]
    # 64-patch images, 16384 patches per rank, 2 ranks: 512 images per call
    assert [r["calls"] for r in rows] == [1, 1, 2]
    assert all(r["same_groups"] for r in rows)
    table = [ln for ln in out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split("|")[1].strip() for ln in table] == ["64", "512", "1024"]
    assert all(ln.rstrip(" |").endswith("yes") for ln in table)


@pytest.mark.control(
    reason="harness: the bench stops when a splitter disagrees with its reference "
    "(a stand-in splitter, whatever the build)"
)
def test_a_splitter_that_disagrees_stops_the_bench(monkeypatch, capsys):
    # The balancer's module first (with the series it imports the splitter's
    # module), as the bench imports it, then the stand-in.
    import sglang.srt.multimodal.mm_utils  # noqa: F401

    def one_image_per_call(items, cap, ranks):
        return [range(i, i + 1) for i in range(len(items))]

    # Where the bench imports the series' splitter from (it imports it when it runs).
    monkeypatch.setitem(
        sys.modules,
        SPLITTER_MODULE,
        types.SimpleNamespace(split_encoder_calls=one_image_per_call),
    )
    with pytest.raises(SystemExit, match="disagree"):
        B.main(["--splitter-only"])
    assert "| NO |" in capsys.readouterr().out


@pytest.mark.control(
    reason="harness: the bench's pre-fix reference splitter (upstream's DP load balancer)"
)
@pytest.mark.parametrize(
    "n, patches, cap, ranks", [(64, 64, 1024, 2), (100, 16, 100, 1), (37, 64, 64, 4)]
)
def test_prefix_reference_splits_uniform_images_into_full_calls(n, patches, cap, ranks):
    per_call = max(1, cap * ranks // patches) if ranks > 1 else max(1, cap // patches)
    groups = B.prefix_call_groups([patches] * n, cap, ranks)
    assert [len(g) for g in groups[:-1]] == [per_call] * (len(groups) - 1)
    assert len(groups) == math.ceil(n / per_call)
    assert [i for g in groups for i in g] == list(range(n))


def test_split_encoder_calls_matches_the_prefix_reference_on_mixed_sizes():
    """One-grid images (one piece each, as Qwen3-VL's): the series' splitter
    makes the calls the reference makes."""
    from sglang.srt.multimodal import vit_batching

    rng = random.Random(12)
    for _ in range(300):
        ranks = rng.choice([1, 2, 3, 4])
        cap = rng.randint(1, 3000)
        sizes = [
            rng.choice([1, 16, 64, 256, 1024, rng.randint(1, 2000)])
            for _ in range(rng.randint(1, 40))
        ]
        calls = vit_batching.split_encoder_calls([[s] for s in sizes], cap, ranks)
        assert [list(call) for call in calls] == B.prefix_call_groups(
            sizes, cap, ranks
        ), (sizes, cap, ranks)
