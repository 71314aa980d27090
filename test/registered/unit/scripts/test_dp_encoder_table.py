"""scripts/dp_encoder_table.py: the generated table of every multimodal model
class, and docs/warmup.md's copy of it.

The script parses the model files (no model is imported): each class's
``dp_encoder_spreads_images`` answer and ``precompile_kernels_after_loading``
warm-up, along its bases. Its command line runs twice,
side by side: on the installed SGLang against the docs, and on a copy of the
models folder with new classes added.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=9, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "scripts" / "dp_encoder_table.py"
DOC = ROOT / "docs" / "warmup.md"
sys.path.insert(0, str(ROOT / "scripts"))

import dp_encoder_table  # noqa: E402  (parse_table only; imports no sglang)


def _start(*args):
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc, timeout=300):
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _run(*args, timeout=300):
    return _finish(_start(*args), timeout)


def _sglang_root() -> Path:
    import sglang

    return Path(sglang.__file__).parent


BEGIN, END = dp_encoder_table.BEGIN, dp_encoder_table.END


def _around(text: str):
    return text[: text.index(BEGIN)], text[text.index(END) + len(END) :]


def _rows(path: Path) -> dict:
    table = dp_encoder_table.parse_table(path.read_text())
    return {key[0].strip("`"): cells for key, cells in table.items()}


PROBE = """\
from torch import nn

from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration


class TinyProbeVLM(nn.Module):
    def get_image_feature(self, items):
        return None


class TinyProbeQwen3VLChild(Qwen3VLForConditionalGeneration):
    pass


class TinyProbeTextOnly(nn.Module):
    pass


