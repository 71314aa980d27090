#!/usr/bin/env python
"""Lint the patch series the way SGLang's pre-commit lints a pull request.

    .venv/bin/python scripts/lint_series.py [-v] [--tree DIR --pristine DIR]
    .venv/bin/python scripts/lint_series.py --repo [--fix] [-v]   # make lint

prints one verdict line per Python file the series touches and exits 1 when
any fails. Without ``--tree``/``--pristine`` it builds (or reuses) the two
trees of ``cpu_support/server/sglang_trees.py``: the 0.5.23 wheel unpacked,
and a copy with the series applied.

What SGLang's ``.pre-commit-config.yaml`` runs on ``python/sglang/``, at its
pins (``requirements/lint.txt``; the script refuses other versions):

* black 24.10.0 with its defaults (line length 88);
* isort 5.13.2 with SGLang's ``.isort.cfg``: ``profile=black``,
  ``known_first_party=sglang``;
* ruff 0.11.7 with ``--select=F401,F821`` (unused imports, undefined names),
  ``__init__.py`` excluded.

Only what the series itself writes is judged, because some pristine 0.5.23
files already fail black 24.10 (``layers/attention/vision.py`` among them):

* a file the series creates must pass all three entirely;
* in a file it modifies, only its added lines count (a line of the patched
  file that the pristine file does not have at that place, by a line diff of
  the two): black and isort must leave every added line as it is (a line
  they would rewrite or delete, or a line they would insert right before or
  after, is a failure), and ruff may report nothing on an added line.

``-v`` adds one line per offending line (tool, line number, text).

``--repo`` lints this repository's own Python instead (every tracked ``.py``
file: the tools, ``cpu_support``, the demo, the benchmarks, the tests), each
file entirely, with the same three tools and settings. ``--fix`` first
rewrites those files with isort and black (ruff's findings stay to fix by
hand).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES = os.path.join(ROOT, "patches")
LINT_REQUIREMENTS = os.path.join(ROOT, "requirements", "lint.txt")

# SGLang's settings (.isort.cfg and the ruff hook's arguments).
ISORT_SETTINGS = {"profile": "black", "known_first_party": ["sglang"]}
RUFF_SELECT = "F401,F821"


def _reexec_in_venv() -> None:
    """Run under the project's .venv when black is not importable here."""
    try:
        import black  # noqa: F401
        import isort  # noqa: F401
    except ImportError:
        venv_python = os.path.join(ROOT, ".venv", "bin", "python")
        in_venv = os.path.realpath(sys.prefix) == os.path.realpath(
            os.path.join(ROOT, ".venv")
        )
        if not in_venv and os.path.exists(venv_python):
            os.execv(
                venv_python, [venv_python, os.path.abspath(__file__)] + sys.argv[1:]
            )
        sys.exit(
            "lint_series: black/isort are not installed; run `make setup` "
            "(it installs requirements/lint.txt into .venv)"
        )


def pinned_versions(path: str = LINT_REQUIREMENTS) -> Dict[str, str]:
    pins = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s#]+)", line)
            if m:
                pins[m.group(1).lower()] = m.group(2)
    return pins


def ruff_binary() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "ruff")
    return here if os.path.exists(here) else "ruff"


