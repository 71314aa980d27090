"""Runner of the bare-GPU archive built by scripts/pack_gpu_check.py.

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
  (no compiled extension of the wheel) and the pure-Python wheels the check's
  imports need, unpacked with their metadata;
* ``site-cpXY/``: the few compiled wheels the check uses, for one Python
  (``--python`` of the packer); used only when this interpreter matches;
* ``scripts/``: gpu_vit_check.py and the cpu_support modules it imports.

STAND-INS. SGLang imports, at module level, packages that this check never
calls: the CUDA kernel package ``sgl_kernel`` and a few compiled helpers
(listed in ``manifest.json`` as ``standins``). When one of them is not
importable on the box, a light stand-in module answers the import: every name
in it is a class that raises ``BareStandInCalled`` (naming the package and the
name) when it is called or instantiated. A stand-in that is ever used stops
the run with that error; a real package, when the box has one, always wins.
The runner writes which stand-ins were installed into ``bare_runner.json``
next to the check's tables.
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

    return _Meta(qualname.rsplit(".", 1)[-1], (), {"__module__": qualname.rsplit(".", 1)[0]})


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
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)


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
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another run unpacked it meanwhile
        if not os.path.isfile(os.path.join(dest, MANIFEST)):
            raise
    return dest


def _split_args(argv):
    """The runner's own ``--workdir DIR``; everything else goes to the check."""
    workdir, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--workdir" and i + 1 < len(argv):
            workdir, i = argv[i + 1], i + 2
            continue
        if a.startswith("--workdir="):
            workdir, i = a.split("=", 1)[1], i + 1
            continue
        rest.append(a)
        i += 1
    return workdir, rest


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
        print(f"run_gpu_check: note: the archive's compiled wheels are for {manifest['compiled_python']}, "
              f"this is {tag}; using whatever this Python has", file=sys.stderr)
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    finder = install_standins(manifest["standins"])
    return manifest, finder, os.path.isdir(compiled)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    workdir, check_args = _split_args(argv)
    if "-h" in check_args or "--help" in check_args:
        print(__doc__)
    device = _option(check_args, "--device") or ("cpu" if "--tiny" in check_args else "cuda")
    notes = []
    if device == "cuda" and _option(check_args, "--mm-attention-backend") is None:
        # SGLang's own choice on Hopper/Blackwell (fa3/fa4) needs sgl_kernel or a
        # kernel download; Triton ships with torch. Triton (and torch.compile)
        # build their launchers with the system C compiler.
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        backend = "triton_attn" if compiler else "sdpa"
        check_args = check_args + ["--mm-attention-backend", backend]
        notes.append(f"vision attention backend {backend} (the runner's default on a bare box)")
        if not compiler:
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
            notes.append("no C compiler on PATH: sdpa, and TORCHDYNAMO_DISABLE=1 (torch.compile'd helpers run eagerly)")
    if device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # The check's CPU peak-RSS needs glibc's mmap threshold pinned at start;
        # re-exec with the interpreter's own flags (-S, -I, ...) kept.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = os.environ["MALLOC_TRIM_THRESHOLD_"] = str(128 * 1024)
        os.execv(sys.executable, list(getattr(sys, "orig_argv", [sys.executable] + sys.argv)))

    archive = _archive_path()
    if archive:
        root = _unpack(archive, workdir or os.path.join(tempfile.gettempdir(), "gpu_vit_check_bare"))
    else:  # run from an unpacked copy
        root = os.path.abspath(os.path.dirname(__file__))
    manifest, finder, compiled = prepare(root)

    script = os.path.join(root, "scripts", "gpu_vit_check.py")
    sys.argv = [script] + check_args
    t0 = time.perf_counter()
    status, error = 0, None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # e.g. BareStandInCalled: recorded, then shown
        traceback.print_exc()
        status, error = 1, f"{type(e).__name__}: {e}"
    out = _option(check_args, "--out")
    if out and os.path.isdir(out):
        record = dict(
            archive=os.path.basename(archive) if archive else None,
            unpacked=root,
            python=sys.version.split()[0],
            compiled_wheels_used=compiled,
            standins_installed=sorted(finder.used),
            notes=notes,
            check_args=check_args,
            series=manifest.get("series"),
            sglang=manifest.get("sglang"),
            modules={name: getattr(sys.modules.get(name), "__file__", None)
                     for name in ("sglang", "transformers", "numpy", "torch")},
            sys_path=list(sys.path),
            check_seconds=time.perf_counter() - t0,
            exit_status=status,
            error=error,
        )
        with open(os.path.join(out, "bare_runner.json"), "w") as f:
            json.dump(record, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
