"""Runner of the bare-GPU archive built by benchmark/gpu_check/pack_gpu_check.py.

Inside the archive this file is ``__main__.py``, so on the GPU box

    python gpu_vit_check_bare.pyz --out /tmp/gpu_vit_check

unpacks the archive (once, into --workdir, default $TMPDIR/gpu_vit_check_bare),
puts its Python trees in front of ``sys.path`` and runs ``gpu_vit_check.py``
with the given options (default: the Qwen3-VL-8B-sized tower on ``--device
cuda``). The box needs only Python, a CUDA (or ROCm) torch and what torch
itself depends on. On cuda without ``--mm-attention-backend`` the runner
passes ``triton_attn`` (SGLang's own choice on H100/H200, fa3, needs
sgl_kernel or a kernel download); with no C compiler on PATH (Triton and
torch.compile need one) it passes ``sdpa`` and sets TORCHDYNAMO_DISABLE=1.

What the archive holds (``manifest.json`` lists it):

* ``site/``: SGLang 0.5.23's Python sources with the fork's series applied
  (no compiled extension of the wheel) and the pure-Python distributions the
  check's imports need, installed by pip at pack time (``pip install
  --target``, so the box needs no pip), each with its metadata;
* ``site-cpXY/``: the few compiled distributions the check uses, for one
  Python (``--python`` of the packer); used only when this interpreter matches;
* ``scripts/``: gpu_vit_check.py, bench_dp_encoder_gather.py and the
  cpu_support modules they import.

STAND-INS. SGLang imports, at module level, packages that this check never
calls: the CUDA kernel package ``sgl_kernel`` and a few compiled helpers
(listed in ``manifest.json`` as ``standins``). When one of them is not
importable on the box, a light stand-in module answers the import: every name
in it is a class that raises ``BareStandInCalled`` (naming the package and the
name) when it is called or instantiated. A stand-in that is ever used stops
the run with that error; a real package, when the box has one, always wins.
The runner writes which stand-ins were installed into ``bare_runner.json``
next to the check's tables.

ORDER OF WORK (every file under ``--out``, which is created if missing;
default ``./gpu_vit_check_out``):

1. ``env.json`` / ``env.md``, before anything is imported or unpacked: GPU
   (``nvidia-smi``, else ``rocm-smi``), driver, ``*_VISIBLE_DEVICES``, Python,
   the box's torch, triton, typing_extensions and numpy versions (from their
   metadata, nothing imported), the C compiler and its version;
2. the import check, before any model is built (``preflight.json``): the
   requirements of every packed distribution that the box must provide are
   compared with the box's versions (a too-old ``typing_extensions`` is
   replaced by the packed fallback copy, first on the path), then torch and
   every SGLang module the check uses are imported. A failure ends the run in
   seconds with one line naming the module or distribution (exit 3); with
   ``--device cuda`` and no GPU visible to torch it ends before SGLang's
   imports, as the check itself would (exit 2);
3. the check (``gpu_vit_check.py``), which writes each section's table and
   JSON as soon as it ends;
4. unless the check was stopped, the DP encoder's gather benchmark
   (``bench_dp_encoder_gather.py``), ``dp_encoder_gather.json`` / ``.md``, on
   ``--dp-gather-ranks`` N rank processes started here (env://): by default
   on cuda the largest of 2, 4, 8 that the GPUs allow, one GPU each over
   NCCL/RCCL; with more ranks than GPUs (one GPU: two ranks) they share the
   GPUs over gloo, which takes the CUDA tensors of the runner's all-gather and
   broadcast. On the CPU it runs only when N is given (two tiny-tower ranks
   re-import SGLang: half a minute here). A failed rank stops the others and
   its last line is written instead of the table; exit 1 if the check passed;
5. ``bare_runner.json``. On SIGTERM (``timeout``) the check stops, the
   finished sections stay on disk and ``bare_runner.json`` says it was
   stopped (exit 143).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zipfile

MANIFEST = "manifest.json"


class BareStandInCalled(RuntimeError):
    """A stand-in for a package missing on the box was used, not only imported."""


def _standin_class(qualname: str):
    def _refuse(*args, **kwargs):
        raise BareStandInCalled(
            f"{qualname} belongs to a package the bare-GPU archive stands in for "
            "(not installed on this box); the check reached code that needs it"
        )

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _standin_class(f"{qualname}.{name}")

        def __call__(cls, *args, **kwargs):
            _refuse()

    return _Meta(
        qualname.rsplit(".", 1)[-1], (), {"__module__": qualname.rsplit(".", 1)[0]}
    )


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _standin_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: submodules are stand-ins too
        module.__bare_standin__ = True
        return module

    def exec_module(self, module):
        pass


class StandInFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: answers only imports nothing else found."""

    def __init__(self, names):
        self.names = frozenset(names)
        self.used = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in self.names:
            return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(
            fullname, _StandInLoader(), is_package=True
        )


