#!/usr/bin/env bash
# Correctness checks and benchmarks on the GPU machine, in one call. Run from the repository root
# with the FlashInfer wheels in .whl/ (and, if an earlier run returned it, its JIT cache in .ficache/).
# The services also need grpcio-health-checking and grpcio-reflection wheels there (and grpcio /
# protobuf at the versions the committed stubs were generated with, and uvloop, without which they
# run on asyncio's own loop); carry native/_prefix.abi3.so
# (with a cffi wheel in .whl/) for the C++ radix tree, else the Python twin runs. .fa/fa_pkg.tgz, where
# present, holds a flash-attn build (the folder fa_pkg/: the flash_attn package and its extension),
# unpacked to /tmp and put first on PYTHONPATH; without it the `fa` backend's tests skip.
# Structured output (stage constrained) needs the xgrammar wheel and those of its needs a stock
# CUDA + PyTorch image lacks: pydantic, pydantic-core, annotated-types, typing-inspection
# (apache-tvm-ffi is there already, for FlashInfer).
# .tok/qwen3-tokenizer.tgz, where present, holds a real-size tokenizer (the folder qwen3tok/, made by
# `radixserve bench tokenizer`): the models that `serving`, `dp-shared` and `constrained` use then
# carry it instead of the demo tokenizer, so detokenizing and grammar masks see a real vocabulary.
#   bash bench/gpu_check.sh STAGE...     stages: tests, cache, small, big, extra, kernels, pieces,
#                                        pieces-8b, long-curve, long-curve-compute, constrained,
#                                        serving, serving-8b, fa,
#                                        dp-shared, abort, mixed, overload, graph-prefill,
#                                        overload-ab, pdl, piece-prefill,
#                                        piece-prefill-serving, piece-prefill-kernels,
#                                        cores, serving-load, serving-load-8b, gateways-serving,
#                                        mixed-cap-serving
#   save:MODEL: /tmp/models/MODEL (config, tokenizer, random bf16 weights) for py: stages
#   spy:SECONDS: py-spy (its wheel in .whl) samples the next scheduler process to start, from outside
#   and without slowing it, for SECONDS, into $OUT/spy-scheduler.txt; read it with the stage
#   "bench:stacks:$OUT/spy-scheduler.txt:--thread:engine-loop:--under:_iterate" (docs/benchmarks.md,
#   "GPU, twenty-ninth round")
#   pstats:PATH: after stages run with RADIXSERVE_PROFILE_ENGINE=PATH (cProfile of each scheduler's
#   engine loop thread, services/scheduler/profiling.py), each file's functions by their own time
#   cores: bench cores (which CPUs slow Python work on the highest-numbered one)
#   serving-load: the inter-token goal's measurement on this machine: the 0.6B's maximum rate at
#   concurrency 256 (1,536 requests, four gateways over 32 connections, four client processes),
#   then Poisson arrivals at SERVING_RATES of it (default 0.5,0.75,0.75,0.9), and the offline engine;
#   serving-load-8b: the same for Qwen3-8B, 768 requests a level and only 0.75 by default (within
#   the stage's time)
#   gateways-serving: serving_pair (below) with PAIR_GATEWAYS gateways (default 8) and with four
#   mixed-cap-serving: serving_pair with steps that decode held to PAIR_MIXED_TOKENS prefill tokens
#   (default 512, one prompt of the workload) and with the learned cap alone; after serving-load
#   in the same run, the pairs run at 75 % of the maximum it measured (pair_rate)
#   tests:EXPR: the tests stage's files, only the tests pytest's -k EXPR selects (spaces allowed)
#   ab:bench:MODULE:ARGS (after bash bench/ab_base.sh REV [NAME], carrying .ab): MODULE under this
#   tree and under each tree in .ab/, in turn, e.g. ab:bench:suite:--model:qwen3-0.6b:--parts:latency,offline
#   serving with two gateways (docs/benchmarks.md, "GPU, sixth round"):
#   SERVING_FLAGS="--gateways 2" SERVING_BENCH_FLAGS="--channels 4" bash bench/gpu_check.sh serving
#   and with tokens sent two at a time: SERVING_FLAGS="--stream-interval 2" bash bench/gpu_check.sh serving
#   abort: cancel -> freed at 256 running, through each count of gateways in ABORT_GATEWAYS (default
#   4, what `serve --gateways auto` starts on a 16-core host; two client connections a gateway, in
#   each client process, where there are several),
#   from ABORT_PROCESSES client processes (default 4: three read the streams that stay), the first
#   cancel each of ABORT_SETTLE seconds after all ran (default 1; "0 1": both, in turn)
#   mixed: decode steps of 128 and 256 rows, alone and each carrying one new prompt of 128 or 512
#   tokens (bench profile --mixed), host phases split; the decode rows of those steps through the
#   decode kernel (split_mixed_attention, the default) and through the prefill kernel
#   graph-prefill: steps of 8, 64 and 128 decode rows, each carrying a prompt of 32, 128 or 250
#   tokens, with those tokens replayed as decode-graph rows (graph_prefill_keys GRAPH_PREFILL_KEYS,
#   default 16384, as the engine's) and through the piecewise graphs (0); overload-ab: `overload`
#   twice each way, in turn
#   pdl: batch-1 decode (Qwen3-0.6B twice, Qwen3-8B) and the offline workload with the Triton
#   kernels launched by programmatic dependent launch and without, in turn
#   fa: the fa and fa,flashinfer GPU tests, prefill attention of each backend (bench kernels
#   --parts attention_prefill), and the offline workload (qwen3-0.6b) on flashinfer, fa and
#   fa,flashinfer at pages of 256. A prefill profile on one backend, for instance:
#   bench:profile:--model:qwen3-0.6b:--prefill:8192:--engine:attention_backend=fa:--engine:page_size=256
# Results: $OUT/log.txt (everything), $OUT/results.jsonl (one JSON line per figure).
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 RADIXSERVE_TEST_RESULTS="$OUT/results.jsonl"
if [ "$(ls -l .whl)" != "$(cat /tmp/site/.wheels 2>/dev/null)" ]; then  # once per set of wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  ls -l .whl > /tmp/site/.wheels
fi
# radixserve.* import names map onto the project folders (setup.py's package-dir) through links.
shim() {  # shim DIR TREE: DIR/radixserve/* links onto TREE's folders
  local pair
  mkdir -p "$1/radixserve"
  for pair in engine:engine native:native services:services bench:bench client:clients/python/radixserve/client \
              v1:clients/python/radixserve/v1 internal:protos/gen/radixserve/internal; do
    ln -sfn "$2/${pair#*:}" "$1/radixserve/${pair%%:*}"
  done
}
shim /tmp/shim "$PWD"
AB_TREES=()  # bench/ab_base.sh REV [NAME]: the trees to compare with this one, .ab/NAME each
for t in .ab/*/; do
  [ -f "$t/REV" ] || continue
  t=$(basename "$t"); AB_TREES+=("$t"); shim "/tmp/shim-ab/$t" "$PWD/.ab/$t"
done
export PYTHONPATH=/tmp/shim:/tmp/site
if [ -f .fa/fa_pkg.tgz ]; then  # a flash-attn build: fa_pkg/flash_attn and flash_attn_2_cuda*.so
  tar xzf .fa/fa_pkg.tgz -C /tmp && export PYTHONPATH=/tmp/fa_pkg:$PYTHONPATH
fi
FI_HOME="$HOME/.cache/flashinfer"
if ls .ficache/fi.tgz.part* >/dev/null 2>&1; then
  cat .ficache/fi.tgz.part* | tar xzf - -C "$HOME" && find "$FI_HOME" -path '*cached_ops*' -type f -exec touch -d '+2 hours' {} +
  echo "restored flashinfer JIT cache: $(du -sh "$FI_HOME" | cut -f1)" | tee -a "$LOG"
fi
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,uuid --format=csv;
  python3 -c "import torch, triton, flashinfer, transformers as t; print('torch', torch.__version__, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__, 'transformers', t.__version__)";
  python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>/dev/null || echo "flash_attn: not installed"; } 2>&1 | tee -a "$LOG"

stage() {  # stage NAME SECONDS CMD...: one stage's failure or timeout never stops the next
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date -u +%T), limit ${secs}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee -a "$LOG" | grep -v -e '^DEBUG' -e 'Warning' | tail -n 40
  echo "=== $name done in $((SECONDS - t0))s, rc ${PIPESTATUS[0]}" | tee -a "$LOG"
}
SUITE=(python3 -m radixserve.bench.suite --out "$OUT/results.jsonl")
SPIES=()  # spy: stages' background samplers
TOK=()
if [ -f .tok/qwen3-tokenizer.tgz ]; then
  tar xzf .tok/qwen3-tokenizer.tgz -C /tmp && TOK=(--tokenizer /tmp/qwen3tok)
  echo "real-size tokenizer: /tmp/qwen3tok" | tee -a "$LOG"
fi

save_model() {  # save_model NAME: config.json, the tokenizer (TOK's or the demo one), random bf16 weights
  [ -d "/tmp/models/$1" ] || python3 -c "
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from radixserve.bench.models import write_model_dir
d = write_model_dir(sys.argv[1], '/tmp/models', (sys.argv[3:] or [None])[0])
with torch.device('cuda'):
    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.bfloat16)
m.save_pretrained(d)" "$1" "${TOK[@]}" 2>&1 | tail -n 2 | tee -a "$LOG"
}
# The served plane through all four services against the offline engine (docs/benchmarks.md,
# "Serving plane"); SERVING_LEVELS and SERVING_RATES override the concurrencies and rate fractions
# (SERVING_RATES="" runs none: then SERVING_BENCH_FLAGS="--request-rate R" for a fixed rate),
# SERVING_FLAGS adds serve flags (e.g. "--admission-wait-ms 0") and SERVING_LABEL names the JSON.
serving() {  # serving NAME
  save_model "$1"
  stage "serving $1" 560 python3 -m radixserve.bench.serving --launch --model "/tmp/models/$1" \
    --num-prompts 512 --input-len 512 --output-len 512 --temperature 0.6 \
    --concurrency "${SERVING_LEVELS:-256,32}" --rate-fractions "${SERVING_RATES-0.5,0.75,0.9}" \
    --offline-baseline --json "$OUT/serving-$1${SERVING_LABEL:-}.json" ${SERVING_BENCH_FLAGS:-} \
    -- --device cuda --max-running-requests 256 ${SERVING_FLAGS:-}
}

# serving_load NAME PROMPTS RATES: its maximum rate at concurrency 256, then SERVING_RATES (default
# RATES) of it, PROMPTS requests a level
serving_load() {
  SERVING_LEVELS=256 SERVING_RATES=${SERVING_RATES-$3} \
    SERVING_FLAGS="--gateways 4 ${SERVING_FLAGS:-}" \
    SERVING_BENCH_FLAGS="--channels 32 --processes 4 --num-prompts $2 ${SERVING_BENCH_FLAGS:-}" \
    SERVING_LABEL=-load serving "$1"
}

# Data-parallel replicas sharing GPU 0 (serve --dp-size gives each replica GPUs of its own, so the
# services start one by one here): the shared-prefix workload through one gateway for each
# DP_SPECS entry POLICY:REPLICAS[:BALANCE_ABS] (docs/benchmarks.md, "Data-parallel replicas").
dp_shared() {
  save_model qwen3-0.6b
  local M=/tmp/models/qwen3-0.6b CLI="python3 -m radixserve.services.cli" spec
  for spec in ${DP_SPECS:-cache_aware:2 round_robin:2 cache_aware:1}; do
    local r n abs D pids=() backends=""
    IFS=: read -r r n abs <<< "$spec"; D=$(mktemp -d)
    $CLI tokenizer --model $M --address unix:$D/tok.sock --log-level WARNING & pids+=($!)
    for i in $(seq 0 $((n - 1))); do
      $CLI detokenizer --model $M --address unix:$D/det$i.sock --log-level WARNING & pids+=($!)
      $CLI scheduler --model $M --address unix:$D/s$i.sock --detokenizer-addr unix:$D/det$i.sock \
        --device cuda --max-running-requests 256 --num-pages 20000 --log-level WARNING & pids+=($!)
      backends="$backends --scheduler-addr unix:$D/s$i.sock --detokenizer-addr unix:$D/det$i.sock"
    done
    $CLI gateway --address 127.0.0.1:50999 --tokenizer-addr unix:$D/tok.sock $backends \
      --routing "$r" --routing-balance-abs "${abs:-32}" --log-level WARNING & pids+=($!)
    python3 -c "
import sys, time, grpc
from radixserve.v1 import generate_pb2 as pb, generate_pb2_grpc as pb_grpc
stub, n, t0 = pb_grpc.GenerateServiceStub(grpc.insecure_channel('127.0.0.1:50999')), $n, time.time()
while time.time() - t0 < 300:  # until every replica serves (each loads, captures, warms up)
    try:
        r = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=2).replicas
        if sum(x.state == pb.REPLICA_STATE_SERVING for x in r) == n: sys.exit(0)
    except grpc.RpcError: pass
    time.sleep(1)
sys.exit('replicas not serving after 300 s')" || echo "dp-shared $spec: not ready" | tee -a "$LOG"
    stage "dp-shared $spec" 300 python3 -m radixserve.bench.serving --target 127.0.0.1:50999 \
      --workload shared-prefix --concurrency 128 --json "$OUT/dp-shared-${spec//:/-}.json"
    kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$D"
  done
}

# Piecewise graphs on (the default) against off, side by side: prefill-step host time, the offline
# workload, and the long-prompt mix; `pieces` for Qwen3-0.6B, `pieces-8b` for Qwen3-8B, `long-curve`
# for chunk sizes 256..4096 (short-request ITL against long-prompt TTFT).
EAGER=(--engine piecewise_graph_max_tokens=0)
pieces() {  # pieces MODEL PREFILL_TOKENS PARTS
  stage "prefill $1 pieces" 200 python3 -m radixserve.bench.profile --model "$1" --prefill "$2" \
    --json "$OUT/prefill-$1-pieces.json"
  stage "prefill $1 eager" 200 python3 -m radixserve.bench.profile --model "$1" --prefill "$2" \
    "${EAGER[@]}" --json "$OUT/prefill-$1-eager.json"
  stage "suite $1 pieces" 300 "${SUITE[@]}" --model "$1" --parts "$3"
  stage "suite $1 eager" 300 "${SUITE[@]}" --model "$1" --parts "$3" "${EAGER[@]}"
}

# Mixed steps' prefill attention inside the piecewise graphs (piece_prefill_keys, off: 0): its GPU
# tests, its kernel in the launch shapes of PAGED_PREFILL_SHAPES against FlashInfer's (bench
# kernels --parts paged_prefill), mixed steps profiled each way; piece-prefill-serving:
# PIECE_PREFILL_MODEL (default qwen3-0.6b; PIECE_PREFILL_PROMPTS requests, default 1536) served at
# PIECE_PREFILL_RATE (default: pair_rate's, below) each way in turn,
# PIECE_PREFILL_ROUNDS times (default 2; PIECE_PREFILL_KEYS: 4096); piece-prefill-kernels: the
# kernel part alone.
# mixed_profile LABEL FIELD=VALUE JSON: 0.6B steps of 128 and 256 decode rows beside a prompt
mixed_profile() {
  stage "$1" 200 python3 -m radixserve.bench.profile --model qwen3-0.6b --batches 128,256 \
    --mixed 128,512 --steps 60 --host --temperature 0.6 --engine "$2" --json "$3"
}
piece_prefill_kernels() {
  stage "piece-prefill kernels" 300 python3 -m radixserve.bench.kernels --parts paged_prefill \
    --out "$OUT/results.jsonl"
}
piece_prefill() {
  local keys=${PIECE_PREFILL_KEYS:-4096} k
  stage "piece-prefill tests" 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
    -k "paged_prefill or (prefill and inside)" "${GPU_TESTS[@]}"
  piece_prefill_kernels
  for k in "$keys" 0; do
    mixed_profile "piece-prefill profile keys=$k" "piece_prefill_keys=$k" \
      "$OUT/piece-prefill-profile-$k.json"
  done
}
piece_prefill_serving() {
  local keys=${PIECE_PREFILL_KEYS:-4096}
  PAIR_MODEL=${PIECE_PREFILL_MODEL:-qwen3-0.6b} PAIR_PROMPTS=${PIECE_PREFILL_PROMPTS:-1536} \
    PAIR_RATE=${PIECE_PREFILL_RATE:-} PAIR_ROUNDS=${PIECE_PREFILL_ROUNDS:-2} \
    serving_pair piece-prefill "--piece-prefill-keys $keys" "--piece-prefill-keys 0"
}

# The rate serving_pair runs MODEL at: PAIR_RATE where given; else 75 % of the maximum that a
# serving-load stage earlier in this run measured on this machine; else 74.2 req/s (75 % of an
# H200's maximum for the 0.6B, 95 % of an H100's).
pair_rate() {
  if [ -n "${PAIR_RATE:-}" ]; then echo "$PAIR_RATE"; return; fi
  python3 -c 'import json, math, sys
levels = json.load(open(sys.argv[1]))["results"]
print(round(0.75 * max(r["request_s"] for r in levels if math.isinf(r["request_rate"])), 1))' \
    "$OUT/serving-$1-load.json" 2>/dev/null || echo 74.2
}

# serving_pair LABEL "SERVE FLAGS A" "SERVE FLAGS B": PAIR_MODEL (default qwen3-0.6b, PAIR_PROMPTS
# requests, default 1536) at pair_rate's rate, 512 in and out, four gateways, served with A and
# with B in turn, PAIR_ROUNDS times (default 2): A then B, then B then A, so neither way always
# runs first on a fresh machine.
serving_pair() {
  local label=$1 model=${PAIR_MODEL:-qwen3-0.6b} i flags order rate
  save_model "$model"
  rate=$(pair_rate "$model")
  echo "$label pairs at $rate req/s" | tee -a "$LOG"
  for i in $(seq "${PAIR_ROUNDS:-2}"); do
    order=("$2" "$3"); [ $((i % 2)) = 0 ] && order=("$3" "$2")
    for flags in "${order[@]}"; do
      stage "$label serving $flags" 300 python3 -m radixserve.bench.serving --launch \
        --model "/tmp/models/$model" --num-prompts "${PAIR_PROMPTS:-1536}" \
        --input-len 512 --output-len 512 --temperature 0.6 --concurrency 256 \
        --request-rate "$rate" --channels 32 --processes 4 \
        --json "$OUT/$label-serving-$model-${flags// /}-$SECONDS.json" \
        -- --device cuda --max-running-requests 256 --gateways 4 $flags
    done
  done
}

overload() {  # overload "SERVE FLAGS": 3x the saturating rate through the services
  save_model qwen3-0.6b
  local label=${1// /}
  stage "overload $1" 200 python3 -m radixserve.bench.overload --launch --channels 8 \
    --model /tmp/models/qwen3-0.6b --duration 30 --json "$OUT/overload${label:+-$label}-$SECONDS.json" \
    -- --device cuda $1
}

# ab:SPEC (SPEC as after "bench:" or "py:" below): the module under this tree, then under each tree
# bench/ab_base.sh put in .ab/, AB_ROUNDS times (default 2), in turn on this machine: hosts differ
# by more than most changes, so a before/after pair is only read from one call.
ab() {
  local spec=$1 i mod t
  [ ${#AB_TREES[@]} -gt 0 ] || { echo "ab: no tree in .ab/ (bash bench/ab_base.sh REV, then carry .ab)" | tee -a "$LOG"; return; }
  case $spec in bench:*) mod=radixserve.bench.${spec#bench:} ;; py:*) mod=${spec#py:} ;; *) mod=$spec ;; esac
  for i in $(seq "${AB_ROUNDS:-2}"); do
    stage "ab $spec [this tree, $i]" 300 python3 -m ${mod//:/ }
    for t in "${AB_TREES[@]}"; do
      stage "ab $spec [$t $(cut -c1-8 ".ab/$t/REV"), $i]" 300 \
        env PYTHONPATH="/tmp/shim-ab/$t:/tmp/site" python3 -m ${mod//:/ }
    done
  done
}

GPU_TESTS=(tests/engine/test_fused_gpu.py tests/engine/test_backends_gpu.py tests/engine/test_engine_gpu.py
           tests/engine/test_flashinfer_direct_gpu.py tests/engine/test_sampling.py
           tests/engine/test_paged_prefill.py)
for s in "$@"; do
  case $s in
    tests) stage tests 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE "${GPU_TESTS[@]}" ;;
    tests:*) stage "$s" 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
               -k "${s#tests:}" "${GPU_TESTS[@]}" ;;  # e.g. "tests:small or swiglu"
    cache) if [ ! -d .ficache ]; then  # return the JIT cache only if it fits what comes back (60 MB)
             tar czf /tmp/fi.tgz -C "$HOME" .cache/flashinfer; ls -la /tmp/fi.tgz | tee -a "$LOG"
             [ "$(stat -c %s /tmp/fi.tgz)" -le 62914560 ] && split -b 15M /tmp/fi.tgz "$OUT/fi.tgz.part"
           fi ;;
    pieces) pieces qwen3-0.6b 64,256,1024,4096 offline,long ;;
    pieces-8b) pieces qwen3-8b 64,1024 offline ;;
    long-curve) stage long-curve 400 python3 -m radixserve.bench.long --model qwen3-0.6b \
                  --chunk 256,512,1024,2048,4096 --json "$OUT/long-curve.json" ;;
    long-curve-compute) stage long-curve-compute 400 python3 -m radixserve.bench.long \
                  --model qwen3-0.6b --chunk 1024,2048,4096,8192 --engine prefill_budget=compute \
                  --json "$OUT/long-curve-compute.json" ;;
    constrained) stage xgrammar 60 python3 -c "import importlib.metadata as m, xgrammar
print('xgrammar', m.version('xgrammar'), 'pydantic', m.version('pydantic'))"
                 stage constrained 400 "${SUITE[@]}" --model qwen3-0.6b --parts constrained "${TOK[@]}" ;;
    serving) serving qwen3-0.6b ;;
    serving-load) serving_load qwen3-0.6b 1536 0.5,0.75,0.75,0.9 ;;
    serving-load-8b) serving_load qwen3-8b 768 0.75 ;;  # within the stage's time
    gateways-serving) serving_pair gateways "--gateways ${PAIR_GATEWAYS:-8}" "--gateways 4" ;;
    mixed-cap-serving) serving_pair mixed-cap "--mixed-prefill-tokens ${PAIR_MIXED_TOKENS:-512}" "" ;;
    abort) save_model qwen3-0.6b  # client cancel -> freed at 256 running, per ABORT_GATEWAYS count
           for g in ${ABORT_GATEWAYS:-4}; do
             for settle in ${ABORT_SETTLE:-1}; do
               stage "abort gateways=$g settle=$settle" 200 python3 -m radixserve.bench.abort \
                 --launch --model /tmp/models/qwen3-0.6b --running 256 --cancels 64 \
                 --output-len 4000 --channels $((g == 1 ? 1 : 2 * g)) \
                 --processes "${ABORT_PROCESSES:-4}" --settle-s "$settle" \
                 --json "$OUT/abort-g$g-s$settle-$SECONDS.json" -- --device cuda --gateways $g
             done
           done ;;
    overload) overload "" ;;  # 3x the saturating rate: refusal latency, admitted ITL
    graph-prefill) for keys in 0 "${GRAPH_PREFILL_KEYS:-16384}"; do  # short prompts in the decode graphs, or not (0)
                     stage "graph-prefill profile keys=$keys" 200 python3 -m radixserve.bench.profile \
                       --model qwen3-0.6b --batches 8,64,128 --mixed 32,128,250 --steps 60 --host \
                       --temperature 0.6 --engine graph_prefill_keys=$keys \
                       --json "$OUT/graph-prefill-$keys.json"
                   done ;;
    overload-ab) k=${GRAPH_PREFILL_KEYS:-16384}
                 for keys in 0 "$k" 0 "$k"; do overload "--graph-prefill-keys $keys"; done ;;
    pdl) for m in qwen3-0.6b qwen3-0.6b qwen3-8b; do  # programmatic dependent launch on, off
           for v in true false; do
             stage "pdl=$v $m latency" 200 "${SUITE[@]}" --model $m --parts latency --engine pdl=$v
           done
         done
         for v in true false; do
           stage "pdl=$v offline" 200 "${SUITE[@]}" --model qwen3-0.6b --parts offline --engine pdl=$v
         done ;;
    piece-prefill) piece_prefill ;;
    piece-prefill-serving) piece_prefill_serving ;;
    cores) stage cores 120 python3 -m radixserve.bench.cores --json "$OUT/cores.json" ;;
    piece-prefill-kernels) piece_prefill_kernels ;;
    mixed) for split in true false; do
             mixed_profile "mixed split=$split" "split_mixed_attention=$split" \
               "$OUT/mixed-split-$split.json"
           done ;;
    dp-shared) dp_shared ;;
    serving-8b) serving qwen3-8b ;;
    save:*) save_model "${s#save:}" ;;  # e.g. save:qwen3-8b before a py: stage that serves it
    kernels) stage kernels 300 python3 -m radixserve.bench.kernels --out "$OUT/results.jsonl" ;;
    small) stage small 300 "${SUITE[@]}" --model qwen3-0.6b --parts latency,offline,no_overlap,offline_llm ;;
    big) stage big 240 "${SUITE[@]}" --model qwen3-8b --parts latency,offline,no_overlap ;;
    extra) stage extra 400 "${SUITE[@]}" --model qwen3-0.6b --parts prefix,long,hf ;;
    fa) stage fa-tests 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k fa \
          tests/engine/test_backends_gpu.py tests/engine/test_engine_gpu.py  # ids naming fa
        stage fa-kernels 60 python3 -m radixserve.bench.kernels --parts attention_prefill \
          --out "$OUT/results.jsonl"
        for b in flashinfer fa fa,flashinfer; do
          stage "fa-offline $b" 60 "${SUITE[@]}" --model qwen3-0.6b --parts offline \
            --engine attention_backend="$b" --engine page_size=256
        done ;;
    ab:*) ab "${s#ab:}" ;;
    bench:*) b=${s#bench:}; stage "$s" 300 python3 -m radixserve.bench.${b//:/ } ;;  # e.g. "bench:profile:--model:tiny"
    py:*) b=${s#py:}; stage "$s" 580 python3 -m ${b//:/ } ;;  # any module, e.g. "py:radixserve.bench.soak:--clients:1000"
    pstats:*) for f in "${s#pstats:}".*; do  # each scheduler's file (services/scheduler/profiling.py)
                stage "pstats $f" 60 python3 -c "import pstats, sys
pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(30)" "$f"
              done ;;
    spy:*) (  # in the background: the stages after it start the scheduler
             for _ in $(seq 600); do
               pid=$(pgrep -n -f "radixserve.services.cli scheduler") && break; sleep 1
             done
             [ -n "${pid:-}" ] && /tmp/site/bin/py-spy record -p "$pid" -d "${s#spy:}" -r 200 \
               --nonblocking --threads -f raw -o "$OUT/spy-scheduler.txt" >> "$LOG" 2>&1 ) &
           SPIES+=($!) ;;
    *) stage "$s" 300 "${SUITE[@]}" ${s//:/ } ;;  # e.g. "--model:qwen3-8b:--parts:no_overlap"
  esac
done
for p in "${SPIES[@]}"; do  # a spy: sampler writes once its scheduler has exited; one that found
  for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 1; done  # none is stopped
  kill "$p" 2>/dev/null
done
du -sh "$OUT"/* 2>/dev/null
