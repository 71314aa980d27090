"""Kernel-cache entries built after ready (cpu_support/bench/vit_bench_util.py).

The burst benchmark, the A/B and the GPU check count what the Triton and
Inductor cache folders gained after the server (or the check) was ready. These
tests lay the folders out as Triton and Inductor do and check what counts as
one entry; test_ab_dry_run.py counts them per burst through a stub server.
The module's other helpers that the archive packs (``markdown_table``,
``config_dir``) are tested here too.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
sys.path.insert(0, REPO)

from cpu_support.bench import vit_bench_util as U  # noqa: E402

pytestmark = pytest.mark.control(reason="folder walking of the fork's own tools")


def _touch(root, *rel):
    path = os.path.join(root, *rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("x")


def test_triton_kernel_is_its_hash_folder(tmp_path):
    root = str(tmp_path / "triton")
    for name in ("k.json", "k.hsaco", "__grp__k.json"):
        _touch(root, "abc123", name)
    _touch(root, "abc123", "tmp.pid_7_99", "k.json")  # a writer's scratch
    _touch(root, "tmp.pid_8_1", "x.json")
    _touch(root, "cache.lock")
    assert U.cache_entries(root, "triton") == {"abc123"}


def test_inductor_files_and_its_per_device_triton_kernels(tmp_path):
    root = str(tmp_path / "inductor")
    _touch(root, "fxgraph", "ab", "key", "entry")
    _touch(root, "c2", "c2xyz.py")
    _touch(root, "triton", "0", "h1", "k.json")
    _touch(root, "triton", "0", "h1", "k.cubin")
    _touch(root, "triton", "1", "h1", "k.json")
    assert U.cache_entries(root, "inductor") == {
        "fxgraph/ab/key/entry",
        "c2/c2xyz.py",
        "triton/0/h1",
        "triton/1/h1",
    }


def test_new_entries_since_ready_per_device(tmp_path):
    dirs = {"triton": str(tmp_path / "t"), "inductor": str(tmp_path / "i")}
    _touch(dirs["inductor"], "before.py")  # built before ready: not counted
    ready = U.cache_snapshot(dirs)
    assert ready == {"triton": set(), "inductor": {"before.py"}}  # t/ is missing
    _touch(dirs["triton"], "k1", "k.json")
    _touch(dirs["inductor"], "triton", "1", "h", "k.json")
    _touch(dirs["inductor"], "fx", "g.py")
    new = U.new_cache_entries(ready, U.cache_snapshot(dirs))
    assert new == {
        "triton": {"new": 1, "per_device": {}, "entries": ["k1"]},
        "inductor": {
            "new": 2,
            "per_device": {"1": 1},
            "entries": ["fx/g.py", "triton/1/h"],
        },
    }
    assert U.fmt_cache_entries(new) == "Triton 1 / Inductor 2 (triton/1: 1)"
    assert U.fmt_cache_entries(None) == "not counted"


def test_unknown_cache_kind_is_refused():
    with pytest.raises(ValueError, match="unknown compile cache 'miopen'"):
        U.cache_entries("/nonexistent", "miopen")


def test_markdown_table_refuses_a_bad_alignment():
    assert U.markdown_table(["a", "b"], [[1, 2]], align="ll").splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | 2 |",
    ]
    with pytest.raises(ValueError, match="align takes only"):
        U.markdown_table(["a"], [[1]], align="c")


def test_config_dir_is_one_folder_per_config_whoever_asks(tmp_path, monkeypatch):
    from transformers import PretrainedConfig

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = U.config_dir(PretrainedConfig(depth=2), "tiny-x")
    # Asked again (another rank, another run): the same folder, nothing new.
    assert U.config_dir(PretrainedConfig(depth=2), "tiny-x") == first
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(first)]
    assert PretrainedConfig.from_pretrained(first).depth == 2
    other = U.config_dir(PretrainedConfig(depth=3), "tiny-x")
    assert other != first and len(os.listdir(tmp_path)) == 2
    # A folder left empty (a run killed mid-write elsewhere) is filled, not trusted.
    os.remove(os.path.join(other, "config.json"))
    assert U.config_dir(PretrainedConfig(depth=3), "tiny-x") == other
    assert PretrainedConfig.from_pretrained(other).depth == 3
    assert len(os.listdir(tmp_path)) == 2
