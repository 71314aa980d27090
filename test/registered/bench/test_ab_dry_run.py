"""The A/B harness's GPU path (no ``--cpu``), dry-run on the CPU with two ``--target`` trees.

``benchmark/image_burst/ab_image_burst.py`` runs as the docs' GPU commands run it: two real
trees (pristine SGLang 0.5.23 and the series, ``cpu_support/server/sglang_trees.py``)
put first on ``PYTHONPATH``, the model given as a Hugging Face repo id with a
pinned ``--revision`` after ``--``, the real ``sglang.bench_serving`` for every
burst. Only what needs a GPU is faked: ``launch_server`` (``stub_gpu_server.py``,
through a Python wrapper), ``nvidia-smi`` (on ``PATH``, reading the stub's GPU
state) and the model download (``huggingface_hub.snapshot_download``, which
here writes the tiny model into a private cache as the pinned commit, and no
``refs/main``, as a pinned download does).

One A/B of two runs (no text warm-up, two bursts of two requests) whose third
launch fails checks, in one go:
the untimed pre-fetch before the first launch; every
request completing offline although "main" is not cached (item 1); the wait
for GPU memory between launches (item 5); ab.json holding every finished run
after a failed launch (item 4); images per rank and encoder calls from
``/metrics`` as the series tree's own metrics class exports them (item 7);
every launch cold, with its own empty compile-cache folders, and the ready
timeout derived from the first launch; burst 2 sending burst 1's
images with its encoder-cache hits counted. A second A/B stops after a text
warm-up that completes nothing. ``--throwaway-launch`` is checked in
``test_ab_mixed_dry_run.py`` (its launches take no request, whichever path).

These are tests of the harness: both trees are explicit ``--target`` folders,
so the SGLang the test process imports does not change the result.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=130, suite="stage-a-test-cpu")

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402

import huggingface_hub  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.control(
    reason="harness dry run: both trees are explicit --target folders, independent of the SGLang under test"
)

import ab_image_burst as AB  # noqa: E402
import bench_image_burst as B  # noqa: E402
from cpu_support.server.sglang_trees import pristine_tree, series_tree  # noqa: E402
from cpu_support.tiny_models.make_tiny_model import make_tiny_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(HERE, "stub_gpu_server.py")
REPO_ID = "fork-test/tiny-qwen3-vl"
SHA = "0123456789abcdef0123456789abcdef01234567"

FAKE_SMI = r"""#!{python}
import json, os, sys, time
path = os.path.join({state!r}, "gpu.json")
g = json.load(open(path)) if os.path.exists(path) else {{"in_use": False, "release_at": 0}}
used = 70000 if g["in_use"] or time.time() < g["release_at"] else 300
if sys.argv[1:] != ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]:
    sys.exit("fake nvidia-smi: unexpected arguments %r" % sys.argv[1:])
print("0, %d\n1, %d" % (used, used))
"""

WRAPPER = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then
  shift 2
  exec {python} {stub} "$@"
fi
exec {python} "$@"
"""


def _executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def gpu_box(tmp_path, monkeypatch):
    """A CPU machine dressed as a GPU box: fake nvidia-smi, stub server, empty HF cache."""
    state = tmp_path / "state"
    state.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(
        bin_dir / "nvidia-smi", FAKE_SMI.format(python=sys.executable, state=str(state))
    )
    python = _executable(
        tmp_path / "python", WRAPPER.format(python=sys.executable, stub=STUB)
    )
    model = make_tiny_model(str(tmp_path / "tiny-model"), check=False)
    cache = tmp_path / "hub"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_STATE_DIR", str(state))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fetches = []
    out = tmp_path / "ab"

    def fake_snapshot_download(repo_id, revision=None, **kwargs):
        """The download: the pinned commit's snapshot, as huggingface_hub lays it out."""
        logs = sorted(p.name for p in out.glob("*.server.log")) if out.exists() else []
        fetches.append(
            {
                "repo_id": repo_id,
                "revision": revision,
                "server_logs_then": logs,
                "kwargs": kwargs,
            }
        )
        snap = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision
        shutil.copytree(model, snap, dirs_exist_ok=True)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    return {"python": python, "out": out, "fetches": fetches, "state": state}


def _argv(
    box,
    *server_flags,
    runs=2,
    warmup=0,
    bursts=1,
    ready_timeout=("--ready-timeout", "60"),
):
    return [
        "--runs",
        str(runs),
        "--bursts",
        str(bursts),
        "--num-prompts",
        "2",
        "--max-concurrency",
        "2",
        "--image-resolution",
        "224x224",
        "--input-len",
        "32",
        "--output-len",
        "4",
        "--warmup-text-prompts",
        str(warmup),
        "--a-python",
        box["python"],
        "--a-target",
        pristine_tree(),
        "--a-label",
        "base",
        "--b-python",
        box["python"],
        "--b-target",
        series_tree(),
        "--b-label",
        "series",
        "--model-path",
        REPO_ID,
        "--out-dir",
        str(box["out"]),
        *ready_timeout,
        "--gpu-release-timeout",
        "30",
        "--",
        "--revision",
        SHA,
        "--tp-size",
        "2",
        *server_flags,
    ]


