"""scripts/check_docs.py: the docs name only things that exist.

One index of the code (this repository and the patched SGLang tree) serves
every test. The wrong names below are assembled at run time, so this file
does not itself put them in the code the check searches.
"""

import os
import sys
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "scripts"))

import check_docs  # noqa: E402

pytestmark = pytest.mark.control(
    reason="checks this repository's docs, not the series' behaviour"
)


@pytest.fixture(scope="module")
def checker():
    if not os.path.isdir(os.path.join(check_docs.DEFAULT_TREE, "python", "sglang")):
        pytest.fail(f"no patched tree at {check_docs.DEFAULT_TREE}: run make setup")
    index = check_docs.CodeIndex([(str(ROOT), ""), (check_docs.DEFAULT_TREE, "")])
    return check_docs.Checker(index, str(ROOT), str(ROOT))


def _doc(tmp_path, text):
    # Inside the repository, so its relative links resolve as a doc's would.
    p = ROOT / "docs" / f".check_docs_test_{os.getpid()}_{tmp_path.name}.md"
    p.write_text(text)
    return p


def test_every_doc_of_the_repository_passes(checker):
    problems = []
    for doc in check_docs.doc_files(str(ROOT)):
        problems += checker.check_doc(doc)
    assert problems == [], "\n".join(problems)


def test_the_docs_checked_include_readme_docs_and_folder_readmes():
    files = {os.path.relpath(f, ROOT) for f in check_docs.doc_files(str(ROOT))}
    assert {"README.md", "docs/design.md", "cpu_support/server/README.md"} <= files


def test_wrong_names_of_each_kind_are_reported(checker, tmp_path):
    flag = "--mm-max-encoder-patches-per-" + "batchx"
    env = "SGLANG_VIT_ENABLE_CUDA_" + "GRAPHS"
    metric = "sglang:encoder_" + "callz_total"
    func = "hip_dp_encoder_batches_" + "vitt"
    path = "scripts/" + "serie" + "s_tol.py"
    patch = "vlm-fix-return-copies-of-the-vit-cuda-graph-outputs-from-each-" + "replays"
    sha = "0123abc" + "def"
    outside = "../" + "shared/seeds/001_x.txt"
    link = "design.md#" + "no-such-heading"
    doc = _doc(
        tmp_path,
        f"Launch with `{flag}` and `{env}=1`; read `{metric}`.\n"
        f"`{func}()` decides, in `{path}`, patch `{patch}`.\n"
        f"Measured at {sha}. Seed: `{outside}`. See [there]({link}).\n"
        "```bash\n"
        f"{env}=1 python -m sglang.launch_server {flag} 4\n"
        "```\n",
    )
    try:
        out = "\n".join(checker.check_doc(str(doc)))
    finally:
        doc.unlink()
    for name in (flag, env, metric, func + "()", path, patch, sha, outside, link):
        assert name in out, (name, out)
    # The code block's line is checked too (line 5: the flag and the variable).
    assert f":5: flag {flag}" in out and f":5: environment variable {env}" in out


def test_right_names_pass(checker, tmp_path):
    doc = _doc(
        tmp_path,
        "Launch with `--mm-enable-dp-encoder` and `SGLANG_VIT_ENABLE_CUDA_GRAPH=1`;\n"
        "read `sglang:mm_encoder_calls_total`; `hip_dp_encoder_batches_vit()` in\n"
        "`scripts/series.py`, `mm_utils.run_dp_sharded_mrope_vision_model`,\n"
        "patch `vlm-fix-return-copies-of-the-vit-cuda-graph-outputs-from-each-replay`;\n"
        "`TORCH_LOGS` is torch's. See [design](design.md).\n",
    )
    try:
        assert checker.check_doc(str(doc)) == []
    finally:
        doc.unlink()


def test_missing_tree_is_one_line_and_exit_2(tmp_path, capsys):
    rc = check_docs.main(["--tree", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "make setup" in err[0]
