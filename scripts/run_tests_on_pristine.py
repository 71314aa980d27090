"""Run the test suite against pristine SGLang 0.5.23 and list what passes there.

    .venv/bin/python scripts/run_tests_on_pristine.py [PYTEST ARGS...]

Same tests, same venv; only the sglang imported changes. The pristine tree is
the 0.5.23 wheel unpacked (``cpu_support.server.sglang_trees.pristine_tree``:
``.cache/trees/sglang-0.5.23-pristine``, checked to carry no series). It goes
first on ``PYTHONPATH`` of pytest, so every process pytest starts inherits it
(gloo ranks, ``python -c`` probes, scripts run as subprocesses), and into
``FORK_SGLANG_TREE``, which ``cpu_support.server.cpu_server`` puts first on every CPU
server's ``PYTHONPATH``, ahead of the series tree the server tests name.

PYTEST ARGS default to pytest.ini's ``testpaths`` (this repository's
``test/registered`` and the tests the patches carry); anything pytest takes works
(``-m "not control"``, ``-k``, file paths). The pytest output goes to
``--log`` (default ``out/pristine/pytest.log``), every test's outcome to
``out/pristine/report.json`` (a module that cannot be collected there counts
as one error). Printed: the counts, then every test that passed
on pristine: unmarked ones first (each is a finding: it does not test the
series), then the controls with their reasons; then every control that
failed or errored on pristine (each is a finding too: a control passes on
both builds, so one that fails there tests the series and is no control),
with a module that could not be collected there and marks controls (its
controls never ran) among them.

Exit status: 0 when no unmarked test passed on pristine and every control
passed there, 1 when an unmarked test passed or a control failed, 2 when the
run itself failed (no pristine tree, pytest did not complete a run, or it
imported an sglang outside the pristine tree).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # cpu_support

from cpu_support.server.cpu_server import SGLANG_TREE_ENV  # noqa: E402
from cpu_support.server.sglang_trees import (  # noqa: E402
    TreeError,
    pristine_tree,
    series_status,
)

REPORT_ENV = "FORK_TEST_REPORT"  # read by conftest.py


def _fail(msg: str) -> int:
    print(f"run_tests_on_pristine: error: {msg}", file=sys.stderr)
    return 2


def summarize(report: dict) -> dict:
    """Counts by outcome; the passing tests split into unmarked / controls; and
    the controls that did not pass (failed or error: not controls)."""
    counts: dict = {}
    unmarked, controls, failed_controls = [], [], []
    for nodeid, t in sorted(report["tests"].items()):
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        if t["outcome"] == "passed":
            (unmarked if t["control"] is None else controls).append(
                (nodeid, t["control"])
            )
        elif t["control"] is not None and t["outcome"] in ("failed", "error"):
            failed_controls.append((nodeid, t["outcome"], t["control"]))
    return {
        "counts": counts,
        "unmarked": unmarked,
        "controls": controls,
        "failed_controls": failed_controls,
    }


def uncollected_modules_with_controls(report: dict, root: str) -> list:
    """Modules that could not be collected on pristine (one error under the
    module's own id) although they mark controls: those controls never ran
    there. Read from the module's text, since pytest saw no test in it."""
    found = []
    for nodeid, t in sorted(report["tests"].items()):
        path = os.path.join(root, nodeid)
        if "::" in nodeid or t["outcome"] != "error" or not os.path.isfile(path):
            continue
        with open(path) as f:
            if "mark.control" in f.read():
                found.append(nodeid)
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Run the tests against pristine SGLang; list every test that passes there."
    )
    p.add_argument(
        "--log",
        default=os.path.join(ROOT, "out", "pristine", "pytest.log"),
        help="pytest's output (default: out/pristine/pytest.log)",
    )
    p.add_argument("--python", default=sys.executable, help="the venv's python")
    a, pytest_args = p.parse_known_args(argv)
    try:
        tree = pristine_tree()
        status = series_status(tree)
    except (TreeError, subprocess.CalledProcessError, OSError) as e:
        return _fail(f"no pristine tree: {e}")
    if status.get("applied"):
        return _fail(f"{tree} carries a series; remove it and run again")
    out_dir = os.path.dirname(os.path.abspath(a.log))
    os.makedirs(out_dir, exist_ok=True)
    report_path = os.path.join(out_dir, "report.json")
    if os.path.exists(report_path):
        os.remove(report_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [tree] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env[SGLANG_TREE_ENV] = tree
    env[REPORT_ENV] = report_path
    # A module that imports a series-only module fails to collect on pristine:
    # count it as an error and run the rest.
    cmd = [
        a.python,
        "-m",
        "pytest",
        "-q",
        "-rA",
        "--continue-on-collection-errors",
        *pytest_args,
    ]
    print(f"pristine tree: {tree} (sglang {status.get('sglang_version')}, no series)")
    print(f"running: {' '.join(cmd)}  (log: {a.log})", flush=True)
    start = time.monotonic()
    with open(a.log, "w") as log:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    seconds = time.monotonic() - start
    if not os.path.exists(report_path):
        return _fail(f"pytest exited {proc.returncode} without a report; see {a.log}")
    if proc.returncode not in (0, 1):  # interrupted, usage error, nothing collected
        return _fail(
            f"pytest exited {proc.returncode} (not a completed run); see {a.log}"
        )
    with open(report_path) as f:
        report = json.load(f)
    if not os.path.abspath(report["sglang_file"]).startswith(
        os.path.abspath(tree) + os.sep
    ):
        return _fail(f"pytest imported {report['sglang_file']}, not the pristine tree")
    s = summarize(report)
    uncollected = uncollected_modules_with_controls(report, ROOT)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(s["counts"].items()))
    print(f"pristine run: {counts} in {seconds:.0f} s (pytest exit {proc.returncode})")
    print(
        f"passed on pristine: {len(s['unmarked'])} unmarked, {len(s['controls'])} controls"
    )
    for nodeid, _ in s["unmarked"]:
        print(f"  UNMARKED {nodeid}")
    for nodeid, reason in s["controls"]:
        print(f"  control  {nodeid}  -- {reason}")
    failing = len(s["failed_controls"]) + len(uncollected)
    print(f"controls that FAIL on pristine (not controls): {failing}")
    for nodeid, outcome, reason in s["failed_controls"]:
        print(f"  FAILED   {nodeid}  ({outcome})  -- {reason}")
    for nodeid in uncollected:
        print(
            f"  FAILED   {nodeid}  (not collected; the module marks controls, none ran)"
        )
    return 1 if s["unmarked"] or failing else 0


if __name__ == "__main__":
    sys.exit(main())
