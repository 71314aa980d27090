"""The A/B harness's launch-side pieces, each on its own, in seconds.

Only GPU tools and the network are faked: ``nvidia-smi``/``rocm-smi`` are
small scripts put first on ``PATH`` (their output read from a file the test
changes), and the model download is a function swapped in for
``huggingface_hub.snapshot_download``.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import ab_image_burst as AB  # noqa: E402
import bench_image_burst as B  # noqa: E402
import huggingface_hub  # noqa: E402
import pytest  # noqa: E402
from cpu_support.tiny_models.make_tiny_model import make_tiny_model  # noqa: E402

pytestmark = pytest.mark.control(
    reason="the A/B harness's own launch-side pieces; no SGLang code under test"
)

SCRIPTS = os.path.dirname(os.path.abspath(AB.__file__))

# A fake smi: prints the file's text, or fails when told to.
SMI = """#!{python}
import sys
text = open({state!r}).read()
if text.startswith("FAIL"):
    sys.stderr.write("no devices found\\n")
    sys.exit(9)
sys.stdout.write(text)
"""


def _tool(tmp_path, monkeypatch, name, first_output):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    state = tmp_path / f"{name}.out"
    state.write_text(first_output)
    path = bin_dir / name
    path.write_text(SMI.format(python=sys.executable, state=str(state)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    # Only the fake tools: no real smi of the machine can answer instead.
    monkeypatch.setenv("PATH", str(bin_dir))
    return state


# ---------------------------------------------------------------- item 5


def test_waits_until_memory_is_back_near_the_baseline(tmp_path, monkeypatch):
    state = _tool(tmp_path, monkeypatch, "nvidia-smi", "0, 512\n1, 400\n")
    tool, before, note = AB.gpu_memory_used()
    assert (tool, before, note) == ("nvidia-smi", {"0": 512.0, "1": 400.0}, "")
    state.write_text(
        "0, 71000\n1, 70500\n"
    )  # the previous server still holds its memory

    def release():
        time.sleep(1.0)
        # within the slack of the baseline; replaced whole, so the fake tool
        # polling meanwhile never reads a half-written file
        fresh = state.with_suffix(".new")
        fresh.write_text("0, 900\n1, 420\n")
        os.replace(fresh, state)

    threading.Thread(target=release).start()
    t0 = time.monotonic()
    seen = AB.wait_gpu_memory_released(before, slack_mib=1024, timeout=20, poll=0.1)
    assert 0.9 <= time.monotonic() - t0 < 10
    assert seen["tool"] == "nvidia-smi" and seen["used_mib"] == {"0": 900.0, "1": 420.0}
    assert seen["waited_s"] >= 0.9


def test_memory_never_released_fails_in_one_line_at_the_timeout(tmp_path, monkeypatch):
    state = _tool(tmp_path, monkeypatch, "nvidia-smi", "0, 300\n")
    _, before, _ = AB.gpu_memory_used()
    state.write_text("0, 65000\n")
    t0 = time.monotonic()
    with pytest.raises(AB.ABError) as e:
        AB.wait_gpu_memory_released(before, slack_mib=1024, timeout=1.0, poll=0.2)
    assert 1.0 <= time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and "GPU 0 uses 65000 MiB" in msg and "300 MiB before" in msg


def test_rocm_smi_json_is_read_in_mib(tmp_path, monkeypatch):
    out = {
        "card0": {
            "VRAM Total Memory (B)": str(192 * 2**30),
            "VRAM Total Used Memory (B)": str(3 * 2**30),
        },
        "card1": {
            "VRAM Total Memory (B)": str(192 * 2**30),
            "VRAM Total Used Memory (B)": str(2**29),
        },
    }
    _tool(tmp_path, monkeypatch, "rocm-smi", json.dumps(out))
    assert AB.gpu_memory_used() == ("rocm-smi", {"card0": 3072.0, "card1": 512.0}, "")


def test_only_the_visible_gpus_are_read(tmp_path, monkeypatch):
    """Another user's job on GPU 5 must not stall the wait of a run on GPUs 0 and 2."""
    _tool(tmp_path, monkeypatch, "nvidia-smi", "0, 300\n1, 300\n2, 310\n5, 70000\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert AB.gpu_memory_used() == ("nvidia-smi", {"0": 300.0, "2": 310.0}, "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a2f,GPU-77c1")  # UUIDs: every GPU
    assert AB.gpu_memory_used()[1] == {"0": 300.0, "1": 300.0, "2": 310.0, "5": 70000.0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    tool, used, note = AB.gpu_memory_used()
    assert used == {} and "none of the GPUs CUDA_VISIBLE_DEVICES=7 names" in note
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    out = {
        f"card{i}": {"VRAM Total Used Memory (B)": str((i + 1) * 2**30)}
        for i in range(4)
    }
    (tmp_path / "bin" / "nvidia-smi").unlink()
    _tool(tmp_path, monkeypatch, "rocm-smi", json.dumps(out))
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,3")
    assert AB.gpu_memory_used() == ("rocm-smi", {"card1": 2048.0, "card3": 4096.0}, "")


def test_no_tool_or_a_failing_tool_skips_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    tool, used, note = AB.gpu_memory_used()
    assert (tool, used) == (None, {}) and "no nvidia-smi, rocm-smi or amd-smi" in note
    seen = AB.wait_gpu_memory_released({}, slack_mib=1024, timeout=1)
    assert seen["waited_s"] == 0 and "not waiting" in seen["note"]
    _tool(tmp_path, monkeypatch, "nvidia-smi", "FAIL")
    tool, used, note = AB.gpu_memory_used()
    assert (tool, used) == ("nvidia-smi", {}) and "code 9: no devices found" in note


def test_burst_time_limit_is_minutes_and_grows_with_the_burst():
    seed = B.BurstConfig()  # 64 prompts at concurrency 64, 128 output tokens
    assert 120 <= B.burst_timeout_s(seed) <= 600
    four_waves = B.BurstConfig(num_prompts=256, max_concurrency=64)
    assert B.burst_timeout_s(four_waves) > B.burst_timeout_s(seed)
    assert AB.parse(["--model-path", "m"]).burst_timeout is None  # derived per burst


def test_a_hung_bench_serving_is_killed_at_its_limit(tmp_path):
    hung = [sys.executable, "-c", "import time; time.sleep(120)"]
    t0 = time.monotonic()
    rec, rc, tail = B.run_bench_serving(
        hung, str(tmp_path / "o.jsonl"), str(tmp_path / "l.log"), 1.5
    )
    assert time.monotonic() - t0 < 30
    assert rec is None and rc == 124 and "timed out after 2 s" in tail
    s = B.summarize_record(rec, 8, rc, tail)
    assert (s["completed"], s["failed"]) == (0, 8) and "timed out" in s["harness_error"]


# ---------------------------------------------------------------- item 6


def test_prefetch_fetches_the_pinned_revision_once_and_records_it(
    tmp_path, monkeypatch
):
    calls = []

    def fetch(repo_id, revision=None, **kwargs):
        calls.append((repo_id, revision, kwargs))
        time.sleep(0.2)
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    rev = "b5688f25491202978c19c4d036eef579f61bbe07"
    flags = ["--quantization", "quark", "--revision", rev, "--tp-size", "2"]
    got = AB.prefetch_model(
        "amd/GLM-5.3-Flash-Quark-MXFP4", AB.server_revision(flags), echo=lambda m: None
    )
    assert calls == [("amd/GLM-5.3-Flash-Quark-MXFP4", rev, {})]
    assert got["fetched"] is True and got["revision"] == rev and got["seconds"] >= 0.2
    assert got["local_dir"] == str(tmp_path / "snap")
    assert (
        AB.server_revision(["--revision=abc"]) == "abc"
        and AB.server_revision([]) is None
    )


def test_prefetch_of_a_local_folder_fetches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda *a, **k: pytest.fail("a local folder must not be fetched"),
    )
    got = AB.prefetch_model(str(tmp_path), None)
    assert got["fetched"] is False and got["local_dir"] == str(tmp_path)


def test_prefetch_failure_is_one_line(monkeypatch):
    def fetch(repo_id, revision=None, **kwargs):
        raise OSError("Connection refused\nmore detail\neven more")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    with pytest.raises(AB.ABError) as e:
        AB.prefetch_model("org/model", "v1", echo=lambda m: None)
    assert "\n" not in str(e.value) and "org/model at revision v1" in str(e.value)


# ---------------------------------------------------------------- item 4


def test_ab_json_is_replaced_atomically(tmp_path):
    path = tmp_path / "ab.json"
    AB.write_json_atomic(str(path), {"runs": [1]})
    AB.write_json_atomic(str(path), {"runs": [1, 2]})
    assert json.loads(path.read_text()) == {"runs": [1, 2]}
    with pytest.raises(TypeError):
        AB.write_json_atomic(str(path), {"runs": [object()]})  # fails half-way
    assert json.loads(path.read_text()) == {"runs": [1, 2]}  # the last good file stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ab.json"]


# ---------------------------------------------------------------- item 1

_RESOLVE = """
import sys
sys.path.insert(0, {scripts!r})
import bench_image_burst as B
try:
    print("DIR", B.local_model_dir({repo!r}, {rev!r}))
except B.BenchError as e:
    print("ERR", e)
"""


def _resolve(cache, repo, rev):
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", _RESOLVE.format(scripts=SCRIPTS, repo=repo, rev=rev)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith(("DIR", "ERR"))]
    assert line, out.stderr[-2000:]
    return line[0]


def test_pinned_snapshot_is_what_bench_serving_loads_offline(tmp_path):
    """A pinned download leaves snapshots/<sha> and no refs/main: the repo id at
    "main" is not found offline, the revision is, and the processor loads from it."""
    sha = "89abcdef0123456789abcdef0123456789abcdef"
    snap = tmp_path / "hub" / "models--org--tiny-vl" / "snapshots" / sha
    make_tiny_model(str(snap), check=False)
    assert _resolve(tmp_path / "hub", "org/tiny-vl", sha) == f"DIR {snap}"
    err = _resolve(tmp_path / "hub", "org/tiny-vl", None)
    assert err.startswith(
        "ERR org/tiny-vl at revision main is not in the local Hugging Face cache"
    )
    assert B.local_model_dir(str(snap)) == str(snap)  # a folder is used as it is
    # What bench_serving does with it, offline (sglang.benchmark.utils.get_processor).
    probe = (
        "from sglang.benchmark.utils import get_processor, get_tokenizer; import sys; "
        "print(type(get_processor(sys.argv[1])).__name__, len(get_tokenizer(sys.argv[1])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(snap)],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub")),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "Qwen3VLProcessor"


