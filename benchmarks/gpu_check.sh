#!/usr/bin/env bash
# GPU check of jaxinfer.kernels.pallas, prepared for two H200 calls (installs nothing):
#   STEPS="tests bench engine" (< 10 min), then STEPS="llama throughput oracle" (< 6 min).
#
# Assumes the GPU machine's python3 with jax 0.11.x + CUDA (its image has jax, flax, orbax,
# transformers; jaxinfer's server-only packages such as fastapi are not needed here).
# Runs, each under its own time limit, from the repository root:
#   1. nvidia-smi and jax.devices()                                     -> env.txt
#   2. kernel tests compiled (JAXINFER_PALLAS_COMPILED=1)              -> tests.log
#   3. kernel benchmark, full sizes (pallas vs reference, copy BW)     -> bench.log, kernels_*.json
#   4. engine check: pallas vs xla backend on random SmolLM2-shaped weights, float32 and
#      bfloat16 (tokens and logits)                                   -> engine.log, backend_check.json
#      and on a 2-layer Llama-3-8B layout in bfloat16, with a decode-throughput probe
#      per backend (64 sequences)                                     -> backend_check_llama3-8b-2l.json
#      (a stand-in for the oracle tests on a GPU host that has neither the converted
#      SmolLM2, ~336 MB, nor network access to fetch it)
#   5. engine throughput, Llama-3-8B layout (32 layers, random bf16 weights), 64 prompts of
#      128 tokens, 128 out, continuous against static batching  -> throughput.log,
#      engine_throughput.json
#   6. tests/test_oracle.py with JAXINFER_TEST_BACKEND=pallas, only if weights/ holds the
#      converted model (reference outputs: tests/data/)                -> oracle.log
# and writes summary.txt (exit code of each step). STEPS (default "tests bench engine llama
# throughput oracle") picks steps, so a run can be split over two calls under the device's
# 10-minute limit per command. Everything lands flat in
# ${OUT:-benchmarks/results/gpu/$(date +%F)} (8 files without steps 5 and 6).
# Usage: bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-benchmarks/results/gpu/$(date +%F)}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
STEPS=" ${STEPS:-tests bench engine llama throughput oracle} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

step() {  # step NAME LIMIT_SECONDS LOG COMMAND...
  local name=$1 limit=$2 log=$3; shift 3
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start))s" | tee -a "$SUMMARY"
  tail -n 25 "$log"
}

{
  date -u +%FT%TZ
  nvidia-smi || echo "nvidia-smi failed"
  "$PY" -c 'import sys, jax; print(sys.version); print("jax", jax.__version__); print(jax.devices())'
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

want tests && step "kernel tests, compiled" 180 "$OUT_DIR/tests.log" \
  env JAXINFER_PALLAS_COMPILED=1 "$PY" -m pytest -p no:cacheprovider -q -rA \
  --durations=10 tests/test_pallas_kernels.py

want bench && step "kernel benchmark" 170 "$OUT_DIR/bench.log" \
  "$PY" benchmarks/kernel_bench.py --out "$OUT_DIR"

want engine && step "engine check, pallas vs xla" 200 "$OUT_DIR/engine.log" \
  "$PY" benchmarks/backend_check.py --decode-batch 0 --out "$OUT_DIR"

want llama && step "engine check, Llama-3-8B layout (2 layers, bf16)" 120 "$OUT_DIR/engine.log" \
  "$PY" benchmarks/backend_check.py --config configs/llama-3-8b.json --layers 2 \
  --dtypes bfloat16 --decode-batch 64 --tag llama3-8b-2l --out "$OUT_DIR"

want throughput && step "engine throughput, Llama-3-8B layout (32 layers, bf16)" 200 \
  "$OUT_DIR/throughput.log" "$PY" benchmarks/engine_throughput.py \
  --config configs/llama-3-8b.json --batch 64 --input 128 --output 128 --out "$OUT_DIR"

if ! want oracle; then
  :
elif [ -f weights/smollm2-135m-instruct/config.json ] && [ -f tests/test_oracle.py ]; then
  # shellcheck disable=SC2086  # ORACLE_ARGS is a list of words
  step "oracle tests, pallas backend" 80 "$OUT_DIR/oracle.log" \
    env JAXINFER_TEST_BACKEND=pallas "$PY" -m pytest -p no:cacheprovider -q -rA \
    tests/test_oracle.py ${ORACLE_ARGS:-}
else
  echo "oracle tests: skipped (no converted model in weights/; step 4 stands in)" | tee -a "$SUMMARY"
fi

echo "=== summary ($OUT_DIR)"
cat "$SUMMARY"
