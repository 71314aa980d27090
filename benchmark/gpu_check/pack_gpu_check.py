#!/usr/bin/env python
"""Pack benchmark/gpu_check/gpu_vit_check.py for a bare GPU box into ONE archive (at most --max-mib).

The box may have no SGLang and no network: only Python, a CUDA (or ROCm)
torch and torch's own dependencies. The archive is a zip application:

    python benchmark/gpu_check/pack_gpu_check.py        # here: out/gpu_check/gpu_vit_check_bare.pyz
    python3 gpu_vit_check_bare.pyz --out "$OUT"  # there (run_gpu_check.py)

pip does the work here, so the box needs no pip: ``pip download`` fetches
the wheels once into ``.cache/gpu_check_wheels`` (``--fetch-only`` does that
and stops; ``make setup`` runs it for its own Python), then ``pip install
--no-index --no-deps --target`` installs them, for the box's Python and
platform, into the folders the archive holds (``manifest.json`` lists them):

* ``site/``: sglang 0.5.23 (from ``.cache/wheels``, which make setup fills)
  without its compiled extensions, ``sglang/multimodal_gen`` and
  ``sglang/test``, with the series in ``patches/`` applied by
  ``scripts/series.py apply`` (whatever series is there when this runs), and
  the pure-Python distributions in PURE;
* ``fallback/``: FALLBACK (typing_extensions), used only when the box's own
  copy is older than a packed distribution requires;
* ``site-cpXY/``: the compiled distributions in COMPILED for one Python
  (``--python``, default 3.12, manylinux x86_64), only used by a matching
  interpreter;
* ``scripts/``: gpu_vit_check.py, bench_dp_encoder_gather.py and the
  cpu_support modules they import (SCRIPT_FILES says where each comes from);
* ``__main__.py`` / ``run_gpu_check.py``: the runner; STANDINS are the
  packages it stands in for when the box lacks them (see run_gpu_check.py).

PURE, COMPILED and STANDINS were found by running the check's import chain
(its --tiny CPU path and SGLang's CUDA branch at import) with nothing but
torch and its dependencies installed. They are names only: every version is
the venv's own pin in requirements/constraints.txt.

The archive (stdlib ``zipapp``) is written to a temporary file beside --out
and renamed into place only when it is complete and under --max-mib; on any
error nothing is left behind and one line says why.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipapp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONSTRAINTS = os.path.join(REPO, "requirements", "constraints.txt")
SGLANG_VERSION = "0.5.23"

# Pure-Python distributions the import chain needs (py3-none-any).
PURE = [
    "transformers",
    "huggingface_hub",
    "tqdm",
    "packaging",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "pydantic",
    "annotated-types",
    "typing-inspection",
    "starlette",
    "IPython",
    "traitlets",
    "Pygments",
    "openai",
    "distro",
    "compressed-tensors",
    "loguru",
    "gguf",
    "dill",
    "einops",
    "partial-json-parser",
]
# Pure-Python distributions the box normally has (torch requires them) and
# the packed code needs at a minimum version: installed into ``fallback/``,
# which the runner puts first on the path only when the box's copy is too old
# for a packed distribution (pydantic and pydantic_core need a recent typing_extensions).
FALLBACK = ["typing_extensions"]
# Compiled distributions the check uses (or transformers requires at import).
COMPILED = [
    "numpy",
    "pydantic_core",  # pydantic's models, built at import
    "msgspec",  # SGLang's runtime context (SpawnRanks)
    "psutil",  # ServerArgs' memory checks
    "regex",  # transformers, required at import
    "safetensors",  # transformers, required at import
    "PyYAML",  # transformers, required at import
    "tokenizers",  # transformers' gguf integration imports it
]
# Imported at module level by SGLang, never called by the check: stood in for
# when the box lacks them (run_gpu_check.py).
STANDINS = [
    "sgl_kernel",  # SGLang's CUDA kernels (the check's path uses torch/triton ones)
    "torchvision",  # must match the box's torch; only image processors use it
    "PIL",
    "aiohttp",
    "zmq",
    "orjson",
    "pybase64",
    "sentencepiece",
    "tvm_ffi",
]
# The check's own files: path under the archive's scripts/ -> path in this repository.
SCRIPT_FILES = {
    "gpu_vit_check.py": "benchmark/gpu_check/gpu_vit_check.py",
    "bench_dp_encoder_gather.py": "benchmark/vit/bench_dp_encoder_gather.py",
    # The cpu_support modules it imports, each subpackage's __init__ with them,
    # at the same path under scripts/ as here.
    **{
        path: path
        for path in (
            "cpu_support/__init__.py",
            "cpu_support/bench/__init__.py",
            "cpu_support/bench/vit_bench_util.py",
            "cpu_support/tiny_models/__init__.py",
            "cpu_support/tiny_models/tiny_sizes.py",
            "cpu_support/tiny_models/seeded_model.py",
            "cpu_support/standins/__init__.py",
            "cpu_support/standins/prepare.py",
            "cpu_support/standins/vllm_standin/vllm/__init__.py",
            "cpu_support/standins/vllm_standin/vllm/_custom_ops.py",
        )
    },
}
# Left out of the installed sglang: two subpackages the check never imports,
# and every compiled extension (the box's Python may differ from this one).
SGLANG_SKIP = ["sglang/multimodal_gen", "sglang/test", "*.so"]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


class PackError(Exception):
    """One line for the user."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(names, constraints: str = CONSTRAINTS) -> list:
    """``name==version`` for each of ``names``, the version from ``constraints``."""
    pinned = {}
    with open(constraints) as f:
        for line in f:
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            if m:
                pinned[_norm(m.group(1))] = m.group(2)
    missing = [n for n in names if _norm(n) not in pinned]
    if missing:
        raise PackError(
            f"{os.path.relpath(constraints, REPO)} pins no {', '.join(missing)}"
        )
    return [f"{n}=={pinned[_norm(n)]}" for n in names]


