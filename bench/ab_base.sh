#!/usr/bin/env bash
# Prepare an older tree for same-machine A/B runs on the GPU machine: exports commit REV's
# importable folders into .ab/base/ (git-ignored; carry ".ab" with the run), with the built C++
# radix tree where one is here. Then `bash bench/gpu_check.sh ab:STAGE` runs STAGE's module under
# this tree and under .ab/base in turn (docs/benchmarks.md, "Comparing two trees").
#   bash bench/ab_base.sh REV
set -euo pipefail
rev=${1:?usage: bash bench/ab_base.sh REV}
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/base && mkdir -p .ab/base
git archive "$rev" engine native services bench clients/python/radixserve protos/gen | tar x -C .ab/base
[ -f native/_prefix.abi3.so ] && cp native/_prefix.abi3.so .ab/base/native/
git rev-parse "$rev" > .ab/base/REV
echo ".ab/base: $(cat .ab/base/REV) ($(du -sh .ab/base | cut -f1))"
