"""Input makers and the accuracy check shared by the tests."""

import pytest
import torch

import vga_linear
from vga_linear._tolerance import TOLERANCE  # noqa: F401  (atol = rtol per dtype; tests import it from here)
from vga_linear.reference import gather_concat_linear_float64

TWO_GPUS = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs in one process"
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
POISON = float("nan")
SHAPES = [
    # (R, batch, H, K): the seed, R=1, odd H, K=1, B=1, two batch dims, tails everywhere
    (4, (12,), 32, 56),
    (1, (7,), 16, 5),
    (3, (5,), 13, 9),
    (2, (9,), 8, 1),
    (5, (1,), 24, 33),
    (2, (3, 5), 16, 7),
    (8, (65,), 72, 130),
    (3, (2, 1), 1, 3),
]


@pytest.fixture(autouse=True)
def highest_fp32_precision():
    """fp32 matmuls at "highest" precision (no TF32), as the contract's tolerance assumes; autouse in
    every test module that imports it."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)


# Layer shapes (R, batch, H, K) at which the dispatcher's own plans run the Hopper core: long
# reductions split across the grid or in a cluster, token widths, packed tails (80-wide heads), a
# 4-D x; the forced configurations' tests take small shapes.
LAYER_SHAPES = [(32, (100,), 128, 4096), (32, (333,), 128, 4096), (3, (1024,), 256, 1000), (16, (2048,), 80, 1280),
                (12, (256,), 64, 768), (12, (4096,), 64, 768), (8, (100,), 1024, 256), (8, (333,), 1024, 256),
                (40, (512,), 128, 5120), (2, (3, 100), 64, 512), (2, (3, 700), 64, 512)]


def make_x(R, batch, H, dtype, device, layout="contiguous", generator=None):
    """x of shape (R, *batch, H) with fresh random values, laid out as asked.

    layouts: "contiguous"; "sdpa" (a transpose(0, 1) view of a contiguous (b, R, *rest, H)
    tensor, the layout of attention output); "padded" (rows padded: every stride but
    the last is larger than dense); "shard_last" (R is the innermost batch-like dim);
    "misaligned" (dense, but one element past a vector boundary); "odd_pitch" (an aligned
    start, rows H + 1 elements apart).
    """
    shape = (R, *batch, H)
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype, device=device, generator=generator)
    if layout == "sdpa":
        base = torch.randn((batch[0], R, *batch[1:], H), dtype=dtype, device=device, generator=generator)
        return base.transpose(0, 1)
    if layout == "padded":
        padded = torch.randn((R + 1, *(b + 1 for b in batch), H + 8), dtype=dtype, device=device,
                             generator=generator)
        return padded[(slice(1, R + 1), *(slice(0, b) for b in batch), slice(0, H))]
    if layout == "shard_last":
        base = torch.randn((*batch, R, H), dtype=dtype, device=device, generator=generator)
        return base.movedim(-2, 0)
    if layout == "misaligned":
        return misaligned(torch.randn(shape, dtype=dtype, device=device, generator=generator))
    if layout == "odd_pitch":
        pitched = torch.randn((R, *batch, H + 1), dtype=dtype, device=device, generator=generator)
        return pitched[..., :H]
    raise ValueError(layout)


def misaligned(t):
    """A dense copy of t whose storage starts one element past t's alignment."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = flat[1:].view(t.shape)
    out.copy_(t)
    return out


def make_params(R, H, K, dtype, device, bias=True, generator=None):
    # Scaled so outputs stay O(1) in every dtype.
    weight = torch.randn(K, R * H, dtype=dtype, device=device, generator=generator) / max(R * H, 1) ** 0.5
    b = torch.randn(K, dtype=dtype, device=device, generator=generator) if bias else None
    return weight, b


def assert_close_to_float64(out, x, weight, bias, dtype=None):
    """out within atol = rtol = TOLERANCE[dtype] of the float64 reference, NaN nowhere unexpected."""
    dtype = dtype or x.dtype
    ref = gather_concat_linear_float64(x, weight, bias)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == dtype
    assert out.is_contiguous()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, equal_nan=True)


def reference_grads(grad_out, x, weight):
    """grad_x and grad_weight in float64, by vga_linear.ops' own references (the ops' CPU kernels)."""
    g = grad_out.double()
    return (vga_linear.ops._grad_x_reference(g, weight.double(), x.shape[0]),
            vga_linear.ops._grad_weight_reference(g, x.double()))


def assert_close_scaled(out, ref):
    """out within 2e-2 relative of the float64 `ref`, with an absolute floor scaled to its spread (a
    half-precision result of a long reduction carries ~2^-8 relative rounding), and never NaN."""
    assert not out.isnan().any(), "an element was never written (poisoned output)"
    tol = 2e-2
    atol = tol * max(ref.abs().mean().item(), 1e-6)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=tol)


def poison_next_output(shape, dtype, device):
    """Leave a NaN-filled block of the output's size in torch's caching allocator, so the
    op's own output allocation most likely reuses it: an element a kernel fails to write
    then shows up as NaN instead of as a stale plausible value."""
    poison_next_outputs([shape], dtype, device)


def poison_next_outputs(shapes, dtype, device):
    """poison_next_output for an op with several outputs: the blocks are all held at once before
    they are freed, so that each output's allocation finds its own."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full(shape, POISON, dtype=dtype, device=device) for shape in shapes]
    del blocks  # freed, cached


def run_op(x, weight, bias, family=None):
    """The op (or one named CUDA kernel family) on a poisoned allocator."""
    poison_next_output((*x.shape[1:-1], weight.shape[0]), x.dtype, x.device)
    if family is None:
        return torch.ops.vga.gather_concat_linear(x, weight, bias)
    return torch.ops.vga._gather_concat_linear_family(x, weight, bias, family)


def gpu_ms(fn):
    """One call's GPU time in ms, after a warm-up call: a spinning kernel ahead of the start event
    (~1 ms) lets the host queue the call before the GPU reaches it, so the host's time per call is
    not counted. (Without it, the H200 machine of run 122, whose host-bound bench rows take 2-3x
    the H100 machine's, timed a 256-tile grad_weight call at 79 us, more than its ~16 MB explain.)"""
    fn()  # (warm)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(2_000_000)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)
