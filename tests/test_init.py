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


def _run(code, cwd=ROOT, **env):
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120,
    )


def test_force_cpu_uses_the_reference_silently():
    result = _run(CHECK_OP_WORKS, VGA_LINEAR_FORCE_CPU="1")
    assert result.returncode == 0, result.stderr
    assert "reference: VGA_LINEAR_FORCE_CPU=1" in result.stdout
    assert "RuntimeWarning" not in result.stderr


# A finder that hands out a vga_linear._C whose loading fails as a .so without its libcudart would.
BROKEN_EXTENSION = """
import importlib.abc, importlib.machinery, sys
class _Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == "vga_linear._C" else None
    def create_module(self, spec):
        raise OSError("libcudart.so.13: cannot open shared object file: No such file or directory")
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Broken())
"""


def test_a_broken_extension_warns_once_and_falls_back():
    result = _run(BROKEN_EXTENSION + CHECK_OP_WORKS)
    assert result.returncode == 0, result.stderr
    assert "reference: OSError: libcudart.so.13: cannot open" in result.stdout
    assert result.stderr.count("the CUDA kernels failed to load") == 1, result.stderr
    if (ROOT / "vga_linear" / "_build_info.py").exists():
        assert "they were built for" in result.stderr


def _package_copy(tmp_path, with_build=False):
    """A copy of vga_linear/ without the compiled _C (and without _build_info unless asked)."""
    import shutil

    import vga_linear  # the package under test: the repo's, or an installed wheel's

    dest = tmp_path / "src"
    shutil.copytree(Path(vga_linear.__file__).parent, dest / "vga_linear",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__", *([] if with_build else ["_build_info.py"])))
    return dest


# An editable install maps vga_linear to the repo through a finder on sys.meta_path, ahead of
# PYTHONPATH; drop it so that the copy on PYTHONPATH is the one imported.
WITHOUT_EDITABLE_FINDER = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in (getattr(f, "__module__", "") + repr(f)).lower()]
"""


def test_an_unbuilt_source_tree_says_so_not_circular_import(tmp_path):
    src = _package_copy(tmp_path)
    result = _run(WITHOUT_EDITABLE_FINDER + CHECK_OP_WORKS, cwd=tmp_path, PYTHONPATH=str(src))
    assert result.returncode == 0, result.stderr
    # Where a vga-linear is also installed (a wheel under test), the copy shadows it: said so instead.
    assert ("a source tree that was never built" in result.stdout
            or "this source tree shadows the installed vga-linear" in result.stdout), result.stdout
    assert "circular import" not in result.stdout + result.stderr
    assert result.stderr.count("the CUDA kernels are not available") == 1, result.stderr


def test_a_source_tree_shadowing_the_installed_package_names_both(tmp_path):
    # An "installed" vga-linear (dist-info + package) in site/, the source tree first on the path.
    src = _package_copy(tmp_path)
    site = tmp_path / "site"
    (site / "vga_linear").mkdir(parents=True)
    (site / "vga_linear" / "__init__.py").write_text("")
    info = site / "vga_linear-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vga-linear\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("vga_linear/__init__.py,,\n")
    result = _run(WITHOUT_EDITABLE_FINDER + CHECK_OP_WORKS, cwd=tmp_path, PYTHONPATH=f"{src}{os.pathsep}{site}")
    assert result.returncode == 0, result.stderr
    assert "this source tree shadows the installed vga-linear in" in result.stdout
    assert str(site / "vga_linear") in result.stdout


def test_info_reports_the_build():
    result = _run("import runpy; runpy.run_module('vga_linear.info', run_name='__main__')")
    assert result.returncode == 0, result.stderr
    for field in ("vga-linear", "torch", "CUDA kernels", "kernel families", "GPU"):
        assert field in result.stdout


def _dispatch_table_families():
    import re

    text = (ROOT / "csrc" / "gather_concat_linear.cu").read_text()
    table = re.search(r"kFamilies\[\]\s*=\s*\{(.*?)\};", text, re.DOTALL).group(1)
    return tuple(re.findall(r'\{\s*"(\w+)"', table))


def test_info_names_the_families_a_gpu_can_run():
    from vga_linear.info import runnable_families

    families = _dispatch_table_families()
    archs = ["sm_90a", "compute_80"]
    assert runnable_families(families, (9, 0), archs) == list(families)
    on_ampere = runnable_families(families, (8, 0), archs)
    assert on_ampere and not any(f.startswith("sm90_") for f in on_ampere) and "generic" in on_ampere
    assert runnable_families(families, (7, 5), archs) == []


def test_kernel_families_come_from_the_build():
    # One source of truth: csrc's kFamilies table, recorded by setup.py in _build_info.py, which
    # vga_linear.ops.KERNEL_FAMILIES reads; a package without kernels lists none.
    import vga_linear
    from vga_linear import ops

    # a build lists csrc's table whether or not its library loads; a package without kernels, none
    assert ops.KERNEL_FAMILIES in ((), _dispatch_table_families())
    if vga_linear.kernels_loaded():
        assert ops.KERNEL_FAMILIES == _dispatch_table_families()


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI builds the extension and requires it")
def test_ci_build_loaded_the_kernels():
    result = _run("import vga_linear; assert vga_linear.kernels_loaded(), vga_linear.kernels_not_loaded_reason()")
    assert result.returncode == 0, result.stderr


def test_the_cpu_fast_path_answers_and_refuses_as_the_op_does():
    # vga_linear.gather_concat_linear skips the dispatcher for plain CPU tensors (ops.py):
    # it must give the op's results and the op's error messages.
    import torch

    import vga_linear

    x, w, b = torch.randn(3, 4, 5), torch.randn(6, 15), torch.randn(6)
    strided = torch.randn(4, 3, 5).transpose(0, 1)  # (R, B, H) view of a (B, R, H) tensor
    for args in ((x, w, b), (x, w, None), (strided, w, b), (torch.randn(2, 2, 3, 5), torch.randn(6, 10), b),
                 (torch.randn(0, 4, 5), torch.randn(6, 0), b)):
        torch.testing.assert_close(vga_linear.gather_concat_linear(*args),
                                   torch.ops.vga.gather_concat_linear(*args), rtol=0, atol=0)
    bad = [(x[0], w, b), (x, w[:, :10], b), (x, w, b[:1]), (x, w, b[None]), (x.double(), w, b),
           (x, w.double(), b), (x, w, b.half()), (x.int(), w.int(), b.int()), (x.mT.contiguous().mT, w, b),
           (x, w[0], b)]
    for args in bad:
        with pytest.raises(RuntimeError) as op_error:
            torch.ops.vga.gather_concat_linear(*args)
        with pytest.raises(RuntimeError) as fn_error:
            vga_linear.gather_concat_linear(*args)
        assert str(fn_error.value) == str(op_error.value)


LAZY_SUBMODULES = """
import sys
import torch
before = {m for m in ("torch._inductor", "torch.distributed.distributed_c10d") if m in sys.modules}
import vga_linear
assert "vga_linear.compile" not in sys.modules and "vga_linear.distributed" not in sys.modules
assert {m for m in ("torch._inductor", "torch.distributed.distributed_c10d") if m in sys.modules} == before
assert callable(vga_linear.compile.enable) and vga_linear.compile is sys.modules["vga_linear.compile"]
assert callable(vga_linear.distributed.all_gather_linear)
try:
    vga_linear.no_such_thing
except AttributeError as exc:
    assert "no_such_thing" in str(exc)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""


def test_compile_and_distributed_are_lazy_attributes():
    # import vga_linear pulls in neither torch._inductor nor torch.distributed's process groups;
    # vga_linear.compile / vga_linear.distributed import them on first use.
    result = _run(LAZY_SUBMODULES)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
