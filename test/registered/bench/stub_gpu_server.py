"""Stand-in for ``python -m sglang.launch_server`` on a GPU, for the A/B dry run.

Not a test module. ``test_ab_dry_run.py`` gives the A/B harness a Python
wrapper that runs this file instead of ``-m sglang.launch_server`` (every
other command, e.g. the harness's ``import sglang`` probes and bench_serving,
runs on the real Python and the real ``--target`` trees). It fakes only what
needs a GPU, and keeps the preconditions a real GPU server has:

* its model must be on disk at start: a folder, or the Hugging Face cache's
  snapshot at ``--revision`` (no network here; a real server would download it
  inside the timed launch);
* the GPUs' memory must have been released by the previous server
  (``$STUB_STATE_DIR/gpu.json``, which the fake ``nvidia-smi`` reads too): else
  it fails like an out-of-memory start; on SIGTERM it marks the memory as
  released ``$STUB_GPU_RELEASE_S`` seconds later, as a driver does;
* it answers ``/health``, ``/v1/models``, streaming ``/v1/chat/completions``
  (one chunk per output token, then usage; 400 for an image data URI that
  holds neither PNG nor JPEG bytes, as a real server's loader fails) and
  ``/metrics``. When the sglang
  on its ``PYTHONPATH`` has the series applied (``series.py status``),
  ``/metrics`` exports the series' encoder series through the tree's own
  collector (``sglang.srt.observability.metrics_collector
  .MMEncoderMetricsCollector``, ``sglang:mm_encoder_*``), one per simulated
  scheduler as a TP server
  has them: each with a scheduler's labels (its own ``tp_rank``) in its own
  registry, attention-TP rank 0 recording the call series, and ``/metrics``
  holding every scheduler's series as a multiprocess server's does. Each
  request is one encoder call whose images go to ranks by the tree's
  DP-encoder load balancer (``mm_utils.get_dp_encoder_lb_assignment`` over
  the images' patch counts), every scheduler recording its share as the
  series does; a pristine tree exports none;
* at start it records the compile-cache folders it was given
  (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``AITER_JIT_DIR``) and
  the files in them in ``$STUB_STATE_DIR/launch-N.json``, then writes one
  file into each, as a compiling server would;
* the first request with a PNG image of a size it has not seen "builds its
  kernels", as a server that compiles per shape would, before answering: a
  kernel folder ``size-HxW/`` in ``TRITON_CACHE_DIR``, and in
  ``TORCHINDUCTOR_CACHE_DIR`` a file ``fx/size-HxW.py`` and one kernel folder
  per rank under ``triton/<rank>/`` (Inductor's per-device layout).

Extra flags (after ``--`` in the harness): ``--stub-fail-launch N`` exits at
the Nth start counted in ``$STUB_STATE_DIR``; ``--stub-chat-status CODE``
answers every chat request with that HTTP status; ``--stub-token-delay S``
waits S seconds before each streamed token (so a closed-loop client does not
spin).
"""

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
READY = "The server is fired up and ready to roll!"


def _state(name):
    return os.path.join(os.environ["STUB_STATE_DIR"], name)


def _model_on_disk(model, revision):
    if os.path.isdir(model):
        return True
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model, revision=revision, local_files_only=True)
        return True
    except Exception as e:  # noqa: BLE001
        print(f"stub: {model}@{revision} not on disk: {type(e).__name__}", flush=True)
        return False


def _gpu(update=None):
    path = _state("gpu.json")
    if update is not None:
        with open(path + ".tmp", "w") as f:
            json.dump(update, f)
        os.replace(path + ".tmp", path)
        return update
    if not os.path.exists(path):
        return {"in_use": False, "release_at": 0}
    with open(path) as f:
        return json.load(f)


def _series_on_path():
    """Whether the sglang this process imports has the series applied (series.py status)."""
    tree = os.path.dirname(os.path.dirname(importlib.util.find_spec("sglang").origin))
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "series.py"),
            "status",
            "--json",
            "--target",
            tree,
        ],
        capture_output=True,
        text=True,
    )
    return bool(json.loads(out.stdout).get("applied"))


def _decodable(url: str) -> bool:
    """A data URI holding PNG or JPEG bytes (what a real server's loader would open)."""
    import base64
    import binascii

    if not url.startswith("data:"):
        return True  # not ours to judge: a real server would fetch it
    try:
        raw = base64.b64decode(url.split(",", 1)[1], validate=False)
    except (IndexError, binascii.Error):
        return False
    return raw.startswith(b"\x89PNG\r\n\x1a\n") or raw.startswith(b"\xff\xd8\xff")


def _patches(url: str) -> int:
    """16-px patches of a PNG data URI's image (its IHDR width and height)."""
    import base64
    import struct

    raw = base64.b64decode(url.split(",", 1)[1][:64])
    if not raw.startswith(b"\x89PNG"):
        return 1  # a JPEG: its size is not needed for the stub's split
    width, height = struct.unpack(">II", raw[16:24])
    return max(1, round(width / 32)) * 2 * max(1, round(height / 32)) * 2


def _png_size(url: str):
    """(height, width) of a PNG data URI's image, None for anything else."""
    import base64
    import struct

    if not url.startswith("data:"):
        return None
    raw = base64.b64decode(url.split(",", 1)[1][:64])
    if not raw.startswith(b"\x89PNG"):
        return None
    width, height = struct.unpack(">II", raw[16:24])
    return height, width


def _build_kernels(size, tp_size: int) -> None:
    """The cache entries a first request of image ``size`` leaves (see the docstring)."""
    tag = f"size-{size[0]}x{size[1]}"
    triton = os.environ.get("TRITON_CACHE_DIR")
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    paths = []
    if triton:
        paths.append(os.path.join(triton, tag, "kernel.json"))
    if inductor:
        paths.append(os.path.join(inductor, "fx", f"{tag}.py"))
        paths += [
            os.path.join(inductor, "triton", str(r), tag, "kernel.json")
            for r in range(tp_size)
        ]
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("stub kernel")


