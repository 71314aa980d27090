#!/usr/bin/env bash
# Run the stored copies of SGLang's upstream unit tests (test/registered/...)
# against one SGLang tree.
#   usage: run.sh TREE [NAME]
# TREE is either a site-packages layout (TREE/sglang) or a repository layout
# (TREE/python/sglang).  NAME (default: basename of TREE) names the outputs:
#   results/NAME.xml   junit xml
#   results/NAME.txt   one line per test: OUTCOME<TAB>nodeid<TAB>reason
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=${PY:-/work/main/.venv/bin/python}
TREE="$(cd "${1:?usage: run.sh TREE [NAME]}" && pwd)"
NAME="${2:-$(basename "$TREE")}"
if [ -d "$TREE/python/sglang" ]; then SRC="$TREE/python"
elif [ -d "$TREE/sglang" ]; then SRC="$TREE"
else echo "run.sh: no sglang package under $TREE or $TREE/python" >&2; exit 2; fi
mkdir -p "$HERE/results"
cd "$HERE"   # no repository conftest.py above this directory
export PYTHONPATH="$SRC"
export PYTHONDONTWRITEBYTECODE=1
GOT="$("$PY" -c 'import sglang, os; print(os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))))')"
if [ "$GOT" != "$SRC" ]; then
  echo "run.sh: sglang imports from $GOT, not $SRC" >&2; exit 2
fi
echo "sglang from: $GOT"
FILES=$(cd "$HERE" && find test -name 'test_*.py' | sort)
set +e
"$PY" -m pytest -q -p no:cacheprovider -p no:xdist -o addopts= \
  --rootdir="$HERE" --junitxml="results/$NAME.xml" $FILES
RC=$?
set -e
"$PY" "$HERE/summarize.py" "results/$NAME.xml" > "results/$NAME.txt"
echo "pytest rc=$RC; per-test list: $HERE/results/$NAME.txt"
awk -F'\t' '{n[$1]++} END {for (k in n) printf "%s=%d ", k, n[k]; print ""}' "results/$NAME.txt"
