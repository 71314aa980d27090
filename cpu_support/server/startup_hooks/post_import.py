"""Patch a module right after it is imported, and chain start-up hooks.

Shared by the CPU server's test-only start-up hooks (the ``sitecustomize.py``
files in ``fault_injection/``, ``rocm_gate_sim/`` and ``vit_profile/``), which import it at
interpreter start-up: standard library only.
"""

import importlib.abc
import importlib.util
import os
import sys


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patches):
        self._loader = loader
        self._patches = patches

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for patch in self._patches:
            patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.patches = {}

    def find_spec(self, fullname, path, target=None):
        patches = self.patches.get(fullname)
        if not patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patches)
                return spec
        return None


def patch_after_import(module_name, patch):
    """Call ``patch(module)`` once ``module_name`` is imported (now, if it is)."""
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    if finder is None:
        finder = _Finder()
        sys.meta_path.insert(0, finder)
    finder.patches.setdefault(module_name, []).append(patch)


def chain_next_sitecustomize(this_file):
    """Run the next ``sitecustomize.py`` on ``sys.path`` after the one at
    ``this_file`` (Python itself only imports the first)."""
    here = os.path.dirname(os.path.abspath(this_file))
    entries = [os.path.abspath(e) for e in sys.path if e]
    # Only entries after this hook's own, so two hooks never load each other.
    if here in entries:
        entries = entries[entries.index(here) + 1 :]
    for entry in entries:
        if entry == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            name = "_fork_chained_sitecustomize_" + str(abs(hash(candidate)))
            spec = importlib.util.spec_from_file_location(name, candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return
