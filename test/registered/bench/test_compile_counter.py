"""The compile-line counter of benchmark/image_burst/bench_image_burst.py on real torch logs.

Fixtures (fixtures/README.md) were captured on a CPU: a plain
``TORCH_LOGS=recompiles`` run, and a real two-rank CPU server log with
``TORCH_LOGS=recompiles,dynamo``. Expected counts were read off the files by
hand (line numbers in the comments).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import os  # noqa: E402

import bench_image_burst as B  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.control(
    reason="parser of torch compile log lines, on frozen logs"
)

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _lines(name):
    with open(os.path.join(FIX, name), errors="replace") as f:
        return f.readlines()


def test_plain_recompiles_log_one_event_without_rank_prefix():
    events = B.parse_compile_events(_lines("torch_logs_recompiles_plain.log"))
    # One "Recompiling function f" record spread over 3 lines = one event.
    assert len(events) == 1
    e = events[0]
    assert e.function == "f" and e.where == "/tmp/cmp.py:2" and e.compile_id == "0/1"
    assert e.rank == f"pid{e.pid}"
    assert B.compiles_per_rank(events) == {e.rank: 1}


def test_server_log_events_per_rank_and_dedup():
    lines = _lines("server_tp2_series_rocm_sim.log")
    events = B.parse_compile_events(lines)
    # rank0: apply_rotary_pos_emb_native [0/0] (l.3), get_masked_input_and_mask
    # [1/0] (l.5) and its recompile [1/1] (l.9 + start tracing l.12: one event);
    # rank1 the same (l.1, 6, 13/16).
    assert B.compiles_per_rank(events) == {"rank0": 3, "rank1": 3}
    fns = sorted({e.function for e in events})
    assert fns == ["apply_rotary_pos_emb_native", "get_masked_input_and_mask"]
    recompiled = [e for e in events if e.compile_id == "1/1"]
    assert sorted(e.rank for e in recompiled) == ["rank0", "rank1"]


def test_parser_finds_no_compile_after_ready_in_the_frozen_series_log():
    """A parser test on a log captured once (fixtures/README.md); it says nothing about
    today's series, which the CPU server tests check on a live server."""
    lines = _lines("server_tp2_series_rocm_sim.log")
    ready = B.ready_line_index(lines)
    assert ready == 18  # 0-based; "fired up and ready to roll" is line 19
    after = lines[ready + 1 :]
    assert (
        B.parse_compile_events(after) == []
    )  # the warm-up compiled everything before ready


def test_ready_marker_missing():
    assert B.ready_line_index(["nothing here\n"]) is None


def test_log_cursor_reads_only_complete_new_lines(tmp_path):
    p = tmp_path / "s.log"
    p.write_text("a\nb\npart")
    cur = B.LogCursor(str(p))
    assert cur.read_new() == ["a\n", "b\n"]
    with open(p, "a") as f:
        f.write("ial\nc\n")
    assert cur.read_new() == ["partial\n", "c\n"]
    assert cur.read_new() == [] and cur.lines_read == 4


def test_pristine_server_log_compile_after_ready_on_rank0():
    lines = _lines("server_tp2_pristine_rocm_sim.log")
    ready = B.ready_line_index(lines)
    assert ready == 16  # line 17
    after = B.parse_compile_events(lines[ready + 1 :], ready + 1)
    # l.21 "Recompiling function apply_rotary_pos_emb_native" + l.24 start tracing [0/1].
    assert [(e.rank, e.function, e.compile_id, e.line_no + 1) for e in after] == [
        ("rank0", "apply_rotary_pos_emb_native", "0/1", 21)
    ]
