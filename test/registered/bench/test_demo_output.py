"""`make demo`'s terminal carries only the demo's own lines (demo/demo.py, ``Terminal``).

Warnings, prints from libraries and output of child processes (server ranks,
bench_serving) go to the log file; the demo's progress lines reach the
terminal and are copied into the log too.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

pytestmark = pytest.mark.control(reason="the demo terminal's output routing (harness)")

DEMO_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "demo"
)

NOISY = r"""
import os, subprocess, sys, warnings
sys.path.insert(0, {demo_dir!r})
import demo
with demo.Terminal({log!r}) as term:
    term.say("== progress ==")
    print("a library's print")
    warnings.warn("a transformers-style warning")
    sys.stderr.write("NCCL WARN something\n")
    subprocess.run([sys.executable, "-c", "import sys; print('child out'); sys.stderr.write('child err\\n')"])
    os.write(2, b"raw fd 2 write\n")
    term.say("| table | row |")
print("after the demo")
"""


def test_only_the_demo_lines_reach_the_terminal(tmp_path):
    log = tmp_path / "demo.log"
    out = subprocess.run(
        [sys.executable, "-c", NOISY.format(demo_dir=DEMO_DIR, log=str(log))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "== progress ==",
        "| table | row |",
        "after the demo",
    ]
    assert out.stderr == ""
    text = log.read_text()
    for noise in (
        "a library's print",
        "a transformers-style warning",
        "NCCL WARN something",
        "child out",
        "child err",
        "raw fd 2 write",
        "[demo] == progress ==",
    ):
        assert noise in text, noise
    assert "after the demo" not in text
