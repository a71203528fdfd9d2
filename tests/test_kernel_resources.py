"""The built extension's kernels as compiled, read from its sm_90a code with cuobjdump (no GPU needed):
the registers and stack that the launch plans count on.

sm90_skinny's ring is sized so that two CTAs share an SM (csrc/kernels/sm90_skinny.cuh), and its split
plan asks the runtime how many clusters fit at once. A change that pushes its registers past two CTAs'
share halves the resident clusters and so changes the plan's split without a word: benchmarks/NOTES.md
run 145 (96 -> 102 registers in the 64-row kernels; decode calls 1.2-1.4x slower on the 4096-wide layers,
read at first as the effect of the change itself)."""

import importlib.util
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SM90_SKINNY_THREADS = 288  # sm90_skinny::kThreads: two consumer warpgroups and the producer warp


def _cuobjdump():
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"
    return shutil.which("cuobjdump") or (str(toolkit) if toolkit.exists() else None)


def _sm90a_resources():
    """{kernel's mangled name: (registers, stack bytes)} of the extension's sm_90a code."""
    extension = importlib.util.find_spec("vga_linear._C")  # (where vga_linear itself finds it)
    if extension is None:
        pytest.skip("the CUDA extension is not built (python3 tools/dev.py setup builds it)")
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (triton's bundled one, or the CUDA toolkit's)")
    dump = subprocess.run([tool, "--dump-resource-usage", extension.origin], capture_output=True, text=True,
                          timeout=120, check=True).stdout
    resources, arch, function = {}, None, None
    for line in dump.splitlines():
        if m := re.match(r"\s*arch = (\S+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+):", line):
            function = m.group(1)
        elif function and (m := re.search(r"REG:(\d+) STACK:(\d+)", line)):
            if arch == "sm_90a":
                resources[function] = (int(m.group(1)), int(m.group(2)))
            function = None
    return resources


def _ctas_per_sm_by_registers(registers, threads):
    """CTAs an sm_90 SM holds as far as registers go, as cuda_occupancy.h counts them: 64 K registers
    in four quarters, allocated to whole warps in units of 256, a warp living in one quarter."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    warps_an_sm = (65536 // 4 // per_warp) * 4
    return warps_an_sm // math.ceil(threads / 32)


def test_register_count_of_ctas_matches_cuda_occupancy():
    # cudaOccMaxActiveBlocksPerMultiprocessor (CUDA 13.0's cuda_occupancy.h, sm_90, 288 threads)
    # gives 3 CTAs at 62 registers, 2 at 96 and 1 at 102 or 104 (no shared memory): the quarters,
    # not 65536 / (288 x registers), decide.
    assert [_ctas_per_sm_by_registers(r, SM90_SKINNY_THREADS) for r in (62, 96, 102, 104)] == [3, 2, 1, 1]


def test_sm90_skinny_kernels_fit_two_ctas_an_sm_and_do_not_spill():
    kernels = {name: use for name, use in _sm90a_resources().items()
               if "sm90_skinny" in name and "skinny_stream_kernel" in name}
    assert kernels, "no sm90_skinny kernel found in the extension's sm_90a code"
    for name, (registers, stack) in kernels.items():
        assert stack == 0, f"{name} spills: {stack} bytes of stack"
        assert _ctas_per_sm_by_registers(registers, SM90_SKINNY_THREADS) >= 2, (
            f"{name}: {registers} registers fit one CTA an SM, not the two its ring and split plan are sized for")
