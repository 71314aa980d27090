#!/usr/bin/env bash
# One-command CPU environment: .venv with torch, sglang 0.5.23 (--no-deps), the
# exact-pinned CPU requirements, SGLang's linters (requirements/lint.txt), the CPU
# stand-ins, and the patch series applied: requirements/constraints.txt (all the
# venv's packages, transitive ones included) installed as the lock it is, then
# every requirements file constrained by it.
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
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# pip's noise: the local-index warnings, and the list of sglang's GPU-only
# dependencies that --no-deps deliberately leaves out.
quiet() {
  grep -v -e "^WARNING: Location" -e "^$" -e "^sglang 0\.5\.2[23] requires " \
    -e "^ERROR: pip's dependency resolver does not currently take into account" || true
}

# Every install is constrained by requirements/constraints.txt: each package
# the venv holds, transitive ones included, at one exact version.
# --no-compile: pip byte-compiles one file at a time; compileall does it below
# on every CPU. Compiled here, not on import: where PYTHONDONTWRITEBYTECODE is
# set, an import never writes its .pyc, and every process compiles again.
C="-c requirements/constraints.txt --no-compile"
if [ ! -f "$STAMP" ]; then
  echo "setup: installing pip/setuptools, torch, sglang --no-deps and the requirements"
  $PIP install $C -r requirements/build.txt 2>&1 | quiet   # pip, and setuptools for the stand-ins
fi

# pip keeps one CPU busy; these run beside it (standard library, git and the
# venv's pip only), each to its own log, shown when it ends.
LOGS=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$LOGS"' EXIT
background() {  # NAME COMMAND...: run COMMAND in the background
  local name=$1
  shift
  ("$@") >"$LOGS/$name.out" 2>"$LOGS/$name.err" &
  eval "PID_$name=$!"
}
finish() {  # NAME: wait for it; its messages; its failure stops the set-up
  local name=$1 pid
  eval "pid=\$PID_$name"
  if ! wait "$pid"; then
    cat "$LOGS/$name.err" >&2
    echo "setup: $name failed" >&2
    exit 1
  fi
  cat "$LOGS/$name.err" >&2
}
# The pristine release wheels in .cache/wheels (the apply tool's tests read
# both; 0.5.22 as the release it must refuse), fetched by the one function
# that fetches them, then the pristine and series trees (the A/B tests, the
# pristine run); a later series change rebuilds the series tree on first use.
# The release wheels first, in the foreground: the archive's fetch below reads
# .cache/wheels too, and two pip downloads of one wheel into one folder race.
"$VENV/bin/python" cpu_support/server/sglang_trees.py --wheel 0.5.22 --wheel 0.5.23 >/dev/null
background trees "$VENV/bin/python" cpu_support/server/sglang_trees.py
# The wheels the bare-GPU archive packs, for this Python (its tests pack one):
# downloaded here once, not inside a test.
background archive_wheels "$VENV/bin/python" benchmark/gpu_check/pack_gpu_check.py \
  --fetch-only --python "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

if [ ! -f "$STAMP" ]; then
  # First the lock itself (constraints.txt, pip and setuptools already in),
  # --no-deps, so no resolver runs, in two pip processes at once that write
  # disjoint paths: torch, triton and the CUDA libraries (5 GB), and the rest.
  grep -v -e '^#' -e '^[[:space:]]*$' requirements/constraints.txt |
    grep -v -i -e '^pip==' -e '^setuptools==' >"$LOGS/lock.txt"
  HEAVY='^(torch|torchvision|triton|nvidia-[^=]*|cuda-[^=]*)=='
  grep -i -E "$HEAVY" "$LOGS/lock.txt" >"$LOGS/lock-heavy.txt"
  grep -v -i -E "$HEAVY" "$LOGS/lock.txt" >"$LOGS/lock-rest.txt"
  install_lock() { $PIP install $C --no-deps -r "$1" 2>&1 | quiet >&2; }
  background lock_heavy install_lock "$LOGS/lock-heavy.txt"
  background lock_rest install_lock "$LOGS/lock-rest.txt"
  finish lock_heavy
  # torch's own modules compile on the CPU the heavy pip freed while the other
  # pip still runs; the compileall of the whole site below then skips them.
  # compileall -x searches the whole path: anchored at site-packages, so a
  # checkout that itself lies under a folder named tests is still compiled.
  SKIP_TESTS='/site-packages/.+/tests/'
  compile_heavy() {
    "$VENV/bin/python" -m compileall -qq -x "$SKIP_TESTS" "$SITE/torch" "$SITE/torchvision" \
      >/dev/null || true
  }
  background compile_heavy compile_heavy
  finish lock_rest
  # Then the requirement files, each constrained, as they always install: with
  # the lock in place this only resolves, and installs what a file names that
  # the lock does not pin yet (with its dependencies).
  $PIP install $C --no-deps -r requirements/sglang.txt 2>&1 | quiet
  $PIP install $C -r requirements/torch.txt -r requirements/cpu.txt \
    -r requirements/server.txt -r requirements/lint.txt 2>&1 | quiet
  # The stand-ins build with the venv's setuptools (requirements/build.txt),
  # not one that pip's build isolation would fetch.
  for pkg in cpu_support/standins/standin_pkgs/*/; do
    [ -f "$pkg/pyproject.toml" ] &&
      $PIP install $C --no-deps --no-build-isolation --force-reinstall "$pkg" 2>&1 | quiet
  done
  # Every module (those that do not compile on this Python, such as torch's
  # py312_intrinsics.py, are skipped, as pip skips them), except the packages'
  # own test suites (pandas/tests, sympy/.../tests, ...: 2,719 files nothing
  # here imports).
  finish compile_heavy
  "$VENV/bin/python" -m compileall -qq -j 0 -x "$SKIP_TESTS" "$SITE" >/dev/null || true
  rm -f "$VENV"/.fork-setup-*
  touch "$STAMP"
fi

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
# The files the series changed, compiled again (the rest are up to date).
"$VENV/bin/python" -m compileall -qq -j 0 "$SITE/sglang" >/dev/null || true
finish archive_wheels
finish trees
