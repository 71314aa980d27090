"""scripts/doc_commands.py: every shell command the docs give runs as written.

The docs' own commands run once per module (a sandbox per doc, see the
script's docstring); the other tests give the check docs it must refuse.
"""

import os
import sys
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "scripts"))

import doc_commands  # noqa: E402

pytestmark = pytest.mark.control(
    reason="checks this repository's docs, not the series' behaviour"
)


def _problems(tmp_path, text):
    # Inside the repository, so the doc's relative paths resolve as a doc's would.
    doc = ROOT / "docs" / f".doc_commands_test_{os.getpid()}_{tmp_path.name}.md"
    doc.write_text(text)
    try:
        return doc_commands.check([str(doc)], work=str(tmp_path)).problems
    finally:
        doc.unlink()


def test_every_command_of_the_docs_runs_as_written(tmp_path):
    report = doc_commands.check(work=str(tmp_path))
    assert report.problems == [], "\n".join(report.problems)
    # The docs do give commands, and the checked programs saw them.
    assert report.blocks > 20 and report.commands > 20, report


def test_a_recipe_that_cds_before_its_substitution_fails(tmp_path):
    # The two-trees recipe as it once was: $(...) expands after the cd, so
    # patches/series is not found, and git am has no identity to commit with.
    problems = _problems(
        tmp_path,
        "```bash\n"
        "git clone --branch v0.5.23 https://github.com/sgl-project/sglang /tmp/sglang-series\n"
        '(cd /tmp/sglang-series && git am --keep-non-patch $(sed "s#^#$PWD/patches/#" patches/series))\n'
        "```\n",
    )
    text = "\n".join(problems)
    assert "exit status" in text and "patches/series" in text, text


def test_options_flags_paths_and_programs_are_checked(tmp_path):
    problems = _problems(
        tmp_path,
        "```bash\n.venv/bin/python benchmark/vit/bench_vit_determinism.py --repeats 3\n```\n"
        "```bash\npython3 -m sglang.launch_server --model-path m --tp-size 2 --no-such-flag\n```\n"
        "```bash\nPYTHONPATH=/tmp/none python3 -c 'import sglang'\n```\n"
        "```bash\nvim README.md\n```\n"
        "```bash\nmake no-such-target\n```\n"
        "Then run `.venv/bin/python scripts/no_such_script.py`.\n"
        "```\nuntagged\n```\n"
        "\n    make test\n",
    )
    text = "\n".join(problems)
    for needle in (
        "option --repeats is not defined",
        "server flag --no-such-flag is not defined",
        "PYTHONPATH entry",
        "vim: command not found",
        "make target no-such-target is not in the Makefile",
        "no script scripts/no_such_script.py",
        "code block without a language",
        "an indented command",
    ):
        assert needle in text, (needle, text)


def test_the_fixed_recipes_leave_the_series_applied(tmp_path):
    # Each doc's sandbox keeps its /tmp: the README's trees carry the series.
    work = tmp_path / "work"
    doc_commands.check(
        [str(ROOT / "benchmark" / "image_burst" / "README.md")], work=str(work)
    )
    series = next(work.glob("sandbox/doc*/tmp/sglang-series"))
    base = next(work.glob("sandbox/doc*/tmp/sglang-base"))
    assert (series / "python" / "sglang" / ".fork-series" / "stamp.json").is_file()
    assert not (base / "python" / "sglang" / ".fork-series").exists()
