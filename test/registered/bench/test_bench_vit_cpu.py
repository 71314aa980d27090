"""scripts/bench_vit_cpu.py, run as documented on a very small tower.

The script's numbers are the issue's evidence (docs/benchmarks.md), so it
must keep running: one row per (setting, size, attention), each measured in
its own processes, and a table whose speed-up column is the ratio of the
medians it prints. The "old" rows must really run the masked attention: with
a batch whose dense mask is large, the old batched peak has to exceed the
new one by at least the mask's size.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "bench_vit_cpu.py"

ROW = re.compile(
    r"^\| (?P<setting>[^|]+) \| (?P<side>\d+)×\d+ \| (?P<attn>old|new) "
    r"\| (?P<per>\d+) ms \((?P<per_lo>\d+)–(?P<per_hi>\d+)\) "
    r"\| (?P<bat>\d+) ms \((?P<bat_lo>\d+)–(?P<bat_hi>\d+)\) "
    r"\| (?P<speedup>[\d.]+)× \| (?P<per_mib>\d+) MiB \| (?P<bat_mib>\d+) MiB \|$"
)


@pytest.mark.control(
    reason="the benchmark script's table and its old-path mask memory: the script "
    "builds both attention paths itself, so both builds pass"
)
def test_table_rows_and_old_mask_memory():
    # 8 images of 320x320 at patch 16: 400 patches each, 3200 in the batch,
    # so the old path's bool mask alone is 3200^2 bytes (9.8 MiB); a
    # one-layer, 32-wide tower keeps the rest of the step small and fast.
    side, images = 320, 8
    mask_mib = (side // 16) ** 4 * images**2 / 2**20
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--repeats", "1",
            "--warmup", "1",
            "--settings", "1proc",
            "--sizes", str(side),
            "--images", str(images),
            "--depth", "1",
            "--hidden", "32",
            "--heads", "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [m.groupdict() for m in map(ROW.match, out.stdout.splitlines()) if m]
    assert [(r["setting"], r["side"], r["attn"]) for r in rows] == [
        ("1 process", str(side), "old"),
        ("1 process", str(side), "new"),
    ], out.stdout
    for r in rows:
        per, bat = int(r["per"]), int(r["bat"])
        assert per > 0 and bat > 0
        # One repeat: the range collapses onto the median.
        assert int(r["per_lo"]) == per == int(r["per_hi"])
    old, new = rows
    assert int(old["bat_mib"]) >= int(new["bat_mib"]) + int(mask_mib) - 1, out.stdout
    # Each point ran in its own processes (one stderr line per point).
    assert len(re.findall(r"^# 1 process, \d+, (old|new): ", out.stderr, re.M)) == 2
