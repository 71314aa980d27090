"""Tests for scripts/series.py, the fork's patch-series tool.

The CLI is the product, so every test runs it as a subprocess. Pristine trees
come from the release wheels in .cache/wheels (scripts/setup_env.sh downloads
them); only sglang/version.py, sglang/_version.py and the upstream files the
series touches are extracted, which keeps every test fast.

The series targets sglang 0.5.23 only. The 0.5.22 wheel is still extracted
where a test needs a real release the tool must refuse (the series does not
apply there: it edits files 0.5.22 lacks); a newer release is simulated by a
0.5.23 tree with its version bumped.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=16, suite="stage-a-test-cpu")

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "series.py"
PATCHES = REPO / "patches"
WHEELS = REPO / ".cache" / "wheels"
VERSIONS = ("0.5.23",)  # the supported bases: series.py's SUPPORTED_BASES
UNSUPPORTED = "0.5.22"  # a real release the series does not target
NEWER = "0.5.24"  # a synthetic newer release: the 0.5.23 tree, version bumped
MM_SCHEDULE = "sglang/srt/managers/mm_schedule.py"
MM_UTILS = "sglang/srt/multimodal/mm_utils.py"
GIT_ID = ["-c", "user.name=Series Test", "-c", "user.email=series-test@example.invalid"]

pytestmark = pytest.mark.control(
    reason="the apply tool: it builds its own trees from the wheels, whatever sglang the venv imports"
)


# ---------------------------------------------------------------- helpers


def real_series_names() -> list[str]:
    lines = (PATCHES / "series").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


def _package_path(path: str) -> str | None:
    """A patch path (python/sglang/... or test/...) relative to the
    directory that holds sglang/: python/ goes; None for a test file."""
    if path.startswith("test/"):
        return None
    return path.removeprefix("python/")


def _diff_sections(series_dir: Path):
    """(path, creates) for every code file section of every patch, in series
    order; paths relative to the directory that holds sglang/."""
    names = [
        x.strip()
        for x in (series_dir / "series").read_text().splitlines()
        if x.strip() and not x.strip().startswith("#")
    ]
    for name in names:
        path = None
        for line in (series_dir / name).read_text().splitlines():
            m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
            if m:
                if path:
                    yield path, False
                path = _package_path(m.group(2))
            elif path and line.startswith("new file mode"):
                yield path, True
                path = None
        if path:
            yield path, False


def created_by(series_dir: Path) -> set[str]:
    """Files the series creates (the first patch that names them adds them)."""
    seen, out = set(), set()
    for path, creates in _diff_sections(series_dir):
        if path not in seen and creates:
            out.add(path)
        seen.add(path)
    return out


def series_test_files(series_dir: Path) -> set[str]:
    """The test files (test/...) the series' patches carry."""
    out = set()
    for name in real_series_names() if series_dir == PATCHES else []:
        for line in (series_dir / name).read_text().splitlines():
            m = re.match(r"^diff --git a/(test/\S+) b/\S+$", line)
            if m:
                out.add(m.group(1))
    return out


def touched_by(series_dir: Path) -> set[str]:
    """Upstream files the series changes (the files it creates left out)."""
    return {path for path, _ in _diff_sections(series_dir)} - created_by(series_dir)


def subject_of(patch: Path) -> str:
    """The Subject of a git-format patch, without "[PATCH] ", unfolded."""
    lines = patch.read_text().splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("Subject: "))
    subject = lines[i][len("Subject: ") :]
    for cont in lines[i + 1 :]:
        if not cont.startswith((" ", "\t")):
            break
        subject += " " + cont.strip()
    return subject.removeprefix("[PATCH] ")


# The gate, the live series' first patch that touches mm_schedule.py. The
# tests that break or extend the series build on it (it touches both files
# below).
GATE = next(
    n
    for n in real_series_names()
    if f"a/python/{MM_SCHEDULE} " in (PATCHES / n).read_text()
)


def wheel(version: str) -> Path:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    assert found, (
        f"missing the sglang {version} release wheel in {WHEELS}; run scripts/setup_env.sh "
        f"(it downloads sglang-0.5.22 and sglang-0.5.23 wheels there)"
    )
    return found[0]


@pytest.fixture(scope="session")
def pristine_cache(tmp_path_factory):
    """version -> a directory holding the extracted subset of the release.
    A supported release must hold every file the series touches; the
    unsupported one gets those it has."""
    members = {"sglang/version.py", "sglang/_version.py", MM_SCHEDULE, MM_UTILS}
    members |= touched_by(PATCHES)
    out = {}
    for version in (*VERSIONS, UNSUPPORTED):
        dest = tmp_path_factory.mktemp(f"pristine-{version}")
        with zipfile.ZipFile(wheel(version)) as zf:
            names = set(zf.namelist())
            for m in sorted(members):
                if version == UNSUPPORTED and m not in names:
                    continue
                assert m in names, f"{m} is not in the sglang {version} wheel"
                zf.extract(m, dest)
        out[version] = dest
    return out


@pytest.fixture
def pristine(pristine_cache, tmp_path):
    """Make a fresh, writable copy of a pristine subset tree."""

    def make(version: str, name: str | None = None) -> Path:
        dest = tmp_path / (name or f"v{version}")
        shutil.copytree(pristine_cache[version], dest)
        return dest

    return make


def newer_release(pristine, name: str, version: str = NEWER) -> Path:
    """A synthetic release newer than the supported one: the 0.5.23 tree
    with its version bumped, so the series applies but the tool does not
    know the version."""
    tree = pristine("0.5.23", name)
    for f in ("version.py", "_version.py"):
        p = tree / "sglang" / f
        p.write_text(p.read_text().replace("0.5.23", version))
    return tree