# ---------------------------------------------------------------- cold launches


def test_every_launch_gets_empty_caches_and_its_own_aiter_snapshot_copy(tmp_path):
    jit = tmp_path / "aiter-jit"
    jit.mkdir()
    (jit / "module_prebuilt.so").write_text("shipped with the image")
    args = AB.parse(
        [
            "--model-path",
            "m",
            "--out-dir",
            str(tmp_path / "ab"),
            "--aiter-jit-dir",
            str(jit),
        ]
    )
    assert args.cache_root == str(tmp_path / "ab" / "caches")
    snap = AB.snapshot_tree(
        str(jit), os.path.join(args.cache_root, "aiter-jit-snapshot")
    )
    assert (snap["how"], snap["files"]) == ("hard links", 1)
    first = AB.fresh_caches(args, "run1-base")
    assert (
        first["cold"] is True
        and first["env"]["AITER_JIT_DIR"] == first["env"]["JIT_WORKSPACE_DIR"]
    )
    # The first server compiles into its folders and builds an aiter module.
    for var in AB.CACHE_VARS:
        (tmp_path / first["env"][var] / "kernel").write_text("compiled")
    (
        tmp_path / first["env"]["AITER_JIT_DIR"] / "module_built_at_runtime.so"
    ).write_text("built")
    second = AB.fresh_caches(args, "run1-series")
    assert second["cold"] is True
    assert {v: AB.count_files(second["env"][v]) for v in AB.CACHE_VARS} == {
        v: 0 for v in AB.CACHE_VARS
    }
    assert sorted(os.listdir(second["env"]["AITER_JIT_DIR"])) == ["module_prebuilt.so"]
    assert (
        os.stat(
            os.path.join(second["env"]["AITER_JIT_DIR"], "module_prebuilt.so")
        ).st_ino
        == os.stat(jit / "module_prebuilt.so").st_ino
    )
    assert sorted(os.listdir(jit)) == [
        "module_prebuilt.so"
    ]  # the image's folder is untouched


