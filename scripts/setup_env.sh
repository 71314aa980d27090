#!/usr/bin/env bash
# One-command CPU environment: .venv with torch, sglang 0.5.23 (--no-deps), the
# exact-pinned CPU requirements, SGLang's linters (requirements/lint.txt), the CPU
# stand-ins, and the patch series applied; every install constrained by
# requirements/constraints.txt (all the venv's packages, transitive ones included).
# Safe to re-run: installs are skipped while the requirement files are unchanged,
# and applying the series twice is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=$ROOT/.venv
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV"
fi

inputs_hash() {
  cat requirements/*.txt scripts/setup_env.sh \
    $(find cpu_support/standins/standin_pkgs -type f -not -path '*/__pycache__/*' \
        -not -path '*/build/*' -not -path '*.egg-info/*' 2>/dev/null | sort) \
    | sha256sum | cut -c1-16
}
STAMP=$VENV/.fork-setup-$(inputs_hash)

# pip's noise: the local-index warnings, and the list of sglang's GPU-only
# dependencies that --no-deps deliberately leaves out.
quiet() {
  grep -v -e "^WARNING: Location" -e "^$" -e "^sglang 0\.5\.2[23] requires " \
    -e "^ERROR: pip's dependency resolver does not currently take into account" || true
}

if [ ! -f "$STAMP" ]; then
  echo "setup: installing pip/setuptools, torch (from local disk), sglang --no-deps and the requirements"
  # Every install is constrained by requirements/constraints.txt: each package
  # the venv holds, transitive ones included, at one exact version.
  C="-c requirements/constraints.txt"
  $PIP install $C -r requirements/build.txt 2>&1 | quiet   # pip, and setuptools for the stand-ins
  $PIP install $C -r requirements/torch.txt 2>&1 | quiet
  $PIP install $C --no-deps -r requirements/sglang.txt 2>&1 | quiet
  $PIP install $C -r requirements/cpu.txt 2>&1 | quiet
  $PIP install $C -r requirements/server.txt 2>&1 | quiet
  $PIP install $C -r requirements/lint.txt 2>&1 | quiet   # scripts/lint_series.py
  # The stand-ins build with the venv's setuptools (requirements/build.txt),
  # not one that pip's build isolation would fetch.
  for pkg in cpu_support/standins/standin_pkgs/*/; do
    [ -f "$pkg/pyproject.toml" ] &&
      $PIP install $C --no-deps --no-build-isolation --force-reinstall "$pkg" 2>&1 | quiet
  done
  # Pristine release wheels in .cache/wheels (the apply tool's tests read
  # both; 0.5.22 as the release it must refuse), fetched by the one function
  # that fetches them.
  "$VENV/bin/python" cpu_support/server/sglang_trees.py --wheel 0.5.22 --wheel 0.5.23 >/dev/null
  rm -f "$VENV"/.fork-setup-*
  touch "$STAMP"
fi

# The wheels the bare-GPU archive packs, for this Python (its tests pack one):
# downloaded here once, not inside a test.
"$VENV/bin/python" benchmark/gpu_check/pack_gpu_check.py --fetch-only \
  --python "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# cpu_support on the venv's path, for the pytest plugin that
# cpu_support/standins/standin_pkgs/cpu_standins registers
# (cpu_support.standins.prepare): the series' own tests then get the CPU
# stand-ins in an SGLang checkout too.
echo "$ROOT" > "$SITE/fork_cpu_support.pth"
# The venv is ours: when the series changed since it was applied (a patch was
# edited or added), --replace checks the new series against the saved upstream
# files, reverts the old one and applies the new one. Plain `apply` refuses, as
# it must on somebody else's tree.
"$VENV/bin/python" scripts/series.py apply --replace --target "$SITE"
# The pristine and series trees (the A/B tests, the pristine run), built once
# here; a later series change rebuilds the series tree on first use.
"$VENV/bin/python" cpu_support/server/sglang_trees.py >/dev/null
