"""scripts/lint_series.py: the series' lines pass SGLang's black, isort and ruff.

The first test runs the script as documented, on trees it builds from the
0.5.23 wheel with the current series applied: it fails (naming the files and
lines) whenever a patch adds a line that black 24.10.0, isort 5.13.2
(profile black) or ruff 0.11.7 (F401, F821) would reject. The others prove the
check can fail and judges only the series' lines: a temporary copy of the
patched tree gets one deliberately bad added line (mis-formatted, out of
import order, an unused import) in a file the series modifies or creates,
and a pristine line that black would reformat stays unjudged.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="stage-a-test-cpu")

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
        [sys.executable, str(SCRIPT), "-v"], capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    verdicts = [
        ln for ln in proc.stdout.splitlines() if ln.startswith(("ok ", "FAIL "))
    ]
    # one verdict per Python file of the series, the new modules among them,
    # then one per test file the patches carry, each judged whole
    tests = L.series_files(tests=True)
    assert len(verdicts) == len(L.series_files()) + len(tests), out
    assert len(L.series_files()) >= 2 and tests, out
    assert all(v.startswith("ok ") for v in verdicts), out
    assert any(CREATED in v and "new file" in v for v in verdicts), out
    assert all(any(t in v and "whole file" in v for v in verdicts) for t in tests), out


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


def _findings(verdict):
    return sorted((f.tool, f.line) for f in verdict.findings)


def test_the_copy_is_clean_before_tampering(tampered):
    pristine, copy, _ = tampered
    for rel in (MODIFIED, CREATED):
        assert L.lint_file(rel, pristine, copy).ok


def test_misformatted_added_line_in_a_modified_file_fails_black(tampered):
    pristine, copy, insert = tampered
    anchor = _line_after(Path(copy) / MODIFIED, "embedding_cache:")
    n = insert(MODIFIED, anchor, "_fork_probe = { 'a':1 }\n")
    verdict = L.lint_file(MODIFIED, pristine, copy)
    assert _findings(verdict) == [("black", n)]
    # and the CLI says so, naming the file and the line, exit 1
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "-v", "--tree", copy, "--pristine", pristine],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL  {MODIFIED}" in proc.stdout and f"black L{n}:" in proc.stdout
    assert f"ok    {CREATED}" in proc.stdout


def test_bad_import_order_in_an_added_line_fails_isort(tampered):
    pristine, copy, insert = tampered
    # a standard-library import after `import torch` (the third-party section)
    anchor = _line_after(Path(copy) / MODIFIED, "import torch")
    n = insert(MODIFIED, anchor, "import abc  # noqa: F401\n")
    verdict = L.lint_file(MODIFIED, pristine, copy)
    assert ("isort", n) in _findings(verdict)
    assert {f.tool for f in verdict.findings} == {"isort"}


def test_unused_import_in_an_added_line_fails_ruff(tampered):
    pristine, copy, insert = tampered
    lines = (Path(copy) / MODIFIED).read_text().splitlines()
    n = insert(
        MODIFIED,
        len(lines),
        "\n\ndef _fork_probe():\n    import zlib\n\n    return None\n",
    )
    verdict = L.lint_file(MODIFIED, pristine, copy)
    assert _findings(verdict) == [("ruff", n + 3)]
    assert verdict.findings[0].detail.startswith("F401")


def test_undefined_name_in_a_new_file_fails_ruff_anywhere(tampered):
    pristine, copy, insert = tampered
    lines = (Path(copy) / CREATED).read_text().splitlines()
    n = insert(
        CREATED, len(lines), "\n\ndef _fork_probe():\n    return undefined_fork_name\n"
    )
    verdict = L.lint_file(CREATED, pristine, copy)
    assert verdict.new
    assert [(f.tool, f.line, f.detail.split()[0]) for f in verdict.findings] == [
        ("ruff", n + 3, "F821")
    ]


def test_pristine_lines_are_not_judged(trees):
    """vision.py as released already fails black 24.10; the series' own lines
    in it do not, so the file passes."""
    pristine, tree = trees
    rel = "sglang/srt/layers/attention/vision.py"
    source = (Path(tree) / rel).read_text()
    assert L.black_format(source) != source
    assert L.lint_file(rel, pristine, tree).ok


def test_added_lines_are_what_the_series_wrote():
    pristine = ["a", "b", "c", "d"]
    patched = ["a", "b2", "c", "new", "d", "tail"]
    assert L.added_lines(pristine, patched) == {2, 4, 6}
    assert L.added_lines(None, ["x", "y"]) == {1, 2}
    # a formatter's insertion counts against both neighbours
    assert L.touched_lines(["a", "b", "c"], ["a", "", "b", "c"]) == {1, 2}
    assert L.touched_lines(["a", "b", "c"], ["a", "B", "c"]) == {2}
