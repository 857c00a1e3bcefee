#!/usr/bin/env bash
# Builds the libFuzzer targets with ASan + UBSan and runs each for a share of a bounded time
# (default 60 s in all; the radix tree is the one target today). Exits non-zero on any finding: a crash, a sanitizer report, or a
# disagreement with the reference / oracle.
# Usage: native/fuzz/run.sh [seconds] [extra libFuzzer flags, e.g. -jobs=4 -workers=4]
#   FUZZ_TARGETS="radix" picks targets (default all); FUZZ_OUT moves the build folder.
set -euo pipefail

seconds="${1:-60}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${FUZZ_OUT:-$here/build}"  # gitignored; the corpora kept here make later runs start deeper
cxx="${FUZZ_CXX:-clang++}"
read -r -a targets <<< "${FUZZ_TARGETS:-radix}"
share=$(( seconds / ${#targets[@]} ))
(( share >= 1 )) || share=1

for target in "${targets[@]}"; do
  case "$target" in
    radix) sources=("$here/../radix_tree.cpp" "$here/../radix_api.cpp") ;;
    *) echo "unknown fuzz target: $target" >&2; exit 2 ;;
  esac
  mkdir -p "$out/corpus/$target"
  "$cxx" -std=c++17 -O2 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$here/.." "$here/fuzz_$target.cpp" "${sources[@]}" -o "$out/fuzz_$target"
  "$out/fuzz_$target" -max_total_time="$share" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/" "$@" "$out/corpus/$target"
done
