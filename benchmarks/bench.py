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
  python benchmarks/bench.py --suite decode_oproj --backward
  python benchmarks/bench.py --shape 32,16,128,4096,bf16 --shape 8,4x1024,128,4096,bf16,sdpa
  python benchmarks/bench.py --json r.json --csv r.csv --plot r.png
  python benchmarks/bench.py --list

Nothing here touches the GPU at import time.  Definitions of every number are
in benchmarks/metrics.py (module docstring) and printed in the legend.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import metrics as M  # noqa: E402

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

CPU_SHAPES = [
    Shape("seed", 4, (12,), 32, 56, "fp32", regime="launch-bound"),
    Shape("cpu_mid", 8, (64,), 64, 256, "fp32", regime="cpu"),
    Shape("cpu_bf16", 4, (32,), 64, 128, "bf16", regime="cpu"),
    Shape("cpu_sdpa", 8, (2, 16), 32, 128, "fp32", strided=True, regime="strided view"),
]

SUITES = {
    "default": [s.name for s in NAMED_SHAPES],
    "cpu": [s.name for s in CPU_SHAPES],
    "small": [s.name for s in CPU_SHAPES],
    "hbm": ["decode_oproj", "tp_smallbatch"],
    "tensorcore": ["prefill_oproj", "prefill_fp16", "tp_gather"],
    "strided": ["sdpa_strided", "sdpa_contig"],
}
_BY_NAME = {s.name: s for s in CPU_SHAPES}
_BY_NAME.update({s.name: s for s in NAMED_SHAPES})

ROW_ORDER = ["vga", "reference", "permute", "gemm_only", "compile"]
BASELINES = ["reference", "permute", "gemm_only", "compile"]
LAUNCH_BOUND_US = 30.0        # graph-replay figure when any row's median is below this


def suite_shapes(name: str) -> list:
    if name in SUITES:
        return [dataclasses.replace(_BY_NAME[n]) for n in SUITES[name]]
    if name in _BY_NAME:
        return [dataclasses.replace(_BY_NAME[name])]
    raise SystemExit(f"unknown suite/shape {name!r}; known: {', '.join(list(SUITES) + list(_BY_NAME))}")


# --------------------------------------------------------------------------- the op under test

class OpInfo:
    def __init__(self):
        self.available = False
        self.kernels_loaded = False
        self.version = None
        self.path = None
        self.error = None
        self.op = None

    def label(self, device: str) -> str:
        if not self.available:
            return "vga(missing)"
        if device == "cpu":
            return "vga(cpu)"
        return "vga" if self.kernels_loaded else "vga(fallback)"

    def to_dict(self) -> dict:
        return {"available": self.available, "kernels_loaded": self.kernels_loaded,
                "version": self.version, "path": self.path, "error": self.error}


def load_op() -> OpInfo:
    """Import vga_linear (installed, else from the repo root) without failing the bench."""
    info = OpInfo()
    mod = None
    try:
        import vga_linear as mod  # noqa: F811
    except Exception as e:  # noqa: BLE001
        first = f"{type(e).__name__}: {e}"
        if ROOT not in sys.path:
            sys.path.insert(1, ROOT)
            sys.modules.pop("vga_linear", None)
            try:
                import vga_linear as mod  # noqa: F811
            except Exception as e2:  # noqa: BLE001
                info.error = f"{type(e2).__name__}: {e2}"
        else:
            info.error = first
    if mod is None:
        return info
    info.path = getattr(mod, "__file__", None)
    info.version = getattr(mod, "__version__", None)
    try:
        info.kernels_loaded = bool(mod.kernels_loaded())
    except Exception as e:  # noqa: BLE001
        info.error = f"kernels_loaded(): {type(e).__name__}: {e}"
    if not info.kernels_loaded and info.error is None:
        why = getattr(mod, "kernels_not_loaded_reason", None)
        try:
            info.error = why() if callable(why) else None
        except Exception:  # noqa: BLE001
            pass
    try:
        torch.ops.vga.gather_concat_linear  # noqa: B018  (registered?)
        info.op = mod.gather_concat_linear  # the public API: what a user calls
        info.available = True
    except Exception as e:  # noqa: BLE001
        info.error = f"torch.ops.vga.gather_concat_linear: {type(e).__name__}: {e}"
    return info


# --------------------------------------------------------------------------- rows

def reference_fn(x, weight, bias=None):
    """The seed's Model: cat of x[i] along the last dim, then F.linear."""
    return F.linear(torch.cat([x[i] for i in range(x.shape[0])], -1), weight, bias)


