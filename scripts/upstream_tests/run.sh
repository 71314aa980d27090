#!/usr/bin/env bash
# Run the fetched copies of SGLang's own unit tests (test/registered/...)
# against one SGLang tree.
#   usage: scripts/upstream_tests/run.sh TREE [NAME]
# TREE is a site-packages layout (TREE/sglang) or a repository layout
# (TREE/python/sglang). The tests are read from $TESTS (default
# .cache/upstream-tests, where README.md says to fetch them; they are not
# part of this repository). NAME (default: basename of TREE) names the outputs
# in $TESTS/results/:
#   NAME.xml   junit xml
#   NAME.txt   one line per test: OUTCOME<TAB>nodeid<TAB>reason
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=${PY:-$ROOT/.venv/bin/python}
TESTS="$(cd "${TESTS:-$ROOT/.cache/upstream-tests}" && pwd)"
TREE="$(cd "${1:?usage: run.sh TREE [NAME]}" && pwd)"
NAME="${2:-$(basename "$TREE")}"
if [ -d "$TREE/python/sglang" ]; then SRC="$TREE/python"
elif [ -d "$TREE/sglang" ]; then SRC="$TREE"
else echo "run.sh: no sglang package under $TREE or $TREE/python" >&2; exit 2; fi
mkdir -p "$TESTS/results"
cd "$TESTS"   # no repository conftest.py above this directory
export PYTHONPATH="$SRC"
export PYTHONDONTWRITEBYTECODE=1
GOT="$("$PY" -c 'import sglang, os; print(os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))))')"
if [ "$GOT" != "$SRC" ]; then
  echo "run.sh: sglang imports from $GOT, not $SRC" >&2; exit 2
fi
echo "sglang from: $GOT"
FILES=$(find test -name 'test_*.py' | sort)
[ -n "$FILES" ] || { echo "run.sh: no test_*.py under $TESTS/test (fetch them first: scripts/upstream_tests/README.md)" >&2; exit 2; }
set +e
"$PY" -m pytest -q -p no:cacheprovider -p no:xdist -o addopts= \
  --rootdir="$TESTS" --junitxml="results/$NAME.xml" $FILES
RC=$?
set -e
"$PY" "$HERE/summarize.py" "results/$NAME.xml" > "results/$NAME.txt"
echo "pytest rc=$RC; per-test list: $TESTS/results/$NAME.txt"
awk -F'\t' '{n[$1]++} END {for (k in n) printf "%s=%d ", k, n[k]; print ""}' "results/$NAME.txt"
