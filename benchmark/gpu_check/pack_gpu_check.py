#!/usr/bin/env python
"""Pack benchmark/gpu_check/gpu_vit_check.py for a bare GPU box into ONE archive (< 64 MiB).

The box may have no SGLang and no network: only Python, a CUDA (or ROCm)
torch and torch's own dependencies. The archive is a zip application:

    python benchmark/gpu_check/pack_gpu_check.py        # here: out/gpu_check/gpu_vit_check_bare.pyz
    timeout 280 python3 gpu_vit_check_bare.pyz --out "$OUT"  # there (run_gpu_check.py)

It holds (``manifest.json`` in the archive lists every part):

* ``site/``: the Python sources of the sglang 0.5.23 wheel (no compiled
  extension; ``sglang/multimodal_gen`` and ``sglang/test`` left out) with the
  series in ``patches/`` applied by ``scripts/series.py apply`` (whatever
  series is there when this runs), and the pure-Python wheels in PURE;
* ``fallback/``: FALLBACK (typing_extensions), used only when the box's own
  copy is older than a packed distribution requires;
* ``site-cpXY/``: the compiled wheels in COMPILED for one Python (``--python``,
  default 3.12, manylinux x86_64), only used by a matching interpreter;
* ``scripts/``: gpu_vit_check.py and the cpu_support modules it imports
  (the archive's own folder name; SCRIPT_FILES says where each comes from);
* ``__main__.py`` / ``run_gpu_check.py``: the runner; STANDINS are the
  packages it stands in for when the box lacks them (see run_gpu_check.py).

PURE, COMPILED and STANDINS were found by running the check's import chain
(its --tiny CPU path and SGLang's CUDA branch at import) with nothing but
torch and its dependencies installed. Versions are exact: sglang's own pins
as in requirements/cpu.txt, the others what pip resolves for that file.
Wheels are downloaded with ``pip download`` into ``.cache/gpu_check_wheels``
(once; ``--fetch-only`` downloads and stops, which ``make setup`` runs for
its own Python); the sglang wheel comes from ``.cache/wheels`` (downloaded if
absent).

The archive is written to a temporary file beside --out and renamed into
place only when it is complete and under --max-mib; on any error nothing is
left behind and one line says why.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SGLANG_VERSION = "0.5.23"

# Pure-Python wheels the import chain needs (py3-none-any).
PURE = [
    "transformers==5.19.0",  # sglang pin (requirements/cpu.txt)
    "huggingface_hub==1.33.0",
    "tqdm==4.70.1",
    "packaging==26.4",
    "requests==2.34.2",
    "urllib3==2.8.0",
    "idna==3.20",
    "certifi==2026.10.19.post1",
    "httpx==0.28.1",
    "httpcore==1.0.9",
    "h11==0.16.0",
    "anyio==4.16.0",
    "sniffio==1.3.1",
    "pydantic==2.14.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "starlette==1.10.0",
    "IPython==9.18.1",
    "traitlets==5.16.1",
    "Pygments==2.21.0",
    "openai==2.8.0",  # sglang pin
    "distro==1.9.0",
    "compressed-tensors==0.18.0",  # sglang pin
    "loguru==0.7.3",
    "gguf==0.19.0",
    "dill==0.4.1",
    "einops==0.8.2",
    "partial-json-parser==0.2.1.1.post7",
]
# Pure-Python distributions the box normally has (torch requires them) and
# the packed code needs at a minimum version: unpacked into ``fallback/``,
# which the runner puts first on the path only when the box's copy is too old
# for a packed distribution (pydantic 2.14.4 and pydantic_core 2.50.5 need typing_extensions >= 4.16).
FALLBACK = [
    "typing_extensions==4.16.0",
]
# Compiled wheels the check uses (or transformers requires at import).
COMPILED = [
    "numpy==2.4.6",
    "pydantic_core==2.50.5",  # pydantic's models, built at import
    "msgspec==0.22.0",  # SGLang's runtime context (SpawnRanks)
    "psutil==7.2.2",  # ServerArgs' memory checks
    "regex==2026.11.19",  # transformers, required at import
    "safetensors==0.8.0",  # transformers, required at import
    "PyYAML==6.0.4",  # transformers, required at import
    "tokenizers==0.23.2",  # transformers' gguf integration imports it
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
SGLANG_SKIP = ["sglang/multimodal_gen/*", "sglang/test/*", "*.so", "*/__pycache__/*"]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


class PackError(Exception):
    """One line for the user."""


def _pip_download(spec: str, dest: str, python: str | None) -> str:
    """The wheel of ``spec`` in ``dest`` (downloaded once); ``python`` = target for a compiled wheel."""
    name, version = spec.split("==")
    norm = re.sub(r"[-_.]+", "_", name).lower()
    tag = None if python is None else "cp" + python.replace(".", "")

    def cached():
        for path in glob.glob(os.path.join(dest, "*.whl")):
            base = os.path.basename(path)
            parts = base[:-4].split("-")
            if re.sub(r"[-_.]+", "_", parts[0]).lower() != norm or parts[1] != version:
                continue
            if tag is None and base.endswith("-none-any.whl"):
                return path
            if (
                tag is not None
                and "x86_64" in base
                and (
                    f"-{tag}-" in base
                    or ("abi3" in base and int(parts[-3][2:] or 0) <= int(tag[2:]))
                )
            ):
                return path
        return None

    found = cached()
    if found:
        return found
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        dest,
        spec,
    ]
    if tag is not None:
        cmd += [
            "--python-version",
            python,
            "--implementation",
            "cp",
            "--abi",
            tag,
            "--abi",
            "abi3",
            "--abi",
            "none",
        ]
        for p in PLATFORMS:
            cmd += ["--platform", p]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = cached()
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no wheel matched"])[-1]
        raise PackError(
            f"could not download {spec}{'' if tag is None else ' for ' + tag}: {last}"
        )
    return found


def _sglang_wheel(cache: str) -> str:
    found = sorted(glob.glob(os.path.join(cache, f"sglang-{SGLANG_VERSION}-*.whl")))
    if found:
        return found[0]
    os.makedirs(cache, exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "-q",
            "--no-deps",
            "-d",
            cache,
            f"sglang=={SGLANG_VERSION}",
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(glob.glob(os.path.join(cache, f"sglang-{SGLANG_VERSION}-*.whl")))
    if proc.returncode != 0 or not found:
        raise PackError(
            f"no sglang {SGLANG_VERSION} wheel in {cache} and pip could not download it"
        )
    return found[0]


def _extract(wheel: str, dest: str, skip=()) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir() or any(
                fnmatch.fnmatch(info.filename, pat) for pat in skip
            ):
                continue
            z.extract(info, dest)


def _series_patches():
    with open(os.path.join(REPO, "patches", "series")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.strip().startswith("#")]


def fetch(python: str, wheel_cache: str, sglang_cache: str) -> None:
    """Every wheel the archive takes, in the caches (downloaded once)."""
    _sglang_wheel(sglang_cache)
    os.makedirs(wheel_cache, exist_ok=True)
    for spec in PURE + FALLBACK:
        _pip_download(spec, wheel_cache, None)
    for spec in COMPILED:
        _pip_download(spec, wheel_cache, python)


def stage(work: str, python: str, wheel_cache: str, sglang_cache: str) -> dict:
    """Fill ``work`` with the archive's tree; return the manifest."""
    site = os.path.join(work, "site")
    os.makedirs(site)
    sglang_wheel = _sglang_wheel(sglang_cache)
    _extract(sglang_wheel, site, SGLANG_SKIP)
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "series.py"),
            "apply",
            "--target",
            site,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        last = (
            proc.stderr.strip().splitlines()
            or proc.stdout.strip().splitlines()
            or ["failed"]
        )[-1]
        raise PackError(
            f"the series does not apply to the sglang {SGLANG_VERSION} wheel: {last}"
        )
    fork = os.path.join(site, "sglang", ".fork-series")
    with open(os.path.join(fork, "stamp.json")) as f:
        stamp = json.load(f)
    for entry in os.listdir(fork):  # the upstream backups are not needed on the box
        if entry != "stamp.json":
            path = os.path.join(fork, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    os.makedirs(wheel_cache, exist_ok=True)
    for spec in PURE:
        _extract(_pip_download(spec, wheel_cache, None), site)
    fallback = os.path.join(work, "fallback")
    os.makedirs(fallback)
    for spec in FALLBACK:
        _extract(_pip_download(spec, wheel_cache, None), fallback)
    tag = "cp" + python.replace(".", "")
    compiled = os.path.join(work, f"site-{tag}")
    os.makedirs(compiled)
    for spec in COMPILED:
        _extract(_pip_download(spec, wheel_cache, python), compiled)

    for rel, source in SCRIPT_FILES.items():
        dest = os.path.join(work, "scripts", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(REPO, source), dest)
    runner = os.path.join(HERE, "run_gpu_check.py")
    shutil.copyfile(runner, os.path.join(work, "__main__.py"))
    shutil.copyfile(runner, os.path.join(work, "run_gpu_check.py"))

    manifest = dict(
        sglang=dict(
            version=SGLANG_VERSION,
            wheel=os.path.basename(sglang_wheel),
            skipped=SGLANG_SKIP,
        ),
        series=dict(hash=stamp.get("series_hash"), patches=stamp.get("patches")),
        pure=PURE,
        fallback=FALLBACK,
        compiled=COMPILED,
        compiled_python=tag,
        standins=STANDINS,
        scripts=list(SCRIPT_FILES),
    )
    with open(os.path.join(work, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def write_zip(work: str, out: str, max_mib: float) -> int:
    """Zip ``work`` into ``out`` via a temporary file; return its size."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=".pack-", suffix=".pyz", dir=os.path.dirname(os.path.abspath(out))
    )
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for dirpath, dirnames, filenames in os.walk(work):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith(".pyc"):
                        continue
                    path = os.path.join(dirpath, name)
                    z.write(path, os.path.relpath(path, work))
        size = os.path.getsize(tmp)
        if size > max_mib * 2**20:
            raise PackError(
                f"the archive would be {size / 2**20:.1f} MiB, over --max-mib {max_mib:g}"
            )
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
    if args.fetch_only:
        try:
            fetch(args.python, args.wheel_cache, args.sglang_cache)
        except PackError as e:
            print(f"pack_gpu_check.py: error: {e}", file=sys.stderr)
            return 2
        return 0
    work = tempfile.mkdtemp(prefix="pack-gpu-check-")
    try:
        manifest = stage(work, args.python, args.wheel_cache, args.sglang_cache)
        size = write_zip(work, args.out, args.max_mib)
    except PackError as e:
        print(f"pack_gpu_check.py: error: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    digest = hashlib.sha256(open(args.out, "rb").read()).hexdigest()
    print(
        f"wrote {args.out}: {size / 2**20:.1f} MiB, sha256 {digest[:16]}, series {manifest['series']['hash'][:12]} "
        f"({len(manifest['series']['patches'])} patches), compiled wheels for {manifest['compiled_python']}"
    )
    print(
        f'on the GPU box: timeout 280 python3 {os.path.basename(args.out)} --out "$OUT"  (docs/benchmarks.md)'
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