def check_versions() -> None:
    import black
    import isort

    pins = pinned_versions()
    ruff_out = subprocess.run(
        [ruff_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()
    found = {
        "black": black.__version__,
        "isort": isort.__version__,
        "ruff": ruff_out[-1],
    }
    wrong = [
        f"{k} {v} (pinned {pins.get(k)})" for k, v in found.items() if pins.get(k) != v
    ]
    if wrong:
        sys.exit(
            f"lint_series: not SGLang's linter versions: {', '.join(wrong)}; "
            f"install requirements/lint.txt"
        )


def series_files(
    patches_dir: str = PATCHES, python_only: bool = True, tests: bool = False
) -> List[str]:
    """Paths (``sglang/...``) of the (Python) files the series touches in the
    package, in first-touched order; with ``tests``, the paths
    (``test/...``) of the test files it carries instead. Patch paths are
    SGLang's repository paths (``python/sglang/...``, ``test/...``)."""
    with open(os.path.join(patches_dir, "series")) as f:
        names = [
            ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")
        ]
    seen: List[str] = []
    for name in names:
        with open(os.path.join(patches_dir, name)) as f:
            for line in f:
                m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line.rstrip("\n"))
                if not m or m.group(2).startswith("test/") != tests:
                    continue
                path = m.group(2).removeprefix("python/")
                if (path.endswith(".py") or not python_only) and path not in seen:
                    seen.append(path)
    return seen


def added_lines(pristine: Optional[Sequence[str]], patched: Sequence[str]) -> Set[int]:
    """1-based numbers of the patched file's lines that the series added."""
    if pristine is None:
        return set(range(1, len(patched) + 1))
    sm = difflib.SequenceMatcher(None, list(pristine), list(patched), autojunk=False)
    added: Set[int] = set()
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            added.update(range(j1 + 1, j2 + 1))
    return added


def touched_lines(original: Sequence[str], formatted: Sequence[str]) -> Set[int]:
    """1-based lines of ``original`` that a formatter changes: rewritten or
    deleted lines, and both neighbours of an insertion."""
    sm = difflib.SequenceMatcher(None, list(original), list(formatted), autojunk=False)
    touched: Set[int] = set()
    for tag, i1, i2, _j1, _j2 in sm.get_opcodes():
        if tag in ("replace", "delete"):
            touched.update(range(i1 + 1, i2 + 1))
        elif tag == "insert":
            touched.update(n for n in (i1, i1 + 1) if 1 <= n <= len(original))
    return touched


def black_format(source: str) -> str:
    import black

    return black.format_str(source, mode=black.Mode())


def isort_format(source: str) -> str:
    import isort

    with tempfile.TemporaryDirectory() as empty:
        # src_paths: an empty directory, so nothing but `sglang` is first party
        # whatever the current directory holds.
        config = isort.Config(src_paths=(empty,), **ISORT_SETTINGS)
        return isort.code(source, config=config)


def ruff_diagnostics(source: str, path: str) -> List[Tuple[int, str, str]]:
    """(line, code, message) for each ruff diagnostic of SGLang's selection."""
    proc = subprocess.run(
        [
            ruff_binary(),
            "check",
            "--isolated",
            "--no-cache",
            f"--select={RUFF_SELECT}",
            "--output-format=json",
            "--stdin-filename",
            path,
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed on {path}: {proc.stderr.strip()}")
    return [
        (d["location"]["row"], d["code"], d["message"])
        for d in json.loads(proc.stdout or "[]")
    ]


@dataclass
class Finding:
    tool: str
    line: int
    detail: str = ""


@dataclass
class FileVerdict:
    path: str
    new: bool
    added: int
    findings: List[Finding] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.findings and not self.error


def _ranges(numbers: Sequence[int]) -> str:
    out, run = [], []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
        else:
            if run:
                out.append(f"L{run[0]}" if len(run) == 1 else f"L{run[0]}-{run[-1]}")
            run = [n]
    if run:
        out.append(f"L{run[0]}" if len(run) == 1 else f"L{run[0]}-{run[-1]}")
    return ",".join(out)


def lint_file(rel: str, pristine_root: str, tree_root: str) -> FileVerdict:
    with open(os.path.join(tree_root, rel), encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    pristine_path = os.path.join(pristine_root, rel)
    pristine = None
    if os.path.exists(pristine_path):
        with open(pristine_path, encoding="utf-8") as f:
            pristine = f.read().splitlines()
    added = added_lines(pristine, lines)
    verdict = FileVerdict(rel, new=pristine is None, added=len(added))
    if not added:
        return verdict
    for tool, fmt in (("black", black_format), ("isort", isort_format)):
        try:
            formatted = fmt(source)
        except Exception as e:  # black.InvalidInput: the file does not parse
            verdict.error = f"{tool} cannot format it: {e}"
            return verdict
        for n in sorted(touched_lines(lines, formatted.splitlines()) & added):
            verdict.findings.append(Finding(tool, n))
    if os.path.basename(rel) != "__init__.py":  # SGLang's ruff hook skips them
        for n, code, message in ruff_diagnostics(source, rel):
            if n in added:
                verdict.findings.append(Finding("ruff", n, f"{code} {message}"))
    return verdict


def render(
    verdict: FileVerdict, lines: Sequence[str], verbose: bool, kind: str = ""
) -> List[str]:
    kind = kind or (
        "new file" if verdict.new else f"modified, {verdict.added} added lines"
    )
    if verdict.error:
        return [f"FAIL  {verdict.path} ({kind}): {verdict.error}"]
    if verdict.ok:
        what = (
            "black, isort, ruff clean"
            if verdict.new
            else "added lines pass black, isort, ruff"
        )
        return [f"ok    {verdict.path} ({kind}): {what}"]
    parts = []
    for tool in ("black", "isort", "ruff"):
        hits = [f for f in verdict.findings if f.tool == tool]
        if hits:
            codes = sorted({f.detail.split()[0] for f in hits if f.detail})
            parts.append(
                f"{tool}{' ' + '/'.join(codes) if codes else ''} {_ranges([f.line for f in hits])}"
            )
    out = [f"FAIL  {verdict.path} ({kind}): {'; '.join(parts)}"]
    if verbose:
        for f in verdict.findings:
            text = lines[f.line - 1] if 0 < f.line <= len(lines) else ""
            note = f"  [{f.detail}]" if f.detail else ""
            out.append(f"      {f.tool:5} L{f.line}: {text}{note}")
    return out


def lint_series(
    pristine_root: str, tree_root: str, files: Sequence[str]
) -> List[FileVerdict]:
    return [lint_file(rel, pristine_root, tree_root) for rel in files]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tree",
        help="directory holding the patched sglang package (default: the series tree)",
    )
    p.add_argument(
        "--pristine",
        help="directory holding the pristine sglang package (default: the 0.5.23 wheel's)",
    )
    p.add_argument(
        "--patches",
        default=PATCHES,
        help="patches directory whose series names the files",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="one line per offending line"
    )
    p.add_argument(
        "--repo",
        action="store_true",
        help="lint this repository's own Python files, each entirely",
    )
    p.add_argument(
        "--fix",
        action="store_true",
        help="with --repo: rewrite the files with isort and black first",
    )
    args = p.parse_args(argv)
    if args.fix and not args.repo:
        p.error("--fix goes with --repo (the series is fixed in its patches)")
    _reexec_in_venv()
    check_versions()
    if args.repo:
        return lint_repo(repo_files(), fix=args.fix, verbose=args.verbose)
    if bool(args.tree) != bool(args.pristine):
        p.error("give both --tree and --pristine, or neither")
    with tempfile.TemporaryDirectory(prefix="lint-series-") as work:
        if args.tree:
            tree, pristine = args.tree, args.pristine
        else:
            pristine, tree = build_trees(work, args.patches)
        failed = report(pristine, tree, series_files(args.patches), args.verbose)
        if not args.tree:
            # The tests the patches carry, each a new file, judged entirely.
            tests = series_files(args.patches, tests=True)
            failed |= lint_repo(
                tests,
                root=os.path.dirname(tree),
                verbose=args.verbose,
                what="the patches carry as tests",
            )
        return failed


def build_trees(
    work: str, patches_dir: str = PATCHES, version: str = "0.5.23"
) -> Tuple[str, str]:
    """A pristine and a patched tree holding only what the series touches.

    The files come from the release wheel (``sglang_trees.find_wheel``); the
    patched copy gets ``series.py apply``. Private to the caller's directory,
    so a concurrent rebuild of the shared ``.cache/trees`` cannot race it.
    """
    import shutil
    import zipfile

    sys.path.insert(0, ROOT)
    from cpu_support.server import sglang_trees

    pristine, repo = os.path.join(work, "pristine"), os.path.join(work, "series")
    tree = os.path.join(repo, "python")  # a repository root takes the tests too
    wanted = set(series_files(patches_dir, python_only=False))
    wanted |= {"sglang/version.py", "sglang/_version.py"}
    with zipfile.ZipFile(sglang_trees.find_wheel(version)) as z:
        for name in z.namelist():
            if name in wanted or re.match(r"^sglang-[^/]+\.dist-info/METADATA$", name):
                z.extract(name, pristine)
    shutil.copytree(pristine, tree)
    os.makedirs(os.path.join(repo, "test"))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "series.py"),
            "--series-dir",
            patches_dir,
            "apply",
            "--target",
            repo,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(
            f"lint_series: series.py apply failed: {(proc.stdout + proc.stderr).strip()}"
        )
    return pristine, tree


def repo_files(root: str = ROOT) -> List[str]:
    """The repository's tracked Python files, relative to ``root``."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(
        p
        for p in proc.stdout.split("\0")
        if p and os.path.isfile(os.path.join(root, p))
    )


def lint_repo(
    files: Sequence[str],
    root: str = ROOT,
    fix: bool = False,
    verbose: bool = False,
    what: str = "of the repository",
) -> int:
    """Each file judged entirely, as a file the series creates is."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lint-repo-") as nothing:
        for rel in files:
            path = os.path.join(root, rel)
            if fix:
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                fixed = black_format(isort_format(source))
                if fixed != source:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(fixed)
            verdict = lint_file(rel, nothing, root)
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            if verbose or not verdict.ok:
                for line in render(verdict, lines, verbose, kind="whole file"):
                    print(line)
            failed += not verdict.ok
    print(
        f"{'FAILED' if failed else 'ok'}: {failed} of {len(files)} file(s) {what} fail SGLang's lint "
        f"(black 24.10.0, isort 5.13.2 profile black, ruff 0.11.7 {RUFF_SELECT})"
    )
    return 1 if failed else 0


def report(pristine: str, tree: str, files: Sequence[str], verbose: bool) -> int:
    failed = 0
    for rel in files:
        if not os.path.exists(os.path.join(tree, rel)):
            print(f"FAIL  {rel}: not in {tree}")
            failed += 1
            continue
        verdict = lint_file(rel, pristine, tree)
        with open(os.path.join(tree, rel), encoding="utf-8") as f:
            lines = f.read().splitlines()
        for line in render(verdict, lines, verbose):
            print(line)
        failed += not verdict.ok
    print(
        f"{'FAILED' if failed else 'ok'}: {failed} file(s) fail SGLang's lint "
        f"(black 24.10.0, isort 5.13.2 profile black, ruff 0.11.7 {RUFF_SELECT})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
