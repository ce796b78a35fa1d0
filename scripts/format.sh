#!/usr/bin/env bash
# Format the C++/CUDA sources with clang-format (.clang-format; deamoe_trt/cpu has its own).
#   scripts/format.sh           rewrite the files in place
#   scripts/format.sh --check   change nothing; list what would change, exit 1 if anything would
# Uses .venv/bin/clang-format (pinned in the test extra, installed by scripts/setup.sh), else
# clang-format from PATH: other versions may format some lines differently.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
case "${1:-}" in
    "") ;;
    --check) check=1 ;;
    *) echo "format.sh: unknown argument '$1'; use no argument to format or --check to check" >&2; exit 2 ;;
esac
clang_format=.venv/bin/clang-format
[[ -x $clang_format ]] || clang_format=$(command -v clang-format) || {
    echo "format.sh: clang-format not found; run scripts/setup.sh (it installs it into .venv)" >&2
    exit 2
}
mapfile -t files < <(git ls-files -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
if ((check)); then
    "$clang_format" --dry-run --Werror "${files[@]}"
else
    "$clang_format" -i "${files[@]}"
fi
