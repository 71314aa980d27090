#!/usr/bin/env python
"""Lint the patch series the way SGLang's pre-commit lints a pull request.

    .venv/bin/python scripts/lint_series.py [-v] [--tree DIR --pristine DIR] [--only FILE ...]
    .venv/bin/python scripts/lint_series.py --repo [--fix] [-v]   # make lint

prints one verdict line per Python file the series touches and exits 1 when
any fails. Without ``--tree``/``--pristine`` the trees are the 0.5.23 wheel's
files and a copy with ``series.py apply`` (``build_trees``); the test files
the patches carry are judged too.

The files go into a throwaway git repository: the pristine ones committed,
the patched ones over them in the working tree. There it runs SGLang's
pre-commit linters at its pins, through darker and graylint (all five at the
versions ``requirements/lint.txt`` pins; the script refuses others), on what
the series changes only, because some pristine files already fail them
(``layers/attention/vision.py`` fails black 24.10):

* ``darker --check --diff --revision HEAD``: black 24.10.0 with its defaults
  (line length 88) on the regions the series changed;
* ``graylint --revision HEAD``: the findings the pristine file does not have
  on the same line, of ruff 0.11.7 ``--select=F401,F821`` (``__init__.py``
  skipped) and of isort 5.13.2 with SGLang's ``.isort.cfg`` (``profile=black``,
  ``known_first_party=sglang``), one finding per line it would change
  (``--isort-lines``). Not darker's isort: once the span of a file's edits
  overlaps the span of isort's changes, it re-sorts the whole file, SGLang's
  own imports included.

A file the series creates is judged entirely. ``-v`` adds one line per
finding (tool, line number, text).

``--repo`` lints this repository's own tracked Python files instead, each
entirely, with the black, isort and ruff CLIs and the same settings. ``--fix``
first rewrites them with isort and black (ruff's findings stay to fix by hand).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES = os.path.join(ROOT, "patches")
LINT_REQUIREMENTS = os.path.join(ROOT, "requirements", "lint.txt")

# SGLang's settings (.isort.cfg and the ruff hook's arguments).
ISORT_SETTINGS = {"profile": "black", "known_first_party": ["sglang"]}
RUFF_SELECT = "F401,F821"
RUFF_CHECK = ["check", "--isolated", "--no-cache", f"--select={RUFF_SELECT}"]
GUARDED = ("black", "isort", "ruff", "darker", "graylint")


def _reexec_in_venv() -> None:
    """Run under the project's .venv when the linters are not importable here."""
    try:
        import black  # noqa: F401
        import darker  # noqa: F401
        import graylint  # noqa: F401
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
            "lint_series: black/isort/darker/graylint are not installed; run "
            "`make setup` (it installs requirements/lint.txt into .venv)"
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


