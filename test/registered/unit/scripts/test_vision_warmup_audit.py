"""scripts/vision_warmup_audit.py runs: one family, one mode, in a fresh process.

The full audit (every family, every mode, one fresh process per case:
about 15 minutes on 2 busy cores) is the script's own command:

    .venv/bin/python scripts/vision_warmup_audit.py

Here the cheapest case runs end to end through the script's own command
line: Qwen2.5-VL with the shipped warm-up (one rank's fresh process).
18 s wall with the cores free, 2.3 min under load average 18.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "scripts" / "vision_warmup_audit.py"


def _run(*args, timeout=600):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.control(reason="the audit script's --list, which imports no sglang")
def test_list_names_every_family():
    proc = _run("--list", timeout=60)
    assert proc.returncode == 0, proc.stderr
    names = [line.split(":")[0] for line in proc.stdout.splitlines()]
    assert names == [
        "qwen3_vl",
        "glm5_next",
        "qwen2_5_vl",
        "glm4v",
        "bailing_mm",
        "bailing_moe_v3_vl",
        "kimi_vl",
        "kimi_k25",
        "kimi_k3",
        "minimax_vl",
    ]


def test_one_family_shipped_warm_up_then_no_compile(tmp_path):
    out = tmp_path / "audit.json"
    proc = _run("--family", "qwen2_5_vl", "--mode", "shipped", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (case,) = json.loads(out.read_text())
    assert case["model_class"] == "Qwen2_5_VLForConditionalGeneration"
    assert case["plan"]["tower"] == "visual"
    assert [[tuple(g) for g in c] for c in case["calls"]] == [
        [(1, 32, 32)],
        [(1, 48, 64)],
    ]
    assert case["before"] == 0
    assert case["warm_compiles"] >= 1
    assert case["per_call"] == [0] * 10
    assert case["sweep_compiles"] == 0
    # The markdown row the docs quote.
    assert "### qwen2_5_vl" in proc.stdout
    assert "| Qwen2_5_VLForConditionalGeneration (Qwen2.5-VL) | visual " in proc.stdout
    assert "| shipped | [1,32,32] [1,48,64] | " in proc.stdout
