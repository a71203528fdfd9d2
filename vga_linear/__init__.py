"""vga-linear: ``F.linear(torch.cat(x.unbind(0), -1), weight, bias)`` as one fused op.

``torch.ops.vga.gather_concat_linear(x, weight, bias)`` takes x of shape (R, *batch, H)
(R shards: tensor-parallel ranks, attention heads) and never materialises the
concatenation. Importing this package registers the op: CUDA kernels from the
compiled extension ``vga_linear._C`` when it loads, the PyTorch reference otherwise.
"""

import importlib.util
import os
import warnings

import torch  # loads libtorch, which vga_linear._C links against

__version__ = "0.1.0"
_HERE = os.path.dirname(os.path.realpath(__file__))


def _installed_copy_elsewhere():
    """Where an installed vga-linear lives when it is not this directory (a source tree on
    sys.path, e.g. the repo root as the current directory, shadows it), else None."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = distribution("vga-linear").locate_file("vga_linear/__init__.py")
    except (ImportError, PackageNotFoundError):
        return None
    installed = os.path.dirname(os.path.realpath(installed))
    if os.path.isfile(os.path.join(installed, "__init__.py")) and installed != _HERE:
        return installed
    return None


def _warn(message):
    warnings.warn(
        f"vga_linear: {message}. gather_concat_linear runs the PyTorch reference instead.",
        RuntimeWarning,
        stacklevel=3,
    )


def _load_extension():
    """Import the compiled kernels; when they can't be used, return why (warning once where
    that is a surprise: the kernels should be there, or a GPU is visible)."""
    if os.environ.get("VGA_LINEAR_FORCE_CPU") == "1":
        return "VGA_LINEAR_FORCE_CPU=1"
    try:
        from . import _build_info
    except ImportError:
        _build_info = None
    if _build_info is not None and not _build_info.EXTENSION_BUILT:
        reason = f"the package was built without CUDA kernels ({_build_info.NOT_BUILT_REASON})"
        if torch.cuda.is_available():
            _warn(f"{reason}, but a CUDA GPU is visible; rebuild where nvcc and a CUDA torch are present")
        return reason
    if importlib.util.find_spec(__name__ + "._C") is None:
        elsewhere = _installed_copy_elsewhere()
        if elsewhere is not None:
            reason = (f"{_HERE} has no compiled _C: this source tree shadows the installed vga-linear "
                      f"in {elsewhere} (run from another directory, or install in place: "
                      "pip install --no-build-isolation -e .)")
        elif _build_info is None:
            reason = (f"{_HERE} has no compiled _C: a source tree that was never built "
                      "(pip install --no-build-isolation -e . builds it in place)")
        else:
            reason = f"{_HERE} has no compiled _C although the build made one (deleted since?)"
        _warn(f"the CUDA kernels are not available: {reason}")
        return reason
    try:
        from . import _C  # noqa: F401  (loading the library registers the kernels)
    except Exception as exc:  # an OSError from a missing libcudart, an undefined symbol, ...
        built_for = "an unknown build"
        if _build_info is not None:
            built_for = (
                f"torch >= 2.10 (built against {_build_info.BUILT_AGAINST_TORCH}), "
                f"CUDA {_build_info.BUILT_WITH_CUDA}, archs {', '.join(_build_info.CUDA_ARCHS)}"
            )
        reason = f"{type(exc).__name__}: {exc}"
        _warn(f"the CUDA kernels failed to load ({reason}); they were built for {built_for}")
        return reason
    return None


_EXTENSION_NOT_LOADED_REASON = _load_extension()


def kernels_loaded() -> bool:
    """True when the compiled CUDA kernels are registered (CUDA inputs then run fused)."""
    return _EXTENSION_NOT_LOADED_REASON is None


def kernels_not_loaded_reason() -> str | None:
    """Why the CUDA kernels are not in use, or None when they are."""
    return _EXTENSION_NOT_LOADED_REASON


from . import ops, reference  # noqa: E402  (ops registers on top of what _C defined)
from .module import VGALinear  # noqa: E402
from .ops import gather_concat_linear  # noqa: E402


def __getattr__(name):
    # Imported only by those who use them: torch.distributed (distributed) and
    # torch._inductor (compile, the opt-in torch.compile rewrite).
    if name in ("compile", "distributed"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'vga_linear' has no attribute {name!r}")


__all__ = [
    "VGALinear",
    "__version__",
    "gather_concat_linear",
    "kernels_loaded",
    "kernels_not_loaded_reason",
    "ops",
    "reference",
]
