"""A small workload touching every CUDA kernel path, for compute-sanitizer.

    compute-sanitizer --error-exitcode 1 --tool memcheck  python tools/sanitizer_workload.py [FAMILY ...]
    compute-sanitizer --error-exitcode 1 --tool racecheck python tools/sanitizer_workload.py [FAMILY ...]

Each kernel family (or only those named) is forced on shapes with tails in every dimension,
with and without bias, then the two backward ops run; every result is checked against the
float64 reference, so a clean sanitizer report comes with a correct answer. The last shapes
give sm90_gemm more tiles than there are SMs (each CTA reuses its shared-memory state) and
the skinny families a split-K cluster.
"""

import sys

import torch

import vga_linear
from vga_linear._tolerance import TOLERANCE
from vga_linear.reference import gather_concat_linear_float64

FAMILIES = vga_linear.ops.KERNEL_FAMILIES
SHAPES = [(1, 5, 8, 3), (3, 17, 24, 65), (4, 130, 136, 200), (2, 64, 1024, 130), (5, 3, 13, 7),
          (2, 2050, 64, 2312), (32, 16, 128, 4096)]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def main(argv):
    if not vga_linear.kernels_loaded():
        sys.exit(f"the CUDA kernels are not loaded: {vga_linear.kernels_not_loaded_reason()}")
    unknown = sorted(set(argv) - set(FAMILIES))
    if unknown:
        sys.exit(f"unknown kernel families {unknown}; known: {list(FAMILIES)}")
    families = argv or FAMILIES
    ran = {}
    for dtype in DTYPES:
        for (R, B, H, K), with_bias in [(shape, with_bias) for shape in SHAPES for with_bias in (True, False)]:
            x = torch.randn(B, R, H, dtype=dtype, device="cuda").transpose(0, 1)
            w = torch.randn(K, R * H, dtype=dtype, device="cuda") / (R * H) ** 0.5
            b = torch.randn(K, dtype=dtype, device="cuda") if with_bias else None
            ref = gather_concat_linear_float64(x, w, b)
            for family in families:
                try:
                    out = torch.ops.vga._gather_concat_linear_family(x, w, b, family)
                except RuntimeError as exc:
                    if "refuses" in str(exc) or "unknown kernel family" in str(exc):
                        continue
                    raise
                torch.testing.assert_close(out.double(), ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
                ran[family] = ran.get(family, 0) + 1
            x.requires_grad_()
            w.requires_grad_()
            vga_linear.gather_concat_linear(x, w, b).sum().backward()
    torch.cuda.synchronize()
    idle = [family for family in families if family not in ran]
    if argv and idle:
        sys.exit(f"the named families {idle} refused every shape: nothing of theirs was checked")
    print("sanitizer workload ran:", ", ".join(f"{k} x{v}" for k, v in sorted(ran.items())), "+ backward ops")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