def permute_fn(x, weight, bias=None):
    R, H = x.shape[0], x.shape[-1]
    return F.linear(x.movedim(0, -2).reshape(*x.shape[1:-1], R * H), weight, bias)


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
    rows.append(Row("reference", "reference", fn=lambda inp: reference_fn(inp["x"], inp["w"], inp["b"])))
    rows.append(Row("permute", "permute", fn=lambda inp: permute_fn(inp["x"], inp["w"], inp["b"])))
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
            cfn = torch.compile(reference_fn, dynamic=False)
            c.fn = lambda inp: cfn(inp["x"], inp["w"], inp["b"])
        except Exception as e:  # noqa: BLE001
            c.skip = f"torch.compile unavailable: {short_err(e)}"
    rows.append(c)
    return rows


def short_err(e: BaseException, n: int = 140) -> str:
    s = f"{type(e).__name__}: {e}".strip().splitlines()
    s = s[0] if s else type(e).__name__
    return s if len(s) <= n else s[: n - 3] + "..."


# --------------------------------------------------------------------------- inputs

def make_inputs(shape: Shape, device: str, seed: int, requires_grad: bool) -> dict:
    """Fresh random inputs (never zeros). x is a strided view when shape.strided."""
    dt = M.torch_dtype(shape.dtype)
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, device=device, dtype=dt, generator=g)

    R, H, K, batch = shape.R, shape.H, shape.K, shape.batch
    if shape.strided:
        base = rn(batch[0], R, *batch[1:], H)          # e.g. sdpa_out (b, nh, s, d), contiguous
        x = base.transpose(0, 1)                        # (nh, b, s, d): R=nh, batch=(b, s), H=d
    else:
        x = rn(R, *batch, H)
    # nn.Linear's scale (weights ~ 1/sqrt(fan_in)): outputs O(1), so the fp32 tolerance
    # (atol = rtol = 1e-4) measures the kernel, not the magnitude of a sum of R*H unit terms.
    w = rn(K, R * H) / math.sqrt(R * H)
    b = rn(K) if shape.bias else None
    a = x.movedim(0, -2).reshape(shape.B, R * H).contiguous()
    gy = rn(*batch, K) if requires_grad else None
    if requires_grad:
        x = x.detach().requires_grad_()                 # detach keeps the strides
        w = w.detach().requires_grad_()
        a = a.detach().requires_grad_()
        if b is not None:
            b = b.detach().requires_grad_()
    return {"x": x, "w": w, "b": b, "a": a, "gy": gy}


def leaves(row: Row, inp: dict) -> list:
    ts = [inp["a"] if row.uses_a else inp["x"], inp["w"], inp["b"]]
    return [t for t in ts if t is not None]


def clear_grads(row: Row, inp: dict):
    for t in leaves(row, inp):
        t.grad = None


def make_call(row: Row, inp: dict, backward: bool):
    """(call, setup): call() runs the row once (fwd or fwd+bwd); setup() runs before, untimed."""
    fn = row.fn
    if not backward:
        return (lambda: fn(inp)), None
    gy = inp["gy"]
    gy2 = gy.reshape(inp["a"].shape[0], -1) if row.uses_a else gy

    def call():
        y = fn(inp)
        y.backward(gy2)
        return y

    return call, (lambda: clear_grads(row, inp))


def reference64(inp: dict, backward: bool) -> dict:
    """float64 reference from the same inputs: upcast, cat, F.linear (and autograd)."""
    x = inp["x"].detach().double()
    w = inp["w"].detach().double()
    b = inp["b"].detach().double() if inp["b"] is not None else None
    if not backward:
        with torch.no_grad():
            return {"y": reference_fn(x, w, b)}
    x.requires_grad_()
    w.requires_grad_()
    if b is not None:
        b.requires_grad_()
    y = reference_fn(x, w, b)
    y.backward(inp["gy"].double())
    out = {"y": y.detach(), "grad_x": x.grad, "grad_w": w.grad}
    if b is not None:
        out["grad_b"] = b.grad
    return out


# --------------------------------------------------------------------------- timers

def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


class GpuTimer:
    """triton.testing.do_bench's method: CUDA events around each call, the L2
    flushed before each call, warm-up first, number of runs from a time budget.

    The flush *reads* a 256 MiB buffer (do_bench zeroes one). A write flush leaves
    L2 full of dirty lines that are written back to HBM inside the next timed call,
    charging every row ~60 MB of write traffic that is not its own; a read flush
    leaves L2 clean and cold, so each row pays for exactly its own bytes."""

    def __init__(self, flush_mib: int = 256):
        self.cache = torch.ones(flush_mib * 2**20 // 4, dtype=torch.float32, device="cuda")
        self._sink = torch.empty((), dtype=torch.float32, device="cuda")

    def flush(self):
        torch.sum(self.cache, dim=0, out=self._sink)

    def run(self, fn, setup=None, warmup_ms=25.0, rep_ms=100.0, min_runs=10, max_runs=2000,
            flush=True) -> list:
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            if setup:
                setup()
            if flush:
                self.flush()
            fn()
        e.record()
        torch.cuda.synchronize()
        est = max(s.elapsed_time(e) / 5, 1e-3)
        n_warm = max(1, int(warmup_ms / est))
        n_rep = min(max(min_runs, int(rep_ms / est)), max_runs)
        for _ in range(n_warm):
            if setup:
                setup()
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            if setup:
                setup()
            if flush:
                self.flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)]   # µs


