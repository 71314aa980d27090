"""benchmark/vit/bench_dp_encoder_gather.py at attention-TP 2, tiny towers,
one batch (one 4096-patch image, then 7 of 4 patches), unset and capped,
padded and exact: the buffers it reads off SGLang's three padding DP runners
equal the formula (the bench stops otherwise), the exact path receives the
call's output and no more, and the cap takes the large image out of the
gather."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="stage-a-test-cpu")

import bench_dp_encoder_gather as B

ROW = 64 * (1 + 1) * 4  # tiny tower: out_hidden 64, one deepstack layer; fp32


def test_tp2_gathers_match_the_formula_padded_and_exact(capsys, monkeypatch):
    # RANK and WORLD_SIZE mean "a torchrun rank" to the bench; SGLang's
    # init_single_process_dist(), run by another module of this worker, sets them.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["--tp", "2", "--batches", "large+tiny", "--caps", "512", "--repeats", "1"]
    rows = B.main(argv)
    by = {(r["cap"], r["path"]): r for r in rows}
    assert sorted(by, key=str) == sorted(
        [(None, "padded"), (None, "exact"), (512, "padded"), (512, "exact")], key=str
    )
    padded, exact = by[None, "padded"], by[None, "exact"]
    assert padded["calls"] == exact["calls"] == 1
    # Padded: the 1024-token image on one rank, the other padded to it.
    assert padded["local"] == [1024 * ROW] * 2
    assert padded["gather"] == padded["predicted"] == [2 * 1024 * ROW] * 2
    # Exact: each rank's own rows in, the call's 1031 rows out, nothing more.
    assert exact["local"] == [1024 * ROW, 7 * ROW]
    assert exact["gather"] == exact["predicted"] == [(1024 + 7) * ROW] * 2
    assert exact["ratio"] == [1.0] * 2 and padded["ratio"] == [1.99] * 2
    assert exact["out"] == padded["out"] == [(1024 + 7) * ROW] * 2
    # Capped: the image alone (broadcast, no gather); the 7 tiny ones split 4 / 3.
    capped_padded, capped_exact = by[512, "padded"], by[512, "exact"]
    assert capped_padded["calls"] == capped_exact["calls"] == 2
    assert capped_padded["gather"] == [2 * 4 * ROW] * 2
    assert capped_exact["gather"] == [7 * ROW] * 2
    assert exact["step_ms"] is not None  # one core per rank: timed
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("| 2 ")]
    # The mrope rows, then the pre-sharded and tile runners', padded and exact.
    assert len(table) == 4 + 4