def run(*args, series_dir=None, env=None, cwd=None):
    cmd = [sys.executable, str(SCRIPT)]
    if series_dir is not None:
        cmd += ["--series-dir", str(series_dir)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        cmd + [str(a) for a in args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
    )


def git(cwd, *args, env=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, env=full_env
    )
    assert proc.returncode == 0, f"git {args} failed: {proc.stderr}"
    return proc.stdout


def snapshot(root: Path) -> dict:
    """Every file's bytes and every directory, by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = p.read_bytes() if p.is_file() else "<dir>"
    return out


def one_error_line(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert lines[0].startswith("series.py: error: "), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def copy_series(tmp_path, name="series") -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "series").write_bytes((PATCHES / "series").read_bytes())
    for n in real_series_names():
        shutil.copy2(PATCHES / n, d / n)
    return d


def make_patch(
    workdir: Path, rel: str, before: bytes | None, after: bytes, subject: str
) -> bytes:
    """A genuine git format-patch of one file change (made with git itself);
    before=None makes a patch that creates the file. rel is relative to the
    directory that holds sglang/; the patch names it python/<rel>, as the
    series' patches do."""
    return make_commit_patch(workdir, {f"python/{rel}": (before, after)}, subject)


def break_hunk(patch: bytes, number: int) -> bytes:
    """Replace the first context line of hunk #number so it no longer matches."""
    lines = patch.split(b"\n")
    seen = 0
    for i, line in enumerate(lines):
        if line.startswith(b"@@ "):
            seen += 1
            if seen == number:
                j = i + 1
                while not lines[j].startswith(b" "):
                    j += 1
                lines[j] = b" THIS CONTEXT LINE IS NOT UPSTREAM"
                return b"\n".join(lines)
    raise AssertionError(f"patch has no hunk #{number}")


def hunk_starts(patch: bytes) -> list[int]:
    """The old-file start line of each hunk header, in order."""
    return [int(m) for m in re.findall(rb"^@@ -(\d+)", patch, re.M)]


def edit_lines(data: bytes, numbers, suffix=b"  # fork") -> bytes:
    lines = data.split(b"\n")
    for n in numbers:
        lines[n - 1] = lines[n - 1] + suffix
    return b"\n".join(lines)


def one_patch_series(tmp_path, name: str, patches: dict[str, bytes]) -> Path:
    """A series directory holding the given patches, in that order."""
    d = tmp_path / name
    d.mkdir()
    for fname, data in patches.items():
        (d / fname).write_bytes(data)
    (d / "series").write_text("".join(f + "\n" for f in patches))
    return d


def assert_series_applied(tree: Path, before: dict):
    """Every upstream file the live series touches changed, every file it
    creates exists now and did not before."""
    after = snapshot(tree)
    for rel in touched_by(PATCHES):
        assert after[rel] != before[rel], f"{rel} was not patched"
    for rel in created_by(PATCHES):
        assert rel not in before and isinstance(
            after.get(rel), bytes
        ), f"{rel} was not created"


# ---------------------------------------------------------------- check / apply / revert


@pytest.mark.parametrize("version", VERSIONS)
def test_check_real_series_on_pristine(pristine, version):
    tree = pristine(version)
    before = snapshot(tree)
    r = run("check", "--target", tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        f"ok: {len(real_series_names())} patch(es) apply cleanly to sglang {version}"
        in r.stdout
    )
    assert snapshot(tree) == before, "check must never write to the target"
    # What check runs: one git apply of the concatenated series, the code
    # only (python/sglang/... -> sglang/..., test/... left out).
    series = b"".join((PATCHES / n).read_bytes() for n in real_series_names())
    proc = subprocess.run(
        ["git", "apply", "--check", "-p2", "--include=sglang/*"],
        input=series,
        cwd=tree,
        capture_output=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)},
    )
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_twice_then_revert_is_byte_identical(pristine, version):
    tree = pristine(version)
    before = snapshot(tree)
    assert created_by(
        PATCHES
    ), "the live series creates new modules; this test covers them"
    r = run("apply", "--target", tree)
    assert r.returncode == 0, r.stderr
    assert_series_applied(tree, before)
    assert any(
        b"def hip_dp_encoder_batches_vit" in (tree / rel).read_bytes()
        for rel in touched_by(PATCHES) | created_by(PATCHES)
    )
    assert (tree / "sglang" / ".fork-series" / "stamp.json").is_file()
    after = snapshot(tree)

    r = run("apply", "--target", tree)
    assert r.returncode == 0, r.stderr
    assert "already applied" in r.stdout
    assert snapshot(tree) == after, "second apply must be a no-op"

    r = run("status", "--target", tree, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert {
        "target",
        "sglang_version",
        "applied",
        "current",
        "series_hash",
        "patches",
    } <= set(st)
    assert st["sglang_version"] == version
    assert st["applied"] is True and st["current"] is True
    assert st["patches"] == real_series_names()
    assert re.fullmatch(r"[0-9a-f]{64}", st["series_hash"])

    r = run("revert", "--target", tree)
    assert r.returncode == 0, r.stderr
    assert (
        snapshot(tree) == before
    ), "revert must restore every byte and leave no extra files"
    r = run("revert", "--target", tree)
    assert r.returncode == 0 and "not applied" in r.stdout
    st = json.loads(run("status", "--target", tree, "--json").stdout)
    assert st["applied"] is False and st["patches"] == []


def test_failing_hunk_leaves_tree_untouched_and_check_names_it(pristine, tmp_path):
    tree = pristine("0.5.23")
    series = copy_series(tmp_path)
    utils = (tree / MM_UTILS).read_bytes()
    # Patch 2: two hunks on lines the gate patch leaves alone; hunk #2 broken.
    good = make_patch(
        tmp_path / "mk2", MM_UTILS, utils, edit_lines(utils, [12, 300]), "Second change"
    )
    second = break_hunk(good, 2)
    (series / "second-change.patch").write_bytes(second)
    # Patch 3: fails too, on another file, so check must report both.
    version_py = (tree / "sglang" / "version.py").read_bytes()
    third = make_patch(
        tmp_path / "mk3",
        "sglang/version.py",
        version_py,
        edit_lines(version_py, [3]),
        "Third change",
    )
    third = break_hunk(third, 1)
    (series / "third-change.patch").write_bytes(third)
    (series / "series").write_text(f"{GATE}\nsecond-change.patch\nthird-change.patch\n")
    before = snapshot(tree)

    r = run("check", "--target", tree, series_dir=series)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [x for x in r.stdout.splitlines() if x.startswith("FAILED")]
    assert len(failed) == 2, r.stdout
    # git's own words name the failing hunk by the line its header starts at.
    hunk1, hunk2 = hunk_starts(second)
    assert failed[0].startswith("FAILED second-change.patch: ")
    assert f"patch failed: {MM_UTILS}:{hunk2}" in failed[0], failed[0]
    assert (
        f"{MM_UTILS}:{hunk1}" not in failed[0]
    ), "hunk #1 of patch 2 applies and must not be reported"
    assert failed[1].startswith("FAILED third-change.patch: ")
    assert f"patch failed: sglang/version.py:{hunk_starts(third)[0]}" in failed[1]
    assert GATE not in r.stdout.replace("FAILED", "")
    assert snapshot(tree) == before

    r = run("apply", "--target", tree, series_dir=series)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("series.py: error: ")
    assert "target left unchanged" in r.stderr
    assert snapshot(tree) == before, "a failed apply must leave the tree byte-identical"


def test_refuses_non_sglang_dir(tmp_path):
    empty = tmp_path / "not-sglang"
    (empty / "sglang").mkdir(parents=True)  # a package dir without version.py
    for cmd in ("apply", "check", "status", "revert"):
        r = run(cmd, "--target", empty)
        assert r.returncode == 2, (cmd, r.stderr)
        one_error_line(r, "holds no sglang package")
    assert sorted(p.name for p in empty.rglob("*")) == ["sglang"]


def test_bad_command_lines_get_one_error_line(pristine):
    tree = pristine("0.5.23")
    before = snapshot(tree)
    r = run("apply")
    assert r.returncode == 2
    one_error_line(r, "--target")
    r = run("frobnicate", "--target", tree)
    assert r.returncode == 2
    one_error_line(r, "frobnicate")
    r = run(f"--no-such-option={tree}", "apply", "--target", tree)
    assert r.returncode == 2
    one_error_line(r, "--no-such-option")
    assert snapshot(tree) == before


def test_refuses_unsupported_version_and_force_passes(pristine):
    tree = pristine("0.5.23")
    (tree / "sglang" / "version.py").write_text('__version__ = "0.5.10"\n')
    before = snapshot(tree)
    r = run("apply", "--target", tree)
    assert r.returncode == 2
    one_error_line(r, "sglang 0.5.10", "is not a supported base", "--force")
    assert snapshot(tree) == before
    r = run("apply", "--force", "--target", tree)
    assert r.returncode == 0, r.stderr
    st = json.loads(run("status", "--target", tree, "--json").stdout)
    assert st["sglang_version"] == "0.5.10" and st["applied"] is True
    assert run("revert", "--target", tree).returncode == 0
    assert snapshot(tree) == before


def test_a_git_checkout_reads_its_version_from_the_release_tag(pristine, tmp_path):
    """A clone of SGLang has no _version.py and a version.py that computes the
    version at import: the tool reads the vX.Y.Z tag on HEAD, through python/
    and through the root; off the tag the version is unknown again."""
    checkout = tmp_path / "sglang"
    checkout.mkdir()
    shutil.move(pristine("0.5.23", "pkg"), checkout / "python")
    (checkout / "python" / "sglang" / "_version.py").unlink()
    (checkout / "test").mkdir()
    (checkout / "test" / "README").write_text("upstream tests\n")
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "release")
    git(checkout, "tag", "v0.5.23")
    git(checkout, "tag", "gateway-v1.0.0")  # another tag on the same commit
    before = snapshot(checkout / "python")

    for target in (checkout / "python", checkout):
        st = json.loads(run("status", "--target", target, "--json").stdout)
        assert st["sglang_version"] == "0.5.23" and st["supported_base"] is True
        r = run("apply", "--target", target)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "to sglang 0.5.23" in r.stdout
        assert run("revert", "--target", target).returncode == 0
        assert snapshot(checkout / "python") == before

    git(checkout, "tag", "-d", "v0.5.23")
    git(checkout, "tag", "v0.5.24")
    r = run("apply", "--target", checkout / "python")
    assert r.returncode == 2
    one_error_line(r, "sglang 0.5.24", "is not a supported base")
    git(checkout, "commit", "-q", "--allow-empty", "-m", "past the tag")
    r = run("check", "--target", checkout)
    assert r.returncode == 2
    one_error_line(r, "sglang of unknown version", "is not a supported base")
    assert (
        snapshot(checkout / "python") == before
    ), "a refused apply or check writes nothing"


