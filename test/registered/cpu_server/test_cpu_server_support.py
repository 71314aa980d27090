"""Pieces of the CPU server support that run in seconds (no server).

* the tiny model directory loads as the Qwen3-VL processor, vision tokens special;
* the launcher's command/env and its one-line errors;
* the demo-only ROCm-gate hook, loaded as ``sitecustomize`` in a fresh
  interpreter exactly as the launcher does, against the pristine and the series
  trees (each probe imports the tree it names, whatever the build under test:
  both are controls of the harness).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from cpu_support.server import cpu_server as CS  # noqa: E402
from cpu_support.server.sglang_trees import pristine_tree, series_tree  # noqa: E402
from cpu_support.tiny_models import make_tiny_model as MTM  # noqa: E402

ROOT = os.path.dirname(CS.HERE)


@pytest.mark.control(
    reason="harness: the tiny Qwen3-VL model directory loads with transformers"
)
def test_tiny_model_dir_loads_as_qwen3_vl(tmp_path):
    out = MTM.make_tiny_model(str(tmp_path / "m"), check=False)
    from transformers import AutoConfig, AutoProcessor

    proc = AutoProcessor.from_pretrained(out)
    assert type(proc).__name__ == "Qwen3VLProcessor"
    tok = proc.tokenizer
    ids = MTM.token_ids()
    special = set(tok.all_special_ids)
    for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"):
        assert tok.convert_tokens_to_ids(t) == ids[t] and ids[t] in special
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.architectures == ["Qwen3VLForConditionalGeneration"]
    assert cfg.image_token_id == ids["<|image_pad|>"] == proc.image_token_id
    assert cfg.text_config.vocab_size >= len(tok)
    # Byte-level: any text round-trips.
    text = "héllo wörld 🙂 <b>"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "hi"}],
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    from PIL import Image

    enc = proc(text=[prompt], images=[Image.new("RGB", (224, 224))])
    # 224x224, patch 16, merge 2: a 14x14 patch grid, 49 image tokens.
    assert enc["image_grid_thw"].tolist() == [[1, 14, 14]]
    assert list(enc["input_ids"][0]).count(ids["<|image_pad|>"]) == 49


@pytest.mark.control(
    reason="harness: the tiny Qwen2.5-VL model directory loads with transformers"
)
def test_tiny_qwen2_5_vl_dir_loads_as_its_processor(tmp_path):
    out = str(tmp_path / "q25")
    assert MTM.main(["--out", out, "--family", "qwen2_5_vl"]) == 0
    from transformers import AutoConfig, AutoProcessor

    proc = AutoProcessor.from_pretrained(out)
    assert type(proc).__name__ == "Qwen2_5_VLProcessor"
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == "qwen2_5_vl"
    assert cfg.architectures == ["Qwen2_5_VLForConditionalGeneration"]
    ids = MTM.token_ids()
    assert cfg.image_token_id == ids["<|image_pad|>"] == proc.image_token_id
    assert cfg.text_config.vocab_size >= len(proc.tokenizer)
    assert ids["<|video_pad|>"] in set(proc.tokenizer.all_special_ids)
    # SGLang's Qwen2.5-VL runs its tower only on 1176-wide pixel rows.
    v = cfg.vision_config
    assert v.in_channels * v.temporal_patch_size * v.patch_size**2 == 1176
    prompt = proc.tokenizer.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "hi"}],
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    from PIL import Image

    enc = proc(text=[prompt], images=[Image.new("RGB", (224, 224))])
    # 224x224, patch 14, merge 2: a 16x16 patch grid, 64 image tokens.
    assert enc["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert tuple(enc["pixel_values"].shape) == (256, 1176)
    assert list(enc["input_ids"][0]).count(ids["<|image_pad|>"]) == 64
    # The default family is unchanged.
    assert MTM.model_config()["architectures"] == ["Qwen3VLForConditionalGeneration"]
    with pytest.raises(ValueError, match="unknown family"):
        MTM.model_config("qwen2_vl")


@pytest.mark.control(reason="harness: make_tiny_model.py refuses bad input")
def test_make_tiny_model_cli_refuses_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert MTM.main(["--out", str(f)]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.control(reason="harness: the CPU server's thread binding")
def test_omp_threads_bind():
    assert CS.omp_threads_bind(2, [0, 1]) == "0|1"
    assert CS.omp_threads_bind(2, range(4)) == "0-1|2-3"
    assert CS.omp_threads_bind(1, [3]) == "3"
    with pytest.raises(ValueError, match="need at least 2 CPUs"):
        CS.omp_threads_bind(2, [0])


@pytest.mark.control(reason="harness: the CPU server's command line and environment")
def test_server_command_and_env(tmp_path):
    cmd = CS.server_command("/m", port=1234, tp_size=2, dp_encoder=True, python="py")
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    for flag in (
        "--load-format dummy",
        "--device cpu",
        "--attention-backend torch_native",
        "--mm-attention-backend sdpa",
        "--tp-size 2",
        "--port 1234",
        "--sleep-on-idle",
    ):
        assert flag in " ".join(cmd)
    assert cmd[-1] == "--mm-enable-dp-encoder"
    with pytest.raises(ValueError, match="tp_size >= 2"):
        CS.server_command("/m", port=1, tp_size=1, dp_encoder=True)
    env = CS.server_env(
        tp_size=2,
        simulate_rocm_gate=True,
        python_path=["/tree"],
        base={"PYTHONPATH": "/old"},
    )
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert not os.path.exists(env["SGLANG_NCCL_SO_PATH"])
    assert "|" in env["SGLANG_CPU_OMP_THREADS_BIND"] or os.cpu_count() < 2
    assert env["PYTHONPATH"].split(os.pathsep) == [
        CS.ROCM_GATE_SIM_DIR,
        "/tree",
        "/old",
    ]
    plain = CS.server_env(tp_size=1, base={CS.ROCM_GATE_SIM_ENV: "1"})
    assert CS.ROCM_GATE_SIM_ENV not in plain and "PYTHONPATH" not in plain
    with pytest.raises(ValueError, match="no config.json"):
        CS.CpuServer(str(tmp_path), log_path=str(tmp_path / "l"))


_PROBE = r"""
import json, sys
sys.path.insert(0, ROOT)
from cpu_support.tiny_models.tiny_qwen3_vl import publish_cpu_context
import sglang
import sglang.srt.managers.mm_schedule as ms
import sglang.srt.multimodal.mm_utils as mu
from sglang.srt.runtime_context import get_platform
out = {"has_gate": hasattr(ms, "_batch_vit_across_requests"),
       "is_hip_global": getattr(ms, "_is_hip", None),
       "sglang_file": sglang.__file__}
