"""scripts/lint_series.py: the series' lines pass SGLang's black, isort and ruff.

The first test runs the script as documented, on trees it builds from the
0.5.23 wheel with the current series applied: it fails (naming the files and
lines) whenever a patch adds a line that black 24.10.0 (through darker),
isort 5.13.2 (profile black) or ruff 0.11.7 (F401, F821) (through graylint)
would reject. The others prove the check can fail and judges only the
series' lines: a temporary copy of the patched tree gets one deliberately bad
added line (mis-formatted, out of import order, an unused import) in a file
the series modifies or creates, and a pristine line that black would
reformat stays unjudged; and the script refuses linters at other versions
than requirements/lint.txt pins.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=29, suite="stage-a-test-cpu")

import shutil
import subprocess
import sys
from pathlib import Path

import lint_series as L
import pytest

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "lint_series.py"
MODIFIED = (
    "sglang/srt/managers/mm_schedule.py"  # pristine upstream file the series edits
)
CREATED = "sglang/srt/multimodal/vit_batching.py"  # a module the series adds

pytestmark = pytest.mark.control(
    reason="the series lint: it builds its own trees from the wheel, whatever sglang the venv imports"
)


def test_current_series_passes_sglang_lint():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "-v"], capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    verdicts = [
        ln for ln in proc.stdout.splitlines() if ln.startswith(("ok ", "FAIL "))
    ]
    # one verdict per Python file of the series, the new modules among them,
    # then one per test file the patches carry, each a new file judged whole
    tests = L.series_files(tests=True)
    assert len(verdicts) == len(L.series_files()) + len(tests), out
    assert len(L.series_files()) >= 2 and tests, out
    assert all(v.startswith("ok ") for v in verdicts), out
    assert any(CREATED in v and "new file" in v for v in verdicts), out
    assert all(any(t in v and "new file" in v for v in verdicts) for t in tests), out


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    return L.build_trees(str(tmp_path_factory.mktemp("lint")))


@pytest.fixture
def tampered(trees, tmp_path):
    """A copy of the patched tree and a function that inserts text after a
    given line of one of its files; returns the copy's root."""
    pristine, tree = trees
    copy = tmp_path / "series"
    shutil.copytree(tree, copy)

    def insert(rel, after_line, text):
        path = copy / rel
        lines = path.read_text().splitlines(keepends=True)
        lines[after_line:after_line] = [text]
        path.write_text("".join(lines))
        return after_line + 1  # the first inserted line's number

    return pristine, str(copy), insert


def _line_after(path, startswith):
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.startswith(startswith):
            return n
    raise AssertionError(f"no line starting with {startswith!r} in {path}")


def _lint(pristine, tree, rel, work):
    """lint_series' findings on one file, as (tool, line) pairs and the
    findings themselves."""
    old = Path(pristine) / rel
    pairs = {rel: (str(old) if old.exists() else None, str(Path(tree) / rel))}
    found = L.lint_changes(pairs, str(work))[rel]
    return sorted((f.tool, f.line) for f in found), found


def test_the_copy_is_clean_before_tampering(tampered, tmp_path):
    pristine, copy, _ = tampered
    for rel in (MODIFIED, CREATED):
        assert _lint(pristine, copy, rel, tmp_path) == ([], [])


def test_misformatted_added_line_in_a_modified_file_fails_black(tampered, tmp_path):
    pristine, copy, insert = tampered
    anchor = _line_after(Path(copy) / MODIFIED, "embedding_cache:")
    n = insert(MODIFIED, anchor, "_fork_probe = { 'a':1 }\n")
    assert _lint(pristine, copy, MODIFIED, tmp_path)[0] == [("black", n)]
    # and the CLI says so, naming the file and the line, exit 1 (judging
    # only the two files: the whole series is the first test's run)
    only = ["--only", MODIFIED, CREATED]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "-v", "--tree", copy, "--pristine", pristine]
        + only,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL  {MODIFIED}" in proc.stdout and f"black L{n}:" in proc.stdout
    assert f"ok    {CREATED}" in proc.stdout
    assert "FAILED: 1 of 2 file(s)" in proc.stdout


def test_only_refuses_a_file_the_series_does_not_touch(trees, capsys):
    pristine, tree = trees
    argv = ["--tree", tree, "--pristine", pristine, "--only", MODIFIED, "setup.py"]
    with pytest.raises(
        SystemExit, match=r"^lint_series: not a file of the series: setup\.py$"
    ):
        L.main(argv)
    assert capsys.readouterr().out == ""