def test_check_refuses_an_unsupported_real_release_and_force_checks(pristine):
    """check on the real 0.5.22 tree: one line naming 0.5.22 and the supported
    0.5.23, exit 2, nothing written; --force runs the check, which fails
    there (the series edits files 0.5.22 lacks)."""
    tree = pristine(UNSUPPORTED)
    before = snapshot(tree)
    r = run("check", "--target", tree)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_error_line(
        r,
        f"sglang {UNSUPPORTED} in {tree}",
        "is not a supported base",
        f"(supported: {', '.join(VERSIONS)})",
        "--force to check anyway",
    )
    assert "0.5.23" in line and r.stdout == ""
    assert snapshot(tree) == before, "a refused check writes nothing"

    r = run("check", "--force", "--target", tree)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed, r.stdout
    assert "is not a supported base" not in r.stderr
    assert f"do not apply to sglang {UNSUPPORTED}" in r.stderr
    assert snapshot(tree) == before, "check must never write to the target"


def test_refuses_a_different_series(pristine, tmp_path):
    tree = pristine("0.5.23")
    pristine_state = snapshot(tree)
    assert run("apply", "--target", tree).returncode == 0
    applied = snapshot(tree)
    other = copy_series(tmp_path, "other")
    with open(other / "series", "a") as f:
        f.write("# a comment changes the series hash\n")
    r = run("apply", "--target", tree, series_dir=other)
    assert r.returncode == 2
    one_error_line(r, "a different series", "series.py revert")
    assert snapshot(tree) == applied
    st = json.loads(run("status", "--target", tree, "--json", series_dir=other).stdout)
    assert st["applied"] is True and st["current"] is False
    # check runs the other series on a copy of the upstream files: the backups, with
    # the modules the applied series created counted as absent.
    r = run("check", "--target", tree, series_dir=other)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checking against its upstream backups" in r.stdout
    assert snapshot(tree) == applied

    # --replace (for set-up scripts): revert the old series, apply the new one.
    # Both create the same new modules: the old copies must not count as upstream.
    r = run("apply", "--replace", "--target", tree, series_dir=other)
    assert r.returncode == 0, r.stderr
    st = json.loads(run("status", "--target", tree, "--json", series_dir=other).stdout)
    assert st["applied"] is True and st["current"] is True
    assert snapshot(tree) != applied  # the stamp records the new hash
    assert run("revert", "--target", tree).returncode == 0
    assert snapshot(tree) == pristine_state


