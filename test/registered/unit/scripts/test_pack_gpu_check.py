"""benchmark/gpu_check/pack_gpu_check.py: the bare-GPU archive builds, stays under its --max-mib,
and runs the check from nothing but itself and torch.

The archive is packed with compiled wheels for THIS interpreter's Python (the
GPU box gets 3.12's; the code path is the same), then run as documented in a
fresh process that cannot see the venv: ``python -S -s`` (no site-packages,
no user site) with PYTHONPATH set to one directory that holds only torch and
the distributions torch itself requires (symlinks into the venv, found from
their metadata): what a box with a preinstalled torch has. The check runs its
--tiny CPU path; the runner's record says where sglang, transformers and numpy
were imported from and which stand-ins answered.

The archive is packed once per test session (this module is the only one
that packs it) and unpacked once into a shared work folder, so the sglang
tree is byte-compiled once. One more test runs the unpacked archive's runner
and stops it with SIGTERM between two sections: the finished sections must be
on disk. The import check is tested on a box whose typing_extensions is too
old (the packed fallback takes over) and on one without triton (it stops
before anything is built, naming triton).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=176, suite="stage-a-test-cpu")

import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

# The archive carries its own copy of sglang with the series applied at pack
# time, and every run here imports that copy, never the SGLang first on the
# test's path: these tests pass or fail alike on pristine SGLang.
pytestmark = pytest.mark.control(
    reason="runs the archive's own patched sglang copy (and the runner, packer, stand-ins), "
    "independent of the SGLang under test"
)

REPO = Path(__file__).resolve().parents[4]
GPU_CHECK = REPO / "benchmark" / "gpu_check"
PACK = GPU_CHECK / "pack_gpu_check.py"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
    proc = subprocess.run(
        [sys.executable, str(PACK), "--python", PY, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def test_archive_is_one_file_under_64_mib_with_the_current_series(archive):
    assert archive.stat().st_size < 64 * 2**20
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        stamp = json.loads(z.read("site/sglang/.fork-series/stamp.json"))
    series = [
        ln.strip()
        for ln in (REPO / "patches" / "series").read_text().splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    assert stamp["patches"] == series == manifest["series"]["patches"]
    assert "__main__.py" in names and "scripts/gpu_vit_check.py" in names
    assert "scripts/bench_dp_encoder_gather.py" in names
    # No compiled extension of the sglang wheel, and compiled wheels only in site-cpXY/.
    compiled_dir = f"site-{manifest['compiled_python']}/"
    assert not [
        n for n in names if n.endswith(".so") and not n.startswith(compiled_dir)
    ]
    assert "site/sglang/srt/managers/mm_schedule.py" in names
    # Every packed distribution at the venv's pin in requirements/constraints.txt,
    # installed by pip with its metadata.
    pins = {}
    for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_norm(name)] = version
    packed = manifest["pure"] + manifest["fallback"] + manifest["compiled"]
    assert manifest["pins"] == "requirements/constraints.txt" and len(packed) > 30
    for spec in packed:
        name, version = spec.split("==")
        assert pins[_norm(name)] == version, spec
        dist_info = f"{_norm(name).replace('-', '_')}-{version}.dist-info/metadata"
        assert [n for n in names if n.lower().endswith(dist_info)], spec


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One unpack (and byte-compile) of the archive for every run in this module."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One Inductor cache for the module's two CPU check runs: the first builds
    the C++ header and kernels that the check compiles, the second reuses them."""
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture(scope="module")
def unpacked(archive, workdir):
    """The archive unpacked by the runner's own code, where every ``--workdir`` run finds it."""
    sys.path.insert(0, str(GPU_CHECK))
    try:
        import run_gpu_check
    finally:
        sys.path.remove(str(GPU_CHECK))
    return Path(run_gpu_check._unpack(str(archive), str(workdir)))


def _old_typing_extensions(dest: Path) -> Path:
    """A box whose typing_extensions says 4.10.0 (pydantic 2.14.4 needs >= 4.16)."""
    import typing_extensions

    dest.mkdir()
    (dest / "typing_extensions.py").write_text(
        Path(typing_extensions.__file__).read_text()
    )
    info = dest / "typing_extensions-4.10.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: typing_extensions\nVersion: 4.10.0\n"
    )
    return dest


