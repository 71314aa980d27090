"""benchmark/vit/bench_dp_encoder_gather.py at attention-TP 2, tiny tower, one
batch (one 4096-patch image, then 7 of 4 patches), unset and capped: the
buffers it reads off SGLang's DP runner equal the formula (the bench stops
otherwise), and the cap takes the large image out of the gather."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

import bench_dp_encoder_gather as B

ROW = 64 * (1 + 1) * 4  # tiny tower: out_hidden 64, one deepstack layer; fp32


def test_tp2_gather_matches_the_formula_and_the_cap_bounds_it(capsys, monkeypatch):
    # RANK and WORLD_SIZE mean "a torchrun rank" to the bench; SGLang's
    # init_single_process_dist(), run by another module of this worker, sets them.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["--tp", "2", "--batches", "large+tiny", "--caps", "512", "--repeats", "1"]
    rows = B.main(argv)
    unset, capped = rows
    assert (unset["cap"], capped["cap"]) == (None, 512)
    assert (unset["calls"], capped["calls"]) == (1, 2)
    # Unset: the 1024-token image on one rank, the other padded to it.
    assert unset["local"] == [1024 * ROW] * 2
    assert unset["gather"] == unset["predicted"] == [2 * 1024 * ROW] * 2
    assert unset["useful"] == unset["out"] == [(1024 + 7) * ROW] * 2
    # Capped: the image alone (broadcast, no gather); the 7 tiny ones split 4 / 3.
    assert capped["gather"] == capped["predicted"] == [2 * 4 * ROW] * 2
    assert capped["out"] == [1024 * ROW] * 2 and capped["useful"] == [7 * ROW] * 2
    assert unset["step_ms"] is not None  # one core per rank: timed
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 2 ")]
    assert len(table) == 2
