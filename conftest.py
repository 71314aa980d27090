"""Repository-wide pytest set-up.

The repository root goes on sys.path so tests import `cpu_support` (CPU
stand-ins, the tiny Qwen3-VL); the tool folders (`scripts/`, `demo/`, each
`benchmark/` study) go there too, so tests import a tool by its module name
(`import lint_series`, `import bench_image_burst`). The stand-ins are installed
before any test module imports sglang (see cpu_support/standins/prepare.py).
"""

import os
import re
import socket
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))
TOOL_DIRS = (
    "scripts",
    "demo",
    "benchmark/image_burst",
    "benchmark/vit",
    "benchmark/gpu_check",
)
sys.path[:0] = [ROOT] + [os.path.join(ROOT, d) for d in TOOL_DIRS]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One BLAS/OpenMP thread: several tests assert *bitwise* equality of
# embeddings, and the CPU matmul library may split work differently with more
# threads for some shapes. Spawned gloo ranks use one thread each as well.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# SGLang's init_single_process_dist() rendezvouses on MASTER_PORT (29632 by
# default): every pytest process (each xdist worker imports this file and
# would otherwise inherit the controller's port) takes a free port of its own,
# so that workers running such modules at once do not meet on one store.
with socket.socket() as _sock:
    _sock.bind(("127.0.0.1", 0))
    os.environ["MASTER_PORT"] = str(_sock.getsockname()[1])

from cpu_support.standins.prepare import prepare_cpu_process  # noqa: E402

prepare_cpu_process()


# ---------------------------------------------------------------------------
# Three workers (`make test` runs `pytest -n 3 --dist loadgroup`): a test module
# is one unit of work, so its module-scoped rank pool or server runs once;
# the modules that share the session's TP2 server are one unit. Units run
# longest first (their `register_cpu_ci(est_time=...)`), so no worker is
# left with a long one at the end. The order is the same without workers.
# ---------------------------------------------------------------------------

SHARED_SERVER_GROUP = "cpu-server-shared-tp2"
_EST_TIME = re.compile(r"register_cpu_ci\(\s*est_time=(\d+(?:\.\d+)?)")


def _module(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _est_time(path, cache: dict) -> float:
    if path not in cache:
        found = _EST_TIME.search(open(path).read())
        cache[path] = float(found.group(1)) if found else 0.0
    return cache[path]


def _order_work_units(items) -> None:
    shared = {_module(i) for i in items if "shared_tp2_server" in i.fixturenames}
    units: dict = {}
    files: dict = {}
    cache: dict = {}
    for item in items:
        module = _module(item)
        unit = SHARED_SERVER_GROUP if module in shared else module
        item.add_marker(pytest.mark.xdist_group(name=unit))
        units.setdefault(unit, []).append(item)
        files.setdefault(unit, set()).add(str(item.path))
    est = {u: sum(_est_time(p, cache) for p in paths) for u, paths in files.items()}
    # Stable: equal estimates keep collection order.
    items[:] = [i for u in sorted(units, key=lambda u: -est[u]) for i in units[u]]


# ---------------------------------------------------------------------------
# Outcome report for scripts/run_tests_on_pristine.py (off unless it asks).
# With FORK_TEST_REPORT=<file>, every test's outcome, its `control` reason (if
# marked) and the sglang this process imported are written there as JSON.
# ---------------------------------------------------------------------------

REPORT_ENV = "FORK_TEST_REPORT"
CONTROL_PROPERTY = "fork_control_reason"
_controls: dict = {}
_outcomes: dict = {}


# First: pytest-xdist's own hook turns the xdist_group marks into groups.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    _order_work_units(items)
    for item in items:
        marker = item.get_closest_marker("control")
        if marker is not None:
            reason = marker.kwargs.get("reason") or (
                marker.args[0] if marker.args else ""
            )
            # Carried on the test's reports, which reach the xdist controller
            # (that writes the report) from the worker that collected it.
            item.user_properties.append((CONTROL_PROPERTY, reason))


def _plain(nodeid: str) -> str:
    """The test's id without the ``@group`` that xdist's loadgroup appends."""
    return nodeid.split("@", 1)[0]


def pytest_collectreport(report):
    # A module that cannot even be collected (e.g. it imports a module only
    # the series has) counts as one error under the module's id.
    if os.environ.get(REPORT_ENV) and report.failed:
        _outcomes.setdefault(_plain(report.nodeid), {})["outcome"] = "error"


def pytest_runtest_logreport(report):
    if not os.environ.get(REPORT_ENV):
        return
    nodeid = _plain(report.nodeid)
    seen = _outcomes.setdefault(nodeid, {})
    for name, value in report.user_properties:
        if name == CONTROL_PROPERTY:
            _controls[nodeid] = value
    if report.failed:
        seen["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and "outcome" not in seen:
        seen["outcome"] = "skipped"
    elif report.when == "call" and report.passed and "outcome" not in seen:
        seen["outcome"] = "passed"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    import json

    import sglang

    tests = {
        nodeid: {
            "outcome": seen.get("outcome", "error"),
            "control": _controls.get(nodeid),
        }
        for nodeid, seen in _outcomes.items()
    }
    with open(path, "w") as f:
        json.dump(
            {
                "sglang_file": sglang.__file__,
                "exitstatus": int(exitstatus),
                "tests": tests,
            },
            f,
            indent=1,
        )
