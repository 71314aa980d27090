"""Launch a real ``sglang.launch_server`` on the CPU, wait for it, stop it.

Test-and-demo support (docs/cpu.md, "The CPU server"). The server runs
SGLang's own CPU engine (``SGLANG_USE_CPU_ENGINE=1``) on the tiny Qwen3-VL
from :mod:`cpu_support.tiny_models.make_tiny_model`, with the fork's ``sgl_kernel``
stand-in installed in the venv::

    with CpuServer(model_dir, tp_size=2, dp_encoder=True, log_path="s.log") as srv:
        print(srv.base_url, srv.ready_seconds)

* ``start()`` waits for ``GET /health`` to answer 200 within a deadline and
  fails at once, with the log's tail, if the server process exits first.
* The server runs in its own session/process group; ``stop()`` signals that
  group by its id, then kills every process it started (found by PID, also
  ones that left the group), so nothing is left behind.
* ``simulate_rocm_gate=True`` loads the demo-only start-up hook in
  ``cpu_support/server/startup_hooks/rocm_gate_sim`` into every server
  process (see that file).
* ``python_path`` prepends directories to ``PYTHONPATH``: point it at a
  ``--target`` tree holding another ``sglang`` (the pristine release for A/B
  runs) and the server imports that one instead of the venv's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":  # run as a file: the repository, for cpu_support
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from cpu_support.bench.vit_bench_util import free_port  # noqa: E402

# The start-up hooks: folders holding a sitecustomize.py, put on PYTHONPATH.
STARTUP_HOOKS = os.path.join(HERE, "startup_hooks")
ROCM_GATE_SIM_DIR = os.path.join(STARTUP_HOOKS, "rocm_gate_sim")
ROCM_GATE_SIM_ENV = "FORK_DEMO_SIMULATE_ROCM_GATE"
# A tree holding sglang that every server imports, ahead of ``python_path``
# (scripts/run_tests_on_pristine.py sets it to the pristine tree).
SGLANG_TREE_ENV = "FORK_SGLANG_TREE"
VIT_PROFILE_DIR = os.path.join(STARTUP_HOOKS, "vit_profile")
VIT_PROFILE_ENV = "FORK_VIT_PROFILE_DIR"
# A path that never exists: SGLang then treats NCCL as absent (see docs/cpu.md).
MISSING_NCCL_PATH = "/nonexistent/fork-cpu-support/libnccl.so"


class ServerFailed(RuntimeError):
    """The server exited, or never became healthy before its deadline."""


# ``free_port`` (imported above; its one copy is in vit_bench_util) stays
# importable from here.
SCHEDULER_TITLE = "sglang::scheduler"


def scheduler_titles(pids: Sequence[int]) -> Dict[int, str]:
    """``{pid: process title}`` of the live processes among ``pids`` whose
    title (SGLang sets it, e.g. ``sglang::scheduler_TP1``) starts with
    ``sglang::scheduler``. Read from ``/proc/PID/cmdline``; a process gone, a
    zombie (its cmdline is empty) or one not ours to read is left out."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        title = raw.split(b"\0")[0].decode("utf-8", "replace").strip()
        if title.startswith(SCHEDULER_TITLE):
            out[pid] = title
    return out


