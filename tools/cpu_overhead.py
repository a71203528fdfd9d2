#!/usr/bin/env python3
"""The CPU op's time against the reference's (cat + F.linear) at the CPU bench shapes.

    python tools/cpu_overhead.py      # the issue's bar: op <= 1.1x the reference

Then, without a bar, one training step of each (forward and .sum().backward(), every input
requiring a gradient): what autograd and the backward ops add on the host.

Interleaved batches of calls; each column is the fastest batch's time per call (a shared,
busy host only ever adds time, so the minimum is the steadiest estimate of the cost), with
the median batch's ratio beside it.
"""

import statistics
import sys
import time

import torch

import vga_linear
from vga_linear.reference import gather_concat_linear_reference as reference

# benchmarks/bench.py's CPU_SHAPES: name, R, batch, H, K, dtype, strided (sdpa_out.transpose(0, 1))
SHAPES = [("seed", 4, (12,), 32, 56, torch.float32, False),
          ("cpu_mid", 8, (64,), 64, 256, torch.float32, False),
          ("cpu_bf16", 4, (32,), 64, 128, torch.bfloat16, False),
          ("cpu_sdpa", 8, (2, 16), 32, 128, torch.float32, True)]


def inputs(R, batch, H, K, dtype, strided):
    g = torch.Generator().manual_seed(0)
    if strided:
        b, s = batch
        x = torch.randn(b, R, s, H, generator=g).to(dtype).transpose(0, 1)
    else:
        x = torch.randn(R, *batch, H, generator=g).to(dtype)
    w = torch.randn(K, R * H, generator=g).to(dtype)
    return x, w, torch.randn(K, generator=g).to(dtype)


def per_call_us(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def batch_times(calls, batches):
    """{name: [us a call, one per batch]}: batches of ~2 ms a call kind (sized on the first
    kind), interleaved so that drift hits all kinds alike."""
    first = next(iter(calls.values()))
    n = max(20, int(2e-3 / max(per_call_us(first, 20) * 1e-6, 1e-7)))
    samples = {k: [] for k in calls}
    for _ in range(batches):
        for k, fn in calls.items():
            samples[k].append(per_call_us(fn, n))
    return samples


def main():
    torch.set_num_threads(1)  # steadier; both sides equal
    worst = 0.0
    print(f"torch {torch.__version__}, kernels_loaded={vga_linear.kernels_loaded()}, threads 1")
    print(f"{'shape':10} {'reference us':>12} {'op us':>8} {'public fn us':>12} {'op/ref':>7} {'fn/ref':>7}")
    for name, R, batch, H, K, dtype, strided in SHAPES:
        x, w, b = inputs(R, batch, H, K, dtype, strided)
        torch.testing.assert_close(torch.ops.vga.gather_concat_linear(x, w, b), reference(x, w, b))
        calls = {"ref": lambda: reference(x, w, b),
                 "op": lambda: torch.ops.vga.gather_concat_linear(x, w, b),
                 "fn": lambda: vga_linear.gather_concat_linear(x, w, b)}
        samples = batch_times(calls, 40)
        best = {k: min(v) for k, v in samples.items()}
        med = {k: statistics.median(v) for k, v in samples.items()}
        worst = max(worst, best["fn"] / best["ref"])
        print(f"{name:10} {best['ref']:12.2f} {best['op']:8.2f} {best['fn']:12.2f} "
              f"{best['op'] / best['ref']:7.3f} {best['fn'] / best['ref']:7.3f}"
              f"   (median batch: op/ref {med['op'] / med['ref']:.3f}, fn/ref {med['fn'] / med['ref']:.3f})")
    print(f"worst fn/ref {worst:.3f} ({'within' if worst <= 1.1 else 'OVER'} the 1.1x bar; fn = "
          "vga_linear.gather_concat_linear, what benchmarks/bench.py times; op = torch.ops.vga...)")
    print(f"\nfwd+bwd (no bar)\n{'shape':10} {'reference us':>12} {'fn us':>8} {'fn/ref':>7}")
    for name, R, batch, H, K, dtype, strided in SHAPES:
        x, w, b = (t.requires_grad_() for t in inputs(R, batch, H, K, dtype, strided))

        def step(forward):
            x.grad = w.grad = b.grad = None  # as after zero_grad(set_to_none=True): fresh gradients
            forward(x, w, b).sum().backward()

        best = {k: min(v) for k, v in batch_times({"ref": lambda: step(reference),
                                                   "fn": lambda: step(vga_linear.gather_concat_linear)}, 20).items()}
        print(f"{name:10} {best['ref']:12.2f} {best['fn']:8.2f} {best['fn'] / best['ref']:7.3f}")
    return 0 if worst <= 1.1 else 1


if __name__ == "__main__":
    sys.exit(main())
