"""scripts/doc_commands.py: every shell command the docs give runs as written.

The docs' own commands run once per module (a sandbox per doc, see the
script's docstring); the other tests give the check docs it must refuse.
"""

import os
import subprocess
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


@pytest.fixture(scope="module")
def every_doc(tmp_path_factory):
    """The docs' commands, run once; the sandbox stays for the tests to read."""
    work = tmp_path_factory.mktemp("docs")
    return doc_commands.check(work=str(work)), work


def _doc_tmp(work, name):
    """NAME under the sandbox /tmp of the doc that made it."""
    found = sorted(work.glob(f"sandbox/doc*/tmp/{name}"))
    assert found, f"no doc made /tmp/{name}"
    return found[0]


def test_every_command_of_the_docs_runs_as_written(every_doc):
    report, _ = every_doc
    assert report.problems == [], "\n".join(report.problems)
    # The docs do give commands, and the checked programs saw them.
    assert report.blocks > 20 and report.commands > 20, report


def test_the_edit_loop_of_series_md_ran_for_real(every_doc):
    # import made a git repository of the series, the per-commit test loop
    # rebased over it, and export wrote patches/ back byte for byte.
    _, work = every_doc
    repo = _doc_tmp(work, "sg-work")
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s", "upstream..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    series = (ROOT / "patches" / "series").read_text().split()
    assert len(log) == len([n for n in series if not n.startswith("#")])
    copy = work / "sandbox" / "repo" / "patches"
    for name in os.listdir(ROOT / "patches"):
        assert (copy / name).read_bytes() == (
            ROOT / "patches" / name
        ).read_bytes(), name


def test_the_ab_trees_are_base_and_current_series(every_doc):
    # The README's tree carries the series where the A/B reads it (python/),
    # and the base tree the benchmark README makes carries none.
    _, work = every_doc
    series = _doc_tmp(work, "sglang-series") / "python" / "sglang" / ".fork-series"
    base = _doc_tmp(work, "sglang-base") / "python" / "sglang" / ".fork-series"
    assert (series / "stamp.json").is_file() and not base.exists()


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


def test_status_that_says_revert_and_apply_again_is_a_problem(tmp_path):
    # The benchmark recipe as it once was: applied at the repository root,
    # asked about python/, series.py tells the user to start over.
    problems = _problems(
        tmp_path,
        "```bash\n"
        "git clone --branch v0.5.23 https://github.com/sgl-project/sglang /tmp/sglang-series\n"
        "python3 scripts/series.py apply --target /tmp/sglang-series\n"
        "python3 scripts/series.py status --target /tmp/sglang-series/python\n"
        "```\n",
    )
    text = "\n".join(problems)
    assert "tells the user to revert and apply again" in text, text


def test_a_path_no_earlier_step_makes_is_a_problem(tmp_path):
    # series.md's release move as it once was: the new release's tree and the
    # imported work tree are made nowhere on the page; a linked recipe that
    # makes a tree runs first, so its tree is no problem.
    problems = _problems(
        tmp_path,
        "[The tree](../README.md#3-launch-on-rocm).\n\n"
        "```bash\n"
        "python3 scripts/series.py status --target /tmp/sglang-series/python\n"
        "python3 scripts/series.py rebase --target /tmp/sg-work --onto /tmp/sg-0.5.24\n"
        "PYTHONPATH=/tmp/sglang-series/python python3 -c 'import sglang'\n"
        "```\n",
    )
    text = "\n".join(problems)
    for needle in (
        "uses /tmp/sg-work, which no earlier step",
        "uses /tmp/sg-0.5.24, which no earlier step",
        "tmp/sg-0.5.24: no such path",
    ):
        assert needle in text, (needle, text)
    assert "uses /tmp/sglang-series" not in text, text