NEW_MOD = "sglang/srt/fork_extra/new_mod.py"


def test_new_files_are_created_and_removed(pristine, tmp_path):
    tree = pristine("0.5.23")
    series = one_patch_series(
        tmp_path,
        "adds",
        {
            "add-new-mod.patch": make_patch(
                tmp_path / "mk", NEW_MOD, None, b"VALUE = 42\n", "Add new_mod"
            ),
        },
    )
    before = snapshot(tree)

    r = run("apply", "--target", tree, series_dir=series)
    assert r.returncode == 0, r.stderr
    dest = tree / "sglang" / "srt" / "fork_extra"
    assert sorted(p.name for p in dest.iterdir()) == ["new_mod.py"]
    assert (tree / NEW_MOD).read_bytes() == b"VALUE = 42\n"
    st = json.loads(run("status", "--target", tree, "--json", series_dir=series).stdout)
    assert st["current"] is True
    # Python caches the module it imported: revert removes that too.
    (dest / "__pycache__").mkdir()
    (dest / "__pycache__" / "new_mod.cpython-311.pyc").write_bytes(b"\0junk")

    r = run("revert", "--target", tree)
    assert r.returncode == 0, r.stderr
    assert (
        snapshot(tree) == before
    ), "revert must remove the new files and the dirs it created"

    # A different file already at that path: check names it, apply refuses.
    dest.mkdir()
    (tree / NEW_MOD).write_bytes(b"VALUE = 'someone else'\n")
    before = snapshot(tree)
    r = run("check", "--target", tree, series_dir=series)
    assert r.returncode == 1
    assert f"FAILED add-new-mod.patch: {NEW_MOD}: already exists" in r.stdout
    r = run("apply", "--target", tree, series_dir=series)
    assert r.returncode == 2
    assert "target left unchanged" in r.stderr
    assert snapshot(tree) == before


def test_failure_while_writing_rolls_back(pristine):
    tree = pristine("0.5.23")
    before = snapshot(tree)
    # Fault injection: raises after git apply wrote every patched and new file.
    r = run("apply", "--target", tree, env={"SERIES_PY_TEST_FAIL_AFTER_APPLY": "1"})
    assert r.returncode == 2
    one_error_line(
        r, "injected failure after git apply wrote the target", "rolled back"
    )
    assert snapshot(tree) == before
    r = run("apply", "--target", tree)
    assert r.returncode == 0, r.stderr


def test_target_and_tmpdir_inside_a_git_checkout(pristine, tmp_path):
    """Like /sgl-workspace/sglang/python in the ROCm image: git apply must not
    resolve paths against the enclosing repository (it would silently skip them)."""
    outer = tmp_path / "checkout"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "README").write_text("outer\n")
    git(outer, "add", "README")
    git(outer, "commit", "-q", "-m", "outer")
    tree = outer / "python"
    shutil.copytree(pristine("0.5.23"), tree)
    tmpdir = outer / "tmp"
    tmpdir.mkdir()
    env = {"TMPDIR": str(tmpdir)}
    before = snapshot(tree)
    r = run("check", "--target", tree, env=env, cwd=outer)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("apply", "--target", tree, env=env, cwd=tree)
    assert r.returncode == 0, r.stderr
    assert_series_applied(tree, before)
    assert run("revert", "--target", tree, env=env).returncode == 0
    assert snapshot(tree) == before


# ---------------------------------------------------------------- import / export / rebase