if out["has_gate"]:
    from sglang.srt.multimodal.modality import Modality

    from cpu_support.ranks.mm_harness import DecisionModel

    def Model():  # a Qwen3-VL built with the DP encoder: its tower splits a call's images
        return DecisionModel(True)

    encoder = Model().get_image_feature  # what the scheduler passes the gate

    def unhooked_gate():  # the gate with mm_schedule's import-time flag (CPU)
        ms._is_hip = False
        try:
            return ms._batch_vit_across_requests(encoder, Modality.IMAGE)
        finally:
            ms._is_hip = True

    res = {}
    for dp in (True, False):
        publish_cpu_context(tp_size=2, rank=0, dp_encoder=dp)
        res[str(dp)] = {"wrapped": ms._batch_vit_across_requests(encoder, Modality.IMAGE),
                        "original": unhooked_gate(),
                        "helper": ms.hip_dp_encoder_batches_vit(),
                        "warm_up": mu.vision_warm_up_needed(Model()),
                        "warm_up_original": mu.vision_warm_up_needed.__wrapped__(Model())}
    out["decisions"] = res
out["platform_is_hip_after"] = bool(get_platform().is_hip)
print("PROBE" + json.dumps(out))
"""


def _probe(tree):
    """The hook in a fresh interpreter that imports sglang from ``tree``, the
    one named, whatever sglang the test run itself imports (the pristine run's
    FORK_SGLANG_TREE would otherwise go first)."""
    base = {k: v for k, v in os.environ.items() if k != CS.SGLANG_TREE_ENV}
    env = CS.server_env(
        tp_size=1, simulate_rocm_gate=True, python_path=[tree], base=base
    )
    env.pop(
        "SGLANG_USE_CPU_ENGINE"
    )  # in-process probe: the generic branch (docs/cpu.md)
    proc = subprocess.run(
        [sys.executable, "-c", f"ROOT = {ROOT!r}\n" + _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("PROBE")]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(line[0][5:])
    assert out["sglang_file"].startswith(os.path.join(tree, "sglang") + os.sep), out[
        "sglang_file"
    ]
    return out, proc.stderr


@pytest.mark.control(
    reason="harness: the demo's ROCm simulation on the pristine build (the A/B's base)"
)
def test_rocm_gate_hook_on_pristine_forces_the_per_request_branch():
    out, err = _probe(pristine_tree())
    assert out["has_gate"] is False
    assert out["is_hip_global"] is True  # the inline `if _is_hip or ...` now takes it
    assert out["platform_is_hip_after"] is False  # nothing else sees ROCm
    assert "pristine build: mm_schedule._is_hip = True" in err


@pytest.mark.control(
    reason="harness: the demo's ROCm simulation on the series tree, "
    "which the probe imports whatever the build under test"
)
def test_rocm_gate_hook_on_series_decides_like_rocm_only_inside_the_gate():
    out, err = _probe(series_tree())
    assert out["has_gate"] is True
    d = out["decisions"]
    assert out["is_hip_global"] is True  # the gate's own ROCm flag
    # ROCm + DP encoder + attention-TP 2: batch, and warm up under the gate.
    assert d["True"] == {
        "wrapped": True,
        "original": True,
        "helper": True,
        "warm_up": True,
        "warm_up_original": True,
    }
    # ROCm without DP encoder: per-request, no warm-up.
    assert d["False"]["wrapped"] is False and d["False"]["helper"] is False
    assert d["False"]["warm_up"] is False
    # Unhooked, the CPU batches like CUDA: the hook is what makes the difference.
    assert d["False"]["original"] is True
    assert out["platform_is_hip_after"] is False
    assert "series build: mm_schedule._is_hip = True" in err
    assert "mm_utils.vision_warm_up_needed reports its answer" in err
    assert "vision_warm_up_needed -> True" in err