def cpu_times(fn, setup=None, budget_s=0.08, min_runs=5, max_runs=400) -> list:
    for _ in range(2):
        if setup:
            setup()
        fn()
    out = []
    t_end = time.perf_counter() + budget_s
    while len(out) < max_runs and (len(out) < min_runs or time.perf_counter() < t_end):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def wall_us(fn, setup, device: str, target_s=0.05, min_n=10, max_n=1000) -> float:
    """Eager host wall per call: N back-to-back calls, one synchronize, / N."""
    for _ in range(3):
        if setup:
            setup()
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    est = max(time.perf_counter() - t0, 1e-7)
    n = int(min(max(min_n, target_s / est), max_n))
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        if setup:
            setup()
        fn()
    sync(device)
    return (time.perf_counter() - t0) / n * 1e6


def graph_times(timer: GpuTimer, fn, args) -> list:
    """One call captured in a CUDA graph; replays timed like the eager rows (L2 flushed)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    try:
        return timer.run(g.replay, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    finally:
        del g


def peak_mem_bytes(fn, setup) -> int:
    """Peak device memory of one call above what is allocated before it (the inputs)."""
    if setup:
        setup()
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


_LAUNCH_APIS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel", "cudaGraphLaunch"}


def count_launches(fn, setup, n=3) -> dict | None:
    """GPU work items per call from torch.profiler: kernels and memcpy/memset separately."""
    from torch.profiler import profile, ProfilerActivity
    from torch.autograd import DeviceType
    if setup:
        setup()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            if setup:
                setup()
            fn()
        torch.cuda.synchronize()
    kern = memops = api = 0
    names = {}
    for ev in prof.events():
        nm = ev.name or ""
        dt = getattr(ev, "device_type", None)
        if dt == DeviceType.CPU:
            if nm in _LAUNCH_APIS:                  # host-side cross-check
                api += 1
            continue
        if dt != DeviceType.CUDA:
            continue
        act = getattr(ev, "activity_type", None)   # 'kernel', 'gpu_memcpy', 'gpu_memset', ... (newer torch)
        if act:
            if act == "kernel":
                kern += 1
            elif act in ("gpu_memcpy", "gpu_memset"):
                memops += 1
            else:
                continue                            # e.g. gpu_user_annotation ranges
        else:
            if getattr(ev, "is_user_annotation", False):
                continue
            low = nm.lower()
            if low.startswith("memcpy") or low.startswith("memset"):
                memops += 1
            else:
                kern += 1
        names[nm] = names.get(nm, 0) + 1
    if kern + memops == 0:
        return None
    k, m = kern / n, memops / n
    return {"kernels": k, "memops": m, "total": k + m, "launch_api_calls": api / n,
            "names": sorted(((v / n, nm[:100]) for nm, v in names.items()), reverse=True)[:12]}


# --------------------------------------------------------------------------- ceilings

def measure_ceilings(ctx, dtypes) -> dict:
    dev = ctx.device
    out = {"device": dev, "gemm_tflops": {}, "gemm_n": {}}
    if dev == "cuda":
        n = ctx.args.copy_mib * 2**20
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        t = ctx.timer.run(lambda: dst.copy_(src), rep_ms=100, min_runs=10, flush=False)
        med = M.time_stats(t)["median"] * 1e-6
        out["copy_bytes"] = 2 * n
        out["copy_GBps"] = 2 * n / med / 1e9
        del src, dst
    else:
        n = 64 * 2**20
        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.empty_like(src)
        med = M.time_stats(cpu_times(lambda: dst.copy_(src), budget_s=0.1))["median"] * 1e-6
        out["copy_bytes"] = 2 * n
        out["copy_GBps"] = 2 * n / med / 1e9
        del src, dst
    for d in dtypes:
        add_gemm_ceiling(ctx, out, d)
    return out


def add_gemm_ceiling(ctx, ceil: dict, dtype: str):
    if dtype in ceil["gemm_tflops"]:
        return
    dt = M.torch_dtype(dtype)
    if ctx.device == "cuda":
        N = ctx.args.gemm_n
        a = torch.randn(N, N, device="cuda", dtype=dt)
        b = torch.randn(N, N, device="cuda", dtype=dt)
        c = torch.empty(N, N, device="cuda", dtype=dt)
        t = ctx.timer.run(lambda: torch.mm(a, b, out=c), rep_ms=150, min_runs=5, flush=False)
    else:
        N = {"fp32": 512, "fp64": 256}.get(dtype, 256)
        a = torch.randn(N, N, dtype=dt)
        b = torch.randn(N, N, dtype=dt)
        c = torch.empty(N, N, dtype=dt)
        t = cpu_times(lambda: torch.mm(a, b, out=c), budget_s=0.1, min_runs=3, max_runs=50)
    med = M.time_stats(t)["median"] * 1e-6
    ceil["gemm_tflops"][dtype] = 2 * N**3 / med / 1e12
    ceil["gemm_n"][dtype] = N


# --------------------------------------------------------------------------- one block

class Ctx:
    def __init__(self, args, device, op):
        self.args = args
        self.device = device
        self.op = op
        self.compile = args.compile if args.compile is not None else (device == "cuda")
        self.compile_spent_s = 0.0
        self.timer = GpuTimer(args.flush_mib) if device == "cuda" else None
        self.ceilings = None


def bench_block(shape: Shape, backward: bool, ctx) -> dict:
    args, dev = ctx.args, ctx.device
    t_block = time.perf_counter()
    mode = "fwd+bwd" if backward else "fwd"
    add_gemm_ceiling(ctx, ctx.ceilings, shape.dtype)
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
        inp = make_inputs(shape, dev, seed=args.seed + 1 + 7919 * t, requires_grad=backward)
        ref = reference64(inp, backward)
        for r in rows:
            if r.skip or r.error:
                continue
            if r.name == "compile" and r.first_call_s is None and ctx.compile_spent_s > args.compile_budget_s:
                r.skip = f"compile budget spent ({ctx.compile_spent_s:.0f}s)"
                continue
            try:
                call, setup = make_call(r, inp, backward)
                if setup:
                    setup()
                t0 = time.perf_counter()
                y = call()
                sync(dev)
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
                    clear_grads(r, inp)
                del y
            except Exception as ex:  # noqa: BLE001
                r.error = short_err(ex)
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
    inp = make_inputs(shape, dev, seed=args.seed, requires_grad=backward)
    active = [r for r in rows if not r.skip and not r.error]
    calls = {}
    for r in active:
        calls[r.name] = make_call(r, inp, backward)
    for r in active:
        call, setup = calls[r.name]
        try:
            if dev == "cuda":
                ts = ctx.timer.run(call, setup, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                                   min_runs=args.min_runs)
            else:
                ts = cpu_times(call, setup, budget_s=args.cpu_budget_s)
            r.res["time"] = M.time_stats(ts)
        except Exception as ex:  # noqa: BLE001
            r.error = short_err(ex)
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
            r.res["graph"] = M.time_stats(graph_times(ctx.timer, calls[r.name][0], args))
        except Exception as ex:  # noqa: BLE001
            r.res["graph_error"] = short_err(ex)
            torch.cuda.synchronize()

    # 4. eager host wall, peak memory, launches
    for r in timed:
        call, setup = calls[r.name]
        try:
            r.res["wall_us"] = wall_us(call, setup, dev)
        except Exception as ex:  # noqa: BLE001
            r.res["wall_error"] = short_err(ex)
        if dev == "cuda":
            try:
                r.res["peak_mem_bytes"] = peak_mem_bytes(call, setup)
            except Exception as ex:  # noqa: BLE001
                r.res["mem_error"] = short_err(ex)
            if not args.no_profile:
                try:
                    r.res["launches"] = count_launches(call, setup)
                    if r.res["launches"] is None:
                        r.res["launch_error"] = "torch.profiler recorded no CUDA activity"
                except Exception as ex:  # noqa: BLE001
                    r.res["launch_error"] = short_err(ex)
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


# --------------------------------------------------------------------------- output

COLS = [  # header, width
    ("row", 14), ("med_us", 9), ("mean_us", 9), ("std_us", 8), ("min_us", 9), ("graph_us", 9),
    ("wall_us", 9), ("TFLOP/s", 8), ("GB/s", 7), ("%roof", 6), ("x_ref", 6), ("x_perm", 6),
    ("x_gemm", 6), ("x_comp", 6), ("max_rel", 8), ("ok", 4), ("peakMB", 8), ("mem_x", 5),
    ("launch", 6), ("fusion", 6),
]

LEGEND = """\
columns: med/mean/std/min_us = CUDA-event time per call, L2 flushed before each call (CPU: perf_counter);
  graph_us = median of CUDA-graph replays of one call (launch-bound shapes only); wall_us = eager host
  wall per call (N back-to-back calls + 1 sync, / N); TFLOP/s = 2*B*K*R*H / median (x3 fwd+bwd);
  GB/s = (x + W + bias + y) bytes once / median; %roof = roofline floor / median, floor = max(flops /
  GEMM ceiling of the dtype, bytes / copy bandwidth), ceilings measured in this run; x_<row> = that
  row's median / this row's median (>1: this row is faster); max_rel = max |out-ref64| / (|ref64| + 1)
  over all trials (fwd+bwd: over y and all grads); ok = allclose(atol=rtol=tol) on every trial;
  peakMB = peak device memory of one call above the inputs; mem_x = peakMB / reference's;
  launch = GPU kernels + memcpy/memset per call (torch.profiler); fusion = reference launches / row's."""


