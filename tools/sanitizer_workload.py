"""A small workload touching every CUDA kernel path, for compute-sanitizer.

    compute-sanitizer --error-exitcode 1 --tool memcheck  python tools/sanitizer_workload.py [FAMILY[/CONFIG] ...]
    compute-sanitizer --error-exitcode 1 --tool racecheck python tools/sanitizer_workload.py --quick [FAMILY[/CONFIG] ...]

Each kernel family (or only those named, with a forced GEMM-core configuration such as
sm90_gemm/n128/c8) is forced on shapes with tails in every dimension, with and without bias,
for the forward and, where the family has them, the grad_x and grad_weight products, alone and
by the backward op; then the autograd backward runs. Every result is checked against the float64 reference, so a clean
sanitizer report comes with a correct answer. The last shapes give sm90_gemm more tiles than
there are SMs (each CTA reuses its shared-memory state) and the skinny families a split-K cluster.
--quick (racecheck is ~100x slower than memcheck): the first six shapes (80- and 96-wide heads
among them: sm90_gemm's packed shard tails of 4 and 2 shards a k-block), bf16 and fp32 only.
"""

import sys

import torch

import vga_linear
from vga_linear._tolerance import TOLERANCE
from vga_linear.reference import gather_concat_linear_float64

FAMILIES = vga_linear.ops.KERNEL_FAMILIES
SHAPES = [(1, 5, 8, 3), (3, 17, 24, 65), (3, 150, 80, 200), (3, 140, 96, 136), (4, 130, 136, 200),
          (2, 64, 1024, 130), (5, 3, 13, 7), (2, 2050, 64, 2312), (32, 16, 128, 4096)]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _forced(op, *args):
    """The forced family's result, or None where it refuses the input or has no such op."""
    try:
        return op(*args)
    except RuntimeError as exc:
        if any(text in str(exc) for text in ("refuses", "unknown kernel family", "token width of the forward",
                                            "needs H % 64 != 0", "runs the forward only")):
            return None
        raise


def _check_backward(g, x, w, family):
    R = x.shape[0]
    ref_x = vga_linear.ops._grad_x_reference(g.double(), w.double(), R)
    ref_w = vga_linear.ops._grad_weight_reference(g.double(), x.double())
    # grad_x in x's layout, as autograd asks: the workload's x (the transpose of a (B, R, H) tensor, whose
    # strides are the concat's) and a contiguous copy (shard-major: the scattering stores)
    grad_x_op = torch.ops.vga._gather_concat_linear_grad_x_family
    # and both products by the backward op, grad_weight started while grad_x finishes
    both = _forced(torch.ops.vga._gather_concat_linear_backward_family, g, x, w, family, family) or (None, None)
    for got, ref in ((_forced(grad_x_op, g, w, R, family, x), ref_x),
                     (_forced(grad_x_op, g, w, R, family, x.contiguous()), ref_x),
                     (_forced(torch.ops.vga._gather_concat_linear_grad_weight_family, g, x, family), ref_w),
                     (both[0], ref_x), (both[1], ref_w)):
        if got is not None:
            scale = max(ref.abs().max().item(), 1e-6)
            assert (got.double() - ref).abs().max().item() <= 4 * TOLERANCE[g.dtype] * scale, family


def main(argv):
    quick = "--quick" in argv
    argv = [name for name in argv if name != "--quick"]
    shapes, dtypes = (SHAPES[:6], (torch.float32, torch.bfloat16)) if quick else (SHAPES, DTYPES)
    if not vga_linear.kernels_loaded():
        sys.exit(f"the CUDA kernels are not loaded: {vga_linear.kernels_not_loaded_reason()}")
    unknown = sorted({name for name in argv if name.split("/")[0] not in FAMILIES})
    if unknown:
        sys.exit(f"unknown kernel families {unknown}; known: {list(FAMILIES)}")
    families = argv or FAMILIES
    ran = {}
    for dtype in dtypes:
        for (R, B, H, K), with_bias in [(shape, with_bias) for shape in shapes for with_bias in (True, False)]:
            x = torch.randn(B, R, H, dtype=dtype, device="cuda").transpose(0, 1)
            w = torch.randn(K, R * H, dtype=dtype, device="cuda") / (R * H) ** 0.5
            b = torch.randn(K, dtype=dtype, device="cuda") if with_bias else None
            ref = gather_concat_linear_float64(x, w, b)
            g = torch.randn(*x.shape[1:-1], K, dtype=dtype, device="cuda")
            for family in families:
                out = _forced(torch.ops.vga._gather_concat_linear_family, x, w, b, family)
                if out is None:
                    continue
                torch.testing.assert_close(out.double(), ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
                ran[family] = ran.get(family, 0) + 1
                if with_bias:  # the backward products have no bias: once a shape
                    _check_backward(g, x, w, family)
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
