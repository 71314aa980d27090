"""``--target`` trees of SGLang 0.5.23: pristine, series and the series' repository.

    python cpu_support/server/sglang_trees.py [--root .cache/trees]

prints the three directories. A tree is a folder holding the ``sglang``
package (and its dist-info); putting it first on ``PYTHONPATH`` makes any
Python with the right dependencies import that sglang instead of its own.

* pristine: the release wheel unpacked (from ``.cache/wheels``, which
  ``make setup`` fills, or downloaded with ``pip download --no-deps`` by
  ``find_wheel``, the one function that fetches a release wheel: ``--wheel
  VERSION`` prints its path);
* series: a copy of pristine with ``scripts/series.py apply`` run on it;
* series repository: SGLang's repository layout (``python/`` = a copy of
  pristine, and ``test/``) with the series applied, so it holds the tests the
  patches carry under ``test/registered/`` (``pytest.ini`` collects them).
The last two are rebuilt when the series' hash changes.

Both are byte-compiled when built, as pip compiles an installed package.

Each tree is built under a lock file beside it, filled in a temporary folder
and renamed into place, so processes that need the same tree at once build it
once and never see it half-made.
"""

from __future__ import annotations

import argparse
import compileall
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Sequence

# The repository root (this file is in cpu_support/server/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERIES_PY = os.path.join(ROOT, "scripts", "series.py")
DEFAULT_TREES = os.path.join(ROOT, ".cache", "trees")
WHEEL_DIRS = (os.path.join(ROOT, ".cache", "wheels"), "/tmp/sg")


class TreeError(RuntimeError):
    pass


def find_wheel(version: str = "0.5.23", dirs: Sequence[str] = WHEEL_DIRS) -> str:
    """The sglang ``version`` release wheel: the first found in ``dirs``, else
    downloaded once into ``dirs[0]`` (``pip download --no-deps``). The one
    function that fetches it (``python sglang_trees.py --wheel VERSION`` from
    a shell); raises ``TreeError`` with one line when pip cannot get it."""
    pattern = f"sglang-{version}-*.whl"
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, pattern)))
        if hits:
            return hits[0]
    dest = dirs[0]
    os.makedirs(dest, exist_ok=True)
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
            dest,
            f"sglang=={version}",
        ],
        capture_output=True,
        text=True,
    )
    hits = sorted(glob.glob(os.path.join(dest, pattern)))
    if proc.returncode != 0 or not hits:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise TreeError(
            f"no sglang {version} wheel in {', '.join(dirs)} and pip could not "
            f"download it: {last}"
        )
    return hits[0]


def _build(dest: str, fill, keep=lambda path: False) -> None:
    """Make ``dest`` with ``fill(tmp)`` in a fresh temporary folder beside it,
    then rename it into place. Several processes (test workers, parallel runs) may build
    the same tree at once: each fills its own folder, and when ``dest``
    appeared meanwhile and ``keep(dest)`` says it is good, that one stays."""
    # One builder at a time (test workers, parallel runs); a later one finds the
    # tree made and keeps it.
    with open(dest + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(dest) and keep(dest):
            return
        _build_unlocked(dest, fill, keep)


def _build_unlocked(dest: str, fill, keep) -> None:
    tmp = tempfile.mkdtemp(
        prefix=os.path.basename(dest) + ".tmp-", dir=os.path.dirname(dest)
    )
    try:
        fill(tmp)
        if os.path.isdir(dest) and not keep(dest):
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (os.path.isdir(dest) and keep(dest)):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _byte_compile(tree: str) -> None:
    """Compile the tree's sources once, as pip does for an installed package,
    so that no server or probe that imports from it pays for it."""
    compileall.compile_dir(os.path.join(tree, "sglang"), quiet=1, workers=0)


def _unpack(wheel: str, dest: str) -> None:
    def fill(tmp):
        with zipfile.ZipFile(wheel) as z:
            members = [
                m
                for m in z.namelist()
                if m.startswith("sglang/") or m.split("/")[0].endswith(".dist-info")
            ]
            z.extractall(tmp, members)
        _byte_compile(tmp)

    _build(
        dest,
        fill,
        keep=lambda d: os.path.isfile(os.path.join(d, "sglang", "version.py")),
    )


def series_status(target: str) -> dict:
    """``series.py status --json --target TARGET`` as a dict."""
    if not os.path.isfile(SERIES_PY):
        raise TreeError(f"{SERIES_PY} is missing")
    out = subprocess.run(
        [sys.executable, SERIES_PY, "status", "--json", "--target", target],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def _carries_current_series(path: str) -> bool:
    try:
        st = series_status(path)
    except (subprocess.CalledProcessError, ValueError):
        return False
    return bool(st.get("applied") and st.get("current"))


def pristine_tree(root: str = DEFAULT_TREES, version: str = "0.5.23") -> str:
    dest = os.path.join(root, f"sglang-{version}-pristine")
    if not os.path.isfile(os.path.join(dest, "sglang", "version.py")):
        os.makedirs(root, exist_ok=True)
        _unpack(find_wheel(version), dest)
    return dest


def _series_copy(dest: str, pristine: str, version: str, repository: bool) -> str:
    """``dest``: a copy of ``pristine`` with the series applied, as a package
    folder, or as a repository root (``python/`` and ``test/``) that takes the
    series' tests too; kept while it carries the current series."""
    if os.path.isdir(dest) and _carries_current_series(dest):
        return dest

    def fill(tmp):
        if repository:
            shutil.copytree(pristine, os.path.join(tmp, "python"), symlinks=True)
            os.makedirs(os.path.join(tmp, "test"))  # what makes it a repository root
        else:
            shutil.copytree(pristine, tmp, symlinks=True, dirs_exist_ok=True)
        proc = subprocess.run(
            [sys.executable, SERIES_PY, "apply", "--target", tmp],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise TreeError(
                f"series.py apply failed on a pristine {version} tree: "
                f"{(proc.stdout + proc.stderr).strip()}"
            )
        if not repository:
            _byte_compile(tmp)  # the patched and new files; the rest came compiled

    _build(dest, fill, keep=_carries_current_series)
    return dest


def series_tree(root: str = DEFAULT_TREES, version: str = "0.5.23") -> str:
    dest = os.path.join(root, f"sglang-{version}-series")
    return _series_copy(dest, pristine_tree(root, version), version, repository=False)


def series_repo_tree(root: str = DEFAULT_TREES, version: str = "0.5.23") -> str:
    dest = os.path.join(root, f"sglang-{version}-series-repo")
    return _series_copy(dest, pristine_tree(root, version), version, repository=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Make the pristine and series sglang trees")
    p.add_argument("--root", default=DEFAULT_TREES)
    p.add_argument(
        "--wheel",
        action="append",
        metavar="VERSION",
        help="only print the path of the sglang VERSION release wheel, downloaded "
        f"into {WHEEL_DIRS[0]} when no folder of {', '.join(WHEEL_DIRS)} has it; "
        "repeatable",
    )
    a = p.parse_args(argv)
    try:
        if a.wheel:
            for version in a.wheel:
                print(find_wheel(version))
            return 0
        print(pristine_tree(a.root))
        print(series_tree(a.root))
        print(series_repo_tree(a.root))
    except (TreeError, subprocess.CalledProcessError) as e:
        print(f"sglang_trees: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
