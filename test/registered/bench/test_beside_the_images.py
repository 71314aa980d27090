"""The reviewer's three costs in the A/B: a text-only stream beside
the image bursts, image sizes no warm-up used, peak memory per rank per burst.

The GPU path's dry run of all three options is part of ``test_ab_dry_run.py``
(the same stub launches); here the CPU path's scheduler peak-RSS reading,
against a process that carries a scheduler's title, and the option checks.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import subprocess  # noqa: E402
import sys  # noqa: E402

import ab_image_burst as AB  # noqa: E402
import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.control(
    reason="the harness's own measurements, against a stub server and a stub process"
)

CHILD = r"""
import sys, setproctitle
setproctitle.setproctitle(sys.argv[1])
print("up", flush=True)
sys.stdin.readline()
block = bytearray(96 << 20)  # touched: 96 MiB resident
for i in range(0, len(block), 4096):
    block[i] = 1
del block
print("done", flush=True)
sys.stdin.readline()
"""


def test_scheduler_peak_rss_over_a_burst():
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, title],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for title in ("sglang::scheduler_TP0", "sglang::detokenizer")
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"
        sampler = B.MemorySampler(pids=lambda: [p.pid for p in procs])
        sampler.start()
        procs[0].stdin.write("\n")
        procs[0].stdin.flush()
        assert procs[0].stdout.readline().strip() == "done"
        seen = sampler.stop()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # Only the scheduler is read; its peak covers the 96 MiB it held and freed in the window.
    assert list(seen) == ["scheduler_peak_rss_mib"]
    assert list(seen["scheduler_peak_rss_mib"]) == ["sglang::scheduler_TP0"]
    assert seen["scheduler_peak_rss_mib"]["sglang::scheduler_TP0"] >= 96


def test_bad_options_are_refused():
    for bad in (
        ["--unseen-sizes", "64by96"],
        ["--text-stream-concurrency", "-1"],
        ["--b-extra-args", "'open"],
        ["--mixed", "--memory"],
    ):
        with pytest.raises(SystemExit) as e:
            AB.parse(["--model-path", "m", *bad])
        assert e.value.code == 2


def test_the_image_window_reaches_back_from_bench_serving_exit():
    assert B.image_window({"duration": 3.0}, now=100.0) == (
        100.0 - 3.0 - B.IMAGE_WINDOW_SLACK_S,
        100.0,
    )
    assert B.image_window(None) is None and B.image_window({"duration": 0}) is None
