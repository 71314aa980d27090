#!/usr/bin/env python3
"""Apply, check, revert and maintain the fork's patch series over SGLang.

The fork is not a copy of SGLang. It is a *patch series* over a pinned PyPI
release of the ``sglang`` package, and nothing else:

* ``patches/series`` lists the patch files in the order they apply (one name a
  line; blank lines and ``#`` comments are ignored).
* ``patches/<subject-slug>.patch`` are ``git format-patch`` files with
  SGLang's repository paths: ``a/python/sglang/...`` for code and
  ``a/test/...`` for tests, so ``git am`` applies them to an SGLang checkout.
  A patch with any other path is refused.
* A new module is created (``new file mode``) by the patch that first uses
  it, so every commit of ``import`` is a complete change.

The series hash is a sha256 over the series file and every patch's name and
bytes; ``apply`` records it in a stamp.

Targets (``--target DIR``; the tool tells which one it was given)

  package     DIR holds ``sglang/`` (site-packages, or ``python/`` of a
              checkout such as ``/sgl-workspace/sglang/python``): code only;
              the series' test files are not applied there.
  repository  DIR is an SGLang repository root: ``python/sglang/`` and a
              ``test/`` tree beside it; code goes under ``python/``, tests
              under ``test/``.
  The stamp and backups live in ``sglang/.fork-series/`` of the package
  (``python/sglang/.fork-series/`` of a repository root).

Subcommands (check and apply feed the patches, concatenated in ``series``
order, to ONE ``git apply``: all or nothing; ``-p2 --include='sglang/*'``
where DIR holds ``sglang/``, so test files stay out)

  check    ``git apply --check`` on the target (where a series is applied,
           on a temporary copy of its upstream files); exit 0 when the whole
           series applies, else exit 1 with one line per patch git named an
           error in, in git's words (``patch failed: FILE:LINE``); a patch
           that builds on a failing one fails too. Refuses (one line, exit
           2, nothing written) an sglang version that is not a supported
           base; ``--force`` skips only that, to check a new release.
  apply    atomic and idempotent: after that check, byte-exact backups of
           every touched file and ``stamp.json`` go to the package's
           ``.fork-series.partial/``, ``git apply`` writes the target, and
           the directory is renamed ``.fork-series/``. A failure while
           writing restores the backups and removes what the series added.
           Applying the same series again prints "already applied".
           Refuses a target that is neither layout, an sglang version that
           is not a supported base (``--force`` overrides only this check),
           and a target where a different series is applied.
  revert   restores the upstream files byte-identically from the backups,
           removes the files the series created and the stamp ("not
           applied" when nothing is).
  status   the sglang version, whether a series is applied (the current one
           or a different one) and which patches; ``--json`` for scripts.

The developer's loop (modelled on Electron's git-import-patches /
git-export-patches)

  import   turn a pristine tree (a directory holding ``sglang/``, which
           moves to ``python/sglang/``, or a repository root) into a git
           repository in SGLang's layout: one commit with the pristine
           ``python/sglang/`` and ``test/`` (tag ``upstream-<version>``,
           branch ``upstream``), then one commit per patch (``git am
           --3way --keep-non-patch``: subjects keep tags like [AMD][VLM]).
  (edit)   ordinary git in that repository: ``git commit --fixup=<sha>``,
           ``git rebase -i --autosquash upstream``, new commits for new
           patches (a new file goes into the commit that first uses it).
  export   write ``upstream..HEAD`` back as patch files with repository
           paths (one per commit, name = slug of the subject, new files
           included) and rewrite ``series`` in commit order.
  rebase   commit a new release's pristine ``sglang/`` as the new upstream
           and ``git rebase --onto`` it (3-way); a conflict stops with the
           patch and files named; resolve, ``git rebase --continue``, export,
           then ``check --force`` against a pristine tree of the new release
           (``--force`` until it is added to ``SUPPORTED_BASES``).

Errors are one line on stderr, prefixed ``series.py: error:``, with a
non-zero exit (2; ``check`` uses 1 for "does not apply"). Nothing is left
half-done: the target is only written after the series was checked against
it, and a failure while writing rolls it back. Python 3.11, standard library
only; git must be on PATH.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SERIES_DIR = REPO / "patches"
SUPPORTED_BASES = ("0.5.23",)

PKG = "sglang"
CODE = "python"  # the repository folder that holds the package
TESTS = "test"  # the repository's test tree
LAYOUT_PACKAGE = "package"  # a directory holding sglang/
LAYOUT_REPO = "repository"  # a repository root: python/sglang/ and test/
STAMP_DIR = ".fork-series"  # <package dir>/.fork-series/
PARTIAL_DIR = ".fork-series.partial"  # exists only while apply copies back
STAMP_FILE = "stamp.json"
ORIGINALS = "originals"
STAMP_FORMAT = 1

WORK_BRANCH = "fork"
UPSTREAM_BRANCH = "upstream"
UPSTREAM_IDENT = ("sglang upstream", "upstream@sglang.invalid")
FALLBACK_IDENT = ("series.py", "series.py@localhost")

# Only for the test suite: fail after git apply wrote the target, to prove
# that a failure while writing rolls the target back.
_FAULT_ENV = "SERIES_PY_TEST_FAIL_AFTER_APPLY"

EXIT_ERROR = 2
EXIT_CHECK_FAILED = 1


class SeriesError(Exception):
    """A one-line, user-facing error."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------
# git plumbing
# --------------------------------------------------------------------------

_GIT_REPO_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_PREFIX",
    "GIT_NAMESPACE",
)


def _git_env(isolated: bool = False, ceiling: Path | None = None, **extra) -> dict:
    env = dict(os.environ)
    for var in _GIT_REPO_VARS:
        env.pop(var, None)
    env["LC_ALL"] = "C"
    env["LANGUAGE"] = "C"
    env["GIT_TERMINAL_PROMPT"] = "0"
    if isolated:
        # No user/system config: output must not depend on the developer's
        # apply.whitespace, diff.algorithm, format.* settings.
        env["GIT_CONFIG_NOSYSTEM"] = "1"
        env["GIT_CONFIG_GLOBAL"] = os.devnull
    if ceiling is not None:
        # Never discover an enclosing repository (the target or the temp dir
        # may live inside a git checkout): git apply then acts as a plain
        # patch tool relative to its working directory.
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _git(
    args, cwd, env=None, check=True, input_bytes=None
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=str(cwd),
            env=env if env is not None else _git_env(),
            input=input_bytes,
            capture_output=True,
        )
    except FileNotFoundError:
        raise SeriesError(
            "git not found on PATH (the tool drives git apply/am/format-patch)"
        )
    if check and proc.returncode != 0:
        msg = _first_error_line(proc)
        raise SeriesError(f"git {args[0]} failed in {cwd}: {msg}")
    return proc


def _out(proc) -> str:
    return proc.stdout.decode("utf-8", "replace")


def _err(proc) -> str:
    return proc.stderr.decode("utf-8", "replace")


