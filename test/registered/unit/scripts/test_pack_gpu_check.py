"""scripts/pack_gpu_check.py: the bare-GPU archive builds, stays under 64 MiB,
and runs the check from nothing but itself and torch.

The archive is packed with compiled wheels for THIS interpreter's Python (the
GPU box gets 3.12's; the code path is the same), then run as documented in a
fresh process that cannot see the venv: ``python -S -s`` (no site-packages,
no user site) with PYTHONPATH set to one directory that holds only torch and
the distributions torch itself requires (symlinks into the venv, found from
their metadata): what a box with a preinstalled torch has. The check runs its
--tiny CPU path; the runner's record says where sglang, transformers and numpy
were imported from and which stand-ins answered.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="stage-a-test-cpu")

import importlib.metadata as md
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[4]
PACK = REPO / "scripts" / "pack_gpu_check.py"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _torch_only_dir(dest: Path) -> Path:
    """Symlinks to torch and every distribution torch requires, nothing else."""
    dest.mkdir()
    seen, todo, tops = set(), ["torch"], set()
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        dist = md.distribution(name)
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            first = f.parts[0]
            if first not in ("..", "__pycache__") and not first.endswith(".data"):
                tops.add((base, first))
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    for base, first in tops:
        if (base / first).exists() and not (dest / first).exists():
            (dest / first).symlink_to(base / first)
    assert not (dest / "sglang").exists() and not (dest / "transformers").exists()
    return dest


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / "gpu_vit_check_bare.pyz"
    proc = subprocess.run([sys.executable, str(PACK), "--python", PY, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def test_archive_is_one_file_under_64_mib_with_the_current_series(archive):
    assert archive.stat().st_size < 64 * 2**20
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        stamp = json.loads(z.read("site/sglang/.fork-series/stamp.json"))
    series = [ln.strip() for ln in (REPO / "patches" / "series").read_text().splitlines()
              if ln.strip() and not ln.strip().startswith("#")]
    assert stamp["patches"] == series == manifest["series"]["patches"]
    assert "__main__.py" in names and "scripts/gpu_vit_check.py" in names
    # No compiled extension of the sglang wheel, and compiled wheels only in site-cpXY/.
    assert not [n for n in names if n.endswith(".so") and not n.startswith(manifest["compiled_python"].join(["site-", "/"]))]
    assert "site/sglang/srt/managers/mm_schedule.py" in names


def test_runs_the_check_with_only_the_archive_and_torch(archive, tmp_path):
    torch_dir = _torch_only_dir(tmp_path / "torch-only")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": str(torch_dir),
           "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-S", "-s", str(archive), "--workdir", str(work), "--tiny", "--device", "cpu",
           "--repeats", "1", "--burst", "64x64:2,128x128:1", "--caps", "64,none", "--sdpa-images", "2",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    record = json.loads((out / "bare_runner.json").read_text())
    root = record["unpacked"]
    assert root.startswith(str(work))
    site = str(Path(sys.prefix))
    for name in ("sglang", "transformers", "numpy"):
        assert record["modules"][name].startswith(root), record["modules"]
    assert record["modules"]["torch"].startswith(str(torch_dir)), record["modules"]
    assert not [p for p in record["sys_path"] if p.startswith(site) and "site-packages" in p], record["sys_path"]
    with zipfile.ZipFile(archive) as z:
        standins = json.loads(z.read("manifest.json"))["standins"]
    assert set(record["standins_installed"]) <= set(standins)
    assert record["exit_status"] == 0

    report = json.loads((out / "gpu_vit_check.json").read_text())
    assert report["requests"] == 3 and report["deterministic_bitwise_ok"]
    assert [c["cap"] for c in report["caps"]] == [64, None]
    assert (out / "gpu_vit_check.md").read_text().startswith("Device: CPU")


@pytest.mark.parametrize("bad,message", [
    (["--python", "twelve"], "--python must look like 3.12"),
    (["--max-mib", "1"], "over --max-mib 1"),
])
def test_bad_input_is_one_line_and_leaves_no_file(tmp_path, bad, message):
    out = tmp_path / "x.pyz"
    cmd = [sys.executable, str(PACK), "--out", str(out)] + (["--python", PY] if bad[0] != "--python" else []) + bad
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert list(tmp_path.iterdir()) == []
