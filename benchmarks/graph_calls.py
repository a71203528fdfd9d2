#!/usr/bin/env python
"""Per-call time of the op's products timed back to back in a CUDA graph, against cuBLAS.

    python benchmarks/graph_calls.py --layers '16,80,1280;32,96,3072' --rows 100,256,1024,8192 \
        [--kinds fwd,gx,gw,bwd,gx+gw] [--config sm90_gemm/n128] [--cublas] [--producer] [--dtype bf16] \
        [--timing flushed] [--json out.json]

Each (layer R,H,K) x rows point builds fresh random inputs and times `--calls` calls captured in
one graph (no host gaps, no L2 flush; harness.back_to_back_us), or with `--timing flushed` one call a
graph replay with the L2 flushed by a 256 MiB read before each (bench.py's timer, the median): the
forward, grad_x and grad_weight through the private family ops with `--config` forced (a family, or a GEMM-core
configuration such as sm90_gemm/n128/c2), and with --cublas the same products on a
pre-concatenated input (F.linear, grad_y @ W, grad_y^T @ cat(x)). `bwd` is both backward products
by the backward op (grad_weight started while grad_x finishes), `gx+gw` the same two products by
their own ops, one after the other (grad_x in x's layout in both): their ratio is what the overlap
gains. This is how benchmarks/NOTES.md
compares two builds of the kernels: run it once per build, alternating the builds in one device
call, and read the differences against the spread between the two runs of each build. The
flushed, eager figures of bench.py (--suite sweep) stay the performance claims. Where a layer's W
fits in L2 (a 4096-wide layer's 34 MB on a 50 MB L2) the two timings can rank plans differently
(runs 127-132: a plan change that the flushed forced timings favoured took 1.13-1.26x longer back to
back), so a change of the plan rule is compared `--timing flushed` as well. Needs a GPU.

--producer puts an elementwise kernel that rewrites the product's input in place (x * 1 for the
forward, grad_y * 1 for grad_x and grad_weight) before each call, as a model's previous layer
produces it: back to back, one call of the op follows another of its own kernels, which a
programmatic launch (csrc/kernels/launch.cuh) overlaps more than it overlaps a kernel of torch's.
The time printed is then the pair's.
"""

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import harness as H
import metrics as M

DTYPES = ("bf16", "fp16", "fp32")
# The family a call forces unless --config names one: the Hopper family of the dtype.
DEFAULT_CONFIG = {"bf16": "sm90_gemm", "fp16": "sm90_gemm", "fp32": "sm90_tf32x3"}
KINDS = ("fwd", "gx", "gw", "bwd", "gx+gw")


def products(R, H_, K, rows, dtype, config, cublas, producer=False):
    """name -> zero-argument callable for the requested implementation of each product (with
    `producer`, preceded by the in-place rewrite of its input)."""
    inp = H.make_inputs(M.Shape("graph_calls", R, (rows,), H_, K, dtype), "cuda", seed=0, requires_grad=True)
    x, w, b, xc, g = (inp[k].detach() for k in ("x", "w", "b", "a", "gy"))
    if cublas:
        calls = {"fwd": lambda: F.linear(xc, w, b), "gx": lambda: g @ w, "gw": lambda: g.t() @ xc}
        calls["bwd"] = calls["gx+gw"] = lambda: (g @ w, g.t() @ xc)
    else:
        ops = torch.ops.vga
        calls = {"fwd": lambda: ops._gather_concat_linear_family(x, w, b, config),
                 "gx": lambda: ops._gather_concat_linear_grad_x_family(g, w, R, config),
                 "gw": lambda: ops._gather_concat_linear_grad_weight_family(g, x, config),
                 "bwd": lambda: ops._gather_concat_linear_backward_family(g, x, w, config, config),
                 "gx+gw": lambda: (ops._gather_concat_linear_grad_x_family(g, w, R, config, x),
                                   ops._gather_concat_linear_grad_weight_family(g, x, config))}
    inputs = {"fwd": xc if cublas else x, "gx": g, "gw": g, "bwd": g, "gx+gw": g}
    if not producer:
        return calls

    def after_producer(kind):
        def call():
            inputs[kind].mul_(1.0)
            return calls[kind]()
        return call
    return {kind: after_producer(kind) for kind in calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", required=True, type=M.parse_layers, help="R,H,K;R,H,K;...")
    parser.add_argument("--rows", required=True, type=M.parse_counts)
    parser.add_argument("--kinds", default=("fwd",), type=lambda s: tuple(s.split(",")),
                        help="products to time: fwd, gx, gw, bwd, gx+gw (default fwd)")
    parser.add_argument("--config", help="forced family / core configuration (default: sm90_gemm, for fp32 sm90_tf32x3; "
                                         "the dispatcher's own choice at <= 64 rows is sm90_skinny: name it there)")
    parser.add_argument("--cublas", action="store_true", help="time cuBLAS on a pre-concatenated input instead")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--producer", action="store_true",
                        help="an elementwise kernel rewrites the input before each call (the time is the pair's)")
    parser.add_argument("--calls", type=int, default=20, help="calls captured in the graph (back-to-back timing)")
    parser.add_argument("--timing", choices=("back-to-back", "flushed"), default="back-to-back",
                        help="back-to-back: --calls calls in one graph, operands left in L2 (the steadiest A/B); "
                             "flushed: one call a replay, L2 flushed before each, median")
    parser.add_argument("--rep-ms", type=float, default=30.0, help="flushed timing: time budget of one median")
    parser.add_argument("--json", help="write the points here")
    args = parser.parse_args()
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown products {unknown}; known: {', '.join(KINDS)}")
    if not torch.cuda.is_available():
        print("graph_calls.py needs a CUDA GPU", file=sys.stderr)
        return 1
    info = H.load_op()  # (imports vga_linear, which registers torch.ops.vga)
    if not args.cublas and not info.kernels_loaded:
        print(f"graph_calls.py: the CUDA kernels are not loaded ({info.error})", file=sys.stderr)
        return 1
    if args.config is None and not args.cublas and min(args.rows) <= 64:
        print(f"graph_calls.py: timing {DEFAULT_CONFIG[args.dtype]} (the default --config) at <= 64 rows, where the "
              "dispatcher runs sm90_skinny (bf16 / fp16) or skinny; --config sm90_skinny times that", file=sys.stderr)
    args.config = args.config or DEFAULT_CONFIG[args.dtype]
    label = "cublas" if args.cublas else args.config
    timer = H.GpuTimer() if args.timing == "flushed" else None
    points = []
    for (R, H_, K) in args.layers:
        for kind in args.kinds:
            times = []
            for rows in args.rows:
                fn = products(R, H_, K, rows, args.dtype, args.config, args.cublas, args.producer)[kind]
                if timer is None:
                    us = H.back_to_back_us(fn, calls=args.calls)
                else:
                    us = statistics.median(H.graph_times(timer, fn, rep_ms=args.rep_ms))
                times.append(us)
                points.append(dict(R=R, H=H_, K=K, rows=rows, kind=kind, dtype=args.dtype, impl=label,
                                   producer=args.producer, timing=args.timing, us=us))
            print(f"{label} {kind} R={R} H={H_} K={K}: " + " ".join(f"{t:8.2f}" for t in times), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=H.environment("cuda", info), rows=args.rows, points=points), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