def install_standins(names) -> StandInFinder:
    """Stand-ins for ``names``, for imports that nothing else answers.

    Libraries probe optional packages with ``importlib.util.find_spec``
    (transformers' ``is_torchvision_available`` and friends). To such a probe
    a stand-in looks absent, also once imported, so the library takes its
    without-it branch; only a hard import gets the stand-in.
    """
    finder = StandInFinder(names)
    sys.meta_path.append(finder)
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        spec = real_find_spec(name, package)
        if spec is not None and isinstance(spec.loader, _StandInLoader):
            return None
        return spec

    importlib.util.find_spec = find_spec
    return finder


# ---------------------------------------------------------------------------
# 1. The box, before anything is imported
# ---------------------------------------------------------------------------


def _first_line(cmd, timeout=20):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{type(e).__name__}: {e}"
    text = (out.stdout or out.stderr).strip()
    return out.returncode, text


def _dist_version(name, paths=None):
    import importlib.metadata as md

    try:
        dist = (
            next(iter(md.distributions(name=name, path=paths)))
            if paths is not None
            else md.distribution(name)
        )
    except (StopIteration, md.PackageNotFoundError):
        return None
    return dict(version=dist.version, location=str(dist.locate_file("")))


def box_environment(box_paths):
    """What the box has: GPU, driver, Python, versions, compiler (nothing imported)."""
    import platform

    env = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        host=platform.node(),
        platform=platform.platform(),
        python=sys.version.split()[0],
        python_executable=sys.executable,
        visible_devices={
            k: os.environ[k]
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES",
                "ROCR_VISIBLE_DEVICES",
            )
            if k in os.environ
        },
        packages={
            name: _dist_version(name, box_paths)
            for name in (
                "torch",
                "triton",
                "pytorch-triton-rocm",
                "typing_extensions",
                "numpy",
                "sglang",
            )
        },
    )
    gpu = None
    if shutil.which("nvidia-smi"):
        rc, text = _first_line(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total,memory.used",
                "--format=csv,noheader",
            ]
        )
        gpu = dict(tool="nvidia-smi", rc=rc, gpus=text.splitlines() if text else [])
    elif shutil.which("rocm-smi"):
        rc, text = _first_line(
            [
                "rocm-smi",
                "--showproductname",
                "--showdriverversion",
                "--showmeminfo",
                "vram",
            ]
        )
        gpu = dict(tool="rocm-smi", rc=rc, output=text)
    elif os.path.exists("/proc/driver/nvidia/version"):
        with open("/proc/driver/nvidia/version") as f:
            gpu = dict(tool="/proc/driver/nvidia/version", output=f.read().strip())
    env["gpu"] = gpu or dict(
        tool=None, note="no nvidia-smi, rocm-smi or /proc/driver/nvidia/version"
    )
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    version = None
    if compiler:
        text = _first_line([compiler, "--version"])[1] or ""
        version = text.splitlines()[0] if text.strip() else None
    env["compiler"] = dict(path=compiler, version=version)
    return env


def env_markdown(env):
    lines = ["| what | value |", "|---|---|"]
    gpu = env["gpu"]
    lines.append(
        f"| GPU ({gpu.get('tool')}) | "
        + (
            "; ".join(gpu.get("gpus") or [])
            or (gpu.get("output") or gpu.get("note") or "").replace("\n", " ")[:400]
        )
        + " |"
    )
    lines.append(f"| visible devices | {env['visible_devices'] or 'all'} |")
    lines.append(f"| Python | {env['python']} ({env['python_executable']}) |")
    for name, v in env["packages"].items():
        lines.append(
            f"| {name} | {'not installed' if v is None else v['version'] + ' (' + v['location'] + ')'} |"
        )
    c = env["compiler"]
    lines.append(
        f"| C compiler | {c['path'] or 'none on PATH'}{' — ' + c['version'] if c['version'] else ''} |"
    )
    if env.get("torch_runtime"):
        lines.append(f"| torch runtime | {env['torch_runtime']} |")
    return "\n".join(lines)


