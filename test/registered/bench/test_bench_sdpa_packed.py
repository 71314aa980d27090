"""benchmark/vit/bench_sdpa_packed.py at its smallest size: one 8-image call
through one vision attention layer, pristine's tree against the sglang this
test imports (the series, under make test).

The script's table is the SDPA patch's evidence, so it must keep running and
keep measuring what it says: pristine's row builds one dense block-diagonal
mask of patches^2 bytes and hands it to a single SDPA call (a check of the
script's probe), the series' row builds none and makes one SDPA call per
distinct image size, and the two layer outputs match. On pristine the second
row builds the mask too, so the last test fails there; the other two check
the script itself (controls).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=75, suite="stage-a-test-cpu")

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmark" / "vit" / "bench_sdpa_packed.py"
PRISTINE = REPO / ".cache" / "trees" / "sglang-0.5.23-pristine"
IMAGES = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # The tree this test's sglang comes from: the venv's series, or pristine
    # in the pristine run.
    origin = importlib.util.find_spec("sglang").origin
    tested_tree = os.path.dirname(os.path.dirname(os.path.abspath(origin)))
    rows_json = tmp_path_factory.mktemp("bench-sdpa") / "rows.json"
    cmd = [sys.executable, str(SCRIPT), "--images", str(IMAGES), "--distinct", ""]
    cmd += ["--repeats", "1", "--warmup", "0", "--json", str(rows_json)]
    cmd += ["--pristine-tree", str(PRISTINE), "--series-tree", tested_tree]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, json.loads(rows_json.read_text())


@pytest.mark.control(reason="harness: the bench's table, one row per tree")
def test_table_has_one_row_per_tree_with_the_batch(run):
    stdout, _ = run
    head = [ln for ln in stdout.splitlines() if ln.startswith("| images |")]
    assert len(head) == 1 and "mask built MiB" in head[0] and "SDPA calls" in head[0]
    cells = [
        [c.strip() for c in ln.strip("|").split("|")]
        for ln in stdout.splitlines()
        if ln.startswith(f"| {IMAGES} mixed |")
    ]
    assert [c[3] for c in cells] == ["pristine", "series"]
    spread = re.compile(r"^\d+\.\d \(\d+\.\d–\d+\.\d\)$")
    assert all(spread.match(c[7]) and spread.match(c[8]) for c in cells)
    assert "no series applied" in stdout  # the pristine tree's series.py status


@pytest.mark.control(reason="harness: the bench's probe sees pristine's dense mask")
def test_pristine_builds_the_dense_mask_and_one_sdpa_call(run):
    _, result = run
    assert result["status"]["pristine"]["applied"] is False
    pristine = result["rows"][0]
    assert pristine["tree"] == "pristine" and pristine["images"] == IMAGES
    assert os.path.realpath(pristine["sglang"]) == os.path.realpath(PRISTINE)
    assert pristine["built"] == 1
    assert pristine["built_bytes"] == pristine["patches"] ** 2  # [1, s, s] bool
    assert pristine["sdpa_calls"] == 1
    assert pristine["sdpa_mask_bytes"] == pristine["patches"] ** 2


def test_series_builds_no_mask_one_sdpa_call_per_size_same_rows(run):
    _, result = run
    pristine, series = result["rows"]
    assert series["tree"] == "series" and series["backend"] == "VisionSdpaAttention"
    assert series["patches"] == pristine["patches"]
    assert series["built"] == 0 and series["built_bytes"] == 0
    assert series["sdpa_mask_bytes"] == 0
    assert series["sdpa_calls"] == series["lengths"] == IMAGES  # 8 sizes
    assert series["max_abs_diff"] <= 1e-5
    assert len(series["cold_ms"]) == len(series["cached_ms"]) == 1
