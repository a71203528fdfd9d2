"""Build of vga-linear.

With a CUDA build of torch >= 2.10 and a usable CUDA toolkit (>= 12.0, the major version
torch was built with), compiles the CUDA extension `vga_linear._C` against torch's stable
ABI and the limited Python API (abi3, Python >= 3.10), so one wheel serves every such
torch and Python. Otherwise it prints one line saying why and installs the pure-Python
package, which runs the PyTorch reference. Knobs (environment variables, none needed):

  VGA_LINEAR_FORCE_CPU=1     build no extension
  VGA_LINEAR_REQUIRE_CUDA=1  fail instead of falling back when the extension can't be built
  CUDA_HOME (or CUDA_PATH)   the CUDA toolkit; default: the toolkit of `nvcc` on PATH (wrappers
                             resolved), then /usr/local/cuda, then the newest /usr/local/cuda-*
  MAX_JOBS                   parallel compile jobs (torch.utils.cpp_extension; default: all cores)
"""

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
TORCH_TARGET_VERSION = "0x020a000000000000"  # torch 2.10: the oldest torch the .so loads on
MIN_TORCH = (2, 10)
# sm_90a machine code for the Hopper kernels (wgmma, TMA), plus compute_80 PTX so the
# non-Hopper families still JIT-compile and run on any other GPU of compute capability >= 8.0.
GENCODE = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=compute_80",
]
BUILT_ARCHS = ["sm_90a", "compute_80"]
MIN_CUDA = (12, 0)  # the first toolkit with sm_90a (wgmma)


def _version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _nvcc_toolkit(nvcc):
    """The toolkit an `nvcc` on PATH belongs to; wrapper scripts (exec .../cuda-13.0/bin/nvcc)
    are followed by asking nvcc itself (`--dryrun` prints its TOP)."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
        m = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.MULTILINE)
        if m:
            return os.path.realpath(m.group(1).strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def _toolkit_version(home):
    """(major, minor) of the toolkit at home, or None when it has no usable nvcc."""
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _toolkit_problem(home, torch_cuda):
    """None when `home` is a CUDA toolkit this build can use, else what is wrong with it."""
    if not os.path.isdir(home):
        return "no such directory"
    version = _toolkit_version(home)
    if version is None:
        return "no working bin/nvcc"
    if not os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
        return "no include/cuda_runtime.h"
    libdirs = ["lib64", "lib", *glob.glob(os.path.join(home, "targets", "*", "lib"))]
    if not any(glob.glob(os.path.join(home, d, "libcudart.so*")) for d in libdirs):
        return "no libcudart.so in lib64/ or lib/"
    if version < MIN_CUDA:
        return f"CUDA {version[0]}.{version[1]} is older than 12.0 (no sm_90a)"
    if version[0] != _version_tuple(torch_cuda)[0]:
        return (f"CUDA {version[0]}.{version[1]}, but torch was built with CUDA {torch_cuda} "
                "(the major versions must match)")
    return None


def find_cuda_toolkit(torch_cuda):
    """(path, None) for the toolkit to build with, or (None, why none can be used)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):  # an explicit choice is taken or refused, never second-guessed
            why = _toolkit_problem(os.environ[var], torch_cuda)
            return (os.environ[var], None) if why is None else (None, f"{var}={os.environ[var]}: {why}")
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append((f"nvcc on PATH ({nvcc})", _nvcc_toolkit(nvcc)))
    versioned = sorted(glob.glob("/usr/local/cuda-*"), key=lambda p: _version_tuple(p) or (0,), reverse=True)
    candidates += [(p, p) for p in ["/usr/local/cuda", *versioned, "/opt/cuda"]]
    problems, seen = [], set()
    for source, home in candidates:
        real = os.path.realpath(home)
        if real in seen:
            continue
        seen.add(real)
        why = _toolkit_problem(home, torch_cuda)
        if why is None:
            return home, None
        if os.path.exists(home) or source.startswith("nvcc"):
            problems.append(f"{source}: {why}")
    return None, "no usable CUDA toolkit" + (f" ({'; '.join(problems)})" if problems else " (no nvcc on PATH, no /usr/local/cuda)")