def _scheduler_collectors(model, tp_size):
    """(collector, registry) of each scheduler of a TP server with
    --enable-metrics: the tree's MMEncoderMetricsCollector with the labels
    SchedulerMetricsCollector.init_new gives that scheduler, in a registry of
    its own; attention-TP rank 0 records the call series."""
    import functools

    import prometheus_client as pc

    from sglang.srt.observability.metrics_collector import MMEncoderMetricsCollector

    out = []
    for rank in range(tp_size):
        registry = pc.CollectorRegistry()

        class OnRegistry(MMEncoderMetricsCollector):
            _counter_cls = functools.partial(pc.Counter, registry=registry)
            _histogram_cls = functools.partial(pc.Histogram, registry=registry)

        labels = {
            "model_name": model,
            "engine_type": "unified",
            "tp_rank": rank,
            "pp_rank": 0,
            "moe_ep_rank": 0,
        }
        out.append((OnRegistry(labels, records_calls=rank == 0), registry))
    return out


def _exposition(registries):
    """One /metrics text over the given registries: each metric family once,
    with every registry's samples (what a multiprocess server's scrape
    merges)."""
    import prometheus_client as pc

    families = {}
    for registry in registries:
        for family in registry.collect():
            if family.name in families:
                families[family.name].samples.extend(family.samples)
            else:
                families[family.name] = family

    class Merged:
        def collect(self):
            return list(families.values())

    return pc.generate_latest(Merged()).decode()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--revision")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--stub-fail-launch", type=int, default=0)
    p.add_argument("--stub-chat-status", type=int, default=200)
    p.add_argument("--stub-token-delay", type=float, default=0.0)
    args, _ = p.parse_known_args()

    counter = _state("launches")
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    with open(counter, "w") as f:
        f.write(str(n))
    if n == args.stub_fail_launch:
        print(f"stub: launch {n} fails as asked", flush=True)
        sys.exit(1)
    if not _model_on_disk(args.model_path, args.revision):
        sys.exit(1)
    g = _gpu()
    if g["in_use"] or time.time() < g["release_at"]:
        print(
            "torch.OutOfMemoryError: the previous server's memory is still in use",
            flush=True,
        )
        sys.exit(1)
    _gpu({"in_use": True, "release_at": 0})
    caches = {}
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "AITER_JIT_DIR"):
        path = os.environ.get(var)
        if path:
            caches[var] = {
                "path": path,
                "files_at_start": sorted(
                    os.path.relpath(os.path.join(d, f), path)
                    for d, _, fs in os.walk(path)
                    for f in fs
                ),
            }
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, f"compiled-by-launch-{n}"), "w") as f:
                f.write("stub")
    with open(_state(f"launch-{n}.json"), "w") as f:
        json.dump({"caches": caches}, f)

    import prometheus_client as pc

    series = _series_on_path()
    registries = [pc.REGISTRY]
    if series:
        from sglang.srt.multimodal.mm_utils import get_dp_encoder_lb_assignment
        from sglang.srt.multimodal.modality import Modality

        schedulers = _scheduler_collectors(args.model_path, args.tp_size)
        registries += [registry for _, registry in schedulers]
    lock = threading.Lock()
    built = set()  # image sizes whose kernels are in the caches

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, "{}")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": args.model_path}]}))
            elif self.path == "/metrics":
                self._send(200, _exposition(registries), "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                self._send(404, "{}")
                return
            if args.stub_chat_status != 200:
                self._send(args.stub_chat_status, json.dumps({"error": "stub says no"}))
                return
            content = body["messages"][0]["content"]
            k = (
                sum(
                    1
                    for c in content
                    if isinstance(c, dict) and c.get("type") == "image_url"
                )
                if isinstance(content, list)
                else 0
            )
            if k and not all(
                _decodable(c["image_url"]["url"])
                for c in content
                if isinstance(c, dict) and c.get("type") == "image_url"
            ):
                # as a real server does when its image loader fails
                self._send(400, json.dumps({"error": "stub: cannot decode the image"}))
                return
            for c in content if k else []:
                size = (
                    _png_size(c["image_url"]["url"])
                    if isinstance(c, dict) and c.get("type") == "image_url"
                    else None
                )
                with lock:
                    if size is not None and size not in built:
                        built.add(size)
                        _build_kernels(size, args.tp_size)
            if k and series:
                sizes = [
                    _patches(c["image_url"]["url"])
                    for c in content
                    if isinstance(c, dict) and c.get("type") == "image_url"
                ]
                _, per_rank, _ = get_dp_encoder_lb_assignment(sizes, args.tp_size)
                items = [
                    types.SimpleNamespace(modality=Modality.IMAGE, patches=n)
                    for n in sizes
                ]
                with lock:
                    # Every scheduler runs the call (one request's k images)
                    # and observes it once it returned; each records its own
                    # share.
                    for (metrics, _), count in zip(schedulers, per_rank):
                        metrics.observe_encoder_call(
                            "batched", items, 1, lambda item: item.patches, count
                        )
            out = int(body.get("max_completion_tokens") or 4)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(out):
                time.sleep(args.stub_token_delay)
                chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"completion_tokens": out}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.close_connection = True

    server = ThreadingHTTPServer((args.host, args.port), Handler)

    def stop(*_):
        delay = float(os.environ.get("STUB_GPU_RELEASE_S", "1.5"))
        _gpu({"in_use": False, "release_at": time.time() + delay})
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"stub: serving {args.model_path} (series metrics: {series})", flush=True)
    print(READY, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
