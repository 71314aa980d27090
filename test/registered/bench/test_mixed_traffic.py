"""Mixed-traffic bursts of benchmark/image_burst/bench_image_burst.py: the plan and its statistics."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import base64  # noqa: E402
import io  # noqa: E402

import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

pytestmark = pytest.mark.control(
    reason="the mixed-traffic plan and its statistics (harness)"
)


def _cfg(**kw):
    base = dict(
        bursts=6,
        burst_size=8,
        repeats=2,
        bad=1,
        min_width=32,
        max_width=448,
        min_height=32,
        max_height=320,
        seed=7,
    )
    base.update(kw)
    return B.MixedConfig(**base)


def _decode(uri):
    head, b64 = uri.split(",", 1)
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def _shape(plan):
    return [[(r.kind, r.width, r.height, r.image_id, r.text) for r in b] for b in plan]


def test_plan_is_deterministic_in_the_seed():
    a, b = B.mixed_plan(_cfg()), B.mixed_plan(_cfg())
    assert _shape(a) == _shape(b)
    assert [r.data_uri for x in a for r in x] == [r.data_uri for x in b for r in x]
    assert _shape(B.mixed_plan(_cfg(seed=8))) != _shape(a)
    # the sizes do not depend on whether the pixels are made
    assert _shape(B.mixed_plan(_cfg(), with_images=False)) == _shape(a)


def test_sizes_within_bounds_and_images_have_them():
    cfg = _cfg(bursts=20)
    plan = B.mixed_plan(cfg)
    good = [r for b in plan for r in b if r.kind != "bad"]
    assert all(cfg.min_width <= r.width <= cfg.max_width for r in good)
    assert all(cfg.min_height <= r.height <= cfg.max_height for r in good)
    for r in good[:12]:
        assert _decode(r.data_uri).size == (r.width, r.height)
    # mixed, not one size: 120 fresh draws span most of the range
    widths = [r.width for r in good]
    assert max(widths) - min(widths) > (cfg.max_width - cfg.min_width) // 2
    # the processor's floor can be asked for exactly
    tiny = B.mixed_plan(_cfg(min_width=32, max_width=32, min_height=32, max_height=32))
    assert {(r.width, r.height) for b in tiny for r in b if r.kind != "bad"} == {
        (32, 32)
    }


def test_each_burst_has_fresh_repeats_and_one_bad():
    cfg = _cfg()
    plan = B.mixed_plan(cfg)
    assert len(plan) == cfg.bursts
    for k, burst in enumerate(plan):
        kinds = [r.kind for r in burst]
        assert len(burst) == cfg.burst_size + cfg.bad
        assert kinds.count("fresh") == cfg.burst_size - cfg.repeats
        assert kinds.count("repeat") == cfg.repeats
        assert kinds.count("bad") == cfg.bad
        assert [r.index for r in burst] == list(range(len(burst)))
        assert all(r.burst == k for r in burst)
        # distinct texts: no two requests share a prompt
        assert len({r.text for r in burst}) == len(burst)


def test_repeats_carry_identical_bytes_of_an_earlier_image():
    plan = B.mixed_plan(_cfg())
    fresh_by_id = {r.image_id: r for b in plan for r in b if r.kind == "fresh"}
    assert len({r.data_uri for r in fresh_by_id.values()}) == len(
        fresh_by_id
    )  # fresh = new bytes
    for k, burst in enumerate(plan):
        for r in (x for x in burst if x.kind == "repeat"):
            src = fresh_by_id[r.image_id]
            assert src.data_uri == r.data_uri
            assert (src.width, src.height) == (r.width, r.height)
            # from the previous burst (a cache hit); burst 0 repeats its own
            assert src.burst == (k - 1 if k else 0)


def test_bad_input_is_not_an_image():
    plan = B.mixed_plan(_cfg(bursts=1))
    bad = [r for r in plan[0] if r.kind == "bad"]
    assert len(bad) == 1
    with pytest.raises(Exception):
        _decode(bad[0].data_uri).load()


@pytest.mark.parametrize(
    "kw",
    [
        dict(repeats=8),
        dict(repeats=-1),
        dict(bad=-1),
        dict(min_width=500),
        dict(min_height=0),
        dict(bursts=0),
    ],
)
def test_bad_configs_are_refused(kw):
    with pytest.raises(ValueError):
        B.mixed_plan(_cfg(**kw))


def test_stats_count_served_bursts_and_exclude_bad_requests():
    def rec(burst, kind, ok, ttft):
        return {"burst": burst, "kind": kind, "success": ok, "ttft": ttft}

    records = [
        rec(0, "fresh", True, 0.1),
        rec(0, "repeat", True, 0.3),
        rec(0, "bad", False, 0.0),
        rec(1, "fresh", True, 0.2),
        rec(1, "fresh", False, 0.0),
        rec(1, "bad", True, 0.05),
    ]
    s = B.mixed_stats(records, wall_s=30.0, bursts=2)
    assert s["bursts_served"] == 1  # burst 1 lost a good request
    assert s["bursts_per_min"] == pytest.approx(2.0)
    assert (s["good_requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["requests_per_s"] == pytest.approx(3 / 30.0)
    assert s["mean_ttft_ms"] == pytest.approx(
        200.0
    )  # the accepted bad one is not counted
    assert s["bad_accepted"] == 1
    assert s["mean_ttft_ms_by_kind"]["repeat"] == pytest.approx(300.0)


def test_cli_bounds_reach_the_config():
    p = B.build_parser()
    args = p.parse_args(
        [
            "--base-url",
            "http://x",
            "--model",
            "m",
            "--mixed",
            "--mixed-min-size",
            "40x50",
            "--mixed-max-size",
            "100x200",
            "--mixed-repeats",
            "3",
            "--seed",
            "5",
        ]
    )
    cfg = B.mixed_config_from_args(args)
    assert (cfg.min_height, cfg.min_width, cfg.max_height, cfg.max_width) == (
        40,
        50,
        100,
        200,
    )
    assert (cfg.repeats, cfg.seed) == (3, 5)
    args.mixed_repeats = 8
    with pytest.raises(B.BenchError):
        B.mixed_config_from_args(args)


def test_ab_mixed_rows_take_medians_per_build():
    import ab_image_burst as AB

    def run(build, bpm, rps, mean, p99, failed=0):
        stats = {
            "bursts": 10,
            "bursts_served": 10 - failed,
            "bursts_per_min": bpm,
            "requests_per_s": rps,
            "mean_ttft_ms": mean,
            "p99_ttft_ms": p99,
            "failed": failed,
            "bad_requests": 10,
            "bad_accepted": 0,
            "encoder": None,
        }
        return {"build": build, "mixed": {"stats": stats}, "loadavg": [1.0, 2.0]}

    runs = [
        run("base", 100, 10, 300, 900),
        run("series", 120, 12, 250, 700),
        run("base", 90, 9, 320, 950),
        run("series", 130, 13, 240, 650, failed=1),
        run("base", 110, 11, 310, 990),
        run("series", 125, 12.5, 260, 720),
    ]
    rows = AB.aggregate_mixed(runs, ["base", "series"])
    assert [r["build"] for r in rows] == ["base", "series"]
    base, series = rows
    assert (
        base["bursts_per_min"]["median"] == 100
        and series["bursts_per_min"]["median"] == 125
    )
    assert (base["p99_ttft_ms"]["min"], base["p99_ttft_ms"]["max"]) == (900, 990)
    assert series["failed"] == 1 and series["bursts_served"] == [10, 9, 10]
    text = AB.mixed_table(rows, {"base": None, "series": None})
    assert "| series | 125.0 (120.0–130.0) | 12.50 (12.00–13.00) |" in text
    assert "10/10; 9/10; 10/10" in text