def test_runs_the_check_with_only_the_archive_and_torch(
    archive, unpacked, torch_only, workdir, inductor_cache, tmp_path
):
    torch_dir = torch_only
    old_te = _old_typing_extensions(tmp_path / "old-te")
    out, work = tmp_path / "out" / "not" / "there" / "yet", workdir
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": f"{old_te}{os.pathsep}{torch_dir}",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
    }
    cmd = [
        sys.executable,
        "-S",
        "-s",
        str(archive),
        "--workdir",
        str(work),
        "--tiny",
        "--device",
        "cpu",
        "--repeats",
        "1",
        "--burst",
        "64x64:2,128x128:1",
        "--caps",
        "64,none",
        "--sdpa-images",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    record = json.loads((out / "bare_runner.json").read_text())
    root = record["unpacked"]
    assert root == str(unpacked)
    site = str(Path(sys.prefix))
    for name in ("sglang", "transformers", "numpy"):
        assert record["modules"][name].startswith(root), record["modules"]
    assert record["modules"]["torch"].startswith(str(torch_dir)), record["modules"]
    assert not [
        p for p in record["sys_path"] if p.startswith(site) and "site-packages" in p
    ], record["sys_path"]
    with zipfile.ZipFile(archive) as z:
        standins = json.loads(z.read("manifest.json"))["standins"]
    assert set(record["standins_installed"]) <= set(standins)
    assert (
        record["exit_status"] == 0
        and record["error"] is None
        and record["stopped"] is None
    )

    # The import check found the box's typing_extensions too old and put the packed one first.
    pre = json.loads((out / "preflight.json").read_text())
    assert pre["error"] is None and pre["fallback_used"] == [
        "typing-extensions 4.16.0 (the box has 4.10.0)"
    ]
    assert pre["conflicts"] == [] and "sglang.srt.models.qwen3_vl" in pre["imported"]
    assert record["modules"]["typing_extensions"] == os.path.join(
        root, "fallback", "typing_extensions.py"
    )

    # The environment file: the box's versions, from metadata.
    env_rec = json.loads((out / "env.json").read_text())
    assert env_rec["python"] == sys.version.split()[0]
    assert env_rec["packages"]["torch"]["location"] == str(torch_dir)
    assert env_rec["packages"]["typing_extensions"]["version"] == "4.10.0"
    assert env_rec["packages"]["sglang"] is None
    assert "| typing_extensions | 4.10.0" in (out / "env.md").read_text()

    report = json.loads((out / "gpu_vit_check.json").read_text())
    assert report["requests"] == 3
    # Section 3 (no determinism patch: batched vs alone only) ran its one row.
    assert [d["calls"] for d in report["diffs"]] == [1]
    assert [c["cap"] for c in report["caps"]] == [64, None]
    assert report["complete"] is True
    assert report["sections_done"] == ["steps", "caps", "diffs", "sdpa", "graphs"]
    assert record["sections_on_disk"] == [
        "01-steps.json",
        "02-caps.json",
        "03-diffs.json",
        "04-sdpa.json",
        "05-graphs.json",
    ]
    # The section files hold what the whole report holds.
    assert json.loads((out / "02-caps.json").read_text())["caps"] == report["caps"]
    assert report["graphs"] == {
        "skipped": "CUDA graphs need a GPU (--device cuda)",
        "rows": [],
    }
    assert (out / "gpu_vit_check.md").read_text().startswith("Device: CPU")
    # The DP gather benchmark's ranks would re-import SGLang: on the CPU only
    # with --dp-gather-ranks, and the table says so.
    assert record["dp_encoder_gather"] == {
        "ranks": 0,
        "skipped": "not run on the CPU by default",
        "error": None,
    }
    assert (out / "dp_encoder_gather.md").read_text() == (
        "DP encoder gather benchmark skipped: not run on the CPU by default.\n"
    )


def test_sigterm_between_sections_leaves_the_finished_ones(
    unpacked, torch_only, inductor_cache, tmp_path
):
    """The unpacked archive's runner, stopped by SIGTERM (as ``timeout`` does)
    after the second section: the two finished sections are on disk, the
    report says it was stopped and what was not measured."""
    runner = unpacked / "run_gpu_check.py"
    out = tmp_path / "new" / "out"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(torch_only),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
        "GPU_VIT_CHECK_TEST_PAUSE_AFTER": "caps",
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "MALLOC_TRIM_THRESHOLD_": "131072",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-s",
            str(runner),
            "--tiny",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--burst",
            "64x64:2,128x128:1",
            "--caps",
            "64,none",
            "--sdpa-images",
            "2",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while (
            not (out / "02-caps.md").exists()
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert (out / "02-caps.md").exists(), "the caps section never finished"
        time.sleep(0.5)  # the pause: the runner now sleeps after the caps section
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    assert "stopped by signal" in stderr and "finished sections: steps, caps" in stderr

    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if n[:2].isdigit()] == [
        "01-steps.json",
        "01-steps.md",
        "02-caps.json",
        "02-caps.md",
    ]
    assert {
        "env.json",
        "env.md",
        "preflight.json",
        "bare_runner.json",
        "gpu_vit_check.json",
    } <= set(names)
    steps = json.loads((out / "01-steps.json").read_text())["steps"]
    assert [s["path"] for s in steps] == ["per-request", "batched"]
    report = json.loads((out / "gpu_vit_check.json").read_text())
    assert report["complete"] is False and "SIGTERM" in report["stopped"]
    assert report["sections_done"] == ["steps", "caps"] and "diffs" not in report
    md = (out / "gpu_vit_check.md").read_text()
    assert "| per-request | 3 |" in md and "INCOMPLETE (stopped by signal" in md
    assert (
        "not measured: batched vs each image alone; SDPA vision backend launches; ViT CUDA graphs"
        in md
    )
    record = json.loads((out / "bare_runner.json").read_text())
    assert record["exit_status"] == 143 and record["stopped"].startswith(
        "SIGTERM during the check"
    )
    assert record["sections_on_disk"] == ["01-steps.json", "02-caps.json"]


def test_a_box_without_triton_stops_at_the_import_check(
    archive, unpacked, torch_only, workdir, tmp_path
):
    """--device cuda with a C compiler picks triton_attn; with no triton on the
    box the import check names it before any model is built (exit 3)."""
    no_triton = tmp_path / "no-triton"
    no_triton.mkdir()
    for entry in torch_only.iterdir():
        if not entry.name.startswith("triton"):
            (no_triton / entry.name).symlink_to(entry.resolve())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cc").write_text("#!/bin/sh\necho 'cc (fake) 1.0'\n")
    (bin_dir / "cc").chmod(0o755)
    out = tmp_path / "out"
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(no_triton),
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-s",
            str(archive),
            "--workdir",
            str(workdir),
            "--device",
            "cuda",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("run_gpu_check: preflight: importing triton failed")
        and "missing module: triton" in last
    )
    pre = json.loads((out / "preflight.json").read_text())
    assert pre["imported"] == ["torch"]
    assert not [
        p
        for p in out.iterdir()
        if p.name[:2].isdigit() or p.name.startswith("gpu_vit_check")
    ]
    assert json.loads((out / "env.json").read_text())["compiler"] == {
        "path": str(bin_dir / "cc"),
        "version": "cc (fake) 1.0",
    }
    assert json.loads((out / "bare_runner.json").read_text())["exit_status"] == 3


