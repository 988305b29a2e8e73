#!/usr/bin/env bash
# GPU check of both attention kernels (Triton: jaxinfer/kernels/pallas/ragged_paged_attention.py;
# Mosaic GPU: .../mosaic_paged_attention.py), prepared for two calls of under 10 minutes each on an
# H100/H200. Installs nothing: it runs from a copy of the repository with the GPU machine's own
# Python and JAX (CUDA build; the 2026-12-04 H200 had jax 0.11.2), or ${PYTHON}.
#
#   STEPS="env tests engine" bash benchmarks/gpu_check.sh        (call 1, limits add up to 560 s)
#   STEPS="bench throughput" bash benchmarks/gpu_check.sh        (call 2, limits add up to 560 s)
#   STEPS="llama cmdbuf" bash benchmarks/gpu_check.sh            (optional call 3, 330 s)
#
# The limits follow the first H200 run (benchmarks/results/gpu/2026-12-04-h200: a float32
# SmolLM2 engine check alone outran 110 s, a 2-layer Llama-3-8B engine was killed while
# compiling at 60 s), so the engine checks run bfloat16, the GPU default.
#
# Steps, each under its own time limit, all output flat in ${OUT:-benchmarks/results/gpu/$(date +%F)}:
#   env         nvidia-smi, jax version and devices, compute capability; a warning when the JAX
#               here is not the version pyproject.toml pins (the Mosaic GPU API moves) -> env.txt
#   tests       both kernels' tests compiled (JAXINFER_PALLAS_COMPILED=1), the Mosaic matrix of
#               the slow set included                                           -> tests.log
#   bench       kernel benchmark: Triton and Mosaic GPU against the jnp reference, decode batch
#               1/16/64/256 x context 512/2K/8K (Llama-3-8B layout) and mixed steps; achieved
#               bandwidth against the device's peak HBM bandwidth    -> bench.log, kernels_*.json
#   engine      the engine with each GPU backend against the XLA backend on random SmolLM2-shaped
#               weights in bfloat16 (tokens, and logits up to the first near-tie split)
#                                                                   -> engine.log, backend_check.json
#   llama       the same on a 2-layer Llama-3-8B layout in bfloat16, with a decode-throughput probe
#               per backend (64 sequences)                         -> backend_check_llama3-8b-2l.json
#   cmdbuf      the llama step again with XLA_FLAGS capturing custom calls in command buffers
#               (CUDA graphs): its decode probe against llama's says whether the flag pays
#                                                            -> backend_check_llama3-8b-2l-cmdbuf.json
#   throughput  engine throughput, Llama-3-8B layout (32 layers, random bf16 weights), 64 prompts of
#               128 tokens, 128 out, continuous batching, each GPU backend  -> engine_throughput.json
# and summary.txt (exit code and seconds of each step). Only the steps in STEPS run.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-benchmarks/results/gpu/$(date +%F)}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SUMMARY="$OUT_DIR/summary.txt"
touch "$SUMMARY"
STEPS=" ${STEPS:-env tests engine} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
CMDBUF_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"

step() {  # step NAME LIMIT_SECONDS LOG COMMAND...
  local name=$1 limit=$2 log=$3; shift 3
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start))s" | tee -a "$SUMMARY"
  tail -n 25 "$log"
}

if want env; then
  {
    date -u +%FT%TZ
    nvidia-smi || echo "nvidia-smi failed"
    "$PY" - <<'EOF'
import re, sys, pathlib
import jax
print(sys.version)
print("jax", jax.__version__)
print(jax.devices())
d = jax.devices()[0]
print("device_kind", d.device_kind, "compute_capability", getattr(d, "compute_capability", None))
pin = re.search(r'"jax==([0-9.]+)"', pathlib.Path("pyproject.toml").read_text()).group(1)
if jax.__version__ != pin:
    print(f"WARNING: jax {jax.__version__} here, pyproject pins {pin}: the Mosaic GPU kernel is "
          "written against the pinned API (README: Moving the JAX pin)")
EOF
  } >"$OUT_DIR/env.txt" 2>&1
  cat "$OUT_DIR/env.txt"
fi

want tests && step "kernel tests, compiled (Triton and Mosaic GPU)" 330 "$OUT_DIR/tests.log" \
  env JAXINFER_PALLAS_COMPILED=1 "$PY" -m pytest -p no:cacheprovider -q -rA --durations=10 \
  -m "slow or not slow" tests/test_pallas_kernels.py tests/test_mosaic_kernels.py \
  --deselect tests/test_pallas_kernels.py::test_jax_is_pinned_to_the_version_under_test

want bench && step "kernel benchmark" 300 "$OUT_DIR/bench.log" \
  "$PY" benchmarks/kernel_bench.py --out "$OUT_DIR"

want engine && step "engine check, triton and mosaic vs xla (SmolLM2 layout, bf16)" 220 "$OUT_DIR/engine.log" \
  "$PY" benchmarks/backend_check.py --dtypes bfloat16 --backends pallas,mosaic --decode-batch 0 --out "$OUT_DIR"

want llama && step "engine check, Llama-3-8B layout (2 layers, bf16)" 180 "$OUT_DIR/engine.log" \
  "$PY" benchmarks/backend_check.py --config configs/llama-3-8b.json --layers 2 \
  --dtypes bfloat16 --backends pallas,mosaic --decode-batch 64 --tag llama3-8b-2l --out "$OUT_DIR"

want cmdbuf && step "engine check, Llama-3-8B layout, custom calls in command buffers" 150 \
  "$OUT_DIR/engine.log" env XLA_FLAGS="${XLA_FLAGS:-} $CMDBUF_FLAGS" \
  "$PY" benchmarks/backend_check.py --config configs/llama-3-8b.json --layers 2 \
  --dtypes bfloat16 --backends pallas,mosaic --decode-batch 64 --tag llama3-8b-2l-cmdbuf --out "$OUT_DIR"

want throughput && step "engine throughput, Llama-3-8B layout (32 layers, bf16)" 260 \
  "$OUT_DIR/throughput.log" "$PY" benchmarks/engine_throughput.py \
  --config configs/llama-3-8b.json --batch 64 --input 128 --output 128 \
  --schedulers continuous --backends pallas,mosaic --out "$OUT_DIR"

echo "=== summary ($OUT_DIR)"
cat "$SUMMARY"
