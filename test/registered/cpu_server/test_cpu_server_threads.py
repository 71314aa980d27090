"""Intra-op threads per rank of the CPU server, and the tower-timing hook."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402
from cpu_support.server import cpu_server as CS  # noqa: E402

pytestmark = pytest.mark.control(
    reason="harness: the CPU server's threads per rank and its tower-timing hook"
)


def test_threads_per_rank_splits_the_cpus():
    assert CS.threads_per_rank(2, [0, 1]) == 1
    assert CS.threads_per_rank(2, range(4)) == 2
    assert CS.threads_per_rank(1, [0, 1]) == 2
    assert CS.threads_per_rank(3, [0, 1]) == 1  # never 0 threads
    with pytest.raises(ValueError):
        CS.threads_per_rank(0, [0, 1])


def test_server_env_gives_each_rank_its_share_by_default():
    env = CS.server_env(tp_size=2, base={})
    assert env["OMP_NUM_THREADS"] == str(CS.threads_per_rank(2))
    # explicit count wins over the caller's environment
    assert (
        CS.server_env(tp_size=2, omp_threads=3, base={"OMP_NUM_THREADS": "8"})[
            "OMP_NUM_THREADS"
        ]
        == "3"
    )
    # 0: the old set-up, the variable left as the caller has it
    assert "OMP_NUM_THREADS" not in CS.server_env(tp_size=2, omp_threads=0, base={})
    assert (
        CS.server_env(tp_size=2, omp_threads=0, base={"OMP_NUM_THREADS": "8"})[
            "OMP_NUM_THREADS"
        ]
        == "8"
    )
    with pytest.raises(ValueError):
        CS.server_env(tp_size=2, omp_threads=-1, base={})


def test_vit_profile_dir_goes_first_and_chains_to_the_gate_simulation(tmp_path):
    env = CS.server_env(
        tp_size=2,
        simulate_rocm_gate=True,
        vit_profile_dir=str(tmp_path),
        python_path=["/tree"],
        base={},
    )
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[:3] == [CS.VIT_PROFILE_DIR, CS.ROCM_GATE_SIM_DIR, "/tree"]
    assert env[CS.VIT_PROFILE_ENV] == str(tmp_path)
    assert CS.VIT_PROFILE_ENV not in CS.server_env(
        tp_size=2, base={CS.VIT_PROFILE_ENV: "x"}
    )


def _load_hook():
    path = os.path.join(CS.VIT_PROFILE_DIR, "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("_vit_profile_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # env var unset here: installs nothing
    return mod


def test_vit_profile_hook_records_each_call_and_returns_the_result(tmp_path):
    import torch

    hook = _load_hook()

    class Tower:
        def forward(self, x, grid_thw):
            return x * 2

    fake_module = type("M", (), {hook._CLASS: Tower})
    os.environ[hook._DIR_ENV] = str(tmp_path)
    try:
        hook._patch(fake_module)
        hook._patch(fake_module)  # twice: wrapped once
    finally:
        del os.environ[hook._DIR_ENV]
    assert Tower.forward.__wrapped__.__name__ == "forward"
    out = Tower().forward(torch.ones(3), torch.tensor([[1, 4, 6], [1, 2, 2]]))
    assert torch.equal(out, torch.full((3,), 2.0))
    Tower().forward(torch.ones(1), [[1, 2, 4]])
    (log,) = tmp_path.glob("calls-*.jsonl")
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["call"] for r in recs] == [0, 1]
    assert (recs[0]["images"], recs[0]["patches"], recs[0]["image_patches"]) == (
        2,
        28,
        [24, 4],
    )
    assert (recs[1]["images"], recs[1]["patches"]) == (1, 8)
    assert all(r["threads"] == torch.get_num_threads() for r in recs)
