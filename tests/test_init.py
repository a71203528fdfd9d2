"""Importing never crashes: the extension's absence or failure leaves a working op."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK_OP_WORKS = """
import torch, vga_linear
x = torch.randn(3, 4, 5); w = torch.randn(6, 15); b = torch.randn(6)
ref = vga_linear.reference.gather_concat_linear_reference(x, w, b)
torch.testing.assert_close(torch.ops.vga.gather_concat_linear(x, w, b), ref)
if torch.cuda.is_available():
    torch.testing.assert_close(vga_linear.gather_concat_linear(x.cuda(), w.cuda(), b.cuda()).cpu(), ref,
                               atol=1e-4, rtol=1e-4)
print("loaded" if vga_linear.kernels_loaded() else "reference:", vga_linear.kernels_not_loaded_reason())
"""


def _run(code, **env):
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120,
    )


def test_force_cpu_uses_the_reference_silently():
    result = _run(CHECK_OP_WORKS, VGA_LINEAR_FORCE_CPU="1")
    assert result.returncode == 0, result.stderr
    assert "reference: VGA_LINEAR_FORCE_CPU=1" in result.stdout
    assert "RuntimeWarning" not in result.stderr


def test_a_broken_extension_warns_once_and_falls_back():
    # sys.modules[name] = None makes `from . import _C` raise ImportError, as a bad .so would.
    code = "import sys; sys.modules['vga_linear._C'] = None\n" + CHECK_OP_WORKS
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert "reference: ModuleNotFoundError" in result.stdout
    assert result.stderr.count("the CUDA kernels failed to load") == 1, result.stderr
    if (ROOT / "vga_linear" / "_build_info.py").exists():
        assert "they were built for" in result.stderr


def test_info_reports_the_build():
    result = _run("import runpy; runpy.run_module('vga_linear.info', run_name='__main__')")
    assert result.returncode == 0, result.stderr
    for field in ("vga-linear", "torch", "CUDA kernels", "GPU"):
        assert field in result.stdout


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI builds the extension and requires it")
def test_ci_build_loaded_the_kernels():
    result = _run("import vga_linear; assert vga_linear.kernels_loaded(), vga_linear.kernels_not_loaded_reason()")
    assert result.returncode == 0, result.stderr