def test_ab_gpu_path_with_pinned_revision_and_a_failed_third_launch(gpu_box, capsys):
    argv = _argv(
        gpu_box,
        "--stub-fail-launch",
        "3",
        "--stub-token-delay",
        "0.05",
        bursts=2,
        ready_timeout=(),
    )
    beside = [
        "--text-stream-concurrency",
        "2",
        "--text-stream-output-len",
        "3",
        "--unseen-sizes",
        "64x96,96x64",
        "--memory",
    ]
    rc = AB.main(beside + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1 and "server exited with code 1" in err[0], err

    # Item 6: one untimed fetch of the pinned revision, before any server started.
    assert [
        (f["repo_id"], f["revision"], f["server_logs_then"]) for f in gpu_box["fetches"]
    ] == [(REPO_ID, SHA, [])]
    ab = json.loads((gpu_box["out"] / "ab.json").read_text())
    assert ab["prefetch"]["fetched"] is True and ab["prefetch"]["revision"] == SHA
    assert ab["prefetch"]["local_dir"].endswith(os.path.join("snapshots", SHA))

    # Item 4: the failed third launch kept both finished runs, atomically written.
    assert ab["complete"] is False and "exited with code 1" in ab["error"]
    assert [(r["run"], r["build"]) for r in ab["runs"]] == [(1, "base"), (1, "series")]
    assert [
        p.name for p in gpu_box["out"].iterdir() if p.name.startswith(".ab.json")
    ] == []
    md = (gpu_box["out"] / "ab.md").read_text()
    assert (
        "| base | 1 |" in md
        and "| series | 1 |" in md
        and "INCOMPLETE: server exited" in md
    )

    # Item 1: every request completed, although only the pinned commit is cached.
    for r in ab["runs"]:
        res = r["result"]
        assert [
            (b["stats"]["completed"], b["stats"]["failed"]) for b in res["bursts"]
        ] == [(2, 0), (2, 0)]
        cmd = res["bursts"][0]["command"]
        assert cmd[cmd.index("--tokenizer") + 1] == ab["prefetch"]["local_dir"]

    # Item 5: the second launch waited for the first server's memory to be released.
    assert ab["gpu_memory_before"]["tool"] == "nvidia-smi"
    assert ab["gpu_memory_before"]["used_mib"] == {"0": 300.0, "1": 300.0}
    assert ab["runs"][0]["gpu_memory_wait"] is None
    wait = ab["runs"][1]["gpu_memory_wait"]
    assert wait["waited_s"] >= 1.0 and wait["used_mib"] == {"0": 300.0, "1": 300.0}

    # Item 7: images per rank and calls from /metrics, as the series tree's own
    # MMEncoderMetricsCollector exports them (one per scheduler, each with
    # its labels); pristine exports none. Each one-image request is one call,
    # and the DP load balancer puts a lone image on tp_rank 0; tp_rank 1
    # records its empty share.
    base, series = (r["result"]["bursts"][0]["stats"] for r in ab["runs"])
    assert base["images_per_rank"] is None and base["encoder"] is None
    assert series["images_per_rank"] == [2, 0]
    assert series["encoder"]["rank_grids"] == {"0": 2, "1": 0}
    assert (
        series["encoder"]["calls_by_path"] == {"batched": 2}
        and series["encoder"]["images"] == 2
    )

    # Burst 2 sends burst 1's images (the seed's protocol); hits = sent - encoded.
    b1, b2 = ab["runs"][1]["result"]["bursts"]
    assert (b1["seed"], b2["seed"], b2["same_images_as_burst"]) == (42, 42, 1)
    assert (b2["stats"]["images_sent"], b2["stats"]["encoder_cache_hits"]) == (2, 0)
    assert ab["runs"][0]["result"]["bursts"][1]["stats"]["encoder_cache_hits"] is None
    assert "- burst images: burst 2 sends burst 1's images again (seed 42" in md
    assert "from /metrics), series: 0/2" in md and "from /metrics), base: n/a" in md

    # Every launch cold (its own empty Inductor and Triton folders,
    # which the server then filled), and the ready timeout: 1800 s for the
    # first launch, then 3x the slowest launch so far, at least 300 s.
    seen = [
        json.loads((gpu_box["state"] / f"launch-{n}.json").read_text())["caches"]
        for n in (1, 2)
    ]
    for var in AB.CACHE_VARS:
        assert seen[0][var]["path"] != seen[1][var]["path"]
        assert seen[0][var]["files_at_start"] == seen[1][var]["files_at_start"] == []
    for r, got in zip(ab["runs"], seen):
        assert r["caches"]["cold"] is True
        assert {v: r["caches"]["env"][v] for v in AB.CACHE_VARS} == {
            v: got[v]["path"] for v in AB.CACHE_VARS
        }
        # One file at start, then one kernel per image size (224x224, 64x96,
        # 96x64): Triton a file each, Inductor one file and one per rank each.
        assert r["caches"]["files_after"] == {
            "TRITON_CACHE_DIR": 1 + 3,
            "TORCHINDUCTOR_CACHE_DIR": 1 + 3 * 3,
            # ROCm libraries' caches: each launch its own empty folder.
            **{v: 0 for v in AB.ROCM_CACHE_VARS},
        }
        assert all(
            os.path.dirname(r["caches"]["env"][v]) == r["caches"]["root"]
            for v in AB.ROCM_CACHE_VARS
        )
    assert [r["ready_timeout_s"] for r in ab["runs"]] == [1800.0, 300.0]
    assert "- compile caches: 2 of 2 launches cold" in md
    assert "TILELANG_CACHE_DIR, MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR)" in md

    # Every kernel built after ready is counted, per burst and per rank where
    # Inductor's folder tells them apart: burst 1's new image size built its
    # kernels, burst 2 (the same size) none; each unseen size's first request
    # built them, its repeat none. The stub wrote its start-up file before
    # ready: not counted.
    new = {
        "triton": {"new": 1, "per_device": {}},
        "inductor": {"new": 3, "per_device": {"0": 1, "1": 1}},
    }
    none = {
        "triton": {"new": 0, "per_device": {}},
        "inductor": {"new": 0, "per_device": {}},
    }

    def counts(c):
        return {
            k: {"new": v["new"], "per_device": v["per_device"]} for k, v in c.items()
        }

    for r in ab["runs"]:
        bursts = r["result"]["bursts"]
        assert [counts(b["stats"]["cache_entries"]) for b in bursts] == [new, none]
        assert bursts[0]["stats"]["cache_entries"]["triton"]["entries"] == [
            "size-224x224"
        ]
        assert bursts[0]["stats"]["cache_entries"]["inductor"]["entries"] == [
            "fx/size-224x224.py",
            "triton/0/size-224x224",
            "triton/1/size-224x224",
        ]
        for u in r["result"]["unseen_sizes"]:
            assert counts(u["first_cache_entries"]) == new
            assert counts(u["repeat_cache_entries"]) == none
        after = r["result"]["compile_caches"]
        assert after["entries_at_ready"] == {"triton": 1, "inductor": 1}
        assert after["new_after_ready"]["triton"]["new"] == 3
        assert after["new_after_ready"]["inductor"]["per_device"] == {"0": 3, "1": 3}
    cell = "Triton 1 / Inductor 3 (triton/0: 1, triton/1: 1)"
    assert f"| {cell} |" in md  # burst 1, the table's last column
    assert "| Triton 0 / Inductor 0 |" in md  # burst 2
    assert f"| {cell} | Triton 0 / Inductor 0 |" in md  # unseen: first, repeat

    # The reviewer's three costs (test_beside_the_images.py has the CPU memory path).
    for r in ab["runs"]:
        for burst in r["result"]["bursts"]:
            text = burst["stats"]["text_stream"]
            # A text-only stream ran beside every burst, 2 in flight, every request answered.
            assert (
                text["concurrency"] == 2
                and text["completed"] >= 2
                and text["failed"] == 0
            )
            assert text["p50_ttft_ms"] <= text["p99_ttft_ms"]
            # Beside the images: the requests sent within bench_serving's run (its duration + 2 s back
            # from its exit), a part of the stream (how many depends on how long the exit lagged).
            duration = burst["bench_serving"]["duration"]
            assert abs(text["window_s"] - (duration + B.IMAGE_WINDOW_SLACK_S)) < 1e-6
            assert text["in_window"]["completed"] < text["completed"]
            # The fake nvidia-smi shows both GPUs held by the server during the burst.
            assert burst["stats"]["memory"] == {
                "gpu_peak_used_mib": {"0": 70000.0, "1": 70000.0}
            }
        unseen = r["result"]["unseen_sizes"]
        assert [(u["height"], u["width"]) for u in unseen] == [(64, 96), (96, 64)]
        for u in unseen:
            assert u["first_ok"] and u["repeat_ok"]
            assert u["extra_ttft_ms"] == u["first_ttft_ms"] - u["repeat_ttft_ms"]
            assert (
                u["first_compiles"] == u["repeat_compiles"] == {}
            )  # the stub compiles nothing
    assert (
        "Text-only stream beside the image bursts (2 concurrent requests, 3 output tokens"
        in md
    )
    assert "| Build | Burst | Beside images: mean TTFT (ms) |" in md
    assert "| base | 64x96 |" in md and "| series | 96x64 |" in md
    assert "| series | 2 | 0: 70000; 1: 70000 |" in md


def test_warm_up_completing_nothing_stops_the_whole_ab(gpu_box, capsys):
    rc = AB.main(_argv(gpu_box, "--stub-chat-status", "500", runs=2, warmup=1))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "text warm-up completed 0 of 1 requests" in err[0]
    # No image burst ran and no second server was launched.
    out = gpu_box["out"]
    assert sorted(p.name for p in out.glob("*.server.log")) == ["run1-base.server.log"]
    assert not list(out.rglob("burst1.*"))
    ab = json.loads((out / "ab.json").read_text())
    assert ab["complete"] is False and ab["runs"] == []
    assert "text warm-up completed 0 of 1" in ab["error"]