def _first_error_line(proc) -> str:
    text = (_err(proc) + "\n" + _out(proc)).strip().splitlines()
    for line in text:
        if line.startswith(("fatal:", "error:")):
            return line.strip()
    return text[0].strip() if text else f"exit status {proc.returncode}"


# --------------------------------------------------------------------------
# the series
# --------------------------------------------------------------------------


@dataclass
class Series:
    series_dir: Path
    header: list[str]
    names: list[str]
    # Per patch, per diff section as `git apply --numstat` lists them: the
    # section's repository path(s) (two for a rename or copy).
    sections: list[list[tuple[str, ...]]]
    data: bytes  # the patches concatenated in series order: one git apply input
    hash: str

    def paths(self) -> list[str]:
        """Every repository path the series names, first mention first."""
        out: dict[str, None] = {}
        for sections in self.sections:
            for section in sections:
                out.update(dict.fromkeys(section))
        return list(out)

    def test_files(self) -> list[str]:
        return [p for p in self.paths() if p.startswith(TESTS + "/")]

    def owners(self, layout: str) -> list[str]:
        """The patch of each diff section git apply checks in this layout, in
        order (a directory holding sglang/ skips the test sections)."""
        return [
            name
            for name, sections in zip(self.names, self.sections)
            for section in sections
            if layout == LAYOUT_REPO or not section[0].startswith(TESTS + "/")
        ]


def _check_path(path: str, where: str) -> None:
    """Refuse a patch path that is not one of SGLang's repository paths the
    series may change: python/sglang/... (code) or test/... (tests)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SeriesError(f"{where}: path {path!r} is not a relative file path")
    if parts[0] == CODE and len(parts) >= 3 and parts[1] == PKG:
        if parts[2] in (STAMP_DIR, PARTIAL_DIR):
            raise SeriesError(
                f"{where}: path {path!r} is inside the series' own stamp directory"
            )
        return
    if parts[0] == TESTS and len(parts) >= 2:
        if parts[1] == PKG:
            # -p2 would turn it into sglang/..., a file of the package.
            raise SeriesError(
                f"{where}: path {path!r} under {TESTS}/{PKG}/ would land in the package "
                f"of a target holding {PKG}/"
            )
        return
    raise SeriesError(
        f"{where}: path {path!r} is outside {CODE}/{PKG}/ and {TESTS}/ "
        f"(the series patches only SGLang's package and its tests)"
    )


def patch_sections(name: str, data: bytes, cwd: Path) -> list[tuple[str, ...]]:
    """The diff sections of one patch file as git apply reads them (its
    repository paths), each path checked by _check_path."""
    if b"diff --git " not in data:
        raise SeriesError(f"{name}: no 'diff --git' section (not a git-format patch)")
    proc = _git(
        ["apply", "--numstat", "-z"],
        cwd=cwd,
        env=_git_env(isolated=True, ceiling=cwd.parent),
        input_bytes=data,
        check=False,
    )
    if proc.returncode != 0:
        raise SeriesError(
            f"{name}: git apply cannot read it: {_first_error_line(proc)}"
        )
    # -z: "added<TAB>deleted<TAB>path<NUL>", or for a rename or copy
    # "added<TAB>deleted<TAB><NUL>old<NUL>new<NUL>".
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    sections: list[tuple[str, ...]] = []
    i = 0
    while i < len(fields) and fields[i]:
        path = fields[i].split("\t", 2)[2]
        section = (path,) if path else (fields[i + 1], fields[i + 2])
        i += 1 if path else 3
        for p in section:
            _check_path(p, name)
        if len({p.startswith(TESTS + "/") for p in section}) > 1:
            raise SeriesError(
                f"{name}: {section[0]} -> {section[1]} moves a file between {CODE}/ and {TESTS}/"
            )
        sections.append(section)
    return sections


def read_series_names(series_dir: Path) -> tuple[list[str], list[str]]:
    """(header comment lines, patch names) of a series file."""
    path = series_dir / "series"
    if not path.is_file():
        raise SeriesError(f"no series file at {path}")
    header: list[str] = []
    names: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            if not names:
                header.append(raw)
            continue
        if "/" in line or line in (".", ".."):
            raise SeriesError(f"{path}: {line!r} is not a patch file name")
        if line in names:
            raise SeriesError(f"{path}: {line!r} is listed twice")
        names.append(line)
    return header, names


def load_series(series_dir: Path) -> Series:
    series_dir = series_dir.resolve()
    header, names = read_series_names(series_dir)
    h = hashlib.sha256()
    h.update(b"series\0")
    h.update((series_dir / "series").read_bytes())
    sections, chunks = [], []
    for name in names:
        p = series_dir / name
        if not p.is_file():
            raise SeriesError(
                f"patch {name!r} listed in {series_dir / 'series'} does not exist"
            )
        data = p.read_bytes()
        sections.append(patch_sections(name, data, series_dir))
        chunks.append(data if data.endswith(b"\n") else data + b"\n")
        h.update(b"\0patch\0%s\0%d\0" % (name.encode(), len(data)) + data)
    return Series(series_dir, header, names, sections, b"".join(chunks), h.hexdigest())


# --------------------------------------------------------------------------
# the target
# --------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"""^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)


@dataclass
class Target:
    """What --target named: a directory holding sglang/ (site-packages, or
    python/ of a checkout; code only), or an SGLang repository root
    (python/sglang/ with test/ beside it; code and tests)."""

    root: Path
    layout: str

    @property
    def code_root(self) -> Path:
        """The directory that holds the sglang package."""
        return self.root / CODE if self.layout == LAYOUT_REPO else self.root

    @property
    def pkg_dir(self) -> Path:
        return self.code_root / PKG

    @property
    def stamp_dir(self) -> Path:
        return self.pkg_dir / STAMP_DIR

    @property
    def partial_dir(self) -> Path:
        return self.pkg_dir / PARTIAL_DIR

    def rel(self, path: str) -> str | None:
        """A series path (repository form) relative to this target; None for a
        test file where the target has no test/ tree."""
        if self.layout == LAYOUT_REPO:
            return path
        if path.startswith(CODE + "/"):
            return path[len(CODE) + 1 :]
        return None


def detect_target(path: Path) -> Target:
    """Tell the layout of DIR, or refuse it in one line."""
    if (path / CODE / PKG / "version.py").is_file() and (path / TESTS).is_dir():
        return Target(path, LAYOUT_REPO)
    if (path / PKG / "version.py").is_file():
        return Target(path, LAYOUT_PACKAGE)
    if (path / CODE / PKG / "version.py").is_file():
        raise SeriesError(
            f"{path} holds {CODE}/{PKG}/ but no {TESTS}/ tree beside it, so it is not an SGLang "
            f"repository root; pass {path / CODE} (code only) or a repository root"
        )
    raise SeriesError(
        f"{path} holds no sglang package (no {PKG}/version.py, nor {CODE}/{PKG}/version.py with "
        f"a {TESTS}/ tree); pass the directory that CONTAINS sglang/ (site-packages, or python/ "
        f"of a checkout) or an SGLang repository root"
    )