def fmt_launch(v):
    if v is None:
        return "-"
    t = v["total"]
    return str(int(t)) if abs(t - round(t)) < 1e-9 else f"{t:.1f}"


def row_cells(d: dict) -> list:
    t = d.get("time") or {}
    g = d.get("graph") or {}
    sp = d.get("speedup") or {}
    p = d.get("precision")
    pm = d.get("peak_mem_bytes")
    return [
        d["label"], M.fmt_us(t.get("median")), M.fmt_us(t.get("mean")), M.fmt_us(t.get("std")),
        M.fmt_us(t.get("min")), M.fmt_us(g.get("median")), M.fmt_us(d.get("wall_us")),
        M.fmt_sig(d.get("tflops")),
        M.fmt_num(d.get("gbps"), 0), M.fmt_num(d.get("pct_roofline"), 1),
        M.fmt_x(sp.get("reference")), M.fmt_x(sp.get("permute")), M.fmt_x(sp.get("gemm_only")),
        M.fmt_x(sp.get("compile")),
        M.fmt_sci(p["max_rel"]) if p else "-", ("pass" if p["passed"] else "FAIL") if p else "-",
        M.fmt_num(pm / 1e6, 1) if pm is not None else "-", M.fmt_x(d.get("mem_ratio")),
        fmt_launch(d.get("launches")), M.fmt_x(d.get("fusion_ratio")),
    ]