class TinyProbeHidden(TinyProbeVLM):
    get_image_feature = None
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script's two runs, side by side: on the installed tree (checked
    against the docs), and on a copy of its models folder with PROBE added.
    Each also writes its generated table."""
    tmp = tmp_path_factory.mktemp("dp_encoder_table")
    models = tmp / "sglang" / "srt" / "models"
    shutil.copytree(
        _sglang_root() / "srt" / "models",
        models,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (models / "tiny_probe_vlm.py").write_text(PROBE)
    installed_out, probe_out = tmp / "installed.md", tmp / "probe.md"
    # --out into an existing page replaces its table block only.
    before, after = _around(DOC.read_text())
    installed_out.write_text(before + BEGIN + "\n" + END + after)
    procs = [
        _start("--check", str(DOC), "--out", str(installed_out)),
        _start(
            "--sglang-root",
            str(tmp / "sglang"),
            "--check",
            str(DOC),
            "--out",
            str(probe_out),
        ),
    ]
    try:
        installed, probe = [_finish(p) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {"installed": (installed, installed_out), "probe": (probe, probe_out)}


@pytest.fixture
def installed(runs):
    return runs["installed"]


def test_docs_table_is_current(installed):
    proc, out = installed
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout == ""
    rows = _rows(out)
    assert rows == _rows(DOC)
    assert f": {len(rows)} classes." in out.read_text()
    assert _around(out.read_text()) == _around(DOC.read_text())


def test_known_rows(installed):
    _, out = installed
    rows = _rows(out)
    columns = dp_encoder_table.COLUMNS

    def cell(name, column):
        return rows[name][columns.index(column)]

    assert cell("Qwen3OmniMoeThinkerForConditionalGeneration", "image") == (
        "per-request (answers False)"
    )
    assert cell("Qwen3OmniMoeThinkerForConditionalGeneration", "answer") == "`False`"
    assert cell("GlmImageForConditionalGeneration", "image") == (
        "per-request (no answer)"
    )
    assert cell("GlmImageForConditionalGeneration", "answer") == "—"
    assert cell("Qwen3OmniMoeThinkerForConditionalGeneration", "audio") == (
        "per-request"
    )
    assert cell("GlmImageForConditionalGeneration", "warm-up plan").startswith(
        "none: serving it with --mm-enable-dp-encoder is broken upstream"
    )

    assert cell("InternVLChatModel", "image") == "DP"
    assert (
        cell("InternVLChatModel", "answer")
        == "`getattr(self, 'use_data_parallel', False)`"
    )
    assert cell("InternVLChatModel", "warm-up plan") == (
        "`vision_model`: `sorted({-(-tiles // attn_tp_size) for tiles in (1, 13)})` "
        "via `encode_share`"
    )
    assert cell("MuseSparkForConditionalGeneration", "warm-up plan") == (
        "`vision_tower`: [[1,8,12]] [[1,8,12],[1,16,16]] [[1,48,64]] via `encode`"
    )
    assert cell("MuseSparkForConditionalGeneration", "answer") == (
        "`getattr(self, 'use_data_parallel_encoder', False)`"
    )
    assert cell("KimiK3ForConditionalGeneration", "warm-up plan") == (
        "`vision_tower`: [[1,8,12]] [[1,8,12],[1,16,16]] [[1,40,40]] "
        "via `call_on_dummy_patches(rope_2d)`"
    )
    assert cell("MiniMaxM3SparseForConditionalGeneration", "warm-up plan") == (
        "`vision_tower`: [[1,10,14]] [[1,10,14],[2,8,8]] [[1,48,64]] "
        "via `call_on_dummy_patches`"
    )
    assert cell("Glm5NextForConditionalGeneration", "warm-up plan") == (
        "`visual`: [[1,32,32]] [[1,48,64]]"
    )

    for name in (
        "Qwen3VLForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
    ):
        assert cell(name, "image") == "DP"
        assert cell(name, "video") == "DP"
        assert cell(name, "answer") == "`getattr(self, 'use_data_parallel', False)`"
        assert cell(name, "warm-up plan") == (
            "`visual`: [[1,32,32]] [[1,48,64]] [6x[1,8,8]]"
        )
    assert cell("Qwen3_5ForConditionalGeneration", "file") == "`qwen3_5.py`"

    assert cell("MuseSparkForConditionalGeneration", "image") == "DP"
    assert cell("MuseSparkForConditionalGeneration", "audio") == "per-request"

    assert cell("Gemma3ForConditionalGeneration", "image") == "per-request (no answer)"
    assert cell("Gemma3ForConditionalGeneration", "video") == "—"
    assert cell("Gemma3ForConditionalGeneration", "answer") == "—"
    assert cell("Gemma3ForConditionalGeneration", "warm-up plan") == (
        "none (not data-parallel)"
    )
    # An audio-only model: no vision cells.
    assert [
        cell("Qwen2AudioForConditionalGeneration", c)
        for c in ("image", "video", "audio")
    ] == ["—", "—", "per-request"]


@pytest.mark.control(
    reason="the table tool's check, which reads any tree: a missing class fails it"
)
def test_new_vlm_class_fails_the_check(runs):
    proc, out = runs["probe"]
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    # What the two classes add to the installed tree's check (empty when the
    # docs are current; test_docs_table_is_current asserts that).
    installed_lines = runs["installed"][0].stdout.splitlines()
    assert [
        line for line in proc.stdout.splitlines() if line not in installed_lines
    ] == [
        "missing: TinyProbeVLM (tiny_probe_vlm.py)",
        "missing: TinyProbeQwen3VLChild (tiny_probe_vlm.py)",
    ]
    rows = _rows(out)
    assert "TinyProbeTextOnly" not in rows
    assert "TinyProbeHidden" not in rows
    assert rows["TinyProbeVLM"][2:5] == ["per-request (no answer)", "—", "—"]
    # Inherited through the import from qwen3_vl.py: its family's answer and plan.
    assert (
        rows["TinyProbeQwen3VLChild"][2:] == rows["Qwen3VLForConditionalGeneration"][2:]
    )


@pytest.mark.control(reason="argument errors, raised before any sglang module is read")
@pytest.mark.parametrize(
    "args, message",
    [
        (["--sglang-root", "/nonexistent"], "no srt/models folder there"),
        (["--check", "{tmp}/plain.md"], "no <!-- dp-encoder-table:begin -->"),
        (["--out", "/nonexistent/table.md"], "--out /nonexistent/table.md: no folder"),
        (["--out", "{tmp}/plain.md"], "an existing file without a <!-- dp-encoder"),
    ],
)
def test_bad_arguments(args, message, tmp_path):
    (tmp_path / "plain.md").write_text("# A page without the table\n")
    proc = _run(*[a.format(tmp=tmp_path) for a in args], timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert (tmp_path / "plain.md").read_text() == "# A page without the table\n"
    (last,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert message in last
