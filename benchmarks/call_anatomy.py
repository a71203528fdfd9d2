#!/usr/bin/env python
"""Where one flushed call's CUDA-event time goes: the kernel's own duration against the gaps around it,
the op's against cuBLAS on the concatenated input.

    python benchmarks/call_anatomy.py --layers '12,64,768;32,128,4096' --rows 128,512 \
        [--configs sm90_gemm/n64/s1,sm90_gemm/n96]
    VGA_LINEAR_PDL=0 python benchmarks/call_anatomy.py ...   # the kernels launched without PDL

Each call is timed as bench.py times a row (CUDA events, the 256 MiB L2 flush before each call,
median), then profiled (torch.profiler, 40 flushed calls): the first kernel after each flush, its
start after the flush kernel's end, its duration, its end after the flush's end, and the event time
less that end (where a call launches a second kernel, a grid split's sum, that one falls in the
last figure). Under a programmatic launch (csrc/kernels/launch.cuh) the op's kernel starts before
the flush ends and waits for it inside (its duration then includes that wait) and the end event
lands later after it (run 135: 2.3-3.6 µs against cuBLAS's 1.1-1.9): compare kernel durations with
VGA_LINEAR_PDL=0, where both launch the same way. bf16; needs a GPU.
"""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import harness as H
import metrics as M
import vga_linear  # noqa: F401  (registers torch.ops.vga)

FLUSH_KERNEL = "at::native::reduce_kernel"  # the timer's L2 flush (torch.sum); not cuBLAS's or a split's sum


def anatomy(timer, fn, calls=40):
    """(event µs, start after the flush µs, kernel µs, end after the flush µs, kernel name), medians."""
    event = statistics.median(timer.run(fn, rep_ms=20))
    for _ in range(3):
        timer.flush()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            timer.flush()
            fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    starts, durations, ends, names = [], [], [], set()
    flush_end = None
    for e in kernels:
        if FLUSH_KERNEL in e.name or "Memset" in e.name:  # the flush (torch.sum into a scalar)
            if FLUSH_KERNEL in e.name:
                flush_end = e.time_range.end
            continue
        if flush_end is not None:  # the call's first kernel
            starts.append(e.time_range.start - flush_end)
            ends.append(e.time_range.end - flush_end)
            durations.append(e.time_range.end - e.time_range.start)
            names.add(e.name[:60])
            flush_end = None
    if not starts:
        raise RuntimeError(f"no kernel after a flush kernel ({FLUSH_KERNEL}) in the profile")
    return (event, statistics.median(starts), statistics.median(durations), statistics.median(ends),
            ", ".join(sorted(names)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", required=True, type=M.parse_layers, help="R,H,K;R,H,K;...")
    p.add_argument("--rows", required=True, type=M.parse_counts)
    p.add_argument("--configs", default="", type=lambda s: [c for c in s.split(",") if c],
                   help="forced families / core configurations timed besides the op's own choice")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("call_anatomy.py needs a CUDA GPU", file=sys.stderr)
        return 1
    timer = H.GpuTimer()
    family = torch.ops.vga._gather_concat_linear_family
    for R, H_, K in args.layers:
        for rows in args.rows:
            inp = H.make_inputs(M.Shape("anatomy", R, (rows,), H_, K, "bf16"), "cuda", seed=0, requires_grad=False)
            x, w, b, xc = inp["x"], inp["w"], inp["b"], inp["a"]
            calls = [("vga " + torch.ops.vga._gather_concat_linear_choice(x, w, b),
                      lambda: torch.ops.vga.gather_concat_linear(x, w, b)),
                     ("cublas", lambda: F.linear(xc, w, b))]
            calls += [(f"forced {c}", lambda c=c: family(x, w, b, c)) for c in args.configs]
            for label, fn in calls:
                try:
                    event, start, kernel, end, name = anatomy(timer, fn)
                except RuntimeError as exc:  # a forced configuration that refuses the shape
                    print(f"R={R} H={H_} K={K} rows={rows} {label}: {str(exc).splitlines()[0][:160]}")
                    continue
                print(f"R={R} H={H_} K={K} rows={rows} {label:28s} event {event:6.2f}  start after flush "
                      f"{start:5.2f}  kernel {kernel:6.2f}  end after flush {end:6.2f}  event - end "
                      f"{event - end:5.2f}  [{name}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
