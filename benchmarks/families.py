#!/usr/bin/env python
"""Each CUDA kernel family, forced, on each bench shape: the data behind the dispatch rule.

    python benchmarks/families.py [--suite default] [--shape R,B,H,K,dtype ...]

Times (CUDA events, L2 flushed by the bench's read flush, median) every family that
accepts the shape, next to cuBLAS on a pre-concatenated input, and names the family
auto-dispatch picks. Families that refuse a shape say why. Needs a GPU and the kernels.
"""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

import bench
import harness as H
import metrics as M

vga_linear = H.import_vga_linear()
FAMILIES = vga_linear.ops.KERNEL_FAMILIES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="default")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--rep-ms", type=float, default=60.0)
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and vga_linear.kernels_loaded()):
        print("families.py needs a GPU and the CUDA kernels", file=sys.stderr)
        return 2
    torch.set_float32_matmul_precision("highest")
    shapes = [M.parse_shape(s) for s in args.shape] if args.shape else bench.suite_shapes(args.suite)
    timer = H.GpuTimer()
    print(f"{'shape':34s} {'auto':>18s} " + " ".join(f"{f:>10s}" for f in FAMILIES) + f" {'cublas':>10s}   (us)")
    for shape in shapes:
        inp = H.make_inputs(shape, "cuda", seed=0, requires_grad=False)
        x, w, b, a = inp["x"], inp["w"], inp["b"], inp["a"]
        cells = []
        for family in FAMILIES:
            try:
                fn = lambda f=family: torch.ops.vga._gather_concat_linear_family(x, w, b, f)  # noqa: E731
                fn()
            except RuntimeError as exc:
                cells.append("refuses" if "refuses" in str(exc) else "error")
                continue
            cells.append(f"{statistics.median(timer.run(fn, rep_ms=args.rep_ms)):10.2f}")
        cublas = statistics.median(timer.run(lambda: F.linear(a, w, b), rep_ms=args.rep_ms))
        auto = H.kernel_choice(x, w, b)
        print(f"{shape.name + ' ' + shape.spec():34s} {str(auto):>18s} " + " ".join(f"{c:>10s}" for c in cells)
              + f" {cublas:10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