def fmt_line(cells) -> str:
    parts = []
    for (h, w), c in zip(COLS, cells):
        c = str(c)
        parts.append(c.ljust(w) if h == "row" else c.rjust(w))
    return " ".join(parts).rstrip()


def render_block(blk: dict) -> str:
    sh = blk["shape"]
    lines = []
    regime = f"  [{sh['regime']}]" if sh.get("regime") else ""
    lines.append(f"== {blk['name']} ({blk['mode']})  {M.Shape(**{k: sh[k] for k in ('name', 'R', 'batch', 'H', 'K', 'dtype', 'bias', 'strided')}).describe()}{regime}")
    floor = M.fmt_us(blk["floor_us"]) if blk["floor_us"] else "-"
    lines.append(f"   flops {M.fmt_flops(blk['flops'])}  bytes {M.fmt_bytes(blk['bytes'])}  "
                 f"roofline floor {floor} us ({blk['bound']}-bound; GEMM {M.fmt_sig(blk['peak_tflops'])} TFLOP/s "
                 f"{sh['dtype']}, copy {blk['copy_GBps']:.0f} GB/s)  tol {blk['tol']:g}"
                 + (f" (fp32 matmul '{blk.get('fp32_precision')}')" if sh["dtype"] == "fp32" else ""))
    lines.append(fmt_line([h for h, _ in COLS]))
    notes = []
    for d in blk["rows"]:
        if d.get("skip"):
            notes.append(f"   {d['label']}: skipped - {d['skip']}")
            continue
        lines.append(fmt_line(row_cells(d)))
        if d.get("error"):
            notes.append(f"   {d['label']}: ERROR - {d['error']}")
        for k in ("graph_error", "wall_error", "mem_error", "launch_error"):
            if d.get(k):
                notes.append(f"   {d['label']}: {k.replace('_error', '')} n/a - {d[k]}")
        if d["name"] == "compile" and d.get("first_call_s"):
            notes.append(f"   compile: first call (compile) {d['first_call_s']:.1f} s")
    return "\n".join(lines + notes)


