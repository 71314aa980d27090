#!/usr/bin/env bash
# Fetch the SGLang test files that files.txt lists, each at its commit of
# sgl-project/sglang, to the same relative path under $TESTS.
#   usage: scripts/upstream_tests/fetch.sh
# $SGLANG_GIT (default .cache/sglang-git) is a blobless clone of $SGLANG_URL
# (default https://github.com/sgl-project/sglang), made on the first run; a
# commit it lacks is fetched by its id.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TESTS="${TESTS:-$ROOT/.cache/upstream-tests}"
GIT_DIR_="${SGLANG_GIT:-$ROOT/.cache/sglang-git}"
URL="${SGLANG_URL:-https://github.com/sgl-project/sglang}"
if [ ! -d "$GIT_DIR_/.git" ]; then
  git clone -q --filter=blob:none --no-checkout "$URL" "$GIT_DIR_"
fi
n=0
while read -r path commit _; do
  case "$path" in ''|'#'*) continue ;; esac
  if ! git -C "$GIT_DIR_" cat-file -e "$commit^{commit}" 2>/dev/null; then
    git -C "$GIT_DIR_" fetch -q origin "$commit"
  fi
  mkdir -p "$TESTS/$(dirname "$path")"
  git -C "$GIT_DIR_" show "$commit:$path" > "$TESTS/$path"
  n=$((n + 1))
done < "$HERE/files.txt"
echo "fetched $n file(s) to $TESTS"