def omp_threads_bind(tp_size: int, cpus: Optional[Sequence[int]] = None) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` value: the CPUs split evenly per rank.

    ``omp_threads_bind(2, [0, 1]) == "0|1"``; ``(2, range(4)) == "0-1|2-3"``.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0))
    cpus = list(cpus)
    if len(cpus) < tp_size:
        raise ValueError(
            f"{tp_size} ranks need at least {tp_size} CPUs, this process has {len(cpus)}"
        )
    per = len(cpus) // tp_size
    parts = []
    for r in range(tp_size):
        chunk = cpus[r * per : (r + 1) * per]
        parts.append(str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]}-{chunk[-1]}")
    return "|".join(parts)


def threads_per_rank(tp_size: int, cpus: Optional[Sequence[int]] = None) -> int:
    """Intra-op (OpenMP) threads for each rank: the CPUs split evenly, at least 1.

    SGLang's CPU engine binds each rank's OpenMP threads to its
    ``SGLANG_CPU_OMP_THREADS_BIND`` share only through sgl_kernel's
    ``init_cpu_threads_env``, which it calls on AMX or arm64 CPUs alone
    (``distributed/bootstrap.py``, ``_init_cpu_threads_env``). Elsewhere every
    rank keeps torch's default, one thread per CPU: at TP2 on 2 CPUs that is 4
    OpenMP threads on 2 cores, and when both ranks run the DP encoder at once
    their parallel regions wait on threads the other rank's are holding
    (benchmark/image_burst/README.md, "Mixed traffic"). ``OMP_NUM_THREADS`` set to this
    value gives each rank its share.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0))
    return max(1, len(list(cpus)) // tp_size)


def server_command(
    model_path: str,
    *,
    port: int,
    tp_size: int = 1,
    dp_encoder: bool = False,
    python: str = sys.executable,
    max_total_tokens: int = 4096,
    extra_args: Sequence[str] = (),
) -> List[str]:
    """The ``launch_server`` command line the CPU server runs."""
    if dp_encoder and tp_size < 2:
        raise ValueError("--mm-enable-dp-encoder needs tp_size >= 2 to split any work")
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--load-format",
        "dummy",
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--mm-attention-backend",
        "sdpa",
        "--max-total-tokens",
        str(max_total_tokens),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # Without it each scheduler polls its sockets in a busy loop between
        # requests: an idle TP2 server held 1.5 of a 2-CPU VM's CPUs.
        "--sleep-on-idle",
    ]
    if tp_size > 1:
        cmd += ["--tp-size", str(tp_size)]
    if dp_encoder:
        cmd += ["--mm-enable-dp-encoder"]
    return cmd + list(extra_args)


def server_env(
    *,
    tp_size: int = 1,
    simulate_rocm_gate: bool = False,
    python_path: Sequence[str] = (),
    torch_logs: Optional[str] = "recompiles,dynamo",
    base: Optional[Dict[str, str]] = None,
    omp_threads: Optional[int] = None,
    vit_profile_dir: Optional[str] = None,
) -> Dict[str, str]:
    """Environment of the CPU server (each variable is explained in docs/cpu.md).

    ``TORCH_LOGS``: ``recompiles`` logs recompilations only; ``dynamo`` adds
    one "start tracing" record per compile, first compiles included, which is
    what "compiles after ready" counts.

    ``omp_threads``: ``OMP_NUM_THREADS`` of every server process; None (the
    default) gives each rank its share of the CPUs (``threads_per_rank``), 0
    leaves the variable as the caller's environment has it (torch's default
    of one thread per CPU when unset).

    ``vit_profile_dir``: time every vision-tower call into that folder
    (``cpu_support/server/startup_hooks/vit_profile``, profiling only).
    """
    env = dict(os.environ if base is None else base)
    if omp_threads is None:
        omp_threads = threads_per_rank(tp_size)
    if omp_threads < 0:
        raise ValueError(f"omp_threads must be >= 0, got {omp_threads}")
    if omp_threads:
        env["OMP_NUM_THREADS"] = str(omp_threads)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["SGLANG_NCCL_SO_PATH"] = MISSING_NCCL_PATH
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # A stop is a SIGTERM, which SGLang treats as a crash: without these it
    # sleeps 5 s "to let GPU activity settle" and then runs py-spy on the
    # schedulers before it exits.
    env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] = "0"
    env["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] = "0"
    if tp_size > 1:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = omp_threads_bind(tp_size)
    if torch_logs:
        env["TORCH_LOGS"] = torch_logs
    paths = list(python_path)
    if env.get(SGLANG_TREE_ENV):
        paths.insert(0, env[SGLANG_TREE_ENV])
    if simulate_rocm_gate:
        env[ROCM_GATE_SIM_ENV] = "1"
        paths.insert(0, ROCM_GATE_SIM_DIR)
    else:
        env.pop(ROCM_GATE_SIM_ENV, None)
    if vit_profile_dir:
        env[VIT_PROFILE_ENV] = os.path.abspath(vit_profile_dir)
        paths.insert(0, VIT_PROFILE_DIR)  # chains to the next sitecustomize
    else:
        env.pop(VIT_PROFILE_ENV, None)
    if paths:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    return env


def _descendants(pid: int) -> List[int]:
    try:
        import psutil
    except ImportError:
        return []
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):  # the process may be gone already
        return []


def _alive(pid: int) -> bool:
    try:
        import psutil
    except ImportError:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):  # gone, or not ours to read
        return False


class ServerProcess:
    """One server process tree started from ``command``; ready = /health 200."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Dict[str, str],
        port: int,
        log_path: str,
        ready_timeout: float = 300.0,
    ):
        self.command = list(command)
        self.env = dict(env)
        self.port = port
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.ready_seconds: Optional[float] = None
        # Size of the log when /health first answered 200: everything the
        # server logged before it reported ready lies in these bytes.
        self.log_bytes_at_ready: Optional[int] = None
        self._seen_pids: set = set()
        self._log_file = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_flags(self) -> List[str]:
        """The flags after ``-m sglang.launch_server`` (for report headers)."""
        return self.command[3:]

    def env_summary(self) -> Dict[str, str]:
        keys = (
            "SGLANG_USE_CPU_ENGINE",
            "SGLANG_CPU_OMP_THREADS_BIND",
            "SGLANG_NCCL_SO_PATH",
            "TORCH_LOGS",
            ROCM_GATE_SIM_ENV,
            "PYTHONPATH",
        )
        return {k: self.env[k] for k in keys if k in self.env}

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def _health(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self) -> float:
        """Start the server; return seconds from launch to ``/health`` 200."""
        if self.proc is not None:
            raise RuntimeError("server already started")
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        self._log_file = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = t0 + self.ready_timeout
        try:
            while True:
                self._seen_pids.update(_descendants(self.proc.pid))
                code = self.proc.poll()
                if code is not None:
                    raise ServerFailed(
                        f"server exited with code {code} before /health was ready; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                if self._health():
                    self.ready_seconds = time.monotonic() - t0
                    self._log_file.flush()
                    self.log_bytes_at_ready = os.path.getsize(self.log_path)
                    self._seen_pids.update(_descendants(self.proc.pid))
                    return self.ready_seconds
                if time.monotonic() > deadline:
                    raise ServerFailed(
                        f"server not healthy after {self.ready_timeout:.0f}s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def pids(self) -> List[int]:
        """Every PID this server started (main process and its children)."""
        if self.proc is None:
            return []
        self._seen_pids.update(_descendants(self.proc.pid))
        return [self.proc.pid] + sorted(self._seen_pids - {self.proc.pid})

    def stop(self, grace: float = 20.0) -> List[int]:
        """Stop the process group, then any straggler by PID; return leftovers (empty)."""
        if self.proc is None:
            return []
        pids = self.pids()
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            for pid in pids[1:]:
                if _alive(pid):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            end = time.monotonic() + wait
            while time.monotonic() < end:
                self.proc.poll()
                if not any(_alive(p) for p in pids):
                    break
                time.sleep(0.2)
            else:
                continue
            break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return [p for p in pids if _alive(p)]

    def __enter__(self) -> "CpuServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class CpuServer(ServerProcess):
    """``sglang.launch_server`` on the CPU (tiny model, CPU engine, gloo)."""

    def __init__(
        self,
        model_path: str,
        *,
        log_path: str,
        tp_size: int = 1,
        dp_encoder: bool = False,
        port: Optional[int] = None,
        python: str = sys.executable,
        python_path: Sequence[str] = (),
        simulate_rocm_gate: bool = False,
        torch_logs: Optional[str] = "recompiles,dynamo",
        max_total_tokens: int = 4096,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 300.0,
        omp_threads: Optional[int] = None,
        vit_profile_dir: Optional[str] = None,
    ):
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            raise ValueError(
                f"{model_path} holds no config.json (make it with make_tiny_model.py)"
            )
        self.model_path = model_path
        self.tp_size = tp_size
        self.dp_encoder = dp_encoder
        port = port or free_port()
        super().__init__(
            server_command(
                model_path,
                port=port,
                tp_size=tp_size,
                dp_encoder=dp_encoder,
                python=python,
                max_total_tokens=max_total_tokens,
                extra_args=extra_args,
            ),
            env=server_env(
                tp_size=tp_size,
                simulate_rocm_gate=simulate_rocm_gate,
                python_path=python_path,
                torch_logs=torch_logs,
                omp_threads=omp_threads,
                vit_profile_dir=vit_profile_dir,
            ),
            port=port,
            log_path=log_path,
            ready_timeout=ready_timeout,
        )


def main(argv=None) -> int:
    """Start the CPU server, print its URL and ready time, serve until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(description="Run the tiny Qwen3-VL CPU server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--mm-enable-dp-encoder", action="store_true")
    p.add_argument("--simulate-rocm-gate", action="store_true")
    p.add_argument("--port", type=int)
    p.add_argument("--log", default="cpu_server.log")
    p.add_argument(
        "--python-path",
        action="append",
        default=[],
        help="a --target tree holding sglang, put first on the server's PYTHONPATH "
        "(e.g. .cache/trees/sglang-0.5.23-series); repeatable",
    )
    p.add_argument(
        "--omp-threads",
        type=int,
        help="OMP_NUM_THREADS of the server (default: the CPUs split per rank; "
        "0: leave it unset, torch's one thread per CPU in every rank)",
    )
    p.add_argument(
        "--vit-profile-dir",
        help="time every vision-tower call into this folder "
        "(cpu_support/server/startup_hooks/vit_profile)",
    )
    a = p.parse_args(argv)
    srv = CpuServer(
        a.model_path,
        log_path=a.log,
        tp_size=a.tp_size,
        dp_encoder=a.mm_enable_dp_encoder,
        port=a.port,
        simulate_rocm_gate=a.simulate_rocm_gate,
        python_path=[os.path.abspath(x) for x in a.python_path],
        omp_threads=a.omp_threads,
        vit_profile_dir=a.vit_profile_dir,
    )
    with srv:
        print(
            f"ready at {srv.base_url} after {srv.ready_seconds:.1f}s (log {a.log})",
            flush=True,
        )
        try:
            while srv.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
