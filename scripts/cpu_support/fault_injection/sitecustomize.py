"""Test-only start-up hook: make one rank's vision tower fail its first call.

NOT part of the patch series. A test puts this directory on the CPU server's
``PYTHONPATH`` and sets ``FORK_FAULT_VISION_OOM_RANK=N``; Python imports this
``sitecustomize`` in every server process. When ``sglang.srt.models.qwen3_vl``
is imported, the forward of its vision tower (``Qwen3VLMoeVisionModel``) is
wrapped: in the process whose TP rank is N, the first call raises
``torch.OutOfMemoryError`` (what a busy GPU does to the vision warm-up);
every later call, and every call on the other ranks, runs the real forward.
Each injected failure is written to stderr, so the server log shows it.

The next ``sitecustomize`` on ``sys.path`` (e.g. the ROCm gate simulation) is
loaded afterwards, so the two hooks combine.
"""

import importlib.abc
import importlib.util
import os
import sys

_ENV = "FORK_FAULT_VISION_OOM_RANK"
_MODULE = "sglang.srt.models.qwen3_vl"
_TOWER = "Qwen3VLMoeVisionModel"


def _patch(module):
    cls = getattr(module, _TOWER, None)
    if cls is None or getattr(cls.forward, "__fork_fault__", False):
        return
    real = cls.forward
    target = int(os.environ[_ENV])
    state = {"failed": False}

    def forward(self, *args, **kwargs):
        from sglang.srt.runtime_context import get_parallel

        if not state["failed"] and get_parallel().tp_rank == target:
            state["failed"] = True
            sys.stderr.write(
                f"[fork fault injection] pid {os.getpid()}: rank {target} vision "
                "tower raises torch.OutOfMemoryError on its first call\n"
            )
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the "
                "fork's fault test)"
            )
        return real(self, *args, **kwargs)

    forward.__fork_fault__ = True
    forward.__wrapped__ = real
    cls.forward = forward


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def _chain_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location(
                "_fork_fault_chained_sitecustomize", candidate
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


if os.environ.get(_ENV):
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
_chain_next_sitecustomize()
