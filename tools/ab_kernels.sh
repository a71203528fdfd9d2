#!/usr/bin/env bash
# Two or more builds of the kernels timed against each other in one GPU call (benchmarks/NOTES.md,
# "Method": graph_calls.py per build, the builds alternated, read with benchmarks/ab_compare.py).
#
# On the CPU machine (CUDA_HOME set; each ref is built in a temporary worktree, ~2 min on 2 cores):
#   bash tools/ab_kernels.sh build NAME=REF [NAME=REF ...]      # -> .dev/abx/NAME.so.xz (ignored: carry .dev/abx)
# On the GPU machine (the checkout's own build is put back afterwards):
#   bash tools/ab_kernels.sh time --layers '32,128,4096;16,80,1280' --rows 64,100,333 \
#        [--kinds fwd,gx] [--config sm90_gemm] [--rounds 2] NAME [NAME ...]
# `time` runs graph_calls.py once a build a round, NAME in the order given, appending to
# $OUT/ab.txt (or /tmp/ab-kernels/ab.txt) with a `== NAME` line before each run, then prints
# ab_compare.py's reading of it. NAME:CONFIG runs that build with --config CONFIG (a forced family or
# core configuration), so one call compares configurations as well as builds:
#   bash tools/ab_kernels.sh time --layers '32,128,4096' --rows 333 new:sm90_gemm/n96 new:sm90_gemm/n112
# graph_calls.py's options pass through (each with its value): `--timing flushed` times each call with the
# L2 flushed, as bench.py does, which a change of the plan rule needs besides the back-to-back default.
# AB_TIMEOUT=seconds bounds each graph_calls.py run (a build that hangs costs that, not the whole call).
set -euo pipefail
cd "$(dirname "$0")/.."
store=.dev/abx
mode=${1:?usage: ab_kernels.sh build NAME=REF ... | time [graph_calls args] [--rounds N] NAME ...}
shift

case "$mode" in
  build)
    mkdir -p "$store"
    python=$(python3 tools/dev.py which)
    for spec in "$@"; do
      name=${spec%%=*} ref=${spec#*=}
      tree=$(mktemp -d /tmp/ab-build.XXXXXX)
      git worktree add -q --detach "$tree" "$ref"
      (cd "$tree" && CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} "$python" setup.py -q build_ext --inplace >build.log 2>&1) ||
        { tail -n 30 "$tree/build.log"; git worktree remove --force "$tree"; exit 1; }
      xz -T2 -c "$tree"/vga_linear/_C*.so >"$store/$name.so.xz"
      echo "$name = $(git rev-parse --short "$ref"): $(du -h "$store/$name.so.xz" | cut -f1)"
      git worktree remove --force "$tree"
    done ;;
  time)
    args=() names=() rounds=2
    while [ $# -gt 0 ]; do
      case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --*) args+=("$1" "$2"); shift 2 ;;
        *) names+=("$1"); shift ;;
      esac
    done
    [ ${#names[@]} -ge 2 ] || { echo "ab_kernels.sh time: name two or more builds" >&2; exit 2; }
    out=${OUT:-/tmp/ab-kernels}
    mkdir -p "$out"
    so=$(ls vga_linear/_C*.so)
    own=$(mktemp /tmp/ab-own.XXXXXX)
    cp "$so" "$own"
    trap 'cp "$own" "$so"; rm -f "$own"' EXIT
    export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
    for ((round = 0; round < rounds; ++round)); do
      for name in "${names[@]}"; do
        build=${name%%:*} config=()
        [ "$build" = "$name" ] || config=(--config "${name#*:}")
        xz -dc "$store/$build.so.xz" >"$so"
        echo "== $name" >>"$out/ab.txt"
        timeout "${AB_TIMEOUT:-0}" "${PYTHON:-python3}" benchmarks/graph_calls.py "${args[@]}" "${config[@]}" \
          >>"$out/ab.txt" 2>&1 || echo "(graph_calls.py exit $?)" >>"$out/ab.txt"
      done
    done
    "${PYTHON:-python3}" benchmarks/ab_compare.py "$out/ab.txt" ;;
  *) echo "ab_kernels.sh: unknown mode $mode (build or time)" >&2; exit 2 ;;
esac
