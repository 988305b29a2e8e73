#!/usr/bin/env bash
# GPU check of pallas_kernels, prepared for one H200 call (< 8 minutes, installs nothing).
#
# Assumes the GPU machine's python3 with jax 0.11.x + CUDA. Runs, each under its own
# time limit, from the repository root:
#   1. nvidia-smi and jax.devices()                                     -> env.txt
#   2. kernel tests compiled (JAXINFER_PALLAS_COMPILED=1)              -> tests.log
#   3. kernel benchmark, full sizes (pallas vs reference, copy BW)     -> bench.log, kernels_*.json
#   4. tests/test_oracle.py with JAXINFER_TEST_BACKEND=pallas, if present -> oracle.log
#      (extra pytest args in ORACLE_ARGS). It needs the converted SmolLM2 in weights/
#      and the oracle in shared/ or ../shared/: neither travels with the working tree
#      by default (the converted model is ~336 MB, over the 64 MiB carry limit), so
#      expect it to skip or fail at set-up unless they are provided on the machine.
# and writes summary.txt (exit code of each step). Everything lands flat in
# ${OUT:-benchmarks/results/gpu/$(date +%F)} (at most 6 files, as the device tool
# brings back 8). Usage: bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-benchmarks/results/gpu/$(date +%F)}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"

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

step "kernel tests, compiled" 170 "$OUT_DIR/tests.log" \
  env JAXINFER_PALLAS_COMPILED=1 "$PY" -m pytest -p no:cacheprovider -q -rA \
  --durations=10 tests/test_pallas_kernels.py

step "kernel benchmark" 210 "$OUT_DIR/bench.log" \
  "$PY" benchmarks/kernels.py --out "$OUT_DIR"

if [ -f tests/test_oracle.py ]; then
  # shellcheck disable=SC2086  # ORACLE_ARGS is a list of words
  step "oracle tests, pallas backend" 80 "$OUT_DIR/oracle.log" \
    env JAXINFER_TEST_BACKEND=pallas "$PY" -m pytest -p no:cacheprovider -q -rA \
    tests/test_oracle.py ${ORACLE_ARGS:-}
else
  echo "oracle tests: skipped (tests/test_oracle.py absent)" | tee -a "$SUMMARY"
fi

echo "=== summary ($OUT_DIR)"
cat "$SUMMARY"
