#!/usr/bin/env python
"""vga-linear benchmark: the package's measuring instrument.

For each shape it answers: how fast (CUDA events, L2 flushed; CUDA-graph replay
for launch-bound shapes; eager host wall time per call), how close to the
hardware limit (TFLOP/s, effective GB/s, % of a roofline built from ceilings
measured in this run), how accurate (against a float64 reference over fresh
random trials), at what memory (peak above the inputs) and launch cost (GPU
kernels per call, torch.profiler), against what a user would otherwise run:

  vga        vga_linear.gather_concat_linear(x, W, b)             (the op)
  reference  F.linear(torch.cat([x[i] for i in range(R)], -1), W, b)  (the seed)
  permute    F.linear(x.movedim(0, -2).reshape(*batch, R*H), W, b)
  gemm_only  F.linear(A, W, b) on a ready, contiguous (B, R*H) A: the floor a
             perfect fusion has to beat (the concat is free for it)
  compile    torch.compile(reference, dynamic=False)  (default mode)

  python benchmarks/bench.py                      # default suite (GPU) / cpu suite (no GPU)
  python benchmarks/bench.py --suite backward     # fwd and fwd+bwd of issue 14's training shapes
  python benchmarks/bench.py --suite sweep [--backward]   # real layers x token counts (sweep.py)
  python benchmarks/bench.py --suite decode_oproj --backward
  python benchmarks/bench.py --shape 32,16,128,4096,bf16 --shape 8,4x1024,128,4096,bf16,sdpa
  python benchmarks/bench.py --json r.json --csv r.csv --plot r.png
  python benchmarks/bench.py --list

Nothing here touches the GPU at import time.  Definitions of every number are
in benchmarks/metrics.py (module docstring) and printed in the legend; the timers,
ceilings and inputs are benchmarks/harness.py's, the tables bench_report.py's.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_report as report  # noqa: E402
import harness as H  # noqa: E402
import metrics as M  # noqa: E402
import sweep  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BENCH_VERSION = "1.0"
Shape = M.Shape

# --------------------------------------------------------------------------- suites

NAMED_SHAPES = [
    Shape("seed", 4, (12,), 32, 56, "fp32", regime="launch-bound"),
    Shape("decode_oproj", 32, (16,), 128, 4096, "bf16", regime="weight-streaming (HBM)"),
    Shape("tp_smallbatch", 8, (64,), 1024, 8192, "bf16", regime="weight-streaming (HBM)"),
    Shape("mid_fp32", 8, (1024,), 256, 1024, "fp32", regime="mid, fp32"),
    Shape("prefill_oproj", 32, (4096,), 128, 4096, "bf16", regime="tensor-core"),
    Shape("prefill_fp16", 32, (2048,), 128, 4096, "fp16", regime="tensor-core"),
    Shape("tp_gather", 8, (8192,), 1024, 8192, "bf16", regime="tensor-core"),
    # x = sdpa_out.transpose(0, 1) of a contiguous (b=4, nh=32, s=1024, d=128) tensor
    Shape("sdpa_strided", 32, (4, 1024), 128, 4096, "bf16", strided=True, regime="strided view"),
    # the same problem with a contiguous x: the strided case should take the same time
    Shape("sdpa_contig", 32, (4, 1024), 128, 4096, "bf16", regime="contiguous control"),
]
TRAINING_SHAPES = [
    # a training step's attention o_proj: x = attn.transpose(0, 1) of a contiguous SDPA output attn
    # (b=4, heads=32, s=2048, d=128); permute = attn.transpose(1, 2).reshape(b, s, heads*d) + F.linear,
    # gemm_only = F.linear on a pre-concatenated (b, s, heads*d) leaf (issue 14)
    Shape("sdpa_train", 32, (4, 2048), 128, 4096, "bf16", strided=True, regime="training, SDPA layout"),
]

CPU_SHAPES = [
    Shape("seed", 4, (12,), 32, 56, "fp32", regime="launch-bound"),
    Shape("cpu_mid", 8, (64,), 64, 256, "fp32", regime="cpu"),
    Shape("cpu_bf16", 4, (32,), 64, 128, "bf16", regime="cpu"),
    Shape("cpu_sdpa", 8, (2, 16), 32, 128, "fp32", strided=True, regime="strided view"),
]

SUITES = {
    "default": [s.name for s in NAMED_SHAPES],
    "cpu": [s.name for s in CPU_SHAPES],
    "small": ["seed", "decode_oproj", "mid_fp32"],   # a quick GPU check: one shape per small regime
    "hbm": ["decode_oproj", "tp_smallbatch"],
    "tensorcore": ["prefill_oproj", "prefill_fp16", "tp_gather"],
    "strided": ["sdpa_strided", "sdpa_contig"],
    # issue 14's target table; --suite backward implies --backward
    "backward": ["seed", "decode_oproj", "mid_fp32", "prefill_oproj", "tp_gather", "sdpa_train"],
}
# run by sweep.py, not from the shape table: real layer shapes x token counts
SWEEP_SUITE = "sweep"
_BY_NAME = {s.name: s for s in CPU_SHAPES}
_BY_NAME.update({s.name: s for s in NAMED_SHAPES + TRAINING_SHAPES})

ROW_ORDER = report.ROW_ORDER
LAUNCH_BOUND_US = 30.0        # graph-replay figure when any row's median is below this


def suite_shapes(name: str) -> list:
    if name in SUITES:
        return [dataclasses.replace(_BY_NAME[n]) for n in SUITES[name]]
    if name in _BY_NAME:
        return [dataclasses.replace(_BY_NAME[name])]
    raise SystemExit(f"unknown suite/shape {name!r}; known: {', '.join(list(SUITES) + [SWEEP_SUITE] + list(_BY_NAME))}")


# --------------------------------------------------------------------------- rows

@dataclasses.dataclass
class Row:
    name: str
    label: str
    fn: object = None            # fn(inp) -> y
    uses_a: bool = False         # takes the pre-concatenated A instead of x
    skip: str | None = None      # reason, row not run
    error: str | None = None     # reason, row failed
    first_call_s: float | None = None
    res: dict = dataclasses.field(default_factory=dict)


def build_rows(shape: Shape, ctx, backward: bool) -> list:
    op = ctx.op
    rows = []
    r = Row("vga", op.label(ctx.device))
    if op.available:
        f = op.op
        r.fn = lambda inp: f(inp["x"], inp["w"], inp["b"])
    else:
        r.skip = f"vga_linear not importable ({op.error})"
    rows.append(r)
    rows.append(Row("reference", "reference", fn=lambda inp: H.reference_fn(inp["x"], inp["w"], inp["b"])))
    rows.append(Row("permute", "permute", fn=lambda inp: H.permute_fn(inp["x"], inp["w"], inp["b"])))
    rows.append(Row("gemm_only", "gemm_only", fn=lambda inp: F.linear(inp["a"], inp["w"], inp["b"]), uses_a=True))
    c = Row("compile", "compile")
    if not ctx.compile:
        c.skip = "torch.compile off" + (" (CPU default; --compile forces it)" if ctx.device == "cpu" else " (--no-compile)")
    elif ctx.compile_spent_s > ctx.args.compile_budget_s:
        c.skip = f"compile budget spent ({ctx.compile_spent_s:.0f}s > {ctx.args.compile_budget_s:.0f}s)"
    else:
        try:
            import torch._dynamo
            torch._dynamo.reset()          # fresh caches per block: no recompile-limit fallbacks
            cfn = torch.compile(H.reference_fn, dynamic=False)
            c.fn = lambda inp: cfn(inp["x"], inp["w"], inp["b"])
        except Exception as e:  # noqa: BLE001
            c.skip = f"torch.compile unavailable: {H.short_err(e)}"
    rows.append(c)
    return rows


# --------------------------------------------------------------------------- one block

class Ctx:
    def __init__(self, args, device, op):
        self.args = args
        self.device = device
        self.op = op
        self.compile = args.compile if args.compile is not None else (device == "cuda")
        self.compile_spent_s = 0.0
        self.timer = H.GpuTimer(args.flush_mib) if device == "cuda" else None
        self.ceilings = None


def bench_block(shape: Shape, backward: bool, ctx) -> dict:
    args, dev = ctx.args, ctx.device
    t_block = time.perf_counter()
    mode = "fwd+bwd" if backward else "fwd"
    H.add_gemm_ceiling(ctx.ceilings, shape.dtype, dev, ctx.timer, args.gemm_n)
    rows = build_rows(shape, ctx, backward)
    flops = M.shape_flops(shape, backward)
    nbytes = M.shape_bytes(shape, backward)
    peak = ctx.ceilings["gemm_tflops"][shape.dtype] * 1e12
    bw = ctx.ceilings["copy_GBps"] * 1e9
    floor_s, bound = M.roofline_floor_s(flops, nbytes, peak, bw)
    tol = M.tolerance_for(shape.dtype)

    # 1. precision: fresh random inputs per trial, float64 reference, every row
    errs = {r.name: {} for r in rows}
    for t in range(args.trials):
        inp = H.make_inputs(shape, dev, seed=args.seed + 1 + 7919 * t, requires_grad=backward)
        ref = H.reference64(inp, backward)
        for r in rows:
            if r.skip or r.error:
                continue
            if r.name == "compile" and r.first_call_s is None and ctx.compile_spent_s > args.compile_budget_s:
                r.skip = f"compile budget spent ({ctx.compile_spent_s:.0f}s)"
                continue
            try:
                call, setup = H.make_call(r.fn, inp, backward, r.uses_a)
                if setup:
                    setup()
                t0 = time.perf_counter()
                y = call()
                H.sync(dev)
                if r.first_call_s is None:
                    r.first_call_s = time.perf_counter() - t0
                    if r.name == "compile":
                        ctx.compile_spent_s += r.first_call_s
                e = errs[r.name]
                e.setdefault("y", []).append(M.error_stats(y, ref["y"], tol))
                if backward:
                    gx_ref = ref["grad_x"]
                    src = inp["a"] if r.uses_a else inp["x"]
                    if r.uses_a:
                        gx_ref = gx_ref.movedim(0, -2).reshape(src.shape)
                    e.setdefault("grad_x", []).append(M.error_stats(src.grad, gx_ref, tol))
                    e.setdefault("grad_w", []).append(M.error_stats(inp["w"].grad, ref["grad_w"], tol))
                    if inp["b"] is not None:
                        e.setdefault("grad_b", []).append(M.error_stats(inp["b"].grad, ref["grad_b"], tol))
                    H.clear_grads(inp, r.uses_a)
                del y
            except Exception as ex:  # noqa: BLE001
                r.error = H.short_err(ex)
                if args.verbose:
                    traceback.print_exc()
        del inp, ref
    for r in rows:
        per = {k: M.merge_error_stats(v) for k, v in errs[r.name].items()}
        if per:
            worst = M.merge_error_stats(per.values())
            worst.pop("n", None)
            r.res["precision"] = {**worst, "trials": min(len(v) for v in errs[r.name].values()),
                                  "tensors": list(per), "per_tensor": per}
    if dev == "cuda":
        gc.collect()
        torch.cuda.empty_cache()

    # 2. timing inputs (fixed), timed with CUDA events / perf_counter
    inp = H.make_inputs(shape, dev, seed=args.seed, requires_grad=backward)
    active = [r for r in rows if not r.skip and not r.error]
    calls = {}
    for r in active:
        calls[r.name] = H.make_call(r.fn, inp, backward, r.uses_a)
    for r in active:
        call, setup = calls[r.name]
        try:
            if dev == "cuda":
                ts = ctx.timer.run(call, setup, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                                   min_runs=args.min_runs)
            else:
                ts = H.cpu_times(call, setup, budget_s=args.cpu_budget_s)
            r.res["time"] = M.time_stats(ts)
        except Exception as ex:  # noqa: BLE001
            r.error = H.short_err(ex)
            if args.verbose:
                traceback.print_exc()
    timed = [r for r in active if "time" in r.res]

    # 3. CUDA-graph replay (forward) for launch-bound shapes
    want_graph = (dev == "cuda" and not backward and args.graph != "never" and
                  (args.graph == "always" or any(r.res["time"]["median"] < LAUNCH_BOUND_US for r in timed)))
    for r in timed:
        if not want_graph:
            break
        try:
            r.res["graph"] = M.time_stats(H.graph_times(ctx.timer, calls[r.name][0], args.warmup_ms, args.rep_ms))
        except Exception as ex:  # noqa: BLE001
            r.res["graph_error"] = H.short_err(ex)
            torch.cuda.synchronize()

    # 4. eager host wall, peak memory, launches
    for r in timed:
        call, setup = calls[r.name]
        try:
            r.res["wall_us"] = H.wall_us(call, setup, dev)
        except Exception as ex:  # noqa: BLE001
            r.res["wall_error"] = H.short_err(ex)
        if dev == "cuda":
            try:
                r.res["peak_mem_bytes"] = H.peak_mem_bytes(call, setup)
            except Exception as ex:  # noqa: BLE001
                r.res["mem_error"] = H.short_err(ex)
            if not args.no_profile:
                try:
                    r.res["launches"] = H.profile_call(call, setup)
                    if r.res["launches"] is None:
                        r.res["launch_error"] = "torch.profiler recorded no CUDA activity"
                except Exception as ex:  # noqa: BLE001
                    r.res["launch_error"] = H.short_err(ex)
    del calls, inp
    if dev == "cuda":
        gc.collect()
        torch.cuda.empty_cache()

    # 5. derived metrics
    med = {r.name: r.res["time"]["median"] * 1e-6 for r in timed}
    gmed = {r.name: r.res["graph"]["median"] * 1e-6 for r in timed if "graph" in r.res}
    ref_r = next((r for r in timed if r.name == "reference"), None)
    out_rows = []
    for r in rows:
        d = {"name": r.name, "label": r.label, "skip": r.skip, "error": r.error,
             "first_call_s": r.first_call_s}
        d.update(r.res)
        if r.name in med:
            s = med[r.name]
            d["tflops"] = M.tflops(flops, s)
            d["gbps"] = M.gbps(nbytes, s)
            d["pct_roofline"] = M.pct_of_roofline(floor_s, s)
            d["speedup"] = {b: M.speedup(med[b], s) for b in ROW_ORDER if b in med and b != r.name}
            if r.name in gmed:
                d["pct_roofline_graph"] = M.pct_of_roofline(floor_s, gmed[r.name])
                d["speedup_graph"] = {b: M.speedup(gmed[b], gmed[r.name]) for b in ROW_ORDER
                                      if b in gmed and b != r.name}
            if ref_r is not None:
                d["mem_ratio"] = M.ratio(d.get("peak_mem_bytes"), ref_r.res.get("peak_mem_bytes"))
                rl, ml = ref_r.res.get("launches"), d.get("launches")
                d["fusion_ratio"] = M.ratio(rl and rl["total"], ml and ml["total"])
        out_rows.append(d)
    return {
        "shape": shape.to_dict(), "name": shape.name, "mode": mode,
        "flops": flops, "bytes": nbytes, "tol": tol,
        "peak_tflops": peak / 1e12, "copy_GBps": bw / 1e9,
        "floor_us": floor_s * 1e6 if floor_s else None, "bound": bound,
        "graph": want_graph, "fp32_precision": torch.get_float32_matmul_precision(), "rows": out_rows, "elapsed_s": time.perf_counter() - t_block,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="suites: " + ", ".join(f"{k}={'+'.join(v)}" for k, v in SUITES.items())
                                + f", {SWEEP_SUITE}=real layers x token counts (sweep.py)")
    p.add_argument("--suite", action="append", default=None,
                   help="suite or shape name (repeatable); default: 'default' on CUDA, 'cpu' without; "
                        "'backward' implies --backward; 'sweep' runs sweep.py")
    p.add_argument("--shape", action="append", default=[], metavar="R,B,H,K,dtype[,nobias][,sdpa]",
                   help="custom shape (repeatable); B may be bxs for two batch dims; sdpa = x as "
                        "sdpa_out.transpose(0,1)")
    p.add_argument("--backward", action="store_true",
                   help="also time forward+backward of every row (the sweep: fwd+bwd only, on its subset)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--csv", metavar="PATH")
    p.add_argument("--plot", metavar="PATH", help="PNG: speedup vs gemm_only and %% of roofline per shape "
                                                  "(the sweep: ratio against rows, one line per layer)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="torch.compile row (default on CUDA, off on CPU)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--compile-budget-s", type=float, default=180.0,
                   help="skip the compile row once this much compile time is spent (default 180)")
    p.add_argument("--graph", choices=["auto", "always", "never"], default="auto",
                   help=f"CUDA-graph replay figure (auto: when a row's median < {LAUNCH_BOUND_US:g} us)")
    p.add_argument("--trials", type=int, default=5, help="precision trials with fresh inputs (default 5)")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0, help="timing budget per row (CUDA)")
    p.add_argument("--min-runs", type=int, default=10)
    p.add_argument("--cpu-budget-s", type=float, default=0.08, help="timing budget per row (CPU)")
    p.add_argument("--flush-mib", type=int, default=256, help="L2 flush buffer (MiB)")
    p.add_argument("--copy-mib", type=int, default=1024, help="copy-bandwidth ceiling size (MiB)")
    p.add_argument("--gemm-n", type=int, default=8192, help="GEMM ceiling size N (N^3)")
    p.add_argument("--allow-tf32", action="store_true",
                   help="fp32 matmul precision 'high' (TF32) instead of the default 'highest'")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler launch count")
    p.add_argument("--require-kernels", action="store_true",
                   help="exit 2 if on CUDA and vga_linear's CUDA kernels are not loaded")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any row fails precision or errors (default: report only, exit 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="list suites and shapes and exit")
    p.add_argument("-v", "--verbose", action="store_true")
    sweep.add_arguments(p)
    return p.parse_args(argv)


def banner_lines(args, device: str, has_cuda: bool, op) -> list:
    """What runs, on what, timed how (printed first, so a log says what it measured)."""
    lines = []
    meta = H.environment(device)
    if device == "cpu":
        lines.append("*** CPU FALLBACK: " + ("--device cpu" if has_cuda else "no CUDA device") +
                     " - the CUDA kernels are not in use: every row runs torch's CPU kernels; times are host"
                     f" perf_counter figures, not GPU numbers. (torch threads {meta['torch_threads']},"
                     f" {meta['cpu_count']} CPUs) ***")
        load1, ncpu = meta["loadavg_1min"], meta["cpu_count"]
        if load1 is not None and load1 > 0.75 * ncpu:
            lines.append(f"*** warning: load average {load1:.1f} on {ncpu} CPUs - other work is running; "
                         "CPU timings will be noisy ***")
    lines.append(f"vga-linear bench {BENCH_VERSION}  device: {meta['device_name']}  torch {torch.__version__}"
                 f" (cuda {torch.version.cuda})  triton {meta['triton']}  python {meta['python']}")
    if op.available and device == "cpu":
        why = ("built and loaded, but these are CPU tensors" if op.kernels_loaded
               else f"not loaded: {op.error or 'kernels_loaded() is False'}")
        lines.append(f"op: vga_linear.gather_concat_linear, CPU path (the shards moved into one (*batch, R*H) copy, "
                     f"then F.linear)  vga_linear {op.version}  ({op.path}); CUDA kernels {why}")
    elif op.available:
        lines.append(f"op: vga_linear.gather_concat_linear (torch.ops.vga.gather_concat_linear below autograd when no grad is needed)  vga_linear {op.version}  "
                     f"kernels_loaded={op.kernels_loaded}  ({op.path})")
        if device == "cuda" and not op.kernels_loaded:
            lines.append("*** vga_linear CUDA extension NOT loaded: the 'vga(fallback)' row is the Python fallback"
                         f" ({op.error or 'kernels_loaded() is False'}) ***")
    else:
        lines.append(f"*** op unavailable: {op.error} - the vga row is skipped ***")
    lines.append(f"fp32 matmul precision: '{torch.get_float32_matmul_precision()}' (TF32 {'on' if args.allow_tf32 else 'off'}); "
                 f"precision: {args.trials} fresh torch.randn trials vs float64 reference; "
                 f"timing: " + ("CUDA events, L2 flushed by a 256 MiB read before each call" if device == "cuda"
                                else "perf_counter per call"))
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for k, v in SUITES.items():
            print(f"suite {k}: {', '.join(v)}")
        print(f"suite {SWEEP_SUITE}: {sweep.describe()}")
        for s in NAMED_SHAPES + TRAINING_SHAPES + CPU_SHAPES[1:]:
            print(f"  {s.name:<15} {s.spec():<28} {s.regime}")
        return 0
    t_start = time.perf_counter()
    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = "cuda" if (args.device == "cuda" or (args.device == "auto" and has_cuda)) else "cpu"
    cpu_fallback = device == "cpu"

    suites = args.suite or ([] if args.shape else ["default" if device == "cuda" else "cpu"])
    if SWEEP_SUITE in suites:
        if len(suites) > 1 or args.shape:
            print(f"error: --suite {SWEEP_SUITE} runs on its own (no other --suite or --shape)", file=sys.stderr)
            return 2
        return sweep.run(args, device)
    args.backward = args.backward or "backward" in suites
    shapes = []
    for s in suites:
        shapes += suite_shapes(s)
    for spec in args.shape:
        try:
            shapes.append(M.parse_shape(spec))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    seen, uniq = set(), []
    for s in shapes:
        if s.name not in seen:
            seen.add(s.name)
            uniq.append(s)
    shapes = uniq

    # fp32 semantics: 'highest' = no TF32 (F.linear and the op follow the same switch)
    torch.backends.cuda.matmul.allow_tf32 = bool(args.allow_tf32)
    torch.set_float32_matmul_precision("high" if args.allow_tf32 else "highest")

    op = H.load_op()
    if args.require_kernels and device == "cuda" and not op.kernels_loaded:
        print(f"error: --require-kernels: vga_linear CUDA kernels not loaded ({op.error or 'kernels_loaded() is False'})",
              file=sys.stderr)
        return 2
    ctx = Ctx(args, device, op)
    print("\n".join(banner_lines(args, device, has_cuda, op)), flush=True)

    print(f"[ceilings] measuring on {device} ...", file=sys.stderr, flush=True)
    ctx.ceilings = H.measure_ceilings(device, ctx.timer, sorted({s.dtype for s in shapes}), args.copy_mib, args.gemm_n)
    c = ctx.ceilings
    print(f"ceilings (measured now): copy {c['copy_GBps']:.0f} GB/s (read+write of {c['copy_bytes'] / 1e9:.2f} GB); "
          + ", ".join(f"{k} GEMM {M.fmt_sig(v)} TFLOP/s (N={c['gemm_n'][k]})" for k, v in c["gemm_tflops"].items()))
    print(report.legend(cpu_fallback), flush=True)

    meta = {"bench_version": BENCH_VERSION, **H.environment(device, op, argv),
            "allow_tf32": bool(args.allow_tf32), "compile": ctx.compile,
            "timing": ("CUDA events around each call, 256 MiB read-only L2 flush before each, warm-up, median"
                       if device == "cuda" else "time.perf_counter per call, median"),
            "definitions": M.__doc__}
    result = {"meta": meta, "ceilings": ctx.ceilings, "blocks": []}
    modes = [False, True] if args.backward else [False]
    jobs = [(s, m) for s in shapes for m in modes]
    for i, (s, bwd) in enumerate(jobs):
        tag = f"[{i + 1}/{len(jobs)}] {s.name} {s.spec()} {'fwd+bwd' if bwd else 'fwd'}"
        print(f"{tag} ...", file=sys.stderr, flush=True)
        try:
            blk = bench_block(s, bwd, ctx)
        except Exception as e:  # noqa: BLE001
            print(f"{tag} FAILED: {H.short_err(e)}", file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
            result["blocks"].append({"name": s.name, "mode": "fwd+bwd" if bwd else "fwd",
                                     "shape": s.to_dict(), "error": H.short_err(e), "rows": []})
            continue
        result["blocks"].append(blk)
        print("\n" + report.render_block(blk, cpu_fallback), flush=True)
        v = next((r for r in blk["rows"] if r["name"] == "vga"), {})
        vt = (v.get("time") or {}).get("median")
        msg = f"{tag} done in {blk['elapsed_s']:.1f}s"
        if vt is not None:
            msg += f"  ({v['label']} {M.fmt_us(vt)} us, x_gemm {M.fmt_x((v.get('speedup') or {}).get('gemm_only'))})"
        print(msg, file=sys.stderr, flush=True)
        result["meta"]["total_s"] = time.perf_counter() - t_start
        report.write_outputs(args, result)

    good = [b for b in result["blocks"] if not b.get("error")]
    print("\n" + "\n".join(report.summary_lines(good, cpu_fallback)))
    failed = [(b["name"], r["label"]) for b in good for r in b["rows"]
              if r.get("precision") and not r["precision"]["passed"]]
    errored = [(b["name"], r["label"]) for b in good for r in b["rows"] if r.get("error")]
    total = time.perf_counter() - t_start
    result["meta"]["total_s"] = total
    result["meta"]["precision_failures"] = failed
    result["meta"]["row_errors"] = errored
    if failed:
        print("precision FAIL: " + ", ".join(f"{a}/{b}" for a, b in failed))
    if errored:
        print("row errors: " + ", ".join(f"{a}/{b}" for a, b in errored))
    print(f"total {total:.1f} s{'  (CPU FALLBACK)' if cpu_fallback else ''}")
    report.write_outputs(args, result)
    if args.plot:
        msg = report.plot(args.plot, result)
        print(msg or f"plot written: {args.plot}", file=sys.stderr if msg else sys.stdout)
    if args.strict and (failed or errored):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
