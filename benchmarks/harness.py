"""The benchmarks' shared instrument: the problem and its baselines, timers, ceilings, reporting.

bench.py, sweep.py, families.py, floors.py, bench_distributed.py, train_step.py, graph_calls.py
and call_anatomy.py import it;
metrics.py holds the definitions of the numbers (flops, bytes, roofline, precision, formats).
Nothing here touches the GPU at import time.

  the op      load_op(): vga_linear (installed, else this checkout), never failing the caller
  the problem make_inputs(), reference_fn / permute_fn (what users write), reference64()
  timers      GpuTimer (CUDA events, L2 flushed by a read before each call), cpu_times,
              wall_us, graph_times, peak_mem_bytes, profile_call
  ceilings    measure_ceilings(), add_gemm_ceiling(): copy bandwidth and GEMM rate, measured now
  reporting   environment(), write_json(), pyplot(), short_err()
"""
from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import metrics as M  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def short_err(e: BaseException, n: int = 140) -> str:
    s = f"{type(e).__name__}: {e}".strip().splitlines()
    s = s[0] if s else type(e).__name__
    return s if len(s) <= n else s[: n - 3] + "..."


# --------------------------------------------------------------------------- the op under test

class OpInfo:
    def __init__(self):
        self.available = False
        self.kernels_loaded = False
        self.version = None
        self.path = None
        self.error = None
        self.op = None
        self.module = None

    def label(self, device: str) -> str:
        if not self.available:
            return "vga(missing)"
        if device == "cpu":
            return "vga(cpu)"
        return "vga" if self.kernels_loaded else "vga(fallback)"

    def to_dict(self) -> dict:
        return {"available": self.available, "kernels_loaded": self.kernels_loaded,
                "version": self.version, "path": self.path, "error": self.error}


def import_vga_linear():
    """vga_linear as installed, else from this checkout's root; raises what the import raised."""
    try:
        import vga_linear
        return vga_linear
    except Exception:  # noqa: BLE001
        if ROOT in sys.path:
            raise
        sys.path.insert(1, ROOT)
        sys.modules.pop("vga_linear", None)
        import vga_linear
        return vga_linear


def load_op() -> OpInfo:
    """Import vga_linear without failing the bench; say what was found."""
    info = OpInfo()
    try:
        mod = import_vga_linear()
    except Exception as e:  # noqa: BLE001
        info.error = f"{type(e).__name__}: {e}"
        return info
    info.module = mod
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


def kernel_choice(x, w, b) -> str | None:
    """The family auto-dispatch picks for these inputs, with the GEMM core's configuration
    ("sm90_gemm/n128/s2"; None without the CUDA kernels)."""
    try:
        return str(torch.ops.vga._gather_concat_linear_choice(x, w, b))
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------- the problem

def reference_fn(x, weight, bias=None):
    """The seed's Model: cat of x[i] along the last dim, then F.linear."""
    return F.linear(torch.cat([x[i] for i in range(x.shape[0])], -1), weight, bias)


def permute_fn(x, weight, bias=None):
    """What users write: x.movedim(0, -2).reshape(*batch, R*H) -- for x = attn.transpose(0, 1) of
    an attention output attn (b, heads, s, d), that is attn.transpose(1, 2).reshape(b, s, heads*d)."""
    R, H = x.shape[0], x.shape[-1]
    return F.linear(x.movedim(0, -2).reshape(*x.shape[1:-1], R * H), weight, bias)


def make_inputs(shape: M.Shape, device: str, seed: int, requires_grad: bool) -> dict:
    """Fresh random inputs (never zeros): x (a strided view when shape.strided), w, b, the
    pre-concatenated a = (*batch, R*H) contiguous, and gy (*batch, K) for the backward."""
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
    a = x.movedim(0, -2).reshape(*batch, R * H).contiguous()
    gy = rn(*batch, K) if requires_grad else None
    if requires_grad:
        x = x.detach().requires_grad_()                 # detach keeps the strides
        w = w.detach().requires_grad_()
        a = a.detach().requires_grad_()
        if b is not None:
            b = b.detach().requires_grad_()
    return {"x": x, "w": w, "b": b, "a": a, "gy": gy}


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
        """Times of fn() in µs, one per run."""
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
    """Times of fn() in µs by perf_counter, for budget_s seconds."""
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


def capture_graph(fn, calls: int = 1) -> "torch.cuda.CUDAGraph":
    """`calls` back-to-back calls of fn captured in one CUDA graph, after three warm-up calls on a
    side stream (what capture requires: allocator pools and lazy initialisation settled)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g


def graph_times(timer: GpuTimer, fn, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> list:
    """One call captured in a CUDA graph; replays timed like the eager rows (L2 flushed)."""
    g = capture_graph(fn)
    try:
        return timer.run(g.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)
    finally:
        del g


def back_to_back_us(fn, calls: int = 20, replays: int = 5) -> float:
    """Per-call time of `calls` back-to-back calls captured in one CUDA graph (no host gaps, no L2
    flush: operands stay wherever the previous call left them), median over `replays` replays.
    The A/B measure of kernel variants in benchmarks/NOTES.md, whose differences of a few percent
    the flushed eager timings' call-to-call drift would hide."""
    g = capture_graph(fn, calls)
    g.replay()  # (the first replay uploads the graph)
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del g
    return statistics.median(times)


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