def check_versions(path: str = LINT_REQUIREMENTS) -> None:
    from importlib.metadata import version

    pins = pinned_versions(path)
    found = {name: version(name) for name in GUARDED if name != "ruff"}
    found["ruff"] = subprocess.run(
        [ruff_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    wrong = [
        f"{k} {found[k]} (pinned {pins.get(k)})"
        for k in GUARDED
        if pins.get(k) != found[k]
    ]
    if wrong:
        sys.exit(
            f"lint_series: not the pinned linter versions: {', '.join(wrong)}; "
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


def isort_lines(paths: Sequence[str]) -> int:
    """isort as a line linter for graylint: ``PATH:N: isort would change this
    line`` for each line isort rewrites or deletes, or inserts a line after."""
    import isort

    with tempfile.TemporaryDirectory() as empty:
        # src_paths: an empty directory, so nothing but `sglang` is first party
        # whatever the current directory holds.
        config = isort.Config(src_paths=(empty,), **ISORT_SETTINGS)
        for path in paths:
            if not os.path.isfile(path):  # graylint's baseline lacks new files
                continue
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines(keepends=True)
            fixed = isort.code("".join(lines), config=config).splitlines(True)
            sm = difflib.SequenceMatcher(None, lines, fixed, autojunk=False)
            for tag, i1, i2, _j1, _j2 in sm.get_opcodes():
                for n in range(i1 + 1, i2 + 1) if tag != "insert" else [i1]:
                    if tag != "equal":
                        print(f"{path}:{max(n, 1)}: isort would change this line")
    return 0


def darker_lines(diff: str) -> List[Tuple[str, int]]:
    """(path, line) of each line of the checked files that darker's diff
    rewrites or deletes, or inserts a line after."""
    hits: List[Tuple[str, int]] = []
    path, old, old_left, new_left, prev = "", 0, 0, 0, " "
    for line in diff.splitlines():
        if old_left or new_left:
            tag = line[:1]
            if tag == "-":
                hits.append((path, old))
            elif tag == "+" and prev == " ":
                hits.append((path, max(old - 1, 1)))
            old += tag != "+"
            old_left -= tag != "+"
            new_left -= tag != "-"
            prev = tag
        elif line.startswith("--- "):
            path = line[4:].split("\t")[0]
        else:
            m = re.match(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@", line)
            if m:
                old, prev = int(m.group(1)), " "
                old_left, new_left = int(m.group(2) or 1), int(m.group(3) or 1)
    return sorted(set(hits))


@dataclass
class Finding:
    tool: str
    line: int
    detail: str = ""


def _run(cmd: Sequence[str], cwd: str, ok=(0, 1)) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode not in ok:
        err = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        why = err[-1][:200] if err else f"exit status {proc.returncode}"
        sys.exit(f"lint_series: {shlex.join(cmd[:4])} failed: {why}")
    return proc


def lint_changes(
    pairs: Dict[str, Tuple[Optional[str], str]], work: str
) -> Dict[str, List[Finding]]:
    """Findings on what changes from each ``pairs[rel][0]`` (pristine file, or
    None for a new one) to ``pairs[rel][1]``, keyed by ``rel``."""
    repo = tempfile.mkdtemp(prefix="repo-", dir=work)
    git = ["git", "-c", "user.name=lint", "-c", "user.email=lint@localhost"]
    for side in (0, 1):
        for rel, files in pairs.items():
            if files[side]:
                os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
                shutil.copyfile(files[side], os.path.join(repo, rel))
        if side == 0:
            _run(git + ["init", "-q"], repo, ok=(0,))
            _run(git + ["add", "-A"], repo, ok=(0,))
            _run(git + ["commit", "-q", "--allow-empty", "-m", "pristine"], repo, (0,))
    rels = sorted(pairs)
    found: Dict[str, List[Finding]] = {rel: [] for rel in rels}
    darker = [sys.executable, "-m", "darker", "--check", "--diff", "-r", "HEAD"]
    # darker names a file relative to the deepest directory holding them all
    top = os.path.commonpath([os.path.dirname(os.path.join(repo, r)) for r in rels])
    for path, n in darker_lines(_run(darker + rels, repo).stdout):
        found[os.path.relpath(os.path.join(top, path), repo)].append(
            Finding("black", n)
        )
    ruff = shlex.join([ruff_binary(), *RUFF_CHECK, "--output-format=concise"])
    isort = shlex.join([sys.executable, os.path.abspath(__file__), "--isort-lines"])
    gray = [sys.executable, "-m", "graylint", "-r", "HEAD", "-L", ruff, "-L", isort]
    for line in _run(gray + rels, repo).stdout.splitlines():
        m = re.match(r"^(.+?):(\d+):(?:\d+:)? (.*) \[(.+)\]$", line)
        if not m or m.group(1) not in found:
            continue
        if m.group(4).endswith("ruff"):
            if os.path.basename(m.group(1)) != "__init__.py":  # SGLang skips them
                found[m.group(1)].append(Finding("ruff", int(m.group(2)), m.group(3)))
        else:
            found[m.group(1)].append(Finding("isort", int(m.group(2))))
    for hits in found.values():
        hits.sort(key=lambda f: (f.line, f.tool))
    return found


def render(
    rel: str, kind: str, findings: List[Finding], lines: Sequence[str], verbose: bool
) -> List[str]:
    if not findings:
        return [f"ok    {rel} ({kind}): black, isort, ruff report nothing on it"]
    what = [f"{f.tool} L{f.line} {f.detail[:4]}".rstrip() for f in findings]
    out = [f"FAIL  {rel} ({kind}): {'; '.join(what)}"]
    for f in findings if verbose else []:
        text = lines[f.line - 1] if 0 < f.line <= len(lines) else ""
        note = f"  [{f.detail}]" if f.detail else ""
        out.append(f"      {f.tool:5} L{f.line}: {text}{note}")
    return out


def versions_note() -> str:
    pins = pinned_versions()
    return (
        f"black {pins.get('black')}, isort {pins.get('isort')} profile black, "
        f"ruff {pins.get('ruff')} {RUFF_SELECT}"
    )


def report(
    pairs: Dict[str, Tuple[Optional[str], str]], work: str, verbose: bool, missing=0
) -> int:
    findings = lint_changes(pairs, work)
    failed = missing
    for rel, (pristine, patched) in pairs.items():
        with open(patched, encoding="utf-8") as f:
            lines = f.read().splitlines()
        kind = "modified" if pristine else "new file"
        print("\n".join(render(rel, kind, findings[rel], lines, verbose)))
        failed += bool(findings[rel])
    print(
        f"{'FAILED' if failed else 'ok'}: {failed} of {len(pairs) + missing} file(s) "
        f"fail SGLang's lint on the series' changes ({versions_note()})"
    )
    return 1 if failed else 0


def build_trees(
    work: str, patches_dir: str = PATCHES, version: str = "0.5.23"
) -> Tuple[str, str]:
    """A pristine and a patched tree holding only what the series touches.

    The files come from the release wheel (``sglang_trees.find_wheel``); the
    patched copy gets ``series.py apply``. Private to the caller's directory,
    so a concurrent rebuild of the shared ``.cache/trees`` cannot race it.
    """
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
    series = [sys.executable, os.path.join(ROOT, "scripts", "series.py")]
    proc = subprocess.run(
        series + ["--series-dir", patches_dir, "apply", "--target", repo],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(
            f"lint_series: series.py apply failed: {(proc.stdout + proc.stderr).strip()}"
        )
    return pristine, tree


def series_pairs(
    pristine: str, tree: str, patches_dir: str, tests: bool
) -> Tuple[Dict[str, Tuple[Optional[str], str]], List[str]]:
    """``lint_changes``' pairs for the series' Python files (and, with
    ``tests``, the test files the patches carry, new files in the repository
    root above ``tree``), and the files missing from ``tree``."""
    pairs: Dict[str, Tuple[Optional[str], str]] = {}
    missing = []
    for rel in series_files(patches_dir):
        old, new = os.path.join(pristine, rel), os.path.join(tree, rel)
        if not os.path.isfile(new):
            missing.append(rel)
            continue
        pairs[rel] = (old if os.path.isfile(old) else None, new)
    for rel in series_files(patches_dir, tests=True) if tests else []:
        pairs[rel] = (None, os.path.join(os.path.dirname(tree), rel))
    return pairs, missing


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
    files: Sequence[str], root: str = ROOT, fix: bool = False, verbose: bool = False
) -> int:
    """Each file judged entirely by the linters' own CLIs; prints their
    findings and one summary line."""
    with tempfile.TemporaryDirectory(prefix="lint-repo-") as empty:
        # No configuration but SGLang's: an empty black config, and isort's
        # settings path empty, so nothing but `sglang` is first party.
        open(os.path.join(empty, "pyproject.toml"), "w").close()
        black = [sys.executable, "-m", "black", "--config", f"{empty}/pyproject.toml"]
        isort = [sys.executable, "-m", "isort", "--settings-path", empty]
        isort += ["--src", empty, "--profile", "black", "-p", "sglang"]
        if fix:
            _run(isort + ["-q", *files], root, ok=(0,))
            _run(black + ["-q", *files], root, ok=(0,))
        diff = ["--diff"] if verbose else []
        bad = set()
        out = _run(black + ["--check", *diff, *files], root)
        print(out.stdout, end="")
        for line in out.stderr.splitlines():
            if line.startswith("would reformat "):
                print(line)
                bad.add(os.path.relpath(line.split(" ", 2)[2], root))
        out = _run(isort + ["--check-only", *diff, *files], root)
        print(out.stdout, end="")
        for line in out.stderr.splitlines():
            m = re.match(r"^ERROR: (\S+) Imports are incorrectly sorted", line)
            if m:
                print(line)
                bad.add(os.path.relpath(m.group(1), root))
        ruff = [ruff_binary(), *RUFF_CHECK, "--output-format=concise"]
        checked = [f for f in files if os.path.basename(f) != "__init__.py"]
        for line in _run(ruff + checked, root).stdout.splitlines():
            m = re.match(r"^(.+?):\d+:\d+: ", line)
            if m:
                print(line)
                bad.add(os.path.relpath(m.group(1), root))
    print(
        f"{'FAILED' if bad else 'ok'}: {len(bad)} of {len(files)} file(s) of the "
        f"repository fail SGLang's lint ({versions_note()})"
    )
    return 1 if bad else 0


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
    p.add_argument("-v", "--verbose", action="store_true", help="one line per finding")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="FILE",
        help="judge only these of the series' files (paths as the verdicts name them)",
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
    # graylint's isort linter (see isort_lines)
    p.add_argument("--isort-lines", nargs="*", metavar="FILE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.isort_lines is not None:
        return isort_lines(args.isort_lines)
    if args.fix and not args.repo:
        p.error("--fix goes with --repo (the series is fixed in its patches)")
    if bool(args.tree) != bool(args.pristine):
        p.error("give both --tree and --pristine, or neither")
    _reexec_in_venv()
    check_versions()
    if args.repo:
        return lint_repo(repo_files(), fix=args.fix, verbose=args.verbose)
    with tempfile.TemporaryDirectory(prefix="lint-series-") as work:
        if args.tree:
            pristine, tree = args.pristine, args.tree
        else:
            pristine, tree = build_trees(work, args.patches)
        pairs, missing = series_pairs(pristine, tree, args.patches, not args.tree)
        if args.only:
            unknown = sorted(set(args.only) - set(pairs) - set(missing))
            if unknown:
                sys.exit(f"lint_series: not a file of the series: {', '.join(unknown)}")
            pairs = {rel: pairs[rel] for rel in args.only if rel in pairs}
            missing = [rel for rel in missing if rel in args.only]
        for rel in missing:
            print(f"FAIL  {rel}: not in {tree}")
        return report(pairs, work, args.verbose, missing=len(missing))


if __name__ == "__main__":
    sys.exit(main())