def summary_lines(blocks: list) -> list:
    out = ["== summary (vga row; x_gemm > 1 means faster than cuBLAS on a pre-concatenated input)",
           f"{'shape':<20} {'mode':<7} {'vga_us':>9} {'graph_us':>9} {'ref_us':>9} {'gemm_us':>9} "
           f"{'x_ref':>6} {'x_gemm':>6} {'x_comp':>6} {'%roof':>6} {'max_rel':>8} {'ok':>4} {'fusion':>6}"]
    for b in blocks:
        rows = {r["name"]: r for r in b["rows"]}
        v = rows.get("vga") or {}
        sp = v.get("speedup") or {}
        p = v.get("precision")

        def med(n):
            return ((rows.get(n) or {}).get("time") or {}).get("median")
        out.append(f"{b['name'][:20]:<20} {b['mode']:<7} {M.fmt_us(med('vga')):>9} "
                   f"{M.fmt_us((v.get('graph') or {}).get('median')):>9} {M.fmt_us(med('reference')):>9} "
                   f"{M.fmt_us(med('gemm_only')):>9} {M.fmt_x(sp.get('reference')):>6} "
                   f"{M.fmt_x(sp.get('gemm_only')):>6} {M.fmt_x(sp.get('compile')):>6} "
                   f"{M.fmt_num(v.get('pct_roofline')):>6} {M.fmt_sci(p['max_rel']) if p else '-':>8} "
                   f"{('pass' if p['passed'] else 'FAIL') if p else '-':>4} {M.fmt_x(v.get('fusion_ratio')):>6}")
    # strided vs contiguous of the same problem
    for b in blocks:
        s = b["shape"]
        if not s["strided"]:
            continue
        for c in blocks:
            cs = c["shape"]
            if (not cs["strided"] and c["mode"] == b["mode"] and
                    all(cs[k] == s[k] for k in ("R", "batch", "H", "K", "dtype", "bias"))):
                parts = []
                for name in ROW_ORDER:
                    rb = next((r for r in b["rows"] if r["name"] == name and r.get("time")), None)
                    rc = next((r for r in c["rows"] if r["name"] == name and r.get("time")), None)
                    if rb and rc:
                        parts.append(f"{name} {rb['time']['median'] / rc['time']['median']:.2f}")
                out.append(f"strided/contiguous time ({b['name']} / {c['name']}, {b['mode']}; target 1.00): "
                           + ", ".join(parts))
                b["strided_over_contiguous"] = c["name"]
                break
    return out


CSV_FIELDS = ["shape", "mode", "spec", "R", "B", "H", "K", "dtype", "bias", "strided", "row", "label",
              "median_us", "mean_us", "std_us", "min_us", "n_runs", "graph_us", "wall_us", "tflops",
              "gbps", "pct_roofline", "floor_us", "bound", "speedup_vs_reference", "speedup_vs_permute",
              "speedup_vs_gemm_only", "speedup_vs_compile", "speedup_vs_vga", "max_abs", "mean_abs",
              "max_rel", "tol", "passed", "peak_mem_mb", "mem_ratio", "kernels", "memops", "launches",
              "fusion_ratio", "skip", "error"]


def csv_rows(blocks):
    for b in blocks:
        s = b["shape"]
        for d in b["rows"]:
            t = d.get("time") or {}
            p = d.get("precision") or {}
            sp = d.get("speedup") or {}
            ln = d.get("launches") or {}
            pm = d.get("peak_mem_bytes")
            yield {
                "shape": b["name"], "mode": b["mode"], "spec": s["spec"], "R": s["R"], "B": s["B"],
                "H": s["H"], "K": s["K"], "dtype": s["dtype"], "bias": s["bias"], "strided": s["strided"],
                "row": d["name"], "label": d["label"], "median_us": t.get("median"),
                "mean_us": t.get("mean"), "std_us": t.get("std"), "min_us": t.get("min"),
                "n_runs": t.get("n"), "graph_us": (d.get("graph") or {}).get("median"),
                "wall_us": d.get("wall_us"), "tflops": d.get("tflops"), "gbps": d.get("gbps"),
                "pct_roofline": d.get("pct_roofline"), "floor_us": b["floor_us"], "bound": b["bound"],
                **{f"speedup_vs_{k}": sp.get(k) for k in ROW_ORDER},
                "max_abs": p.get("max_abs"), "mean_abs": p.get("mean_abs"), "max_rel": p.get("max_rel"),
                "tol": b["tol"], "passed": p.get("passed"),
                "peak_mem_mb": pm / 1e6 if pm is not None else None, "mem_ratio": d.get("mem_ratio"),
                "kernels": ln.get("kernels"), "memops": ln.get("memops"), "launches": ln.get("total"),
                "fusion_ratio": d.get("fusion_ratio"), "skip": d.get("skip"), "error": d.get("error"),
            }


def write_outputs(args, result):
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=_json_default)
        os.replace(tmp, args.json)
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for row in csv_rows(result["blocks"]):
                w.writerow(row)


def _json_default(o):
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return str(o)