def test_ready_timeout_is_a_few_times_the_slowest_launch():
    args = AB.parse(["--model-path", "m"])
    assert args.ready_timeout is None
    assert AB.ready_timeout_for(args, []) == 1800.0
    assert AB.ready_timeout_for(args, [40.0]) == 300.0
    assert AB.ready_timeout_for(args, [240.0, 231.0]) == 720.0
    assert (
        AB.ready_timeout_for(
            AB.parse(["--model-path", "m", "--ready-timeout", "90"]), [240.0]
        )
        == 90.0
    )


def test_prefetch_only_fetches_and_launches_nothing(tmp_path, monkeypatch):
    calls = []

    def fetch(repo_id, revision=None, **kwargs):
        calls.append((repo_id, revision))
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    out = tmp_path / "ab"
    rc = AB.main(
        [
            "--prefetch-only",
            "--model-path",
            "org/model",
            "--out-dir",
            str(out),
            "--",
            "--revision",
            "abc123",
            "--tp-size",
            "2",
        ]
    )
    assert rc == 0 and calls == [("org/model", "abc123")]
    assert json.loads((out / "prefetch.json").read_text())["local_dir"] == str(
        tmp_path / "snap"
    )
    assert sorted(p.name for p in out.iterdir()) == ["prefetch.json"]


def test_sigterm_is_not_swallowed_by_a_broad_except():
    """SIGTERM can land inside library code that catches Exception (a psutil
    call while a launch is polled); the harness's stop must pass through it."""
    with pytest.raises(AB.ABStopped, match="stopped by signal 15"):
        try:
            AB._stop_on_sigterm(15, None)
        except Exception:  # noqa: BLE001 - what such library code does
            pass
