#!/usr/bin/env bash
# On the GPU machine (no network, torch preinstalled): check what a user gets there from
#   wheel  - the release wheel, installed into a fresh venv beside the preinstalled torch, and
#            the test suite run against that installed package (not a source tree: the tests
#            run from a copy of the repo without vga_linear/);
#   test   - README's second command, `python3 tools/dev.py test`, in a fresh clone;
#   bench  - README's first command, `python3 tools/dev.py bench`, in the same clone.
# The clone and the wheel are made on the CPU machine (kernels are never compiled here):
# tools/make_h200_carry.sh puts them in .dev/h200/ (ignored; carry it). The clone carries the
# in-place build its own first command made there, so `dev.py` finds it current and builds nothing.
#
#   bash tools/h200_wheel_check.sh wheel|test|bench [CARRY_DIR]   # default CARRY_DIR: .dev/h200
#
# Logs and a one-line-per-step summary go to $OUT/<mode>/ (or /tmp/h200-check/<mode>/).
set -uo pipefail
mode=${1:?usage: h200_wheel_check.sh wheel|test|bench [CARRY_DIR]}
carry=$(cd "${2:-.dev/h200}" && pwd)
out="${OUT:-/tmp/h200-check}/$mode"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
# shellcheck source=tools/steps.sh
. "$(dirname "$0")/steps.sh"  # note, step

note "host $(hostname), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
note "python3 $(python3 -c 'import sys; print(sys.version.split()[0])'), torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
rc=0
case "$mode" in
  wheel)
    whl=$(find "$carry/wheel" -name "vga_linear-*.whl" | head -1)
    note "wheel $(basename "$whl") ($(stat -c %s "$whl") bytes)"
    venv=/tmp/vga-wheel-venv
    rm -rf "$venv" /tmp/vga-wheel-tests
    python3 -m venv "$venv"
    # python3 there is itself a venv holding torch: --system-site-packages would reach the base
    # interpreter's packages, not that venv's. A .pth puts python3's site-packages folders behind the
    # fresh venv's, so the wheel installs beside the preinstalled torch without reinstalling it.
    python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
      >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/preinstalled_torch.pth"
    step install "$venv/bin/python" -m pip install --no-deps --no-index "$whl" || rc=1
    # The repo without its package: tests, benchmarks, csrc (read by one test), pyproject (pytest config).
    mkdir -p /tmp/vga-wheel-tests
    (cd "$carry/clone" && cp -r tests benchmarks csrc tools pyproject.toml /tmp/vga-wheel-tests/)
    cd /tmp/vga-wheel-tests || exit 1
    step info "$venv/bin/python" -m vga_linear.info || rc=1
    step where "$venv/bin/python" -c "import vga_linear, sys; print(vga_linear.__file__); \
sys.exit(0 if vga_linear.__file__.startswith('$venv') and vga_linear.kernels_loaded() else 'not the wheel, or no kernels: ' + str(vga_linear.kernels_not_loaded_reason()))" || rc=1
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
    step pytest timeout 540 "$venv/bin/python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} || rc=1
    ;;
  test | bench)
    cd "$carry/clone" || exit 1
    rm -rf .venv  # fresh: the venv is made here, beside the preinstalled torch
    step "dev_$mode" timeout 560 python3 tools/dev.py "$mode" || rc=1
    grep -E "^\[dev\]" "$out/dev_$mode.log" | head -12 | sed 's/^/    /' | tee -a "$summary"
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
note "overall: exit $rc"
exit $rc
