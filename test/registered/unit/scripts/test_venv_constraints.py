"""requirements/constraints.txt pins the venv exactly.

scripts/setup_env.sh installs every requirements file with ``-c
requirements/constraints.txt``. These tests compare that file with the
distributions the running interpreter's environment holds (its purelib and
platlib, read with ``importlib.metadata``): one fails when the venv holds a
distribution the file does not pin, holds it at another version, or the file
pins one the venv lacks; the only distributions left out are the ones on the
file's ``# exclude:`` lines, which must be the CPU stand-ins this checkout
builds. Every third-party module the repository's own Python imports must come
from a distribution that a requirements file names and the constraints pin.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="stage-a-test-cpu")

import ast
import importlib.metadata as md
import os
import re
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.control(
    reason="compares the venv's installed distributions with requirements/, not SGLang's code"
)

REPO = Path(__file__).resolve().parents[4]
REQUIREMENTS = REPO / "requirements"
CONSTRAINTS = REQUIREMENTS / "constraints.txt"
STANDIN_PKGS = REPO / "cpu_support" / "standins" / "standin_pkgs"
NOT_OURS = {".venv", ".cache", ".git", "patches", "out"}
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path):
    """``({name: version}, {excluded name: reason})`` of a requirements file."""
    pins, excluded = {}, {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        exclude = re.match(r"#\s*exclude:\s*(\S+)\s*(.*)", line)
        if exclude:
            excluded[_norm(exclude[1])] = exclude[2].strip()
            continue
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        pin = PIN.fullmatch(text)
        assert pin, f"{path.name}:{number}: not an exact `name==version` pin: {text!r}"
        assert _norm(pin[1]) not in pins, f"{path.name}:{number}: {pin[1]} pinned twice"
        pins[_norm(pin[1])] = pin[2]
    return pins, excluded


def installed():
    """``{name: version}`` of the running interpreter's environment."""
    paths = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    found = {}
    for dist in md.distributions(path=paths):
        name = _norm(dist.metadata["Name"])
        assert name not in found, f"{name} is installed twice in {paths}"
        found[name] = dist.version
    return found


def test_constraints_pin_every_installed_distribution_at_its_version():
    pins, excluded = read_pins(CONSTRAINTS)
    have = installed()
    wrong = [
        f"{name} {version} (pinned: {pins.get(name, 'not pinned')})"
        for name, version in sorted(have.items())
        if name not in excluded and pins.get(name) != version
    ]
    absent = sorted(set(pins) - set(have))
    assert not wrong and not absent, (
        f"the venv differs from {CONSTRAINTS.relative_to(REPO)}: installed "
        f"{wrong}; pinned but not installed {absent}. Regenerate it with the "
        "command in its header."
    )


def test_the_only_exclusions_are_the_standins_this_checkout_builds():
    _, excluded = read_pins(CONSTRAINTS)
    standins = {
        _norm(tomllib.loads(p.read_text())["project"]["name"])
        for p in STANDIN_PKGS.glob("*/pyproject.toml")
    }
    assert standins and set(excluded) == standins
    assert all(excluded.values()), f"an exclusion without a reason: {excluded}"
    have = installed()
    assert all(name in have for name in excluded)


def test_every_requirements_pin_agrees_with_the_constraints():
    pins, _ = read_pins(CONSTRAINTS)
    for path in sorted(REQUIREMENTS.glob("*.txt")):
        if path == CONSTRAINTS:
            continue
        for name, version in read_pins(path)[0].items():
            assert pins.get(name) == version, (
                f"{path.name} pins {name}=={version}, "
                f"constraints.txt {pins.get(name, 'nothing')}"
            )


def _third_party_imports():
    """``{top-level module: a file importing it}`` of the repository's own Python."""
    ours = []
    for folder, dirs, files in os.walk(REPO):
        if folder == str(REPO):
            dirs[:] = [d for d in dirs if d not in NOT_OURS]
        ours += [Path(folder, f) for f in files if f.endswith(".py")]
    local = {p.stem for p in ours} | {
        d for p in ours for d in p.relative_to(REPO).parts[:-1]
    }
    found = {}
    for path in ours:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


# Modules imported only where they exist on a GPU box, each under a guard with
# a fallback, so the CPU venv does not hold them.
GPU_BOX_ONLY = {
    "triton": "gpu_vit_check.compile_cache_dirs asks the box's Triton for its "
    "cache folder and falls back to ~/.triton/cache without it",
}


def test_every_direct_import_is_named_in_requirements_and_pinned():
    pins, _ = read_pins(CONSTRAINTS)
    named = set()
    for path in REQUIREMENTS.glob("*.txt"):
        if path != CONSTRAINTS:
            named |= set(read_pins(path)[0])
    providers = md.packages_distributions()
    imports = _third_party_imports()
    assert "torch" in imports and "transformers" in imports  # the scan sees imports
    unpinned = []
    for module, where in sorted(imports.items()):
        if module in GPU_BOX_ONLY:
            continue
        dists = {_norm(d) for d in providers.get(module, [])}
        if not dists or not dists & named or not dists <= set(pins):
            unpinned.append(f"{module} ({where}; from {sorted(dists) or 'nothing'})")
    assert (
        not unpinned
    ), f"imported but not named in requirements/*.txt and pinned: {unpinned}"
