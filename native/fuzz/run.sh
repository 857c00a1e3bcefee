#!/usr/bin/env bash
# Builds the libFuzzer target with ASan + UBSan and runs it for a bounded time (default 60 s).
# Exits non-zero on any finding: a crash, a sanitizer report, or a disagreement with the reference.
# Usage: native/fuzz/run.sh [seconds] [extra libFuzzer flags, e.g. -jobs=4 -workers=4]
set -euo pipefail

seconds="${1:-60}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${FUZZ_OUT:-$here/build}"  # gitignored; the corpus kept here makes later runs start deeper
cxx="${FUZZ_CXX:-clang++}"
mkdir -p "$out/corpus"

"$cxx" -std=c++17 -O2 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$here/.." "$here/fuzz_prefix.cpp" "$here/../prefix.cpp" -o "$out/fuzz_prefix"

"$out/fuzz_prefix" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/" "$@" "$out/corpus"
