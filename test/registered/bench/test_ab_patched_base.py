"""The A/B harness refuses a base tree that already carries the series.

A base copied after an in-place ``series.py apply`` is the series under
another label; the A/B would then compare the series with itself. The
harness asks ``series.py status --target T --json`` about build A's tree and
stops with one line naming the tree and the status, before anything is
launched, unless ``--allow-patched-base`` says it is meant.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-test-cpu")

import ab_image_burst as AB  # noqa: E402
import pytest  # noqa: E402
from cpu_support.server.sglang_trees import pristine_tree, series_tree  # noqa: E402

pytestmark = pytest.mark.control(
    reason="the A/B harness's own check of its trees; no SGLang code under test"
)


def _argv(tmp_path, base, *extra):
    return [
        "--model-path",
        "org/model",
        "--a-target",
        base,
        "--b-target",
        series_tree(),
        "--out-dir",
        str(tmp_path / "ab"),
        *extra,
        "--",
        "--tp-size",
        "2",
    ]


def test_a_patched_base_is_refused_in_one_line(tmp_path, capsys):
    patched = series_tree()
    rc = AB.main(_argv(tmp_path, patched))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(
        f"ab_image_burst: build A (the base) {patched} carries the series"
    )
    assert f"series.py status --target {patched}: applied, series " in err[0]
    assert err[0].endswith("or pass --allow-patched-base")
    assert not (tmp_path / "ab").exists()  # nothing launched, nothing written


def test_allow_patched_base_and_a_pristine_base(tmp_path):
    allowed = AB.describe_builds(
        AB.parse(_argv(tmp_path, series_tree(), "--allow-patched-base"))
    )
    assert [b["series_status"]["applied"] for b in allowed] == [True, True]
    builds = AB.describe_builds(AB.parse(_argv(tmp_path, pristine_tree())))
    assert [b["series_status"]["applied"] for b in builds] == [False, True]
    assert (
        builds[0]["series_hash"] == "none (pristine)"
        and builds[0]["tree"] == pristine_tree()
    )
