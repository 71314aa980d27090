"""benchmark/gpu_check/gpu_vit_dp_step.py dry-run: the TP2 DP-encoder ViT step on two gloo ranks.

The GPU benchmark's own code path (two ranks, SGLang's real Qwen3-VL model
built at attention-TP 2 with ``--mm-enable-dp-encoder``, the real prefill-step
function and DP runner), tiny sizes on the CPU. Per-request calls put every
one-image call on one rank; the cross-request call splits the burst's images
over both ranks as the DP encoder's load balancer assigns them.

Each rank also reports what the series observed of its steps (each
observation it hands the ``MMEncoderMetricsCollector`` a scheduler with
``--enable-metrics`` publishes): the batched path is the series'
cross-request call (``path=batched``, every request in it) with each rank's
share as the balancer assigned it; the per-request path is one
``path=per_request`` call per request.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="stage-a-test-cpu")

import json  # noqa: E402

import gpu_vit_dp_step as D  # noqa: E402
import pytest  # noqa: E402

BURST = "64x64:3,128x64:2"  # 5 requests: 16 and 32 patches, interleaved
REPEATS = 1
REAL_RANK_MAIN = D.rank_main


def observed_rank_main(rank, world_size, init_method, opts):
    """The dry run's own rank, with the series' observations of its steps
    noted (nothing the run computes is replaced). They go to the collector a
    scheduler with --enable-metrics publishes, so this rank publishes one as
    that rank's scheduler would: its tp_rank, the call series recorded on
    rank 0 (observations noted on both)."""
    from cpu_support.ranks.mm_harness import noting_observations, vit_metrics_collector

    from sglang.srt.runtime_context import get_resources

    notes = []
    get_resources().mm_encoder_metrics = noting_observations(
        vit_metrics_collector({"tp_rank": rank}, records_calls=rank == 0)[0],
        notes.append,
    )
    out = REAL_RANK_MAIN(rank, world_size, init_method, opts)
    out["series_observations"] = notes
    return out


@pytest.fixture(autouse=True)
def _restore_malloc_env(monkeypatch):
    # The dry run pins glibc's MALLOC_* for its ranks in this process's
    # environment; later modules' ranks must not inherit it.
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)  # restored after the test


def test_dry_run_per_request_vs_one_cross_request_call(tmp_path, monkeypatch):
    out = tmp_path / "new" / "dir"
    monkeypatch.setattr(D, "rank_main", observed_rank_main)
    assert (
        D.main(
            [
                "--dry-run",
                "--repeats",
                str(REPEATS),
                "--burst",
                BURST,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "vit_dp_step.json").read_text())
    grids = [tuple(g) for g in D.U.burst_grids(D.U.parse_burst(BURST))]
    sizes = [D.U.patches(g) for g in grids]
    assert (
        report["ranks"] == 2
        and report["requests"] == 5
        and report["patches"] == sum(sizes)
    )
    paths = {p["path"]: p for p in report["paths"]}

    # Per request: 5 encoder calls of one image each; the DP runner gives a lone image to rank 0.
    per = paths["per-request"]
    assert per["encoder_calls"] == 5
    assert per["tower_calls_per_rank"] == [5, 0] and per["images_per_rank"] == [5, 0]
    assert per["patches_on_ranks"] == [sum(sizes), 0]

    # One cross-request call: both ranks' towers run once, on the load balancer's shares.
    from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment

    _, counts, loads = get_dp_encoder_lb_assignment(sizes, 2)
    bat = paths["batched"]
    assert bat["encoder_calls"] == 1 and bat["tower_calls_per_rank"] == [1, 1]
    assert bat["images_per_rank"] == list(counts) and bat["patches_on_ranks"] == list(
        loads
    )
    assert min(counts) > 0

    for p in report["paths"]:
        assert len(p["peak_mib_per_rank"]) == 2
        assert p["warm_min_ms"] <= p["warm_median_ms"] <= p["warm_max_ms"]
    md = (out / "vit_dp_step.md").read_text()
    assert "| per-request | 5 | 5 / 0 | 5 / 0 |" in md
    assert f"| batched | 1 | 1 / 1 | {counts[0]} / {counts[1]} |" in md

    # The paths that ran, as the series recorded them on each rank: an
    # unrelated one-image warm-up step, then each path's steps (the first,
    # the memory run, the warmed repeats).
    steps = 2 + REPEATS

    def call(path, images, patches):
        return dict(
            path=path, modality="image", requests=images, items=images, patches=patches
        )

    warm = [call("batched", 1, D.U.patches((1, 4, 4)))]
    per_request = [call("per_request", 1, n) for n in sizes]
    batched = [call("batched", 5, sum(sizes))]
    for rank, per_rank in enumerate(report["per_rank"]):
        noted = per_rank["series_observations"]
        calls = [n for n in noted if "path" in n]
        expected = warm + per_request * steps + batched * steps
        assert calls == expected, (rank, calls)
        shares = [n["tp_rank_share"] for n in noted if "tp_rank_share" in n]
        # The batched steps' shares: each rank's, as the balancer assigned them.
        assert shares[-steps:] == [counts[rank]] * steps, shares


@pytest.mark.control(reason="argument check of the script")
def test_outside_torchrun_without_dry_run_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert D.main(["--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gpu_vit_dp_step: run it under torchrun --nproc-per-node 2 (or --dry-run on the CPU)"
    ]