def test_import_export_round_trip_and_edit_loop(pristine, tmp_path):
    series = copy_series(tmp_path)
    original = snapshot(series)
    work = pristine("0.5.23", "work")

    r = run("import", "--target", work, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert "export" in r.stdout and "--autosquash" in r.stdout
    subjects = git(
        work, "log", "--reverse", "--format=%s", "upstream..HEAD"
    ).splitlines()
    assert subjects == [subject_of(series / n) for n in real_series_names()]
    assert git(work, "rev-parse", "upstream") == git(
        work, "rev-parse", "upstream-0.5.23^{commit}"
    )
    assert git(work, "status", "--porcelain") == ""
    # SGLang's repository layout: the package under python/, a test/ tree beside it.
    assert not (work / "sglang").exists() and (work / "test").is_dir()
    for rel in created_by(PATCHES):
        assert (
            work / "python" / rel
        ).is_file(), f"{rel} must be committed by the patch that creates it"

    r = run("export", "--target", work, series_dir=series)
    assert r.returncode == 0, r.stderr
    exported = snapshot(series)
    assert sorted(exported) == sorted(original)
    for name in real_series_names():
        assert exported[name] == original[name], name
    r = run("export", "--target", work, series_dir=series)
    assert (
        r.returncode == 0 and snapshot(series) == exported
    ), "export twice writes the same bytes"

    # The loop: amend the gate patch with a fixup, add a patch with a new module.
    gate = git(
        work,
        "log",
        "--format=%H",
        "-1",
        f"--grep={subject_of(series / GATE)}",
        "--fixed-strings",
    ).strip()
    p = work / "python" / MM_UTILS
    # At the top: no patch of the series touches the file's first lines.
    p.write_text("# fixed up\n" + p.read_text())
    git(work, "commit", "-q", f"--fixup={gate}", "--", f"python/{MM_UTILS}")
    git(
        work,
        "rebase",
        "-q",
        "-i",
        "--autosquash",
        "upstream",
        env={"GIT_SEQUENCE_EDITOR": "true"},
    )
    v = work / "python" / "sglang" / "version.py"
    v.write_text(
        v.read_text() + "from sglang.srt.fork_extra.helper import helper  # noqa\n"
    )
    helper = work / "python" / "sglang" / "srt" / "fork_extra" / "helper.py"
    helper.parent.mkdir()
    helper.write_text("def helper():\n    return 2\n")
    git(
        work,
        "add",
        "python/sglang/version.py",
        "python/sglang/srt/fork_extra/helper.py",
    )
    git(work, "commit", "-q", "-m", "[ROCm] Import a helper in the version file")

    r = run("export", "--target", work, series_dir=series)
    assert r.returncode == 0, r.stderr
    names = (series / "series").read_text().splitlines()
    new_patch = (series / names[-1]).read_bytes()
    assert names == real_series_names() + [
        "rocm-import-a-helper-in-the-version-file.patch"
    ]
    assert (series / GATE).read_bytes() != exported[GATE]
    assert b"+# fixed up" in (series / GATE).read_bytes()
    assert b"Subject: [PATCH] [ROCm] Import a helper in the version file" in new_patch
    assert b"new file mode 100644" in new_patch and b"+    return 2" in new_patch
    assert b"+from sglang.srt.fork_extra.helper import helper" in new_patch

    # The exported series applies to a fresh pristine tree, new module included.
    fresh = pristine("0.5.23", "fresh")
    r = run("check", "--target", fresh, series_dir=series)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("apply", "--target", fresh, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert (
        fresh / "sglang" / "srt" / "fork_extra" / "helper.py"
    ).read_text() == helper.read_text()

    # An empty commit would be an empty patch: refused, nothing written.
    git(work, "commit", "-q", "--allow-empty", "-m", "Nothing")
    exported = snapshot(series)
    r = run("export", "--target", work, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, "Nothing", "changes nothing")
    assert snapshot(series) == exported

    # Dropping commits drops their patch files.
    git(work, "reset", "-q", "--hard", "HEAD~2")
    r = run("export", "--target", work, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert (series / "series").read_text().splitlines() == real_series_names()
    assert not (series / "rocm-import-a-helper-in-the-version-file.patch").exists()
    assert sorted(p.name for p in series.iterdir()) == sorted(original)


def test_import_refuses_existing_repo_and_names_conflicting_patch(pristine, tmp_path):
    series = copy_series(tmp_path)
    work = pristine("0.5.23", "repo")
    git(work, "init", "-q")
    git(work, "add", "sglang/version.py")
    git(work, "commit", "-q", "-m", "someone's repo")
    r = run("import", "--target", work, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, "already inside a git work tree", "--force")

    # A tree where a patched line changed: git am stops and says how to go on.
    changed = pristine("0.5.23", "changed")
    p = changed / MM_SCHEDULE
    p.write_text(
        p.read_text().replace(
            "from sglang.srt.utils import is_hip, is_npu, is_xpu",
            "from sglang.srt.utils import is_hip, is_npu, is_xpu, is_cuda",
        )
    )
    r = run("import", "--target", changed, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, GATE, MM_SCHEDULE, "am --continue", "export")


def test_rebase_onto_new_release(pristine, tmp_path):
    series = copy_series(tmp_path)
    work = pristine("0.5.23", "work")
    assert run("import", "--target", work, series_dir=series).returncode == 0

    # Clean rebase onto a newer release, export, and the result applies there:
    # check refuses the version it does not know until --force.
    r = run(
        "rebase",
        "--target",
        work,
        "--onto",
        newer_release(pristine, "newer-clean"),
        series_dir=series,
    )
    assert r.returncode == 0, r.stderr
    assert f"check --force --target <a pristine sglang {NEWER} tree>" in r.stdout
    assert git(work, "rev-parse", "upstream") == git(
        work, "rev-parse", f"upstream-{NEWER}^{{commit}}"
    )
    assert run("export", "--target", work, series_dir=series).returncode == 0
    fresh = newer_release(pristine, "fresh-newer")
    before = snapshot(fresh)
    r = run("check", "--target", fresh, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, f"sglang {NEWER}", "is not a supported base", "--force")
    r = run("check", "--force", "--target", fresh, series_dir=series)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        f"ok: {len(real_series_names())} patch(es) apply cleanly to sglang {NEWER}"
        in r.stdout
    )
    assert snapshot(fresh) == before

    # A "release" where a line the patch changes was changed: stop, name patch + file.
    newer = pristine("0.5.23", "newer")
    (newer / "sglang" / "version.py").write_text('__version__ = "0.5.24"\n')
    p = newer / MM_SCHEDULE
    p.write_text(
        p.read_text().replace(
            "from sglang.srt.utils import is_hip, is_npu, is_xpu",
            "from sglang.srt.utils import is_hip, is_npu, is_xpu, is_cuda",
        )
    )
    r = run("rebase", "--target", work, "--onto", newer, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, "0.5.24", GATE, MM_SCHEDULE, "rebase --continue", "export")
    assert (work / ".git" / "rebase-merge").exists()
    # Export refuses while the rebase is unfinished.
    r = run("export", "--target", work, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, "in progress")


# ---------------------------------------------------------------- layouts: package dirs and repository roots

EXISTING_TEST = "test/registered/unit/test_upstream_example.py"
EXISTING_TEST_BYTES = b"def test_upstream():\n    assert 1 + 1 == 2\n"
NEW_TEST = "test/registered/unit/test_fork_new_mod.py"
NEW_MOD_REPO = "python/" + NEW_MOD
LAYOUTS = ("site-packages", "python-dir", "repo-root")


def make_commit_patch(workdir: Path, changes: dict, subject: str) -> bytes:
    """A git format-patch of one commit changing several files; changes maps
    a path to (before, after), before=None for a file the commit creates."""
    workdir.mkdir(parents=True)
    git(workdir, "init", "-q")
    git(workdir, "commit", "-q", "--allow-empty", "-m", "base")
    for rel, (before, _) in changes.items():
        if before is not None:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).write_bytes(before)
            git(workdir, "add", rel)
    git(workdir, "commit", "-q", "--allow-empty", "-m", "upstream")
    for rel, (_, after) in changes.items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_bytes(after)
        git(workdir, "add", rel)
    git(workdir, "commit", "-q", "-m", subject)
    return subprocess.run(
        [
            "git",
            "format-patch",
            "--stdout",
            "-1",
            "--no-numbered",
            "--zero-commit",
            "--no-signature",
            "--no-stat",
        ],
        cwd=workdir,
        capture_output=True,
        check=True,
    ).stdout


def series_with_tests(tmp_path, with_upstream_test_edit=True) -> Path:
    """The live series, plus a patch that adds a module and its test, and
    (optionally) one that edits an upstream test."""
    d = copy_series(tmp_path, "with-tests")
    names = real_series_names()
    (d / "add-new-mod-and-its-test.patch").write_bytes(
        make_commit_patch(
            tmp_path / "mk-mod",
            {
                NEW_MOD_REPO: (None, b"VALUE = 42\n"),
                NEW_TEST: (
                    None,
                    b"from sglang.srt.fork_extra.new_mod import VALUE\n\n\n"
                    b"def test_value():\n    assert VALUE == 42\n",
                ),
            },
            "Add new_mod and its test",
        )
    )
    names.append("add-new-mod-and-its-test.patch")
    if with_upstream_test_edit:
        (d / "extend-an-upstream-test.patch").write_bytes(
            make_commit_patch(
                tmp_path / "mk-test",
                {
                    EXISTING_TEST: (
                        EXISTING_TEST_BYTES,
                        EXISTING_TEST_BYTES + b"    assert 2 + 2 == 4\n",
                    ),
                },
                "Extend an upstream test",
            )
        )
        names.append("extend-an-upstream-test.patch")
    (d / "series").write_text("".join(n + "\n" for n in names))
    return d


def make_layout(pristine, tmp_path, layout: str) -> tuple[Path, Path, Path]:
    """(the tree to snapshot, --target, the directory holding sglang/)."""
    pkg = pristine("0.5.23", "pkg")
    if layout == "site-packages":
        meta = pkg / "sglang-0.5.23.dist-info" / "METADATA"
        meta.parent.mkdir()
        meta.write_text("Name: sglang\nVersion: 0.5.23\n")
        return pkg, pkg, pkg
    checkout = tmp_path / "checkout"
    shutil.move(pkg, checkout / "python")
    (checkout / EXISTING_TEST).parent.mkdir(parents=True)
    (checkout / EXISTING_TEST).write_bytes(EXISTING_TEST_BYTES)
    if layout == "python-dir":  # the ROCm image's /sgl-workspace/sglang/python
        return checkout, checkout / "python", checkout / "python"
    return checkout, checkout, checkout / "python"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_applies_and_reverts_byte_identically(pristine, tmp_path, layout):
    series = series_with_tests(tmp_path)
    root, target, code = make_layout(pristine, tmp_path, layout)
    before = snapshot(root)
    code_before = snapshot(code)
    n = len(real_series_names()) + 2
    n_tests = len(series_test_files(PATCHES)) + 2  # the live series' and the two added
    skipped = f"{n_tests} test file(s) not applied: this target has no test/ tree"

    r = run("check", "--target", target, series_dir=series)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: {n} patch(es) apply cleanly to sglang 0.5.23" in r.stdout
    assert snapshot(root) == before

    r = run("apply", "--target", target, series_dir=series)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_series_applied(code, code_before)
    assert (code / NEW_MOD).read_bytes() == b"VALUE = 42\n"
    stamp = json.loads((code / "sglang" / ".fork-series" / "stamp.json").read_text())
    stamped = {e["path"] for e in stamp["files"]}
    st = json.loads(
        run("status", "--target", target, "--json", series_dir=series).stdout
    )
    assert (
        st["applied"] is True
        and st["current"] is True
        and st["sglang_version"] == "0.5.23"
    )
    after = snapshot(root)
    if layout == "repo-root":
        assert skipped not in r.stdout and st["layout"] == "repository"
        assert st["test_files_not_applied"] == 0
        assert stamp["layout"] == "repository"
        assert {NEW_TEST, EXISTING_TEST, NEW_MOD_REPO} <= stamped
        assert (
            root / EXISTING_TEST
        ).read_bytes() == EXISTING_TEST_BYTES + b"    assert 2 + 2 == 4\n"
        assert b"assert VALUE == 42" in (root / NEW_TEST).read_bytes()
    else:
        assert r.stdout.count(skipped) == 1, r.stdout
        assert st["layout"] == "package" and st["test_files_not_applied"] == n_tests
        assert (
            "layout" not in stamp
        ), "a package target's stamp is the one the tool always wrote"
        assert NEW_MOD in stamped and not any(p.startswith("test/") for p in stamped)
        # No test file anywhere: not in site-packages, not in the checkout's test/ beside python/.
        assert {k: v for k, v in after.items() if "test/" in k or k == "test"} == {
            k: v for k, v in before.items() if "test/" in k or k == "test"
        }
        human = run("status", "--target", target, series_dir=series).stdout
        assert human.count(skipped) == 1, human

    r = run("apply", "--target", target, series_dir=series)
    assert r.returncode == 0 and "already applied" in r.stdout
    assert snapshot(root) == after

    r = run("revert", "--target", target)
    assert r.returncode == 0, r.stderr
    assert (
        snapshot(root) == before
    ), "revert must restore every byte and leave no extra files"


def test_a_checkout_applied_through_python_reverts_or_moves_through_its_root(
    pristine, tmp_path
):
    """A checkout applied through python/ (a package stamp, paths relative to
    python/) reverts through python/ or through the repository root, and the
    root refuses the same series in its other layout until --replace."""
    root, _, code = make_layout(pristine, tmp_path, "python-dir")
    before = snapshot(root)
    r = run("apply", "--target", code)
    assert r.returncode == 0, r.stdout + r.stderr
    stamp = json.loads((code / "sglang" / ".fork-series" / "stamp.json").read_text())
    assert "layout" not in stamp
    applied = snapshot(root)

    # The same series, seen from the root: applied, not current, refused.
    st = json.loads(run("status", "--target", root, "--json").stdout)
    assert st["applied"] is True and st["current"] is False
    assert st["layout"] == "repository"
    r = run("apply", "--target", root)
    assert r.returncode == 2
    one_error_line(r, "as a package target", "series.py revert")
    assert snapshot(root) == applied

    # Reverted through python/ or through the repository root: byte-identical.
    for name, via in (("via-python", "python"), ("via-root", "")):
        copy = tmp_path / name
        shutil.copytree(root, copy, symlinks=True)
        r = run("revert", "--target", copy / via)
        assert r.returncode == 0, r.stderr
        assert snapshot(copy) == before, name

    # Replaced by the series with tests, at the repository root.
    series = series_with_tests(tmp_path)
    r = run("apply", "--target", root, series_dir=series)
    assert r.returncode == 2
    one_error_line(r, "a different series", "series.py revert")
    assert snapshot(root) == applied
    r = run("apply", "--replace", "--target", root, series_dir=series)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / NEW_TEST).is_file() and (code / NEW_MOD).is_file()
    assert run("revert", "--target", code).returncode == 0
    assert snapshot(root) == before