def sglang_version(target: Path) -> str | None:
    """__version__ of TARGET/sglang without importing it.

    version.py (a literal), then the build-generated _version.py, then the
    dist-info METADATA that pip writes beside the package, then the release
    tag of a git checkout's HEAD.
    """
    for name in ("version.py", "_version.py"):
        p = target / PKG / name
        if p.is_file():
            m = _VERSION_RE.search(p.read_text(encoding="utf-8", errors="replace"))
            if m:
                return m.group(1)
    for meta in sorted(target.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return _checkout_tag_version(target)


_RELEASE_TAG_RE = re.compile(r"^v(\d+\.\d+\.\d+\S*)$")


def _checkout_tag_version(code_root: Path) -> str | None:
    """The release a plain SGLang git checkout is at: the vX.Y.Z tag on its
    HEAD, when CODE_ROOT is python/ of that checkout. A clone carries no
    _version.py (the build writes it), and its version.py computes the
    version at import."""
    top = code_root.parent
    if code_root.name != CODE or not (top / ".git").exists():
        return None
    try:
        proc = _git(
            ["tag", "--points-at", "HEAD"],
            cwd=top,
            env=_git_env(ceiling=top.parent),
            check=False,
        )
    except SeriesError:  # no git on PATH: the version stays unknown
        return None
    if proc.returncode != 0:
        return None
    versions = sorted(
        m.group(1) for m in map(_RELEASE_TAG_RE.match, _out(proc).split()) if m
    )
    return versions[0] if len(versions) == 1 else None


def require_supported(
    target: Path, version: str | None, force: bool, verb: str = "apply"
) -> None:
    if version in SUPPORTED_BASES or force:
        return
    shown = version if version else "of unknown version"
    raise SeriesError(
        f"sglang {shown} in {target} is not a supported base "
        f"(supported: {', '.join(SUPPORTED_BASES)}); pass --force to {verb} anyway"
    )


def _stamp_paths(target: Target) -> tuple[Path, Path]:
    return target.stamp_dir, target.partial_dir


def read_stamp(target: Target) -> dict | None:
    stamp_dir, partial = _stamp_paths(target)
    if partial.exists():
        raise SeriesError(
            f"an interrupted apply left {partial}; run `series.py revert --target {target.root}` first"
        )
    if not stamp_dir.exists():
        return None
    try:
        stamp = json.loads((stamp_dir / STAMP_FILE).read_text(encoding="utf-8"))
        if stamp.get("format") != STAMP_FORMAT:
            raise ValueError("unknown stamp format")
    except (OSError, ValueError) as exc:
        raise SeriesError(f"unreadable stamp {stamp_dir / STAMP_FILE}: {exc}")
    return stamp


def _stamp_layout(stamp: dict) -> str:
    # apply writes "layout" only for a repository root; a stamp without it
    # was written for a directory holding sglang/.
    return stamp.get("layout", LAYOUT_PACKAGE)


def _stamp_base(stamp_dir: Path, stamp: dict) -> Path:
    """The directory the stamp's paths are relative to (stamp_dir is
    <package>/.fork-series or its .partial twin)."""
    pkg_dir = stamp_dir.parent
    return (
        pkg_dir.parent.parent if _stamp_layout(stamp) == LAYOUT_REPO else pkg_dir.parent
    )


def _stamp_rel(target: Target, stamp: dict, rel: str) -> str | None:
    """A stamp path relative to target.root (None if outside it, e.g. a test
    file of a repository-root stamp seen from python/)."""
    absolute = _stamp_base(target.stamp_dir, stamp) / rel
    try:
        return absolute.relative_to(target.root).as_posix()
    except ValueError:
        return None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _restore(backup: Path, dst: Path) -> None:
    """Put an original back byte-identically (bytes, mode, times)."""
    tmp = dst.with_name(f".{dst.name}.series-tmp")
    shutil.copy2(backup, tmp)
    os.replace(tmp, dst)


def _missing_dirs(target: Path, rel: str) -> list[str]:
    """Parent dirs of rel that do not exist in target (outermost first)."""
    out = []
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if not (target / d).exists():
            out.append(d)
    return out


# --------------------------------------------------------------------------
# git apply: the whole series in one call
# --------------------------------------------------------------------------


def _touched(target: Target, series: Series) -> list[str]:
    """The files the series touches in this target, relative to it."""
    return [r for r in (target.rel(p) for p in series.paths()) if r is not None]


def git_apply(
    series: Series, layout: str, cwd: Path, check: bool
) -> list[tuple[str, list[str]]]:
    """One all-or-nothing `git apply` of the concatenated series in cwd, laid
    out as a repository root or as a directory holding sglang/ (-p2 turns
    python/sglang/... into sglang/...; --include leaves the test files out).

    Returns [] when it applied (with check, would apply), else
    [(patch, [git's error messages])] for each patch git named an error in:
    --verbose prints "Checking patch FILE..." per diff section, so the errors
    after the n-th one belong to the patch owning the n-th section."""
    opts = [] if layout == LAYOUT_REPO else ["-p2", f"--include={PKG}/*"]
    proc = _git(
        ["apply", "--verbose", "--whitespace=nowarn", *opts]
        + (["--check"] if check else []),
        cwd=cwd,
        # Never the enclosing repository's view (the target may live in a
        # checkout): git apply then patches paths relative to cwd.
        env=_git_env(isolated=True, ceiling=cwd.parent),
        input_bytes=series.data,
        check=False,
    )
    if proc.returncode == 0:
        return []
    owners = series.owners(layout)
    found: dict[str, list[str]] = {}
    section, quoting = -1, False
    for line in _err(proc).splitlines():
        if line.startswith("Checking patch "):
            section, quoting = section + 1, False
        elif line.startswith("error: "):
            message = line[len("error: ") :].strip()
            # "while searching for:" is followed by the hunk's lines: skipped.
            quoting = message == "while searching for:"
            if not quoting:
                owner = owners[section] if 0 <= section < len(owners) else "(series)"
                found.setdefault(owner, []).append(message)
        elif line.startswith("Hunk #"):
            quoting = False
    return list(found.items()) or [("(series)", [_first_error_line(proc)])]


def _failed_lines(failures) -> list[str]:
    return [f"FAILED {name}: " + "; ".join(msgs) for name, msgs in failures]


def _created_by(target: Target, stamp: dict | None) -> set[str]:
    """The files the applied series created (target-relative): absent from
    the upstream tree; the stamp's "files" lists them with existed false."""
    if not stamp:
        return set()
    created = [e["path"] for e in stamp["files"] if not e["existed"]]
    return {r for r in (_stamp_rel(target, stamp, c) for c in created) if r is not None}


def _refuse_odd_paths(root: Path, touched: list[str]) -> None:
    """Refuse a touched path that is a symlink or not a regular file, or
    whose parent is not a directory."""
    for rel in touched:
        src = root / rel
        if src.is_symlink():
            raise SeriesError(f"{src} is a symlink; refusing to patch through it")
        if src.exists() and not src.is_file():
            raise SeriesError(f"{src} is not a regular file")
        for parent in list(Path(rel).parents)[:-1]:
            p = root / parent
            if p.exists() and not p.is_dir():
                raise SeriesError(f"{p} is not a directory; cannot place {rel} there")


def check_upstream(target: Target, series: Series, stamp: dict | None):
    """git_apply --check of the series on the upstream files: the target
    itself, or where a series is applied (stamp), a temporary copy of the
    touched files' upstream bytes (the backups; the files that series
    created are absent upstream)."""
    touched = _touched(target, series)
    _refuse_odd_paths(target.root, touched)
    if stamp is None:
        return git_apply(series, target.layout, target.root, check=True)
    backups = {}
    for e in stamp["files"]:
        r = _stamp_rel(target, stamp, e["path"])
        if e["existed"] and r is not None:
            backups[r] = target.stamp_dir / ORIGINALS / e["path"]
    created = _created_by(target, stamp)
    with tempfile.TemporaryDirectory(prefix="series-check-") as tmp:
        mirror = Path(tmp) / "upstream"
        for rel in touched:
            src = backups.get(rel, target.root / rel)
            if rel in backups and not src.is_file():
                raise SeriesError(
                    f"the backup of {rel} is missing from {target.stamp_dir}; cannot tell "
                    f"its upstream bytes"
                )
            if rel not in created and src.is_file():
                (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, mirror / rel)
        mirror.mkdir(exist_ok=True)
        return git_apply(series, target.layout, mirror, check=True)


# --------------------------------------------------------------------------
# subcommands: check / apply / revert / status
# --------------------------------------------------------------------------


def _open_target(args) -> tuple[Target, str | None, dict | None, Series]:
    """What check, apply and status start from: the target (a directory
    holding sglang, or a repository root), its sglang version, its stamp
    (None when no series is applied) and the series of this checkout."""
    target = detect_target(Path(args.target).resolve())
    series = load_series(args.series_dir)
    return target, sglang_version(target.code_root), read_stamp(target), series


def _tests_skipped_line(target: Target, series: Series) -> str | None:
    """Said once by check, apply and status where the series' test files do
    not go."""
    tests = series.test_files()
    if target.layout == LAYOUT_REPO or not tests:
        return None
    return f"{len(tests)} test file(s) not applied: this target has no {TESTS}/ tree"


def cmd_check(args) -> int:
    target, version, stamp, series = _open_target(args)
    require_supported(target.root, version, args.force, "check")
    if stamp:
        print(
            f"note: a series is applied to {target.root}; checking against its upstream backups"
        )
    skipped = _tests_skipped_line(target, series)
    if skipped:
        print(f"note: {skipped}")
    failures = check_upstream(target, series, stamp)
    for line in _failed_lines(failures):
        print(line)
    if failures:
        print(
            f"series.py: error: {len(failures)} of {len(series.names)} patch(es) do not apply to "
            f"sglang {version} at {target.root}",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    print(
        f"ok: {len(series.names)} patch(es) apply cleanly to sglang {version} at {target.root}"
    )
    return 0


def _require_applies(target, series, version, stamp, untouched: str) -> None:
    """Refuse, naming every failing patch on stderr, unless the whole series
    applies to the upstream files (``stamp``'s backups where one is given)."""
    failures = check_upstream(target, series, stamp)
    if failures:
        for line in _failed_lines(failures):
            print(line, file=sys.stderr)
        raise SeriesError(
            f"{len(failures)} of {len(series.names)} patch(es) do not apply to sglang "
            f"{version} at {target.root}; {untouched}"
        )


def cmd_apply(args) -> int:
    target, version, stamp, series = _open_target(args)
    if stamp:
        same_layout = _stamp_layout(stamp) == target.layout
        if stamp["series_hash"] == series.hash and same_layout:
            print(
                f"already applied: series {series.hash[:12]} ({len(series.names)} patch(es)) "
                f"on sglang {stamp.get('sglang_version')} at {target.root}"
            )
            return 0
        if not args.replace:
            if stamp["series_hash"] == series.hash:
                raise SeriesError(
                    f"this series is applied to {_stamp_base(target.stamp_dir, stamp)} as a "
                    f"{_stamp_layout(stamp)} target, not to {target.root} as a {target.layout} target; "
                    f"run `series.py revert --target {target.root}` first"
                )
            raise SeriesError(
                f"a different series ({stamp['series_hash'][:12]}, {len(stamp['patches'])} patch(es)) "
                f"is already applied to {target.root}; run `series.py revert --target {target.root}` first"
            )
        require_supported(target.root, version, args.force)
        # --replace: prove the new series applies to the upstream files (kept in
        # the old stamp's backups) before anything is reverted.
        _require_applies(
            target, series, version, stamp, "the applied series was left in place"
        )
        problem = _undo(_stamp_base(target.stamp_dir, stamp), target.stamp_dir, stamp)
        if problem:
            raise SeriesError(f"could not revert the applied series ({problem})")
        print(f"reverted the previously applied series {stamp['series_hash'][:12]}")
    require_supported(target.root, version, args.force)
    _require_applies(target, series, version, None, "target left unchanged")
    _write(target, series, version)
    print(
        f"applied series {series.hash[:12]}: {len(series.names)} patch(es) "
        f"to sglang {version} at {target.root}"
    )
    for name in series.names:
        print(f"  {name}")
    skipped = _tests_skipped_line(target, series)
    if skipped:
        print(f"note: {skipped}")
    return 0


def _write(target: Target, series: Series, version: str | None) -> None:
    """Back up every touched upstream file and write the stamp into
    .fork-series.partial, git apply the series onto the target, then record
    each result's sha256 and rename the stamp dir into place. Any failure
    puts the backups back and removes what the series created."""
    stamp_dir, partial = _stamp_paths(target)
    root = target.root
    files, created_dirs = [], []
    for rel in _touched(target, series):
        existed = (root / rel).is_file()
        files.append({"path": rel, "existed": existed})
        if not existed:
            created_dirs += [
                d for d in _missing_dirs(root, rel) if d not in created_dirs
            ]
    stamp = {
        "format": STAMP_FORMAT,
        "tool": "scripts/series.py",
        "series_hash": series.hash,
        "patches": series.names,
        "files": files,
        "created_dirs": created_dirs,
        "sglang_version": version,
        "applied_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
    }
    if target.layout == LAYOUT_REPO:
        # Paths relative to the repository root; a stamp without this key has
        # paths relative to the directory holding sglang/.
        stamp["layout"] = LAYOUT_REPO

    def save_stamp():
        text = json.dumps(stamp, indent=2) + "\n"
        (partial / STAMP_FILE).write_text(text, encoding="utf-8")

    partial.mkdir()
    try:
        for entry in files:
            if entry["existed"]:
                b = partial / ORIGINALS / entry["path"]
                b.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / entry["path"], b)
        save_stamp()
        failures = git_apply(series, target.layout, root, check=False)
        if failures:
            raise SeriesError("git apply failed: " + _failed_lines(failures)[0])
        if os.environ.get(_FAULT_ENV):
            raise OSError(
                f"injected failure after git apply wrote the target ({_FAULT_ENV})"
            )
        for entry in files:
            p = root / entry["path"]
            entry["applied_sha256"] = _sha(p) if p.is_file() else None
        save_stamp()
        os.rename(partial, stamp_dir)
    except BaseException as exc:
        problem = _undo(root, partial, stamp)
        detail = (
            f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, SeriesError)
            else str(exc)
        )
        if problem:
            raise SeriesError(
                f"apply failed while writing the target ({detail}) and the rollback failed too "
                f"({problem}); backups are kept in {partial}"
            )
        raise SeriesError(
            f"apply failed while writing the target ({detail}); target rolled back"
        )