def test_bad_import_order_in_an_added_line_fails_isort(tampered, tmp_path):
    pristine, copy, insert = tampered
    # a standard-library import after `import torch` (the third-party section)
    anchor = _line_after(Path(copy) / MODIFIED, "import torch")
    n = insert(MODIFIED, anchor, "import abc  # noqa: F401\n")
    found, findings = _lint(pristine, copy, MODIFIED, tmp_path)
    assert ("isort", n) in found
    assert {f.tool for f in findings} == {"isort"}


def test_unused_import_in_an_added_line_fails_ruff(tampered, tmp_path):
    pristine, copy, insert = tampered
    lines = (Path(copy) / MODIFIED).read_text().splitlines()
    n = insert(
        MODIFIED,
        len(lines),
        "\n\ndef _fork_probe():\n    import zlib\n\n    return None\n",
    )
    found, findings = _lint(pristine, copy, MODIFIED, tmp_path)
    assert found == [("ruff", n + 3)]
    assert findings[0].detail.startswith("F401")


def test_undefined_name_in_a_new_file_fails_ruff_anywhere(tampered, tmp_path):
    pristine, copy, insert = tampered
    assert not (Path(pristine) / CREATED).exists()
    lines = (Path(copy) / CREATED).read_text().splitlines()
    n = insert(
        CREATED, len(lines), "\n\ndef _fork_probe():\n    return undefined_fork_name\n"
    )
    _, findings = _lint(pristine, copy, CREATED, tmp_path)
    assert [(f.tool, f.line, f.detail.split()[0]) for f in findings] == [
        ("ruff", n + 3, "F821")
    ]


def test_pristine_lines_are_not_judged(trees, tmp_path):
    """vision.py as released already fails black 24.10; the series' own lines
    in it do not, so the file passes."""
    import black

    pristine, tree = trees
    rel = "sglang/srt/layers/attention/vision.py"
    source = (Path(tree) / rel).read_text()
    assert black.format_str(source, mode=black.Mode()) != source
    assert _lint(pristine, tree, rel, tmp_path) == ([], [])


def test_darker_diff_lines_are_the_lines_black_changes():
    diff = (
        "--- a.py\t2026-01-01\n+++ a.py\t2026-01-01\n"
        "@@ -1,5 +1,5 @@\n a\n-b\n+B\n c\n+inserted\n d\n-gone\n"
        "--- b.py\t2026-01-01\n+++ b.py\t2026-01-01\n"
        "@@ -7 +7,2 @@\n--- not a header\n+x\n+y\n"
    )
    # rewritten (a:2), inserted after (a:3), deleted (a:5); a removed line
    # that looks like a file header stays in its hunk (b:7)
    assert L.darker_lines(diff) == [("a.py", 2), ("a.py", 3), ("a.py", 5), ("b.py", 7)]


def test_isort_lines_name_the_lines_isort_changes(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text("import torch\nimport abc\n\nimport sglang\n\nx = 1\n")
    assert L.isort_lines([str(path), str(tmp_path / "missing.py")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and all(ln.startswith(f"{path}:") for ln in out)
    assert {int(ln.split(":")[1]) for ln in out} & {1, 2}
    assert f"{path}:6:" not in "\n".join(out)


def test_other_linter_versions_are_refused(tmp_path):
    pins = (REPO / "requirements" / "lint.txt").read_text()
    assert "black==24.10.0" in pins
    wrong = tmp_path / "lint.txt"
    wrong.write_text(pins.replace("black==24.10.0", "black==23.1.0"))
    L.check_versions(str(REPO / "requirements" / "lint.txt"))  # the pins: accepted
    with pytest.raises(SystemExit, match=r"black 24\.10\.0 \(pinned 23\.1\.0\)"):
        L.check_versions(str(wrong))


def test_repo_mode_judges_whole_files_and_fix_leaves_ruff(tmp_path, capsys):
    files = {
        "good.py": "import os\n\nprint(os.sep)\n",
        "black_bad.py": "x = { 'a':1 }\n",
        "isort_bad.py": "import sys\nimport os\n\nprint(os, sys)\n",
        "ruff_bad.py": "import zlib\n",
        "pkg/__init__.py": "import zlib\n",  # SGLang's ruff hook skips these
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert L.lint_repo(sorted(files), root=str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "would reformat" in out and "black_bad.py" in out
    assert "isort_bad.py Imports are incorrectly sorted" in out
    assert "ruff_bad.py:1:8: F401" in out and "__init__.py:" not in out
    assert "FAILED: 3 of 5 file(s)" in out
    assert L.lint_repo(sorted(files), root=str(tmp_path), fix=True) == 1
    out = capsys.readouterr().out
    assert "FAILED: 1 of 5 file(s)" in out and "ruff_bad.py:1:8: F401" in out
    assert (tmp_path / "black_bad.py").read_text() == 'x = {"a": 1}\n'
    assert (tmp_path / "isort_bad.py").read_text().startswith("import os\nimport sys\n")