def _union_us(intervals) -> float:
    """Total length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def profile_call(fn, setup, n=3) -> dict | None:
    """GPU work items per call from torch.profiler: kernels and memcpy/memset separately, and the
    GPU's busy time per call (the union of their intervals: kernels that overlap count once, the
    gaps the host leaves between them not at all; the calls back to back, no L2 flush)."""
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
    busy = []
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
        busy.append((ev.time_range.start, ev.time_range.end))
    if kern + memops == 0:
        return None
    k, m = kern / n, memops / n
    return {"kernels": k, "memops": m, "total": k + m, "launch_api_calls": api / n, "busy_us": _union_us(busy) / n,
            "names": sorted(((v / n, nm[:100]) for nm, v in names.items()), reverse=True)[:12]}


# --------------------------------------------------------------------------- ceilings

def measure_ceilings(device: str, timer: GpuTimer | None, dtypes, copy_mib: int = 1024,
                     gemm_n: int = 8192) -> dict:
    """Copy bandwidth (read + write) and the GEMM rate of each dtype, measured now."""
    out = {"device": device, "gemm_tflops": {}, "gemm_n": {}}
    n, median_us = _copy_time(device, timer, copy_mib)
    out["copy_bytes"] = 2 * n
    out["copy_GBps"] = 2 * n / (median_us * 1e-6) / 1e9
    for d in dtypes:
        add_gemm_ceiling(out, d, device, timer, gemm_n)
    return out


def _copy_time(device: str, timer: GpuTimer | None, copy_mib: int) -> tuple[int, float]:
    """(bytes, median µs) of a device-to-device copy (its buffers are freed on return)."""
    if device == "cuda":
        n = copy_mib * 2**20
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        t = timer.run(lambda: dst.copy_(src), rep_ms=100, min_runs=10, flush=False)
    else:
        n = 64 * 2**20
        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.empty_like(src)
        t = cpu_times(lambda: dst.copy_(src), budget_s=0.1)
    return n, M.time_stats(t)["median"]


def add_gemm_ceiling(ceil: dict, dtype: str, device: str, timer: GpuTimer | None, gemm_n: int = 8192):
    """ceil["gemm_tflops"][dtype]: an N^3 torch.mm (N = gemm_n on CUDA, small on CPU)."""
    if dtype in ceil["gemm_tflops"]:
        return
    dt = M.torch_dtype(dtype)
    if device == "cuda":
        N = gemm_n
        a = torch.randn(N, N, device="cuda", dtype=dt)
        b = torch.randn(N, N, device="cuda", dtype=dt)
        c = torch.empty(N, N, device="cuda", dtype=dt)
        t = timer.run(lambda: torch.mm(a, b, out=c), rep_ms=150, min_runs=5, flush=False)
    else:
        N = {"fp32": 512, "fp64": 256}.get(dtype, 256)
        a = torch.randn(N, N, dtype=dt)
        b = torch.randn(N, N, dtype=dt)
        c = torch.empty(N, N, dtype=dt)
        t = cpu_times(lambda: torch.mm(a, b, out=c), budget_s=0.1, min_runs=3, max_runs=50)
    med = M.time_stats(t)["median"] * 1e-6
    ceil["gemm_tflops"][dtype] = 2 * N**3 / med / 1e12
    ceil["gemm_n"][dtype] = N


# --------------------------------------------------------------------------- reporting

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


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())


def build_inputs():
    """The hash of the sources the loaded extension was built from (setup.py writes it; tools/dev.py
    recomputes it from a checkout): names the kernels even where git_commit is the checkout's stale
    HEAD (a copied working tree with uncommitted changes)."""
    try:
        from vga_linear import _build_info
        return getattr(_build_info, "BUILD_INPUTS", None)
    except Exception:  # noqa: BLE001
        return None


def environment(device: str, op: OpInfo | None = None, argv=None) -> dict:
    """What ran where: the metadata every JSON result carries."""
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device, "device_name": device_name(device), "cpu_fallback": device == "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": pkg_version("triton"),
        "python": platform.python_version(), "host": platform.node(), "git_commit": git_commit(),
        "build_inputs": build_inputs(),
        "cpu_count": os.cpu_count() or 1, "torch_threads": torch.get_num_threads(), "loadavg_1min": load1,
        "fp32_matmul_precision": torch.get_float32_matmul_precision(),
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    if op is not None:
        meta["op"] = op.to_dict()
    return meta


def _json_default(o):
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return str(o)


def write_json(path: str | None, obj) -> None:
    """Write obj as JSON atomically (a temporary file, then a rename); None writes nothing."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def pyplot():
    """(matplotlib.pyplot, None) with the Agg backend, or (None, why not)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return None, f"matplotlib not available ({short_err(e)})"
    return plt, None


def save_figure(fig, path: str) -> None:
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- calls

def leaves(inp: dict, uses_a: bool) -> list:
    ts = [inp["a"] if uses_a else inp["x"], inp["w"], inp["b"]]
    return [t for t in ts if t is not None]


def clear_grads(inp: dict, uses_a: bool):
    for t in leaves(inp, uses_a):
        t.grad = None


def make_call(fn, inp: dict, backward: bool, uses_a: bool = False):
    """(call, setup): call() runs fn(inp) once, forward or forward + backward (of x or a, w and b
    against inp["gy"]); setup() clears the gradients before each call, untimed."""
    if not backward:
        return (lambda: fn(inp)), None
    gy = inp["gy"]

    def call():
        y = fn(inp)
        y.backward(gy)
        return y

    return call, (lambda: clear_grads(inp, uses_a))
