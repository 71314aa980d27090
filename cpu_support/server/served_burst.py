"""A tiny model served on the CPU and driven once by the burst harness.

``serve_and_burst`` starts the real ``sglang.launch_server`` from the series
tree (:class:`cpu_support.server.cpu_server.CpuServer`: ``--tp-size 2
--mm-enable-dp-encoder --enable-metrics``), runs ``benchmark/image_burst/bench_image_burst.py``
against it with the caller's burst arguments, and stops the server by PID
whatever happened. The CPU server end-to-end tests share it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from cpu_support.server.cpu_server import CpuServer
from cpu_support.server.sglang_trees import series_tree

# The repository root (this file is in cpu_support/server/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_IMAGE_BURST = os.path.join(
    ROOT, "benchmark", "image_burst", "bench_image_burst.py"
)


def serve_and_burst(
    model: str,
    work: Path,
    burst_args: Sequence[str],
    *,
    timeout: float,
    server_kwargs: Optional[dict] = None,
    while_up: Optional[Callable[[CpuServer], object]] = None,
) -> dict:
    """Serve ``model``, run one burst-harness invocation, stop the server.

    ``burst_args`` are bench_image_burst.py's workload arguments; the server's
    address, log, flags and tree, the output files (``work``/burst.json,
    burst.md, bench/) and its own 600 s request timeout are added here.
    ``while_up(srv)`` runs after the burst, before the server stops. Returns
    the server, its PIDs while up, what ``stop`` left alive, the harness's
    ``CompletedProcess``, the paths, and what ``while_up`` returned.
    """
    tree = series_tree()
    srv = CpuServer(
        model,
        log_path=str(work / "server.log"),
        tp_size=2,
        dp_encoder=True,
        python_path=[tree],
        extra_args=["--enable-metrics"],
        ready_timeout=900,
        **(server_kwargs or {}),
    )
    srv.start()
    pids = srv.pids()
    out_json, out_md = work / "burst.json", work / "burst.md"
    run = after = None
    try:
        cmd = [
            sys.executable,
            BENCH_IMAGE_BURST,
            "--base-url",
            srv.base_url,
            "--model",
            model,
            *burst_args,
            "--server-log",
            srv.log_path,
            "--server-flags",
            " ".join(srv.server_flags),
            "--sglang-target",
            tree,
            "--out-json",
            str(out_json),
            "--out-md",
            str(out_md),
            "--work-dir",
            str(work / "bench"),
            "--timeout",
            "600",
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if while_up is not None:
            after = while_up(srv)
    finally:
        leftovers = srv.stop()
    return {
        "srv": srv,
        "pids": pids,
        "leftovers": leftovers,
        "run": run,
        "work": work,
        "json": out_json,
        "md": out_md,
        "while_up": after,
    }