@pytest.fixture(scope="module")
def torch_only(tmp_path_factory):
    return _torch_only_dir(tmp_path_factory.mktemp("torch") / "torch-only")


@pytest.mark.parametrize("compiler", [True, False])
def test_cuda_default_backend_on_a_bare_box(
    archive, unpacked, torch_only, workdir, tmp_path, compiler
):
    """--device cuda with no backend given: triton_attn when a C compiler is on
    PATH, else sdpa with torch.compile off. This CPU has no GPU, so the check
    itself stops with its one-line error (exit 2) after the runner's choice."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if compiler:
        cc = bin_dir / "cc"
        cc.write_text("#!/bin/sh\nexit 1\n")
        cc.chmod(0o755)
    out = tmp_path / "out"
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(torch_only),
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-s",
            str(archive),
            "--workdir",
            str(workdir),
            "--device",
            "cuda",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torch sees no GPU" in proc.stderr.strip().splitlines()[-1]
    record = json.loads((out / "bare_runner.json").read_text())
    args = record["check_args"]
    assert args[args.index("--mm-attention-backend") + 1] == (
        "triton_attn" if compiler else "sdpa"
    )
    assert any("TORCHDYNAMO_DISABLE" in n for n in record["notes"]) is (not compiler)


# SGLang's CUDA branch at import time (module-level `if _is_cuda:` imports),
# from the unpacked archive, with torch told a Hopper GPU is there.
_CUDA_IMPORTS = """
import sys
root = sys.argv[1]
sys.path.insert(0, root)
import run_gpu_check
manifest, finder, compiled = run_gpu_check.prepare(root)
import torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"


class _Props:
    name, major, minor, total_memory, multi_processor_count = "NVIDIA H200", 9, 0, 140 << 30, 132


torch.cuda.get_device_properties = lambda *a, **k: _Props()
import gpu_vit_check  # noqa: F401
from sglang.srt.configs.qwen3_vl import Qwen3VLConfig  # noqa: F401
from sglang.srt.distributed.parallel_state import init_distributed_environment  # noqa: F401
from sglang.srt.managers import mm_schedule  # noqa: F401
from sglang.srt.managers.schedule_batch import MultimodalDataItem  # noqa: F401
from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration  # noqa: F401
from sglang.srt.runtime_context import publish  # noqa: F401
from sglang.srt.server_args import ServerArgs  # noqa: F401
from sglang.srt.layers.attention import vision
assert vision._is_cuda, "the CUDA branch was not taken"
import json
print(json.dumps(dict(standins=sorted(finder.used), compiled=compiled,
                      sglang=sys.modules["sglang"].__file__)))