def write_json(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# 2. The import check
# ---------------------------------------------------------------------------

# What gpu_vit_check imports from SGLang, on every device.
CHECK_MODULES = [
    "sglang.srt.configs.qwen3_vl",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.environ",
    "sglang.srt.managers.mm_schedule",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.models.qwen3_vl",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
    "sglang.srt.layers.attention.vision",
    "cpu_support.tiny_models.seeded_model",
]


class PreflightFailed(Exception):
    """One line: what the box lacks."""


def _norm(name):
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_conflicts(archive_paths, box_paths):
    """Requirements of packed distributions that the box must meet itself.

    Returns ``(conflicts, absent)``: a conflict is a requirement on a
    distribution the archive does not pack and the box has at a version the
    requirement excludes; absent ones are neither packed nor on the box (only
    an import can tell whether the check needs them). sglang's own
    requirements are not checked: the check uses a sliver of SGLang.
    """
    import importlib.metadata as md

    from packaging.requirements import Requirement

    packed = {
        _norm(d.metadata["Name"]): d for d in md.distributions(path=archive_paths)
    }
    box = {}
    for d in md.distributions(path=box_paths):
        box.setdefault(_norm(d.metadata["Name"]), d)
    conflicts, absent = [], []
    for name, dist in sorted(packed.items()):
        if name == "sglang":
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            want = _norm(req.name)
            if want in packed:
                continue
            have = box.get(want)
            if have is None:
                absent.append(f"{req.name} (for {dist.metadata['Name']})")
            elif req.specifier and not req.specifier.contains(
                have.version, prereleases=True
            ):
                conflicts.append(
                    dict(
                        name=want,
                        have=have.version,
                        location=str(have.locate_file("")),
                        needed_by=f"{dist.metadata['Name']} {dist.version}",
                        requires=str(req),
                    )
                )
    return conflicts, sorted(set(absent))


NO_GPU = "--device cuda but torch sees no GPU (use --tiny for the CPU path)"


def preflight(root, box_paths, device, backend):
    """Check the box against the packed code before anything is built."""
    record = dict(fallback_used=[], conflicts=[], absent=[], imported=[], error=None)
    archive_paths = [p for p in sys.path if p.startswith(root)]
    conflicts, record["absent"] = requirement_conflicts(archive_paths, box_paths)
    fallback = os.path.join(root, "fallback")
    if conflicts and os.path.isdir(fallback):
        fixed, _ = requirement_conflicts(archive_paths, [fallback])
        for name in sorted({c["name"] for c in conflicts}):
            packed = _dist_version(name, [fallback])
            if packed and not [f for f in fixed if f["name"] == name]:
                have = next(c["have"] for c in conflicts if c["name"] == name)
                record["fallback_used"].append(
                    f"{name} {packed['version']} (the box has {have})"
                )
        if record["fallback_used"]:
            sys.path.insert(0, fallback)
            os.environ["PYTHONPATH"] = (
                fallback + os.pathsep + os.environ.get("PYTHONPATH", "")
            )
        conflicts = [
            c
            for c in conflicts
            if not any(u.startswith(c["name"] + " ") for u in record["fallback_used"])
        ]
    record["conflicts"] = conflicts
    if device == "cpu":
        from cpu_support.standins.prepare import prepare_cpu_process

        prepare_cpu_process()
    modules = (
        ["torch"] + (["triton"] if backend == "triton_attn" else []) + CHECK_MODULES
    )
    t0 = time.perf_counter()
    for name in modules:
        if (
            name == CHECK_MODULES[0]
            and device == "cuda"
            and not sys.modules["torch"].cuda.is_available()
        ):
            # Before SGLang's imports (seconds): the check cannot run anyway.
            record["error"] = NO_GPU
            break
        try:
            __import__(name)
        except (
            BaseException
        ) as e:  # noqa: BLE001 - ImportError, AttributeError on an old torch, ...
            if isinstance(e, (KeyboardInterrupt, SystemExit, RunnerStopped)):
                raise
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            missing = getattr(e, "name", None)
            hint = "".join(
                f"; {c['name']} {c['have']} on this box, {c['needed_by']} needs {c['requires']}"
                for c in conflicts
            )
            record["error"] = (
                f"importing {name} failed: {why}"
                + (f" (missing module: {missing})" if missing else "")
                + hint
            )
            break
        record["imported"].append(name)
    record["import_seconds"] = time.perf_counter() - t0
    if record["error"] is None and conflicts:
        record["warning"] = (
            "version conflicts above, but every module the check uses imported"
        )
    return record


def _archive_path() -> str:
    here = os.path.abspath(os.path.dirname(__file__))
    return here if zipfile.is_zipfile(here) else ""


def _unpack(archive: str, workdir: str) -> str:
    """Unpack ``archive`` into ``workdir/<sha>`` once; return that directory."""
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    dest = os.path.join(workdir, h.hexdigest()[:16])
    if os.path.isfile(os.path.join(dest, MANIFEST)):
        return dest
    os.makedirs(workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=workdir)
    shutil.unpack_archive(archive, tmp, "zip")
    try:
        os.rename(tmp, dest)
    except OSError:  # another run unpacked it meanwhile
        if not os.path.isfile(os.path.join(dest, MANIFEST)):
            raise
    if (os.cpu_count() or 1) >= 8:
        # First imports would byte-compile a few thousand modules one by one;
        # on a GPU box's many cores, compiling the whole tree in parallel once
        # is faster (2 cores: 39 s for all 8.6k files, so left to the imports).
        import compileall

        compileall.compile_dir(dest, quiet=2, workers=os.cpu_count())
    return dest


RUNNER_OPTIONS = ("--workdir", "--dp-gather-ranks")


def _split_args(argv):
    """The runner's own options (RUNNER_OPTIONS, each with a value); everything
    else goes to the check."""
    own, rest, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a in RUNNER_OPTIONS and i + 1 < len(argv):
            own[a], i = argv[i + 1], i + 2
            continue
        if a.split("=", 1)[0] in RUNNER_OPTIONS and "=" in a:
            own[a.split("=", 1)[0]], i = a.split("=", 1)[1], i + 1
            continue
        rest.append(a)
        i += 1
    return own, rest


def _option(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def prepare(root: str):
    """Put the unpacked archive at ``root`` first on ``sys.path`` (and on
    PYTHONPATH for child processes) and install the stand-ins.

    Returns ``(manifest, stand-in finder, whether compiled wheels matched)``.
    """
    with open(os.path.join(root, MANIFEST)) as f:
        manifest = json.load(f)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    paths = [os.path.join(root, "scripts"), os.path.join(root, "site")]
    compiled = os.path.join(root, f"site-{tag}")
    if os.path.isdir(compiled):
        paths.insert(1, compiled)
    elif manifest.get("compiled_python") and manifest["compiled_python"] != tag:
        print(
            f"run_gpu_check: note: the archive's compiled wheels are for {manifest['compiled_python']}, "
            f"this is {tag}; using whatever this Python has",
            file=sys.stderr,
        )
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(
        paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    finder = install_standins(manifest["standins"])
    return manifest, finder, os.path.isdir(compiled)


DP_GATHER = "bench_dp_encoder_gather.py"


def dp_gather_plan(device: str, gpus: int, ranks=None) -> dict:
    """Ranks, backend and arguments of the gather benchmark on this box
    (``ranks`` from --dp-gather-ranks; 0 skips it)."""
    if ranks is None:
        ranks = max(t for t in (2, 4, 8) if t <= max(gpus, 2))
        ranks = 0 if device == "cpu" else ranks
    if not ranks:
        why = (
            "--dp-gather-ranks 0"
            if device == "cuda"
            else "not run on the CPU by default"
        )
        return dict(ranks=0, skipped=why, error=None)
    if device == "cpu":
        args = ["--device", "cpu", "--batches", "large+tiny", "--caps", ""]
        return dict(ranks=ranks, backend="gloo", args=args + ["--repeats", "1"])
    args = ["--device", "cuda", "--repeats", "3"]
    if ranks <= gpus:
        return dict(ranks=ranks, backend="nccl", args=args)
    return dict(ranks=ranks, backend="gloo", args=args + ["--dist-backend", "gloo"])


def run_dp_gather(root: str, device: str, gpus: int, out: str, ranks=None) -> dict:
    """The gather benchmark on its own ranks; its table lands in ``out``."""
    plan = dp_gather_plan(device, gpus, ranks)
    if not plan["ranks"]:
        with open(os.path.join(out, "dp_encoder_gather.md"), "w") as f:
            f.write(f"DP encoder gather benchmark skipped: {plan['skipped']}.\n")
        return plan
    runner = os.path.join(root, "run_gpu_check.py")
    flags = (["-S"] if sys.flags.no_site else []) + (
        ["-s"] if sys.flags.no_user_site else []
    )
    cmd = [sys.executable, *flags, runner, "--dp-gather-rank", *plan["args"]]
    cmd += ["--out", out]
    env = dict(os.environ, WORLD_SIZE=str(plan["ranks"]), MASTER_ADDR="127.0.0.1")
    from cpu_support.bench.vit_bench_util import free_port

    env["MASTER_PORT"] = str(free_port())
    # SGLang's object broadcaster at TP > 1 needs zmq, stood in for here; the
    # benchmark broadcasts tensors only.
    env["SGLANG_USE_MESSAGE_QUEUE_BROADCASTER"] = "false"
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    procs, logs = [], []
    t0 = time.perf_counter()
    try:
        for r in range(plan["ranks"]):
            log = open(os.path.join(out, f"dp_encoder_gather.rank{r}.log"), "w")
            logs.append(log)
            rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            procs.append(
                subprocess.Popen(
                    cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT
                )
            )
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break  # the others would wait in a collective forever
            time.sleep(0.2)
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        error = failed[0] if failed else None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    plan.update(seconds=time.perf_counter() - t0, error=None)
    if error is not None:
        with open(os.path.join(out, f"dp_encoder_gather.rank{error}.log")) as f:
            lines = [ln.strip() for ln in f if ln.strip()] or ["no output"]
        plan["error"] = f"rank {error} exited {procs[error].returncode}: {lines[-1]}"
        with open(os.path.join(out, "dp_encoder_gather.md"), "w") as f:
            f.write(f"DP encoder gather benchmark not measured: {plan['error']}\n")
    return plan


def dp_gather_rank(argv) -> int:
    """One rank of the gather benchmark, with the archive's paths and stand-ins."""
    root = os.path.abspath(os.path.dirname(__file__))
    prepare(root)
    script = os.path.join(root, "scripts", DP_GATHER)
    sys.argv = [script] + list(argv)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


class RunnerStopped(BaseException):
    """SIGTERM before or after the check (a BaseException: no ``except Exception`` swallows it)."""


def _stop(signum, frame):
    raise RunnerStopped(f"stopped by signal {signum} (SIGTERM)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--dp-gather-rank"]:
        return dp_gather_rank(argv[1:])
    own, check_args = _split_args(argv)
    workdir, gather_ranks = own.get("--workdir"), own.get("--dp-gather-ranks")
    if gather_ranks not in (None, "0", "2", "4", "8"):
        print(
            f"run_gpu_check: --dp-gather-ranks takes 0, 2, 4 or 8, not {gather_ranks!r}",
            file=sys.stderr,
        )
        return 2
    if "-h" in check_args or "--help" in check_args:
        print(__doc__)
    out = _option(check_args, "--out")
    if out is None:
        out = os.path.abspath("gpu_vit_check_out")
        check_args = check_args + ["--out", out]
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        print(
            f"run_gpu_check: cannot create --out {out}: {e.strerror}", file=sys.stderr
        )
        return 2
    box_paths = [
        p for p in sys.path if p and not p.endswith(".pyz") and not os.path.isfile(p)
    ]
    env = box_environment(box_paths)
    write_json(os.path.join(out, "env.json"), env)
    with open(os.path.join(out, "env.md"), "w") as f:
        f.write(env_markdown(env) + "\n")

    device = _option(check_args, "--device") or (
        "cpu" if "--tiny" in check_args else "cuda"
    )
    notes = []
    if device == "cuda" and _option(check_args, "--mm-attention-backend") is None:
        # SGLang's own choice on Hopper/Blackwell (fa3/fa4) needs sgl_kernel or a
        # kernel download; Triton ships with torch. Triton (and torch.compile)
        # build their launchers with the system C compiler.
        compiler = env["compiler"]["path"]
        backend = "triton_attn" if compiler else "sdpa"
        check_args = check_args + ["--mm-attention-backend", backend]
        notes.append(
            f"vision attention backend {backend} (the runner's default on a bare box)"
        )
        if not compiler:
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
            notes.append(
                "no C compiler on PATH: sdpa, and TORCHDYNAMO_DISABLE=1 (torch.compile'd helpers run eagerly)"
            )
    if device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # The check's CPU peak-RSS needs glibc's mmap threshold pinned at start;
        # re-exec with the interpreter's own flags (-S, -I, ...) kept.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = os.environ["MALLOC_TRIM_THRESHOLD_"] = (
            str(128 * 1024)
        )
        os.execv(
            sys.executable, list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
        )

    t0 = time.perf_counter()
    status, error, stopped = 0, None, None
    record = dict(
        archive=None,
        python=sys.version.split()[0],
        notes=notes,
        check_args=check_args,
        out=out,
        exit_status=None,
        error=None,
        stopped=None,
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    finder = None
    try:
        archive = _archive_path()
        if archive:
            root = _unpack(
                archive,
                workdir or os.path.join(tempfile.gettempdir(), "gpu_vit_check_bare"),
            )
        else:  # run from an unpacked copy
            root = os.path.abspath(os.path.dirname(__file__))
        manifest, finder, compiled = prepare(root)
        record.update(
            archive=os.path.basename(archive) if archive else None,
            unpacked=root,
            compiled_wheels_used=compiled,
            series=manifest.get("series"),
            sglang=manifest.get("sglang"),
        )
        backend = _option(check_args, "--mm-attention-backend")
        pre = preflight(root, box_paths, device, backend)
        write_json(os.path.join(out, "preflight.json"), pre)
        record["preflight"] = pre
        if pre["error"] == NO_GPU:
            status, error = 2, NO_GPU
            print(f"run_gpu_check: error: {error}", file=sys.stderr)
        elif pre["error"]:
            status, error = 3, f"preflight: {pre['error']}"
            print(f"run_gpu_check: {error}", file=sys.stderr)
        else:
            torch = sys.modules["torch"]
            hip = getattr(torch.version, "hip", None)
            env["torch_runtime"] = (
                f"torch {torch.__version__} ({'ROCm ' + hip if hip else 'CUDA ' + str(torch.version.cuda)}), "
                f"{torch.cuda.device_count()} visible GPU(s)"
                + (
                    f", GPU 0 {torch.cuda.get_device_name(0)}"
                    if torch.cuda.is_available()
                    else ""
                )
            )
            write_json(os.path.join(out, "env.json"), env)
            with open(os.path.join(out, "env.md"), "w") as f:
                f.write(env_markdown(env) + "\n")
            for note in pre["fallback_used"]:
                print(
                    f"run_gpu_check: note: packed fallback used: {note}",
                    file=sys.stderr,
                )
            script = os.path.join(root, "scripts", "gpu_vit_check.py")
            sys.argv = [script] + check_args
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                status = (
                    e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                )
            if status == 143:
                stopped = "SIGTERM during the check (its finished sections are on disk)"
            else:
                import gc

                gc.collect()  # the check's model: its GPU memory back first
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                gather = run_dp_gather(
                    root,
                    device,
                    torch.cuda.device_count(),
                    out,
                    None if gather_ranks is None else int(gather_ranks),
                )
                record["dp_encoder_gather"] = gather
                if gather["error"] and status == 0:
                    status, error = 1, f"dp encoder gather: {gather['error']}"
                    print(f"run_gpu_check: {error}", file=sys.stderr)
    except RunnerStopped as e:
        status, stopped = 143, str(e)
    except Exception as e:  # e.g. BareStandInCalled: recorded, then shown
        traceback.print_exc()
        status, error = 1, f"{type(e).__name__}: {e}"
    finally:
        signal.signal(signal.SIGTERM, previous)
    record.update(
        standins_installed=sorted(finder.used) if finder else [],
        modules={
            name: getattr(sys.modules.get(name), "__file__", None)
            for name in (
                "sglang",
                "transformers",
                "numpy",
                "torch",
                "typing_extensions",
            )
        },
        sys_path=list(sys.path),
        check_seconds=time.perf_counter() - t0,
        exit_status=status,
        error=error,
        stopped=stopped,
        sections_on_disk=sorted(
            f for f in os.listdir(out) if f[:2].isdigit() and f.endswith(".json")
        ),
    )
    write_json(os.path.join(out, "bare_runner.json"), record)
    return status


if __name__ == "__main__":
    sys.exit(main())