def _undo(base: Path, stamp_dir: Path, stamp: dict) -> str | None:
    """Put the upstream bytes back from stamp_dir; remove what the series
    added. base: the directory the stamp's paths are relative to."""
    problem = None
    for entry in stamp["files"]:
        dst = base / entry["path"]
        try:
            if entry["existed"]:
                b = stamp_dir / ORIGINALS / entry["path"]
                if b.is_file():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    _restore(b, dst)
                elif (
                    dst.exists()
                    and entry.get("applied_sha256")
                    and _sha(dst) == entry["applied_sha256"]
                ):
                    problem = problem or f"no backup of {entry['path']}"
            elif dst.is_file() or dst.is_symlink():
                dst.unlink()
        except OSError as exc:
            problem = problem or f"{entry['path']}: {exc}"
    for d in sorted(stamp.get("created_dirs", []), key=lambda s: -s.count("/")):
        p = base / d
        pycache = p / "__pycache__"
        try:
            if pycache.is_dir() and not any(
                not f.name.endswith((".pyc", ".pyo")) for f in pycache.iterdir()
            ):
                shutil.rmtree(pycache)
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        except OSError:
            pass
    if problem is None:
        shutil.rmtree(stamp_dir, ignore_errors=True)
    return problem


def cmd_revert(args) -> int:
    target = detect_target(Path(args.target).resolve())
    stamp_dir, partial = _stamp_paths(target)
    where = partial if partial.exists() else stamp_dir
    if not where.exists():
        print(f"not applied: no series stamp in {target.pkg_dir}")
        return 0
    if where is partial and not (partial / STAMP_FILE).is_file():
        # apply was interrupted while saving backups, before it wrote anything.
        shutil.rmtree(partial)
        print(
            f"removed the leftovers of an interrupted apply ({partial}); target was not modified"
        )
        return 0
    try:
        stamp = json.loads((where / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SeriesError(
            f"unreadable stamp {where / STAMP_FILE}: {exc}; cannot revert safely"
        )
    base = _stamp_base(where, stamp)
    missing = [
        e["path"]
        for e in stamp["files"]
        if e["existed"] and not (where / ORIGINALS / e["path"]).is_file()
    ]
    if missing and where is stamp_dir:
        raise SeriesError(
            f"the backup of {missing[0]} is missing from {where}; cannot revert safely"
        )
    modified = []
    for e in stamp["files"]:
        dst = base / e["path"]
        want = e.get("applied_sha256")
        if want and dst.is_file() and _sha(dst) != want:
            modified.append(e["path"])
    problem = _undo(base, where, stamp)
    if problem:
        raise SeriesError(f"revert incomplete ({problem}); backups kept in {where}")
    for rel in modified:
        print(f"note: {rel} was edited after apply; restored the upstream file anyway")
    print(
        f"reverted series {stamp['series_hash'][:12]} ({len(stamp['patches'])} patch(es)) "
        f"from {base}"
    )
    return 0


def cmd_status(args) -> int:
    target, version, stamp, series = _open_target(args)
    applied = stamp is not None
    current = bool(
        stamp
        and stamp["series_hash"] == series.hash
        and _stamp_layout(stamp) == target.layout
    )
    skipped = _tests_skipped_line(target, series)
    info = {
        "target": str(target.root),
        "layout": target.layout,
        "sglang_version": version,
        "applied": applied,
        "current": current,
        "series_hash": stamp["series_hash"] if stamp else None,
        "patches": list(stamp["patches"]) if stamp else [],
        "supported_base": version in SUPPORTED_BASES,
        "current_series_hash": series.hash,
        "test_files_not_applied": len(series.test_files()) if skipped else 0,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    base = "supported base" if info["supported_base"] else "NOT a supported base"
    print(f"target:  {target.root} ({target.layout})")
    print(f"sglang:  {version or 'unknown version'} ({base})")
    if not applied:
        print(
            f"series:  not applied (current series {series.hash[:12]}, {len(series.names)} patch(es))"
        )
    elif current:
        print(f"series:  applied, the current series ({series.hash[:12]})")
    elif stamp["series_hash"] == series.hash:
        print(
            f"series:  applied as a {_stamp_layout(stamp)} target to "
            f"{_stamp_base(target.stamp_dir, stamp)} - run `series.py revert` then `series.py apply`"
        )
    else:
        print(
            f"series:  applied, a DIFFERENT series ({stamp['series_hash'][:12]}; current is "
            f"{series.hash[:12]}) - run `series.py revert` then `series.py apply`"
        )
    if applied:
        print("patches:")
        for name in stamp["patches"]:
            print(f"  {name}")
    if skipped:
        print(f"note:    {skipped}")
    return 0


# --------------------------------------------------------------------------
# the developer's loop: import / export / rebase
# --------------------------------------------------------------------------

_CODE_PKG = f"{CODE}/{PKG}"
_NOT_TRACKED = [
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.pyc",
    ":(exclude,glob)**/*.pyo",
    f":(exclude){_CODE_PKG}/{STAMP_DIR}",
    f":(exclude){_CODE_PKG}/{PARTIAL_DIR}",
]

_EXCLUDES = f"""\
# written by scripts/series.py import: only python/sglang/ and test/ are tracked
/*
!/{CODE}/
/{CODE}/*
!/{_CODE_PKG}/
!/{TESTS}/
__pycache__/
*.py[co]
/{_CODE_PKG}/{STAMP_DIR}/
/{_CODE_PKG}/{PARTIAL_DIR}/
"""


def _pristine_tree(path: Path) -> Target:
    """A pristine tree given to import or rebase --onto: a directory holding
    sglang/, or a repository root (python/sglang/; its test/ tree if any)."""
    if (path / CODE / PKG / "version.py").is_file():
        return Target(path, LAYOUT_REPO)
    if (path / PKG / "version.py").is_file():
        return Target(path, LAYOUT_PACKAGE)
    raise SeriesError(
        f"{path} holds no sglang package (no {PKG}/version.py, nor {CODE}/{PKG}/version.py); "
        f"pass a directory that CONTAINS sglang/ or an SGLang repository root"
    )


def _own_git_dir(d: Path) -> Path | None:
    return d / ".git" if (d / ".git").exists() else None


def _inside_work_tree_with_commits(d: Path) -> str | None:
    """The top level of the git work tree holding d, if it has commits."""
    env = _git_env()
    proc = _git(["rev-parse", "--show-toplevel"], cwd=d, env=env, check=False)
    if proc.returncode != 0:
        return None
    if (
        _git(
            ["rev-parse", "--verify", "-q", "HEAD"], cwd=d, env=env, check=False
        ).returncode
        != 0
    ):
        return None
    return _out(proc).strip()


def _ensure_identity(repo: Path) -> None:
    if _git(["var", "GIT_COMMITTER_IDENT"], cwd=repo, check=False).returncode != 0:
        _git(["config", "user.name", FALLBACK_IDENT[0]], cwd=repo)
        _git(["config", "user.email", FALLBACK_IDENT[1]], cwd=repo)
        print(
            f"note: no git identity configured; set user.name/user.email to {FALLBACK_IDENT} in {repo}"
        )


def _has_files(d: Path) -> bool:
    return d.is_dir() and any(p.is_file() for p in d.rglob("*"))


def _commit_upstream(work: Path, version: str | None) -> str:
    """Commit the python/sglang/ and test/ of the work tree `work` as they are
    (the pristine upstream, under a fixed identity and date); its sha."""
    spec = [p for p in (_CODE_PKG, TESTS) if _has_files(work / p)]
    _git(["add", "-A", "-f", "--", *spec, *_NOT_TRACKED], cwd=work)
    env = _git_env(
        GIT_AUTHOR_NAME=UPSTREAM_IDENT[0],
        GIT_AUTHOR_EMAIL=UPSTREAM_IDENT[1],
        GIT_COMMITTER_NAME=UPSTREAM_IDENT[0],
        GIT_COMMITTER_EMAIL=UPSTREAM_IDENT[1],
        GIT_AUTHOR_DATE="@0 +0000",
        GIT_COMMITTER_DATE="@0 +0000",
    )
    msg = (
        f"sglang {version or 'unknown'} (pristine upstream)\n\n"
        f"The unmodified sglang package this series applies to. Written by\n"
        f"scripts/series.py; the patch commits follow on top of it.\n"
    )
    commit = ["commit", "-q", "--no-verify", "--no-gpg-sign", "--allow-empty"]
    _git([*commit, "-m", msg], cwd=work, env=env)
    return _out(_git(["rev-parse", "HEAD"], cwd=work)).strip()


def _require_imported(repo: Path) -> None:
    if (
        _own_git_dir(repo) is None
        or _git(
            ["rev-parse", "--verify", "-q", f"refs/heads/{UPSTREAM_BRANCH}"],
            cwd=repo,
            check=False,
        ).returncode
        != 0
    ):
        raise SeriesError(
            f"{repo} is not an imported series repository (no `{UPSTREAM_BRANCH}` branch); "
            f"run `series.py import --target {repo}` first"
        )
    gd = repo / ".git"
    if (gd / "rebase-apply").exists() or (gd / "rebase-merge").exists():
        raise SeriesError(
            f"a git am/rebase is in progress in {repo}; finish it (`git am --continue` or "
            f"`git rebase --continue`) or abort it first"
        )
    dirty = _out(
        _git(
            ["status", "--porcelain", "--untracked-files=no", "--", _CODE_PKG, TESTS],
            cwd=repo,
        )
    ).strip()
    if dirty:
        first = dirty.splitlines()[0][3:]
        raise SeriesError(
            f"{repo} has uncommitted changes under {_CODE_PKG}/ or {TESTS}/ (e.g. {first}); "
            f"commit or stash them first"
        )


def _conflicted(repo: Path) -> list[str]:
    proc = _git(["diff", "--name-only", "--diff-filter=U"], cwd=repo, check=False)
    return [f for f in _out(proc).splitlines() if f.strip()]


def slug(subject: str) -> str:
    """File name stem for a subject: lowercase, apostrophes dropped ("rank's" ->
    "ranks"), every other run of non-alphanumerics -> "-"."""
    s = re.sub(r"['\u2019`]", "", subject.lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "patch"


def cmd_import(args) -> int:
    given = Path(args.target).resolve()
    source = _pristine_tree(given)
    if source.stamp_dir.exists() or source.partial_dir.exists():
        raise SeriesError(
            f"a series is applied to {given} by `series.py apply`; import needs a pristine tree "
            f"(run `series.py revert --target {given}` first)"
        )
    series = load_series(args.series_dir)
    version = sglang_version(source.code_root)
    top = _inside_work_tree_with_commits(given)
    if top and not args.force:
        raise SeriesError(
            f"{given} is already inside a git work tree with commits ({top}); pass --force to import "
            f"anyway (a repository of its own at {given}, or a re-import if it is one)"
        )
    if source.layout == LAYOUT_PACKAGE:
        # import moves sglang/ to python/sglang/: only in a tree of its own
        # (a wheel's files), never in an installation's site-packages.
        others = sorted(
            e.name
            for e in given.iterdir()
            if e.name != PKG
            and not e.name.startswith(".")
            and not (e.name.startswith(f"{PKG}-") and e.name.endswith(".dist-info"))
        )
        if others:
            raise SeriesError(
                f"{given} holds more than {PKG}/ (e.g. {others[0]}); import moves {PKG}/ to "
                f"{CODE}/{PKG}/, so give it a scratch copy of the pristine tree"
            )

    repo = given
    if source.layout == LAYOUT_PACKAGE:
        # The repository layout: the package moves to python/sglang/, tests go to test/.
        (repo / CODE).mkdir()
        os.rename(repo / PKG, repo / CODE / PKG)
        print(f"moved {repo / PKG} to {repo / CODE / PKG} (SGLang's repository layout)")
    (repo / TESTS).mkdir(exist_ok=True)
    source = Target(repo, LAYOUT_REPO)

    if _own_git_dir(repo) is None:
        _git(["init", "-q", "-b", WORK_BRANCH], cwd=repo)
    info = repo / ".git" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "exclude").write_text(_EXCLUDES, encoding="utf-8")
    _ensure_identity(repo)

    # The pristine tree as a root commit of an unborn branch WORK_BRANCH
    # (a re-import starts it again).
    _git(["symbolic-ref", "HEAD", f"refs/heads/{WORK_BRANCH}"], cwd=repo)
    _git(["update-ref", "-d", f"refs/heads/{WORK_BRANCH}"], cwd=repo, check=False)
    _git(["read-tree", "--empty"], cwd=repo)
    upstream = _commit_upstream(repo, version)
    _git(["tag", "-f", f"upstream-{version}", upstream], cwd=repo)
    _git(["branch", "-f", UPSTREAM_BRANCH, upstream], cwd=repo)

    files = [series.series_dir / name for name in series.names]
    proc = None
    if files:
        proc = _git(
            [
                "am",
                "--3way",
                "--keep-non-patch",
                "--committer-date-is-author-date",
                "--no-gpg-sign",
                *[str(f) for f in files],
            ],
            cwd=repo,
            check=False,
        )
    if proc is not None and proc.returncode != 0:
        text = _out(proc) + "\n" + _err(proc)
        m = re.search(r"^Patch failed at (\d+) ", text, re.M)
        index = int(m.group(1)) - 1 if m else None
        name = series.names[index] if index is not None else "?"
        conflicted = _conflicted(repo)
        # Without a 3-way merge (the patch's base blobs are not in this tree)
        # git apply's "patch failed: FILE:LINE" lines say where.
        failed = []
        if index is not None:
            check = _git(["apply", "--check", str(files[index])], cwd=repo, check=False)
            failed = re.findall(r"^error: (patch failed: .+)$", _err(check), re.M)
        what = (
            f"conflicts in {', '.join(conflicted)}"
            if conflicted
            else "; ".join(failed) or "see `git am --show-current-patch=diff`"
        )
        raise SeriesError(
            f"patch {name} does not apply to sglang {version} ({what}); resolve it in {repo} "
            f"(`git am --show-current-patch=diff` shows the patch), `git add` the files, "
            f"run `git -C {repo} am --continue`, then `series.py export --target {repo}`"
        )

    print(
        f"imported sglang {version} + {len(series.names)} patch(es)"
        f" into {repo} (branch {WORK_BRANCH}; base: branch {UPSTREAM_BRANCH} = tag upstream-{version})"
    )
    print(
        "edit with ordinary git:\n"
        f"  cd {repo}\n"
        "  git log --oneline upstream..            # one commit per patch\n"
        "  git commit --fixup=<commit> <files>     # amend a patch\n"
        "  git rebase -i --autosquash upstream     # fold fixups, reorder, drop\n"
        "  git commit -m '<subject>'               # a new patch (subject = file name)\n"
        "then write the series back:\n"
        f"  python {Path(__file__).resolve()} export --target {repo}"
    )
    return 0


def cmd_export(args) -> int:
    repo = Path(args.target).resolve()
    _require_imported(repo)
    series_dir = Path(args.series_dir).resolve()
    commits = _out(
        _git(
            ["rev-list", "--reverse", "--topo-order", f"{UPSTREAM_BRANCH}..HEAD"],
            cwd=repo,
        )
    ).split()
    merges = _out(
        _git(["rev-list", "--merges", f"{UPSTREAM_BRANCH}..HEAD"], cwd=repo)
    ).split()
    if merges:
        raise SeriesError(
            f"upstream..HEAD holds merge commit {merges[0][:12]}; a series must be linear"
        )

    def changed(c: str) -> list[str]:
        out = _git(
            [
                "diff-tree",
                "-r",
                "--no-commit-id",
                "--name-only",
                "-z",
                "--no-renames",
                c,
            ],
            cwd=repo,
        )
        return [p for p in _out(out).split("\0") if p]

    subjects = {
        c: _out(_git(["log", "-1", "--format=%s", c], cwd=repo)).strip()
        for c in commits
    }
    touched = {c: changed(c) for c in commits}
    for c in commits:
        if not touched[c]:
            raise SeriesError(
                f"commit {c[:12]} ({subjects[c]}) changes nothing; drop it "
                f"(`git rebase -i {UPSTREAM_BRANCH}`) before exporting"
            )
        for p in touched[c]:
            _check_path(p, f"commit {c[:12]} ({subjects[c]})")

    patches: list[tuple[str, bytes]] = []
    used: set[str] = set()
    fmt_env = _git_env(isolated=True)
    for c in commits:
        name = slug(subjects[c])
        n = 2
        while name in used:
            name = f"{slug(subjects[c])}-{n}"
            n += 1
        used.add(name)
        proc = _git(
            [
                "-c",
                "core.abbrev=7",
                "format-patch",
                "--stdout",
                "--no-numbered",
                "--zero-commit",
                "--no-signature",
                "--no-stat",
                "--diff-algorithm=myers",
                f"{c}^..{c}",
            ],
            cwd=repo,
            env=fmt_env,
        )
        patches.append((name + ".patch", proc.stdout))

    # All computed; now write.
    series_dir.mkdir(parents=True, exist_ok=True)
    try:
        header, old_names = read_series_names(series_dir)
    except SeriesError:
        header, old_names = [], []
    written = []
    for name, data in patches:
        dst = series_dir / name
        if not dst.is_file() or dst.read_bytes() != data:
            tmp = dst.with_name(f".{name}.series-tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dst)
            written.append(name)
    new_names = [n for n, _ in patches]
    series_text = "".join(h + "\n" for h in header) + "".join(
        n + "\n" for n in new_names
    )
    (series_dir / "series").write_text(series_text, encoding="utf-8")
    removed = []
    for old in old_names:
        if (
            old not in new_names
            and old.endswith(".patch")
            and (series_dir / old).is_file()
        ):
            (series_dir / old).unlink()
            removed.append(old)
    print(
        f"exported {len(new_names)} patch(es) to {series_dir} ({len(written)} changed, "
        f"{len(removed)} removed)"
    )
    for name in new_names:
        print(f"  {name}{'  (changed)' if name in written else ''}")
    for name in removed:
        print(f"  {name}  (removed)")
    return 0


def cmd_rebase(args) -> int:
    repo = Path(args.target).resolve()
    _require_imported(repo)
    newtree = _pristine_tree(Path(args.onto).resolve())
    if any(p.exists() for p in _stamp_paths(newtree)):
        raise SeriesError(
            f"a series is applied to {newtree.root}; --onto needs a pristine tree (revert it first)"
        )
    version = sglang_version(newtree.code_root)
    _ensure_identity(repo)
    old = _out(_git(["rev-parse", f"refs/heads/{UPSTREAM_BRANCH}"], cwd=repo)).strip()
    # The new upstream on top of the old one, in a temporary work tree: its
    # python/sglang/ replaced by NEWTREE's, its test/ too if NEWTREE has one.
    with tempfile.TemporaryDirectory(prefix="series-rebase-") as tmp:
        work = Path(tmp) / "upstream"
        _git(["worktree", "add", "-q", "--detach", str(work), old], cwd=repo)
        try:
            skip = shutil.ignore_patterns("__pycache__", "*.py[co]", STAMP_DIR)
            new_tests = newtree.root / TESTS
            pairs = [(newtree.pkg_dir, work / _CODE_PKG)]
            if newtree.layout == LAYOUT_REPO and _has_files(new_tests):
                pairs.append((new_tests, work / TESTS))
            for src, dst in pairs:
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, symlinks=True, ignore=skip)
            new = _commit_upstream(work, version)
        finally:
            _git(["worktree", "remove", "--force", str(work)], cwd=repo, check=False)
    _git(["tag", "-f", f"upstream-{version}", new], cwd=repo)
    _git(["branch", "-f", UPSTREAM_BRANCH, new], cwd=repo)
    count = len(_out(_git(["rev-list", f"{old}..HEAD"], cwd=repo)).split())
    proc = _git(["rebase", "--no-gpg-sign", "--onto", new, old], cwd=repo, check=False)
    if proc.returncode != 0:
        text = _out(proc) + "\n" + _err(proc)
        subject = None
        stopped = repo / ".git" / "rebase-merge" / "stopped-sha"
        if stopped.is_file():
            sha = stopped.read_text().strip()
            p = _git(["log", "-1", "--format=%s", sha], cwd=repo, check=False)
            subject = _out(p).strip() or None
        if subject is None:
            m = re.search(r"^Could not apply [0-9a-f]+\.\.\. (.*)$", text, re.M)
            subject = m.group(1).strip() if m else None
        files = _conflicted(repo)
        if (
            not (repo / ".git" / "rebase-merge").exists()
            and not (repo / ".git" / "rebase-apply").exists()
        ):
            _git(["branch", "-f", UPSTREAM_BRANCH, old], cwd=repo, check=False)
            raise SeriesError(f"git rebase failed in {repo}: {_first_error_line(proc)}")
        what = f"patch {slug(subject)}.patch" if subject else "a patch"
        raise SeriesError(
            f"rebase onto sglang {version} stopped at {what}: conflicts in "
            f"{', '.join(files) or 'unknown files'}; resolve them in {repo}, `git add` them, "
            f"run `git -C {repo} rebase --continue`, then `series.py export --target {repo}`"
        )
    print(
        f"rebased {count} commit(s) onto sglang {version} (branch {UPSTREAM_BRANCH} = tag upstream-{version}) in {repo}"
    )
    print(
        f"next: python {Path(__file__).resolve()} export --target {repo}\n"
        f"      then `series.py check{'' if version in SUPPORTED_BASES else ' --force'} "
        f"--target <a pristine sglang {version} tree>`"
    )
    return 0


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, our prefix
        self.exit(EXIT_ERROR, f"series.py: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="series.py",
        description="Apply, check, revert and maintain the fork's patch series over SGLang "
        f"(supported bases: {', '.join(SUPPORTED_BASES)}).",
        epilog=(
            "examples:\n"
            "  series.py check  --target /sgl-workspace/sglang/python\n"
            "  series.py apply  --target /sgl-workspace/sglang/python   # ROCm docker image\n"
            "  series.py apply  --target $(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\n"
            "  series.py status --target DIR --json\n"
            "  series.py revert --target DIR\n"
            "\n"
            "developer loop (DIR = a scratch copy of a pristine tree):\n"
            "  series.py import --target DIR      # git repo: upstream commit + one commit per patch\n"
            "  git -C DIR commit --fixup=<sha>; git -C DIR rebase -i --autosquash upstream\n"
            "  series.py export --target DIR      # commits -> patches/*.patch + patches/series\n"
            "  series.py rebase --target DIR --onto NEWTREE   # new release; conflicts stop, then\n"
            "      git -C DIR rebase --continue; series.py export --target DIR\n"
            "\n"
            "exit status: 0 ok, 1 check found failing patches, 2 error (one line on stderr)."
        ),
        formatter_class=fmt,
    )
    p.add_argument(
        "--series-dir",
        type=Path,
        default=DEFAULT_SERIES_DIR,
        help="directory holding `series` and the *.patch files (default: %(default)s)",
    )
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name, func, help_, desc):
        sp = sub.add_parser(name, help=help_, description=desc, formatter_class=fmt)
        sp.add_argument(
            "--target",
            required=True,
            metavar="DIR",
            help="directory that holds the sglang package (site-packages, or python/ of a checkout; "
            "code only), or an SGLang repository root (python/sglang/ and test/; code and tests)",
        )
        sp.set_defaults(func=func)
        return sp

    sp = add(
        "check",
        cmd_check,
        "dry run: does the series apply? (exit 1 + one line per failing patch if not)",
        "One `git apply --check` of the whole series on the target (on a temporary copy of\n"
        "its upstream files where a series is applied); never writes the target. Reports,\n"
        "one line per patch git named an error in, git's messages (patch failed: FILE:LINE);\n"
        "a patch that builds on a failing one is reported too.\n"
        f"Refuses an sglang version that is not a supported base ({', '.join(SUPPORTED_BASES)})\n"
        "with one line (exit 2); --force checks anyway: use it on a new release.",
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="skip the supported-version check (only that): check a new release",
    )
    sp = add(
        "apply",
        cmd_apply,
        "apply the series atomically and idempotently",
        "Check the series (as `check`), save byte-exact backups of the files it touches and\n"
        "stamp.json, then write the target with one `git apply` of the whole series; a\n"
        f"failure restores the backups. Backups and stamp live in <package>/{STAMP_DIR}/.\n"
        "A target holding sglang/ gets the code only; a repository root the tests too.\n"
        'Applying the same series again is a no-op ("already applied").',
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="skip the supported-version check (only that)",
    )
    sp.add_argument(
        "--replace",
        action="store_true",
        help="if a DIFFERENT series is applied, revert it first (only after checking that this "
        "series applies to the upstream files); for set-up scripts that follow the series",
    )
    add(
        "revert",
        cmd_revert,
        "restore the upstream files byte-identically and remove the files the series created",
        "Restore every file the series changed from its backup, remove the files and\n"
        'directories it created, and remove the stamp. "not applied" (exit 0) if none.',
    )
    sp = add(
        "status",
        cmd_status,
        "show the sglang version and which series/patches are applied",
        "Show the sglang version, whether a series is applied (the current one or a\n"
        "different one) and which patches. --json prints an object with the keys target,\n"
        "sglang_version, applied, current, series_hash, patches (and a few more).",
    )
    sp.add_argument(
        "--json", action="store_true", help="print a JSON object for scripts"
    )
    sp = add(
        "import",
        cmd_import,
        "make DIR (a pristine tree) a git repo with one commit per patch",
        "DIR must hold a pristine sglang: sglang/ (moved to python/sglang/) or a repository\n"
        "root. It becomes a git repository (only python/sglang/ and test/ are tracked):\n"
        f"the pristine tree as one commit (tag upstream-<version>, branch\n"
        f"{UPSTREAM_BRANCH}), then `git am --3way --keep-non-patch` of every patch in series\n"
        "order (subjects keep tags like [AMD][VLM]). Edit with ordinary git, then export.\n"
        "A patch that does not apply stops with the patch and files named: resolve, git add,\n"
        "`git am --continue`, then export.",
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="import even if DIR is already inside a git work tree with commits",
    )
    add(
        "export",
        cmd_export,
        "write upstream..HEAD of an imported DIR back as patch files and series",
        "One patch per commit in upstream..HEAD (git format-patch --no-numbered --zero-commit\n"
        "--no-signature --no-stat), named after the subject (lowercase, '-' separated), and\n"
        "`series` rewritten in commit order; patch files dropped from the series are removed.\n"
        "A new file goes into the patch of the commit that adds it.",
    )
    sp = add(
        "rebase",
        cmd_rebase,
        "move an imported DIR onto a new release's pristine tree (3-way)",
        "Commit NEWTREE's pristine sglang as python/sglang/ (on top of the old upstream commit;\n"
        "the old test/ tree is kept unless NEWTREE is a repository root with one) as the new\n"
        f"upstream (tag upstream-<version>, branch {UPSTREAM_BRANCH}), then\n"
        "`git rebase --onto <new> <old upstream>`. A conflict stops with the patch and files\n"
        "named: resolve them, `git add`, `git rebase --continue`, then export and run\n"
        "`series.py check --force --target <pristine tree of the new release>`.",
    )
    sp.add_argument(
        "--onto",
        required=True,
        metavar="NEWTREE",
        help="directory holding the new pristine sglang, or a repository root of it",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SeriesError as exc:
        print(f"series.py: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("series.py: error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