def plot(path: str, result: dict) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"--plot skipped: matplotlib not available ({short_err(e)})"
    blocks = result["blocks"]
    labels = [b["name"] + (" (f+b)" if b["mode"] != "fwd" else "") for b in blocks]
    series = [r for r in ROW_ORDER]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(blocks) + 3), 8.5), constrained_layout=True)
    width = 0.8 / len(series)
    colors = {"vga": "tab:red", "reference": "tab:gray", "permute": "tab:blue",
              "gemm_only": "tab:green", "compile": "tab:purple"}
    for si, name in enumerate(series):
        sp, pr = [], []
        for b in blocks:
            r = next((r for r in b["rows"] if r["name"] == name), {})
            if name == "gemm_only":
                sp.append(1.0 if r.get("time") else float("nan"))
            else:
                sp.append(((r.get("speedup") or {}).get("gemm_only")) or float("nan"))
            pr.append(r.get("pct_roofline") or float("nan"))
        xs = [i + (si - (len(series) - 1) / 2) * width for i in range(len(blocks))]
        axes[0].bar(xs, sp, width, label=name, color=colors.get(name))
        axes[1].bar(xs, pr, width, label=name, color=colors.get(name))
        if name == "vga":           # label the op's bars with their values
            for x, a, b in zip(xs, sp, pr):
                if a == a:
                    axes[0].annotate(f"{a:.2f}x", (x, a), ha="center", va="bottom", fontsize=7)
                if b == b:
                    axes[1].annotate(f"{b:.0f}%", (x, b), ha="center", va="bottom", fontsize=7)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("speedup vs gemm_only (x)")
    axes[0].set_title("speedup vs cuBLAS on a pre-concatenated input (>1 = faster)")
    axes[1].axhline(100.0, color="k", lw=0.8)
    axes[1].set_ylabel("% of roofline floor")
    axes[1].set_title("% of roofline (floor = max(flops/GEMM peak, bytes/copy BW), measured ceilings)")
    for ax in axes:
        ax.set_xticks(range(len(blocks)))
        ax.set_xticklabels(labels, rotation=20, ha="right")
        ax.grid(axis="y", alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=len(series), fontsize=9)
    m = result["meta"]
    fig.suptitle(f"vga-linear bench - {m['device_name']} - torch {m['torch']}"
                 + (" - CPU FALLBACK" if m["cpu_fallback"] else ""))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------- main

