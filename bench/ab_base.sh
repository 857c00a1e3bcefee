#!/usr/bin/env bash
# Prepare an older (or another) tree for same-machine A/B runs on the GPU machine: exports commit
# REV's importable folders into .ab/NAME/ (NAME defaults to "base"; .ab is git-ignored: carry it with
# the run), with the built C++ radix tree where one is here. Then `bash bench/gpu_check.sh ab:STAGE`
# runs STAGE's module under this tree and under every tree in .ab/ in turn (docs/benchmarks.md,
# "Comparing two trees").
#   bash bench/ab_base.sh REV [NAME]
set -euo pipefail
rev=${1:?usage: bash bench/ab_base.sh REV [NAME]}
name=${2:-base}
case $name in */*|.*|"") echo "NAME must be a plain folder name, not '$name'" >&2; exit 2 ;; esac
cd "$(git rev-parse --show-toplevel)"
rm -rf ".ab/$name" && mkdir -p ".ab/$name"
git archive "$rev" engine native services bench clients/python/radixserve protos/gen | tar x -C ".ab/$name"
[ -f native/_prefix.abi3.so ] && cp native/_prefix.abi3.so ".ab/$name/native/"
git rev-parse "$rev" > ".ab/$name/REV"
echo ".ab/$name: $(cat ".ab/$name/REV") ($(du -sh ".ab/$name" | cut -f1))"