def test_refuses_a_target_that_is_none_of_the_layouts(pristine, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_tests = tmp_path / "no-tests"  # python/sglang/ without test/ beside it
    shutil.move(pristine("0.5.23"), no_tests / "python")
    for target, needle in (
        (empty, "holds no sglang package"),
        (no_tests, "no test/ tree"),
    ):
        before = snapshot(target)
        for cmd in ("check", "apply", "status", "revert"):
            r = run(cmd, "--target", target)
            assert r.returncode == 2, (cmd, r.stderr)
            one_error_line(r, needle, str(target))
        assert snapshot(target) == before


@pytest.mark.parametrize(
    "outside",
    [
        "docs/notes.md",
        "python/pyproject.toml",
        "sgl-kernel/setup.py",
        "sglang/srt/fork_extra/other.py",  # relative to python/: not a repository path
    ],
)
def test_refuses_a_series_with_a_path_outside_python_and_test(
    pristine, tmp_path, outside
):
    series = one_patch_series(
        tmp_path,
        "outside",
        {
            "touch-outside.patch": make_commit_patch(
                tmp_path / "mk",
                {
                    NEW_MOD_REPO: (None, b"VALUE = 1\n"),
                    outside: (None, b"outside\n"),
                },
                "Touch a file outside",
            ),
        },
    )
    pkg = pristine("0.5.23", "site-packages")
    root, repo_target, _ = make_layout(pristine, tmp_path, "repo-root")
    for target, top in ((pkg, pkg), (repo_target, root)):
        before = snapshot(top)
        for cmd in ("check", "apply", "status", "import"):
            r = run(cmd, "--target", target, series_dir=series)
            assert r.returncode == 2, (cmd, r.stdout, r.stderr)
            one_error_line(
                r,
                "touch-outside.patch",
                repr(outside),
                "outside python/sglang/ and test/",
            )
        assert (
            snapshot(top) == before
        ), "nothing may be written (import neither moves nor git-inits)"


def test_refuses_a_test_path_that_minus_p2_maps_into_the_package(pristine, tmp_path):
    """A package target gets git apply -p2 --include='sglang/*': test/sglang/x
    would become sglang/x, so such a path is refused, as is a file that holds
    no git diff."""
    bad = one_patch_series(
        tmp_path,
        "test-sglang",
        {
            "test-under-sglang.patch": make_commit_patch(
                tmp_path / "mk", {"test/sglang/conftest.py": (None, b"X = 1\n")}, "T"
            ),
        },
    )
    not_a_patch = one_patch_series(
        tmp_path, "prose", {"notes.patch": b"Subject: not a diff\n\nprose\n"}
    )
    tree = pristine("0.5.23")
    before = snapshot(tree)
    for series, needles in (
        (bad, ("test-under-sglang.patch", "'test/sglang/conftest.py'", "package")),
        (not_a_patch, ("notes.patch", "not a git-format patch")),
    ):
        for cmd in ("check", "apply", "status", "import"):
            r = run(cmd, "--target", tree, series_dir=series)
            assert r.returncode == 2, (cmd, r.stdout, r.stderr)
            one_error_line(r, *needles)
    assert snapshot(tree) == before


def test_repository_form_round_trip_and_git_am_without_flags(pristine, tmp_path):
    # import -> export of a repository-form series is byte-identical, tests included.
    series = series_with_tests(tmp_path)
    original = snapshot(series)
    root, _, _ = make_layout(pristine, tmp_path, "repo-root")
    r = run("import", "--target", root, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert sorted(git(root, "ls-files", "test").split()) == sorted(
        [EXISTING_TEST, NEW_TEST, *series_test_files(PATCHES)]
    )
    # The repository root's own tests are part of the pristine upstream commit.
    assert git(
        root, "ls-tree", "-r", "--name-only", "upstream", "--", "test"
    ).split() == [EXISTING_TEST]

    r = run("export", "--target", root, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert snapshot(series) == original

    # Plain `git am`, no flags, in series order, on a repository whose
    # python/sglang/ is the release wheel's sglang/.
    am_series = series_with_tests(tmp_path / "am", with_upstream_test_edit=False)
    fresh = tmp_path / "fresh"
    shutil.move(pristine("0.5.23", "wheel"), fresh / "python")
    git(fresh, "init", "-q")
    git(fresh, "add", "python")
    git(fresh, "commit", "-q", "-m", "sglang 0.5.23")
    names = (am_series / "series").read_text().split()
    proc = subprocess.run(
        ["git", *GIT_ID, "am", *[str(am_series / n) for n in names]],
        cwd=fresh,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git(fresh, "status", "--porcelain") == ""
    assert git(fresh, "log", "--format=%s", "-1").strip() == "Add new_mod and its test"
    assert (fresh / NEW_TEST).is_file()

    # The same code as series.py apply gives a package directory.
    applied = pristine("0.5.23", "applied")
    assert run("apply", "--target", applied, series_dir=am_series).returncode == 0
    for rel in touched_by(PATCHES) | created_by(PATCHES) | {NEW_MOD}:
        assert (fresh / "python" / rel).read_bytes() == (
            applied / rel
        ).read_bytes(), rel


def test_import_leaves_an_installation_alone(pristine, tmp_path):
    """import moves sglang/ to python/sglang/: refused where sglang/ has
    neighbours other than its dist-info (an installation's site-packages)."""
    site = pristine("0.5.23", "site-packages")
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("")
    before = snapshot(site)
    r = run("import", "--target", site, series_dir=copy_series(tmp_path))
    assert r.returncode == 2
    one_error_line(r, "numpy", "scratch copy")
    assert snapshot(site) == before


def test_rebase_keeps_or_takes_the_upstream_tests(pristine, tmp_path):
    """rebase --onto a directory holding sglang/ (a wheel has no tests) keeps
    the old upstream's test/ tree; onto a repository root, its test/ is the
    new upstream's."""
    series = one_patch_series(
        tmp_path,
        "tiny",
        {
            "add-new-mod-and-its-test.patch": make_commit_patch(
                tmp_path / "mk",
                {
                    NEW_MOD_REPO: (None, b"VALUE = 42\n"),
                    NEW_TEST: (None, b"def test_value():\n    pass\n"),
                },
                "Add new_mod and its test",
            ),
        },
    )
    original = snapshot(series)
    root, _, _ = make_layout(pristine, tmp_path, "repo-root")
    assert run("import", "--target", root, series_dir=series).returncode == 0

    r = run(
        "rebase",
        "--target",
        root,
        "--onto",
        newer_release(pristine, "newer-wheel"),
        series_dir=series,
    )
    assert r.returncode == 0, r.stderr
    assert git(
        root, "ls-tree", "-r", "--name-only", "upstream", "--", "test"
    ).split() == [EXISTING_TEST]
    assert git(root, "rev-parse", "upstream") == git(
        root, "rev-parse", f"upstream-{NEWER}^{{commit}}"
    )
    assert run("export", "--target", root, series_dir=series).returncode == 0
    assert snapshot(series) == original

    newer = tmp_path / "newer"
    shutil.move(pristine("0.5.23", "newer-pkg"), newer / "python")
    (newer / EXISTING_TEST).parent.mkdir(parents=True)
    (newer / EXISTING_TEST).write_bytes(EXISTING_TEST_BYTES + b"# changed upstream\n")
    r = run("rebase", "--target", root, "--onto", newer, series_dir=series)
    assert r.returncode == 0, r.stderr
    assert git(root, "show", f"upstream:{EXISTING_TEST}").endswith(
        "# changed upstream\n"
    )
    assert (root / NEW_TEST).is_file() and (root / "python" / NEW_MOD).is_file()