"""


def test_cuda_branch_imports_resolve_from_the_archive(unpacked, torch_only, tmp_path):
    work = unpacked
    probe = tmp_path / "cuda_imports.py"
    probe.write_text(_CUDA_IMPORTS)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(torch_only),
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-S", "-s", str(probe), str(work)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["sglang"].startswith(str(work)) and seen["compiled"]
    # The CUDA kernels package is imported at module level there and stood in for.
    assert "sgl_kernel" in seen["standins"]


_STANDIN_BEHAVIOUR = """
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
import run_gpu_check as R
finder = R.install_standins(["fork_absent_pkg", "json"])
import fork_absent_pkg.kernels as k
from fork_absent_pkg import rmsnorm
out = {}
try:
    rmsnorm(1)
except R.BareStandInCalled as e:
    out["called"] = str(e)
class Sub(k.Op):  # subclassing at import time works; instantiating does not
    pass
try:
    Sub()
except R.BareStandInCalled as e:
    out["instantiated"] = str(e)
out["probe"] = importlib.util.find_spec("fork_absent_pkg")
out["real_json_wins"] = json.__file__ is not None and not getattr(json, "__bare_standin__", False)
out["used"] = sorted(finder.used)
print(json.dumps(out))
"""


def test_standins_raise_when_used_and_look_absent_to_probes(tmp_path):
    probe = tmp_path / "standins.py"
    probe.write_text(_STANDIN_BEHAVIOUR)
    proc = subprocess.run(
        [sys.executable, str(probe), str(GPU_CHECK)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "fork_absent_pkg.rmsnorm" in out["called"]
    assert "fork_absent_pkg.kernels.Op" in out["instantiated"]
    assert out["probe"] is None and out["real_json_wins"]
    assert out["used"] == ["fork_absent_pkg"]


def test_bad_input_is_one_line_and_leaves_no_file(tmp_path):
    out = tmp_path / "x.pyz"
    cmd = [sys.executable, str(PACK), "--out", str(out), "--python", "twelve"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "--python must look like 3.12" in last, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_archive_over_max_mib_is_one_line_and_leaves_no_file(
    tmp_path, monkeypatch, capsys
):
    """--max-mib stops the zip as it passes the limit. The packer's own main()
    and write_zip run; only the staging (pip installs of the whole archive, the
    module's ``archive`` fixture packs it for real) is replaced by a runner and
    2 MiB that do not compress."""
    import pack_gpu_check as P

    def stage(work, *args):
        with open(os.path.join(work, "__main__.py"), "w") as f:
            f.write("print('stand-in runner')\n")
        with open(os.path.join(work, "blob.bin"), "wb") as f:
            f.write(os.urandom(2 * 2**20))
        return {}

    monkeypatch.setattr(P, "stage", stage)
    out = tmp_path / "out" / "x.pyz"
    rc = P.main(["--out", str(out), "--python", PY, "--max-mib", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert re.fullmatch(
        r"pack_gpu_check\.py: error: the archive passed \d+\.\d MiB before it "
        r"was complete, over --max-mib 1",
        err[0],
    ), err
    # The folder the archive would have gone to holds no file, not even its temporary.
    assert list((tmp_path / "out").iterdir()) == []


def test_pins_come_from_the_constraints_file_and_name_what_is_missing(tmp_path):
    """The archive's versions are the lines of requirements/constraints.txt; a
    name that file does not pin stops the pack with one line naming it."""
    import pack_gpu_check as P

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        "# header\nPyYAML==6.0.4\ntyping-extensions==4.16.0  # why\n"
    )
    assert P.pins(["pyyaml", "typing_extensions"], str(constraints)) == [
        "pyyaml==6.0.4",
        "typing_extensions==4.16.0",
    ]
    with pytest.raises(P.PackError, match="pins no numpy, loguru"):
        P.pins(["PyYAML", "numpy", "loguru"], str(constraints))


def test_fetch_only_needs_no_index_once_the_wheels_are_there(tmp_path):
    """make setup's ``--fetch-only`` left every wheel in the caches: the same
    call with pip's index switched off succeeds; into an empty cache it fails
    with one line, leaving nothing there."""
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "none"))
    fetch = [sys.executable, str(PACK), "--fetch-only", "--python", PY]
    proc = subprocess.run(fetch, cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    empty = tmp_path / "empty"
    proc = subprocess.run(
        fetch + ["--wheel-cache", str(empty)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("pack_gpu_check.py: error: could not download ")
    assert list(empty.iterdir()) == []