def why_no_cuda_build():
    """None when the CUDA extension can be built here (CUDA_HOME then names the toolkit), else why not."""
    if os.environ.get("VGA_LINEAR_FORCE_CPU") == "1":
        return "VGA_LINEAR_FORCE_CPU=1"
    try:
        import torch
    except ImportError:
        return "torch is not installed in the build environment"
    if _version_tuple(torch.__version__) < MIN_TORCH:
        return f"torch {torch.__version__} is older than 2.10 (no stable ABI to build against)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    home, why = find_cuda_toolkit(torch.version.cuda)
    if home is None:
        return why
    # torch.utils.cpp_extension reads CUDA_HOME once, when it is first imported.
    os.environ["CUDA_HOME"] = home
    if "torch.utils.cpp_extension" in sys.modules:
        sys.modules["torch.utils.cpp_extension"].CUDA_HOME = home
    return None


def build_inputs_hash():
    """A hash of everything the build reads from the tree; tools/dev.py computes the same to
    tell whether an in-place build is current (same recipe there)."""
    h = hashlib.sha256()
    for p in sorted([*(ROOT / "csrc").rglob("*"), ROOT / "setup.py", ROOT / "pyproject.toml"]):
        if p.is_file():
            h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def kernel_families():
    """The family names of csrc's dispatch table (kFamilies), in preference order."""
    text = (ROOT / "csrc" / "gather_concat_linear.cu").read_text()
    table = re.search(r"kFamilies\[\]\s*=\s*\{(.*?)\};", text, re.DOTALL)
    return re.findall(r'\{\s*"(\w+)"', table.group(1)) if table else []


def write_build_info(built, reason, cuda_home=None):
    """vga_linear/_build_info.py: what `python -m vga_linear.info` reports about the build."""
    lines = [
        "# Generated by setup.py; describes the build of vga_linear._C.",
        f"EXTENSION_BUILT = {built!r}",
        f"NOT_BUILT_REASON = {reason!r}",
        f"BUILD_INPUTS = {build_inputs_hash()!r}",
    ]
    if built:
        import torch

        lines += [
            f"BUILT_AGAINST_TORCH = {torch.__version__!r}",
            f"BUILT_WITH_CUDA = {torch.version.cuda!r}",
            f"CUDA_TOOLKIT = {'%s (CUDA %d.%d)' % (cuda_home, *_toolkit_version(cuda_home))!r}",
            f"CUDA_ARCHS = {BUILT_ARCHS!r}",
            f"TORCH_TARGET_VERSION = {TORCH_TARGET_VERSION!r}",
            f"KERNEL_FAMILIES = {tuple(kernel_families())!r}",
        ]
    else:
        lines += ["BUILT_AGAINST_TORCH = None", "BUILT_WITH_CUDA = None", "CUDA_TOOLKIT = None",
                  "CUDA_ARCHS = []", "TORCH_TARGET_VERSION = None", "KERNEL_FAMILIES = ()"]
    (ROOT / "vga_linear" / "_build_info.py").write_text("\n".join(lines) + "\n")


def extensions():
    reason = why_no_cuda_build()
    if reason is not None:
        if os.environ.get("VGA_LINEAR_REQUIRE_CUDA") == "1":
            sys.exit(f"vga-linear: VGA_LINEAR_REQUIRE_CUDA=1 but the CUDA extension can't be built: {reason}")
        print(f"vga-linear: no CUDA kernels, building the pure-Python package: {reason}", file=sys.stderr)
        write_build_info(False, reason)
        return [], {}

    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    cuda_home = os.environ["CUDA_HOME"]
    print(f"vga-linear: building the CUDA kernels with {cuda_home}", file=sys.stderr)
    # py_limited_api=True makes torch define Py_LIMITED_API (3.10); USE_CUDA exposes the
    # CUDA part of the stable C shim (the current stream).
    defines = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}", "-DUSE_CUDA"]
    extension = CUDAExtension(
        name="vga_linear._C",
        sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.c*")),
        include_dirs=[str(ROOT / "csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17", *defines],
            "nvcc": ["-O3", "-std=c++17", "-lineinfo", *GENCODE, *defines],
        },
        py_limited_api=True,
    )
    write_build_info(True, None, cuda_home)
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = extensions()

setup(
    packages=find_packages(include=["vga_linear", "vga_linear.*"]),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if ext_modules else {},
)