def _box_tags(python: str) -> list:
    """pip's options that select wheels for the box: CPython ``python``, manylinux x86_64."""
    abi = "cp" + python.replace(".", "")
    tags = ["--only-binary=:all:", "--python-version", python]
    tags += ["--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        tags += ["--platform", platform]
    return tags


def _pip(args, what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise PackError(f"{what}: {(lines or ['pip failed'])[-1].strip()}")


def fetch(python: str, wheel_cache: str, sglang_cache: str) -> None:
    """Every wheel the archive takes, in the caches (pip downloads only what is missing)."""
    specs = pins(PURE + FALLBACK + COMPILED)
    sglang = f"sglang=={SGLANG_VERSION}"
    os.makedirs(wheel_cache, exist_ok=True)
    os.makedirs(sglang_cache, exist_ok=True)
    for cache, tags, want in (
        (sglang_cache, [], [sglang]),  # for this Python: only its .py files are packed
        (wheel_cache, _box_tags(python), specs),
    ):
        base = ["download", "--no-deps", "-d", cache, *tags, *want]
        try:  # offline first: everything already there
            _pip(base + ["--no-index", "--find-links", cache], "")
        except PackError:
            what = want[0] if len(want) == 1 else f"{len(want)} wheels"
            _pip(base, f"could not download {what} into {cache}")


def _install(target: str, specs, cache: str, tags) -> None:
    args = ["install", "--no-index", "--find-links", cache, "--no-deps"]
    args += ["--no-compile", "--target", target, *tags, *specs]
    what = specs[0] if len(specs) == 1 else f"{len(specs)} distributions"
    _pip(args, f"pip could not install {what} from {cache} into {target}")
    shutil.rmtree(os.path.join(target, "bin"), ignore_errors=True)  # console scripts


def stage(work: str, python: str, wheel_cache: str, sglang_cache: str) -> dict:
    """Fill ``work`` with the archive's tree; return the manifest."""
    fetch(python, wheel_cache, sglang_cache)
    pure, fallback, compiled = pins(PURE), pins(FALLBACK), pins(COMPILED)
    tag, box = "cp" + python.replace(".", ""), _box_tags(python)
    site = os.path.join(work, "site")
    _install(site, [f"sglang=={SGLANG_VERSION}"], sglang_cache, [])
    for folder in SGLANG_SKIP[:-1]:
        shutil.rmtree(os.path.join(site, folder))
    for path in glob.glob(os.path.join(site, "sglang", "**", "*.so"), recursive=True):
        os.remove(path)
    _install(site, pure, wheel_cache, box)
    _install(os.path.join(work, "fallback"), fallback, wheel_cache, box)
    _install(os.path.join(work, f"site-{tag}"), compiled, wheel_cache, box)

    series = [sys.executable, os.path.join(REPO, "scripts", "series.py")]
    proc = subprocess.run(
        series + ["apply", "--target", site], capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr + proc.stdout).strip().splitlines() or ["failed"]
        raise PackError(
            f"the series does not apply to the sglang {SGLANG_VERSION} wheel: {last[-1]}"
        )
    fork = os.path.join(site, "sglang", ".fork-series")
    with open(os.path.join(fork, "stamp.json")) as f:
        stamp = json.load(f)
    for entry in os.listdir(fork):  # the upstream backups are not needed on the box
        if entry != "stamp.json":
            path = os.path.join(fork, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    for rel, source in SCRIPT_FILES.items():
        dest = os.path.join(work, "scripts", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(REPO, source), dest)
    runner = os.path.join(HERE, "run_gpu_check.py")
    shutil.copyfile(runner, os.path.join(work, "__main__.py"))
    shutil.copyfile(runner, os.path.join(work, "run_gpu_check.py"))

    manifest = dict(
        sglang=dict(version=SGLANG_VERSION, skipped=SGLANG_SKIP),
        series=dict(hash=stamp.get("series_hash"), patches=stamp.get("patches")),
        pins=os.path.relpath(CONSTRAINTS, REPO),
        pure=pure,
        fallback=fallback,
        compiled=compiled,
        compiled_python=tag,
        standins=STANDINS,
        scripts=list(SCRIPT_FILES),
    )
    with open(os.path.join(work, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


class _CappedFile(io.FileIO):
    """A file that raises PackError once a write takes it past ``max_mib`` MiB,
    so an archive over --max-mib stops there instead of being zipped whole."""

    def __init__(self, path: str, max_mib: float):
        super().__init__(path, "wb")
        self.max_mib = max_mib

    def write(self, data) -> int:
        n = super().write(data)
        if self.tell() > self.max_mib * 2**20:
            raise PackError(
                f"the archive passed {self.tell() / 2**20:.1f} MiB before it was "
                f"complete, over --max-mib {self.max_mib:g}"
            )
        return n


def write_zip(work: str, out: str, max_mib: float) -> int:
    """Zip ``work`` (a zip application) into ``out`` via a temporary file; return its size."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=".pack-", suffix=".pyz", dir=os.path.dirname(os.path.abspath(out))
    )
    os.close(fd)
    try:
        with _CappedFile(tmp, max_mib) as f:
            zipapp.create_archive(
                work,
                f,
                compressed=True,
                filter=lambda p: "__pycache__" not in p.parts and p.suffix != ".pyc",
            )
        size = os.path.getsize(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        return size
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        default=os.path.join(REPO, "out", "gpu_check", "gpu_vit_check_bare.pyz"),
        help="the archive to write (default out/gpu_check/gpu_vit_check_bare.pyz)",
    )
    p.add_argument(
        "--python",
        default="3.12",
        help="Python X.Y of the GPU box, for the compiled wheels (default 3.12)",
    )
    p.add_argument(
        "--max-mib",
        type=float,
        default=64.0,
        help="refuse an archive larger than this (default 64)",
    )
    p.add_argument(
        "--wheel-cache", default=os.path.join(REPO, ".cache", "gpu_check_wheels")
    )
    p.add_argument(
        "--sglang-cache",
        default=os.path.join(REPO, ".cache", "wheels"),
        help="where the sglang wheel is (scripts/setup_env.sh downloads it there)",
    )
    p.add_argument(
        "--fetch-only",
        action="store_true",
        help="only download the wheels into --wheel-cache (make setup does, for its own Python)",
    )
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d{1,2}", args.python):
        p.error(f"--python must look like 3.12, not {args.python!r}")
    if args.max_mib <= 0:
        p.error("--max-mib must be positive")
    work = tempfile.mkdtemp(prefix="pack-gpu-check-")
    try:
        if args.fetch_only:
            fetch(args.python, args.wheel_cache, args.sglang_cache)
            return 0
        manifest = stage(work, args.python, args.wheel_cache, args.sglang_cache)
        size = write_zip(work, args.out, args.max_mib)
    except PackError as e:
        print(f"pack_gpu_check.py: error: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(args.out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(
        f"wrote {args.out}: {size / 2**20:.1f} MiB, sha256 {digest[:16]}, series {manifest['series']['hash'][:12]} "
        f"({len(manifest['series']['patches'])} patches), compiled wheels for {manifest['compiled_python']}"
    )
    print(
        f'on the GPU box: python3 {os.path.basename(args.out)} --out "$OUT"  (benchmark/gpu_check/README.md)'
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
