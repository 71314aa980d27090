"""``ab_image_burst.py --mixed`` on the GPU path (the prepared MI355X/H100 commands), dry-run on the CPU.

The same GPU box as ``test_ab_dry_run.py`` (stub ``launch_server``, fake
``nvidia-smi``, pinned-revision download into a private cache, the real
pristine and series trees): two alternating runs of mixed bursts, each with a
bad image the server refuses. The series build's ``/metrics`` come from the
series tree's own ``MMEncoderMetricsCollector`` (see ``stub_gpu_server.py``).
With ``--throwaway-launch``: each build's untimed launch comes first, cold,
and seeds the ready timeout of the launches after it, and the A/B still
completes (these launches take no request, so the mixed and the burst path
share them; one A/B checks both).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=26, suite="stage-a-test-cpu")

import json  # noqa: E402

import ab_image_burst as AB  # noqa: E402
import pytest  # noqa: E402
from cpu_support.server.sglang_trees import pristine_tree, series_tree  # noqa: E402
from test_ab_dry_run import REPO_ID, SHA, gpu_box  # noqa: E402,F401  (the fixture)

pytestmark = pytest.mark.control(
    reason="harness dry run: both trees are explicit --target folders, independent of the SGLang under test"
)


def test_mixed_ab_on_the_gpu_path(gpu_box, capsys):  # noqa: F811
    argv = [
        "--throwaway-launch",
        "--runs",
        "2",
        "--mixed",
        "--mixed-bursts",
        "3",
        "--mixed-warmup-bursts",
        "1",
        "--mixed-burst-size",
        "4",
        "--mixed-repeats",
        "1",
        "--mixed-bad",
        "1",
        "--mixed-min-size",
        "32x32",
        "--mixed-max-size",
        "96x128",
        "--mixed-output-len",
        "3",
        "--a-python",
        gpu_box["python"],
        "--a-target",
        pristine_tree(),
        "--a-label",
        "base",
        "--b-python",
        gpu_box["python"],
        "--b-target",
        series_tree(),
        "--b-label",
        "series",
        "--model-path",
        REPO_ID,
        "--out-dir",
        str(gpu_box["out"]),
        "--gpu-release-timeout",
        "30",
        "--",
        "--revision",
        SHA,
        "--tp-size",
        "2",
    ]
    rc = AB.main(argv)
    assert rc == 0, capsys.readouterr().err
    ab = json.loads((gpu_box["out"] / "ab.json").read_text())
    assert ab["complete"] is True
    assert [(r["run"], r["build"]) for r in ab["runs"]] == [
        (1, "base"),
        (1, "series"),
        (2, "base"),
        (2, "series"),
    ]
    for r in ab["runs"]:
        st = r["mixed"]["stats"]
        # every good request served, every bad one refused by the server
        assert (st["bursts_served"], st["completed"], st["failed"]) == (3, 12, 0)
        assert (st["bad_requests"], st["bad_accepted"]) == (3, 0)
        assert st["p99_ttft_ms"] >= st["p50_ttft_ms"]
        assert r["mixed"]["warmup"]["stats"]["bursts_served"] == 1
        assert len(r["loadavg"]) == 2
        kinds = [q["kind"] for q in r["mixed"]["requests"]]
        assert kinds.count("repeat") == 3 and kinds.count("bad") == 3
    # the series' /metrics count only the good requests' images (4 per burst)
    base, series = ab["runs"][0]["mixed"]["stats"], ab["runs"][1]["mixed"]["stats"]
    assert base["encoder"] is None
    assert series["encoder"]["images"] == 12 and series["encoder"]["calls_by_path"] == {
        "batched": 12
    }
    # every scheduler records its share of every call, the lone image of a
    # call on tp_rank 0
    assert series["encoder"]["rank_grids"] == {"0": 12, "1": 0}
    assert all(r["caches"]["cold"] for r in ab["runs"])
    rows = {r["build"]: r for r in ab["mixed_rows"]}
    assert rows["base"]["runs"] == rows["series"]["runs"] == 2
    md = (gpu_box["out"] / "ab.md").read_text()
    assert md.startswith("## Mixed-traffic A/B")
    assert "| base |" in md and "| series |" in md and "3/3; 3/3" in md

    # --throwaway-launch: one untimed launch a build, up and down with no
    # request, before the timed runs.
    out = gpu_box["out"]
    assert [
        (t["run"], t["build"], t["result"], t["mixed"]) for t in ab["throwaway"]
    ] == [(None, "base", None, None), (None, "series", None, None)]
    assert sorted(p.name for p in out.glob("*.server.log")) == [
        "run1-base.server.log",
        "run1-series.server.log",
        "run2-base.server.log",
        "run2-series.server.log",
        "throwaway-base.server.log",
        "throwaway-series.server.log",
    ]
    # The first throwaway launch takes the first-launch timeout; every later one,
    # timed runs included, is derived from the launches before it.
    launches = ab["throwaway"] + ab["runs"]
    assert launches[0]["ready_timeout_s"] == 1800.0
    for i, r in enumerate(launches[1:], start=1):
        slowest = max(x["ready_s"] for x in launches[:i])
        assert r["ready_timeout_s"] == max(300.0, 3 * slowest)
    # Each of the six launches cold, with its own empty cache folders.
    seen = [
        json.loads((gpu_box["state"] / f"launch-{n}.json").read_text())["caches"]
        for n in range(1, 7)
    ]
    for var in AB.CACHE_VARS:
        assert len({s[var]["path"] for s in seen}) == 6
        assert all(s[var]["files_at_start"] == [] for s in seen)
    assert "- compile caches: 6 of 6 launches cold" in md
    first = ab["throwaway"]
    assert (
        f"- untimed throwaway launches first: base {first[0]['ready_s']:.1f} s, "
        f"series {first[1]['ready_s']:.1f} s"
    ) in md
