#!/usr/bin/env bash
# The kernel checklist on a GPU machine, in one command: what a csrc change needs before it is
# called done (CUDA tests, compute-sanitizer on the GEMM-core configurations, the bench suites and
# sweeps whose ratios are the performance claims). It runs the kernels already built in the
# checkout (vga_linear/_C*.so, built on a CPU machine with CUDA_HOME set) and compiles nothing.
#
#   bash tools/gpu_checklist.sh [--h200-only] [STEP ...]      # default: every step, in this order
#
# Steps (each its own time limit, its log one file; a step's failure does not stop the next):
#   tests     pytest -m cuda over every test file but the compile rewrite's          (limit 400 s)
#   compile   pytest -m cuda tests/test_compile_rewrite.py (Inductor compiles: slow)   (limit 300 s)
#   sanitize  memcheck over the core's configuration kinds and tf32x3, racecheck --quick (limit 300 s)
#   suites    bench.py default and backward suites, eager, no compile                  (limit 300 s)
#   sweeps    bench.py --suite sweep (forward, JSON and plot) and --backward            (limit 400 s)
# A step's limit can be changed with LIMIT_<STEP>=seconds (LIMIT_TESTS=200). --h200-only exits 3 at
# once on another GPU: performance claims are the H200's (an H100 still runs the correctness steps);
# without a GPU it exits 4.
#
# PYTHON names the interpreter (default python3, the GPU machine's, which has torch).
# Logs go to $OUT (or /tmp/gpu-checklist): summary.txt (the GPU, each step's exit code, time and last
# lines) and <step>.log (tools/steps.sh), plus sweep.json and sweep.png: eight files at most.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-checklist}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
py=${PYTHON:-python3}
# shellcheck source=tools/steps.sh
. tools/steps.sh  # note, step

h200_only=0
steps=()
for arg in "$@"; do
  case "$arg" in
    --h200-only) h200_only=1 ;;
    tests | compile | sanitize | suites | sweeps) steps+=("$arg") ;;
    *) echo "gpu_checklist.sh: unknown argument $arg (steps: tests compile sanitize suites sweeps)" >&2; exit 2 ;;
  esac
done
[ ${#steps[@]} -gt 0 ] || steps=(tests compile sanitize suites sweeps)

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
note "gpu: ${gpu:-none}; host $(hostname); $(date -u +%FT%TZ)"
note "$("$py" -c '
import sys, torch, vga_linear
try:
    from vga_linear._build_info import BUILD_INPUTS
except ImportError:
    BUILD_INPUTS = "-"
print("python", sys.version.split()[0], "torch", torch.__version__, "kernels loaded:", vga_linear.kernels_loaded(),
      vga_linear.kernels_not_loaded_reason() or "", "build inputs", BUILD_INPUTS[:12])' 2>&1)"
if [ -z "$gpu" ]; then  # (every CUDA test would skip and pass)
  note "no GPU: nothing run"
  exit 4
fi
if [ "$h200_only" = 1 ] && [[ "$gpu" != *H200* ]]; then
  note "not an H200 (--h200-only): nothing run"
  exit 3
fi

overall=0
run_step() {  # run_step NAME DEFAULT_LIMIT CMD...: step NAME under its limit (LIMIT_<NAME> overrides it)
  local name=$1 limit_var=LIMIT_${1^^} default=$2
  shift 2
  step "$name" timeout "${!limit_var:-$default}" "$@" || overall=1
}

sanitizer=(compute-sanitizer --error-exitcode 1 --tool)  # + TOOL "$py" tools/sanitizer_workload.py ...

for name in "${steps[@]}"; do
  case "$name" in
    tests)
      run_step tests 400 "$py" -m pytest -q -m cuda tests --ignore tests/test_compile_rewrite.py -p no:cacheprovider ;;
    compile)
      run_step compile 300 "$py" -m pytest -q -m cuda tests/test_compile_rewrite.py -p no:cacheprovider ;;
    sanitize)
      # memcheck: the core's configuration kinds (plain, in-cluster split, grid split, copies along
      # the concatenation, the swapped forward at 176 and at its narrowest, 96 tokens, the forward's
      # 64-row tiles, unsplit and split across the grid and in the cluster by 4 and 8) and tf32x3;
      # racecheck (~100x slower): one of each synchronisation pattern.
      run_step sanitize 300 "${sanitizer[@]}" memcheck "$py" tools/sanitizer_workload.py sm90_gemm \
        sm90_gemm/n128/span sm90_gemm/n64/c4/span sm90_gemm/n256/s2/span sm90_gemm/n176 sm90_gemm/n96 \
        sm90_gemm/m64 sm90_gemm/n64/s3/m64 sm90_gemm/n64/c4/m64 sm90_gemm/n64/c8/m64 sm90_tf32x3
      run_step sanitize 300 "${sanitizer[@]}" racecheck "$py" tools/sanitizer_workload.py --quick \
        sm90_gemm/n64/s1 sm90_gemm/n128/c2 sm90_gemm/n128/span sm90_gemm/m64 sm90_gemm/n64/c2/m64 sm90_tf32x3 ;;
    suites)
      run_step suites 300 "$py" benchmarks/bench.py --no-compile
      run_step suites 300 "$py" benchmarks/bench.py --suite backward --no-compile ;;
    sweeps)
      run_step sweeps 400 "$py" benchmarks/bench.py --suite sweep --json "$out/sweep.json" --plot "$out/sweep.png"
      run_step sweeps 400 "$py" benchmarks/bench.py --suite sweep --backward ;;
  esac
done
note "overall: exit $overall"
exit $overall
