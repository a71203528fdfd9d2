"""vga-linear: ``F.linear(torch.cat(x.unbind(0), -1), weight, bias)`` as one fused op.

``torch.ops.vga.gather_concat_linear(x, weight, bias)`` takes x of shape (R, *batch, H)
(R shards: tensor-parallel ranks, attention heads) and never materialises the
concatenation. Importing this package registers the op: CUDA kernels from the
compiled extension ``vga_linear._C`` when it loads, the PyTorch reference otherwise.
"""

import os
import warnings

import torch  # noqa: F401  (loads libtorch, which vga_linear._C links against)

__version__ = "0.1.0"


def _load_extension():
    """Import the compiled kernels; on any failure warn once and return the reason."""
    if os.environ.get("VGA_LINEAR_FORCE_CPU") == "1":
        return "VGA_LINEAR_FORCE_CPU=1"
    try:
        from . import _build_info
    except ImportError:
        _build_info = None
    if _build_info is not None and not _build_info.EXTENSION_BUILT:
        return f"the package was built without CUDA kernels ({_build_info.NOT_BUILT_REASON})"
    try:
        from . import _C  # noqa: F401  (loading the library registers the kernels)
    except Exception as exc:  # an ImportError, an OSError from a missing libcudart, ...
        built_for = "an unknown build"
        if _build_info is not None:
            built_for = (
                f"torch >= 2.10 (built against {_build_info.BUILT_AGAINST_TORCH}), "
                f"CUDA {_build_info.BUILT_WITH_CUDA}, archs {', '.join(_build_info.CUDA_ARCHS)}"
            )
        reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"vga_linear: the CUDA kernels failed to load ({reason}); they were built for "
            f"{built_for}. gather_concat_linear runs the PyTorch reference instead.",
            RuntimeWarning,
            stacklevel=3,
        )
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
    # torch.distributed is imported only by those who use it.
    if name == "distributed":
        import importlib

        return importlib.import_module(".distributed", __name__)
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
