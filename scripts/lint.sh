#!/usr/bin/env bash
# Checks that the project's C++ sources are clang-formatted (.clang-format). --fix rewrites them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
clang_format=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
if [ "${1:-}" = "--fix" ]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
"$clang_format" --dry-run --Werror "${files[@]}"
echo "lint: ${#files[@]} files formatted"
