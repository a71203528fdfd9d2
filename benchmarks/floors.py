#!/usr/bin/env python
"""What the bench's timing method charges any kernel: the floor under its figures.

    python benchmarks/floors.py

Timed exactly as bench.py times a row (CUDA events, L2 flushed by the bench's 256 MiB read
before each call, median; graph replays likewise): an empty kernel, a kernel storing 12x56
fp32 values, and PyTorch's own single-kernel read (torch.sum) and copy of the weight bytes
of the decode shapes. A figure below these is out of reach for one kernel timed this way;
benchmarks/NOTES.md reads the launch-bound and HBM-bound targets against them. Needs a GPU.
"""

import statistics
import sys

import torch

import harness as H


def report(timer, name, fn, graph=False):
    event = statistics.median(timer.run(fn, rep_ms=200.0))
    line = f"{name:<44} event {event:8.2f} us"
    if graph:
        line += f"   graph {statistics.median(H.graph_times(timer, fn)):8.2f} us"
    print(line, flush=True)


def read_and_copy(timer, name, mbytes):
    """PyTorch's own single-kernel read (torch.sum) and copy of mbytes of bf16."""
    src = torch.randn(int(mbytes * 1e6 / 2), device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    total = torch.empty((), device="cuda")
    report(timer, f"read {mbytes:g} MB ({name}): torch.sum", lambda: torch.sum(src, dim=0, dtype=torch.float32, out=total))
    report(timer, f"copy {mbytes:g} MB ({name}): copy_", lambda: dst.copy_(src))


def main() -> int:
    if not torch.cuda.is_available():
        print("floors.py needs a CUDA GPU", file=sys.stderr)
        return 1
    timer = H.GpuTimer()
    report(timer, "empty kernel (torch.cuda._sleep(0))", lambda: torch.cuda._sleep(0), graph=True)
    out = torch.empty(12, 56, device="cuda")
    report(timer, "one store: zero_ of a 12x56 fp32 output", out.zero_, graph=True)
    # decode_oproj's and tp_smallbatch's weights (bf16), and a size where the fixed cost fades
    for name, mbytes in (("decode_oproj W", 33.55), ("tp_smallbatch W", 134.2), ("512 MB", 512.0)):
        read_and_copy(timer, name, mbytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