def git_commit():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=5)
        return r.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def pkg_version(name):
    try:
        import importlib.metadata as md
        return md.version(name)
    except Exception:  # noqa: BLE001
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="suites: " + ", ".join(f"{k}={'+'.join(v)}" for k, v in SUITES.items()))
    p.add_argument("--suite", action="append", default=None,
                   help="suite or shape name (repeatable); default: 'default' on CUDA, 'cpu' without")
    p.add_argument("--shape", action="append", default=[], metavar="R,B,H,K,dtype[,nobias][,sdpa]",
                   help="custom shape (repeatable); B may be bxs for two batch dims; sdpa = x as "
                        "sdpa_out.transpose(0,1)")
    p.add_argument("--backward", action="store_true", help="also time forward+backward of every row")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--csv", metavar="PATH")
    p.add_argument("--plot", metavar="PATH", help="PNG: speedup vs gemm_only and %% of roofline per shape")
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
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for k, v in SUITES.items():
            print(f"suite {k}: {', '.join(v)}")
        for s in NAMED_SHAPES + CPU_SHAPES[1:]:
            print(f"  {s.name:<15} {s.spec():<28} {s.regime}")
        return 0
    t_start = time.perf_counter()
    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = "cuda" if (args.device == "cuda" or (args.device == "auto" and has_cuda)) else "cpu"
    cpu_fallback = device == "cpu"

    shapes = []
    for s in args.suite or ([] if args.shape else ["default" if device == "cuda" else "cpu"]):
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
    fp32_prec = torch.get_float32_matmul_precision()

    op = load_op()
    if args.require_kernels and device == "cuda" and not op.kernels_loaded:
        print(f"error: --require-kernels: vga_linear CUDA kernels not loaded ({op.error or 'kernels_loaded() is False'})",
              file=sys.stderr)
        return 2
    ctx = Ctx(args, device, op)
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())

    banner = []
    if cpu_fallback:
        banner.append("*** CPU FALLBACK: no CUDA device" + ("" if not has_cuda else " (--device cpu)") +
                      " - running the CPU path; times are host perf_counter figures, not GPU numbers. ***")
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    ncpu = os.cpu_count() or 1
    if cpu_fallback:
        banner[-1] = banner[-1][:-4] + f" (torch threads {torch.get_num_threads()}, {ncpu} CPUs) ***"
        if load1 is not None and load1 > 0.75 * ncpu:
            banner.append(f"*** warning: load average {load1:.1f} on {ncpu} CPUs - other work is running; "
                          "CPU timings will be noisy ***")
    banner.append(f"vga-linear bench {BENCH_VERSION}  device: {dev_name}  torch {torch.__version__}"
                  f" (cuda {torch.version.cuda})  triton {pkg_version('triton')}  python {platform.python_version()}")
    if op.available:
        banner.append(f"op: vga_linear.gather_concat_linear (torch.ops.vga.gather_concat_linear below autograd when no grad is needed)  vga_linear {op.version}  "
                      f"kernels_loaded={op.kernels_loaded}  ({op.path})")
        if device == "cuda" and not op.kernels_loaded:
            banner.append("*** vga_linear CUDA extension NOT loaded: the 'vga(fallback)' row is the Python fallback"
                          f" ({op.error or 'kernels_loaded() is False'}) ***")
    else:
        banner.append(f"*** op unavailable: {op.error} - the vga row is skipped ***")
    banner.append(f"fp32 matmul precision: '{fp32_prec}' (TF32 {'on' if args.allow_tf32 else 'off'}); "
                  f"precision: {args.trials} fresh torch.randn trials vs float64 reference; "
                  f"timing: " + ("CUDA events, L2 flushed by a 256 MiB read before each call" if device == "cuda"
                                 else "perf_counter per call"))
    print("\n".join(banner), flush=True)

    print(f"[ceilings] measuring on {device} ...", file=sys.stderr, flush=True)
    ctx.ceilings = measure_ceilings(ctx, sorted({s.dtype for s in shapes}))
    c = ctx.ceilings
    print(f"ceilings (measured now): copy {c['copy_GBps']:.0f} GB/s (read+write of {c['copy_bytes'] / 1e9:.2f} GB); "
          + ", ".join(f"{k} GEMM {M.fmt_sig(v)} TFLOP/s (N={c['gemm_n'][k]})" for k, v in c["gemm_tflops"].items()))
    print(LEGEND, flush=True)

    meta = {
        "bench_version": BENCH_VERSION, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device, "device_name": dev_name, "cpu_fallback": cpu_fallback,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": pkg_version("triton"),
        "python": platform.python_version(), "host": platform.node(), "git_commit": git_commit(),
        "cpu_count": ncpu, "torch_threads": torch.get_num_threads(), "loadavg_1min": load1,
        "op": op.to_dict(), "fp32_matmul_precision": fp32_prec, "allow_tf32": bool(args.allow_tf32),
        "compile": ctx.compile, "argv": sys.argv[1:] if argv is None else list(argv),
        "timing": ("CUDA events around each call, 256 MiB read-only L2 flush before each, warm-up, median"
                   if device == "cuda" else "time.perf_counter per call, median"),
        "definitions": M.__doc__,
    }
    result = {"meta": meta, "ceilings": ctx.ceilings, "blocks": []}
    modes = [False, True] if args.backward else [False]
    jobs = [(s, m) for s in shapes for m in modes]
    for i, (s, bwd) in enumerate(jobs):
        tag = f"[{i + 1}/{len(jobs)}] {s.name} {s.spec()} {'fwd+bwd' if bwd else 'fwd'}"
        print(f"{tag} ...", file=sys.stderr, flush=True)
        try:
            blk = bench_block(s, bwd, ctx)
        except Exception as e:  # noqa: BLE001
            print(f"{tag} FAILED: {short_err(e)}", file=sys.stderr, flush=True)
            if args.verbose:
                traceback.print_exc()
            result["blocks"].append({"name": s.name, "mode": "fwd+bwd" if bwd else "fwd",
                                     "shape": s.to_dict(), "error": short_err(e), "rows": []})
            continue
        result["blocks"].append(blk)
        print("\n" + render_block(blk), flush=True)
        v = next((r for r in blk["rows"] if r["name"] == "vga"), {})
        vt = (v.get("time") or {}).get("median")
        msg = f"{tag} done in {blk['elapsed_s']:.1f}s"
        if vt is not None:
            msg += f"  ({v['label']} {M.fmt_us(vt)} us, x_gemm {M.fmt_x((v.get('speedup') or {}).get('gemm_only'))})"
        print(msg, file=sys.stderr, flush=True)
        result["meta"]["total_s"] = time.perf_counter() - t_start
        write_outputs(args, result)

    good = [b for b in result["blocks"] if not b.get("error")]
    print("\n" + "\n".join(summary_lines(good)))
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
    write_outputs(args, result)
    if args.plot:
        msg = plot(args.plot, result)
        print(msg or f"plot written: {args.plot}", file=sys.stderr if msg else sys.stdout)
    if args.strict and (failed or errored):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
