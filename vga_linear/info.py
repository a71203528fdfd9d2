"""``python -m vga_linear.info``: what is installed, what was built, what runs here."""

import platform
import sys

import torch

import vga_linear


def report() -> str:
    try:
        from vga_linear import _build_info as build
    except ImportError:
        build = None
    lines = [
        f"vga-linear        {vga_linear.__version__} ({vga_linear.__file__})",
        f"python            {platform.python_version()} ({sys.executable})",
        f"torch             {torch.__version__} (CUDA {torch.version.cuda or 'none: CPU build'})",
    ]
    if build is None:
        lines.append("build             unknown (no _build_info: a source tree that was never built)")
    elif build.EXTENSION_BUILT:
        lines += [
            f"built against     torch {build.BUILT_AGAINST_TORCH}, CUDA {build.BUILT_WITH_CUDA} "
            f"(stable ABI target {build.TORCH_TARGET_VERSION}: loads on torch >= 2.10)",
            f"archs compiled in {', '.join(build.CUDA_ARCHS)}",
            f"CUDA toolkit      {getattr(build, 'CUDA_TOOLKIT', None) or 'not recorded'}",
        ]
    else:
        lines.append(f"build             pure Python, no CUDA kernels ({build.NOT_BUILT_REASON})")
    if vga_linear.kernels_loaded():
        lines.append("CUDA kernels      loaded")
    else:
        lines.append(f"CUDA kernels      not loaded: {vga_linear.kernels_not_loaded_reason()}")
        lines.append("                  gather_concat_linear runs the PyTorch reference")
    families = vga_linear.ops.KERNEL_FAMILIES  # the build's record of csrc's kFamilies, () without one
    lines.append(f"kernel families   {', '.join(families) if families else 'none (no CUDA build)'}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(
                f"GPU {i}             {props.name}, compute capability {props.major}.{props.minor}, "
                f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
            )
            if families:
                runs = runnable_families(families, (props.major, props.minor), build.CUDA_ARCHS)
                lines.append(f"  runs here       {', '.join(runs) if runs else 'none'}"
                             + ("" if vga_linear.kernels_loaded() else " (once the kernels load)"))
                lines.append(f"  not here        {', '.join(f for f in families if f not in runs) or '-'}")
    else:
        lines.append("GPU               none visible")
    return "\n".join(lines)


def runnable_families(families, capability, archs) -> list:
    """The families a GPU of this compute capability can run with this build's code: sm90_*
    need the sm_90a machine code and a Hopper GPU (cc 9.0: wgmma, TMA, clusters); the others
    need cc >= 8.0 (mma.sync, cp.async), from sm_90a code on Hopper, else the compute_80 PTX."""
    hopper = capability == (9, 0) and "sm_90a" in archs
    others = hopper or (capability >= (8, 0) and "compute_80" in archs)
    return [f for f in families if (hopper if f.startswith("sm90_") else others)]


if __name__ == "__main__":
    print(report())
