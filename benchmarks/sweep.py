#!/usr/bin/env python
"""The sweep: the op over real layer shapes x token counts, against what users run instead.

    python benchmarks/bench.py --suite sweep [--json s.json] [--plot s.png]   # forward, ~200 points
    python benchmarks/bench.py --suite sweep --backward                       # fwd+bwd, a subset
    python benchmarks/bench.py --suite sweep --layers 7b_oproj,vit_b --rows 64,333 --dtypes bf16

Each point (layer, token count, dtype) times, in the same run and interleaved (two rounds of
vga, gemm_only, permute), with CUDA events and the L2 flushed before each call:

  vga        vga_linear.gather_concat_linear(x, W, b), x (R, rows, H)
  gemm_only  F.linear(A, W, b) on a pre-concatenated contiguous (rows, R*H) A (cuBLAS)
  permute    F.linear(x.movedim(0, -2).reshape(rows, R*H), W, b): what users write

and checks the op's output against a float64 reference (atol = rtol = the op's tolerance).
It prints every point (with the kernel family auto-dispatch picks), then per dtype the
distribution of vga/gemm_only and vga/permute time ratios (median, p90, max, the count above
1.1x) and issue 19's targets on the half types; --json writes the points and the summary,
--plot draws the ratio against rows, one line per layer. With --backward each row is forward +
backward of x (or A), W and b, and each point also gets the GPU's busy time of each row per call
(harness.profile_call: calls back to back, no flush) and its ratios ("gpu vga/gemm_only", "gpu
vga/permute"): the small layers' eager fwd+bwd is host-bound, so their event times measure the
host, and those ratios say what the kernels do. The sweep is a sample: rules fitted to it must hold
elsewhere.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import harness as H  # noqa: E402
import metrics as M  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name: (R, H, K)
LAYERS = {
    "7b_oproj": (32, 128, 4096),      # attention o_proj, Llama-2 7B
    "13b_oproj": (40, 128, 5120),     # Llama-2 13B
    "70b_oproj": (64, 128, 8192),     # 70B class
    "tp8_ag_8192": (8, 1024, 8192),   # tensor-parallel all-gather widths
    "tp4_ag_8192": (4, 2048, 8192),
    "tp8_ag_4096": (8, 512, 4096),
    "vit_b_heads": (12, 64, 768),     # ViT-B/16 attention output
    "vit_h_heads": (16, 80, 1280),    # ViT-H/14: 80-wide heads
    "branch3_1000": (3, 256, 1000),   # parallel branches concatenated into a classifier
    "branch2_768": (2, 1536, 768),
    "h96_3072": (32, 96, 3072),       # 96-wide heads
}
ALL_ROWS = (1, 16, 64, 100, 128, 256, 333, 512, 1024, 2048, 4096, 8192)
# (dtype, layers, token counts): every layer at every token count in bf16, a spread in fp16, a few fp32
FORWARD_PLAN = [
    ("bf16", tuple(LAYERS), ALL_ROWS),
    ("fp16", tuple(LAYERS), (16, 100, 333, 1024, 4096)),
    ("fp32", ("7b_oproj", "tp8_ag_4096", "vit_b_heads", "branch3_1000"), (16, 256, 2048)),
]
BACKWARD_PLAN = [
    ("bf16", ("7b_oproj", "70b_oproj", "tp8_ag_8192", "vit_b_heads", "branch3_1000", "h96_3072"),
     (256, 1024, 4096)),
]
CPU_PLAN = [("fp32", ("vit_b_heads", "branch3_1000"), (1, 16, 64))]   # the CPU figures mean little
ROWS = ("vga", "gemm_only", "permute")
RATIOS = ("vga/gemm_only", "vga/permute")
GPU_RATIOS = ("gpu vga/gemm_only", "gpu vga/permute")  # --backward on a GPU: busy-time ratios
# issue 19, on the half types: vga/gemm_only median, p90, max; vga/permute at every point
TARGETS = {"vga/gemm_only": {"median": 0.98, "p90": 1.05, "max": 1.15}, "vga/permute": {"max": 1.05}}
SLOW = 1.1
# The half types' distribution again by token band: the decode family's rows (sm90_skinny, <= 64), the GEMM
# core's short prefills (65-1023: fewer 128-row tiles than a 4096-wide layer needs to fill the SMs) and
# its long ones (>= 1024). A median over all rows hides a band that misses (run 147: 100-512 rows).
BANDS = (("rows 1-64", 1, 64), ("rows 65-1023", 65, 1023), ("rows >= 1024", 1024, None))


def describe() -> str:
    n = sum(len(layers) * len(rows) for _, layers, rows in FORWARD_PLAN)
    nb = sum(len(layers) * len(rows) for _, layers, rows in BACKWARD_PLAN)
    return (f"{len(LAYERS)} layers x token counts {','.join(map(str, ALL_ROWS))} x bf16/fp16/fp32 "
            f"({n} points; --backward: {nb} fwd+bwd points)")


def add_arguments(p) -> None:
    g = p.add_argument_group("sweep (--suite sweep)")
    g.add_argument("--layers", default=None, help=f"comma-separated layer names ({', '.join(LAYERS)})")
    g.add_argument("--rows", default=None, help="comma-separated token counts (default: the plan's)")
    g.add_argument("--dtypes", default=None, help="comma-separated dtypes (default: the plan's)")
    g.add_argument("--sweep-rep-ms", type=float, default=10.0,
                   help="timing budget per row and round (CUDA; default 10 ms, 2 rounds)")


def plan_points(args, device: str) -> list[tuple[str, str, int]]:
    """[(dtype, layer, rows), ...] from the default plan and the --layers/--rows/--dtypes overrides."""
    plan = BACKWARD_PLAN if args.backward else FORWARD_PLAN
    if device == "cpu":
        plan = CPU_PLAN
    layers = args.layers.split(",") if args.layers else None
    rows = tuple(int(v) for v in args.rows.split(",")) if args.rows else None
    dtypes = [M.canon_dtype(d) for d in args.dtypes.split(",")] if args.dtypes else None
    for name in layers or ():
        if name not in LAYERS:
            raise SystemExit(f"unknown layer {name!r}; known: {', '.join(LAYERS)}")
    if dtypes:
        by_dtype = {d: (ls, rs) for d, ls, rs in plan}
        first = plan[0]
        plan = [(d, *by_dtype.get(d, first[1:])) for d in dtypes]
    points = []
    for dtype, plan_layers, plan_rows in plan:
        for layer in layers or plan_layers:
            for n in rows or plan_rows:
                points.append((dtype, layer, n))
    return points


def _time_rows(fns: dict, timer, device: str, args, backward: bool) -> dict:
    """Median µs of each (call, setup) in fns, timed in two interleaved rounds."""
    samples = {k: [] for k in fns}
    rep_ms = args.sweep_rep_ms
    for _ in range(2):
        for name, (call, setup) in fns.items():
            if device == "cuda":
                samples[name] += timer.run(call, setup, warmup_ms=rep_ms / 4, rep_ms=rep_ms,
                                           min_runs=4 if backward else 8, max_runs=60)
            else:
                samples[name] += H.cpu_times(call, setup, budget_s=0.01, min_runs=3, max_runs=50)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure_point(dtype: str, layer: str, rows: int, op, timer, device: str, args) -> dict:
    R, Hd, K = LAYERS[layer]
    backward = bool(args.backward)
    shape = M.Shape(f"{layer}@{rows}", R, (rows,), Hd, K, dtype)
    inp = H.make_inputs(shape, device, seed=args.seed + rows, requires_grad=backward)
    d = {"layer": layer, "R": R, "H": Hd, "K": K, "rows": rows, "dtype": dtype,
         "mode": "fwd+bwd" if backward else "fwd", "family": None}
    with torch.no_grad():
        x, w, b = (t.detach() if t is not None else None for t in (inp["x"], inp["w"], inp["b"]))
        d["family"] = H.kernel_choice(x, w, b)
        y = op.op(x, w, b)
        ref = H.reference64({"x": x, "w": w, "b": b}, backward=False)["y"]
        err = M.error_stats(y, ref, M.tolerance_for(dtype))
        d["max_rel"], d["passed"] = err["max_rel"], err["passed"]
        del y, ref
    fns = {
        "vga": H.make_call(lambda i: op.op(i["x"], i["w"], i["b"]), inp, backward),
        "gemm_only": H.make_call(lambda i: F.linear(i["a"], i["w"], i["b"]), inp, backward, uses_a=True),
        "permute": H.make_call(lambda i: H.permute_fn(i["x"], i["w"], i["b"]), inp, backward),
    }
    med = _time_rows(fns, timer, device, args, backward)
    for name in ROWS:
        d[f"{name}_us"] = med[name]
    d["vga/gemm_only"] = med["vga"] / med["gemm_only"]
    d["vga/permute"] = med["vga"] / med["permute"]
    if backward and device == "cuda" and not args.no_profile:
        try:
            busy = {name: (H.profile_call(*fns[name]) or {}).get("busy_us") for name in ROWS}
        except Exception as e:  # noqa: BLE001  (the profiler unavailable: the point keeps its times)
            busy = dict.fromkeys(ROWS)
            d["profile_error"] = H.short_err(e)
        for name in ROWS:
            d[f"{name}_gpu_us"] = busy[name]
        if all(busy.values()):
            d["gpu vga/gemm_only"] = busy["vga"] / busy["gemm_only"]
            d["gpu vga/permute"] = busy["vga"] / busy["permute"]
    return d


def _quantile(v: list, q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty list."""
    s = sorted(v)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def distribution(points: list) -> dict:
    """Per ratio: n, median, p90, max, the count above 1.1x and the worst point."""
    out = {}
    for key in RATIOS + GPU_RATIOS:
        v = [p[key] for p in points if p.get(key) is not None]
        if not v:
            continue
        worst = max(points, key=lambda p: p.get(key) or 0.0)
        out[key] = {"n": len(v), "median": statistics.median(v), "p90": _quantile(v, 0.9), "max": max(v),
                    "above_1.1": sum(r > SLOW for r in v),
                    "worst": f"{worst['layer']} rows={worst['rows']} {worst['dtype']}"}
    return out


def targets_met(dist: dict) -> dict:
    return {f"{key} {stat} <= {bound:g}": dist[key][stat] <= bound
            for key, bounds in TARGETS.items() if key in dist for stat, bound in bounds.items()}


def summarize(points: list) -> dict:
    groups = {d: [p for p in points if p["dtype"] == d] for d in dict.fromkeys(p["dtype"] for p in points)}
    half = [p for p in points if p["dtype"] in ("bf16", "fp16")]
    if "bf16" in groups and "fp16" in groups:
        groups["half (bf16+fp16)"] = half
    for band, low, high in BANDS:
        in_band = [p for p in half if p["rows"] >= low and (high is None or p["rows"] <= high)]
        if in_band and len(in_band) < len(half):
            groups[f"half, {band}"] = in_band
    summary = {name: distribution(ps) for name, ps in groups.items() if ps}
    if half:
        summary["targets (half types, issue 19)"] = targets_met(distribution(half))
    return summary


def point_line(p: dict) -> str:
    ok = "pass" if p["passed"] else "FAIL"
    slow = " <" if max(p["vga/gemm_only"], p["vga/permute"]) > SLOW else ""
    gpu = (f"  gpu {p['gpu vga/gemm_only']:.2f} / {p['gpu vga/permute']:.2f}"
           if p.get("gpu vga/gemm_only") is not None else "")
    return (f"{p['layer']:<14} {p['dtype']:<5} {p['rows']:>6} {str(p['family']):>18} {M.fmt_us(p['vga_us']):>9} "
            f"{M.fmt_us(p['gemm_only_us']):>9} {M.fmt_us(p['permute_us']):>9} {p['vga/gemm_only']:>9.2f} "
            f"{p['vga/permute']:>8.2f} {M.fmt_sci(p['max_rel']):>8} {ok:>4}{slow}{gpu}")


HEADER = (f"{'layer':<14} {'dtype':<5} {'rows':>6} {'family':>18} {'vga_us':>9} {'gemm_us':>9} {'perm_us':>9} "
          f"{'vga/gemm':>9} {'vga/perm':>8} {'max_rel':>8} {'ok':>4}")


def summary_lines(summary: dict) -> list:
    lines = [f"== distribution of time ratios (vga / row; < 1: vga faster; '<' above marks a point > {SLOW}x;"
             " gpu: of the GPU's busy time)",
             f"{'dtype':<18} {'ratio':<18} {'n':>4} {'median':>7} {'p90':>7} {'max':>7} {'>1.1x':>6}  worst"]
    for group, dist in summary.items():
        if group.startswith("targets"):
            continue
        for key, st in dist.items():
            lines.append(f"{group:<18} {key:<18} {st['n']:>4} {st['median']:>7.3f} {st['p90']:>7.3f} "
                         f"{st['max']:>7.3f} {st['above_1.1']:>6}  {st['worst']}")
    for group, met in summary.items():
        if group.startswith("targets"):
            lines.append(f"{group}: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()))
    return lines


def plot(path: str, result: dict) -> str | None:
    plt, why = H.pyplot()
    if plt is None:
        return f"--plot skipped: {why}"
    points = result["points"]
    dtypes = list(dict.fromkeys(p["dtype"] for p in points))
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(14, 4.2 * len(dtypes)), squeeze=False,
                             constrained_layout=True)
    cmap = plt.get_cmap("tab20")
    layers = list(dict.fromkeys(p["layer"] for p in points))
    for i, dt in enumerate(dtypes):
        for j, key in enumerate(RATIOS):
            ax = axes[i][j]
            for li, layer in enumerate(layers):
                ps = sorted((p for p in points if p["dtype"] == dt and p["layer"] == layer), key=lambda p: p["rows"])
                if ps:
                    R, Hd, K = LAYERS[layer]
                    ax.plot([p["rows"] for p in ps], [p[key] for p in ps], marker="o", ms=3, lw=1.2,
                            color=cmap(li % 20), label=f"{layer} ({R}x{Hd}->{K})")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(SLOW, color="tab:red", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("rows (tokens)")
            ax.set_ylabel(f"{key} time")
            ax.set_title(f"{dt} {result['meta']['mode']}: {key} (< 1: vga faster)")
            ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right center", fontsize=8)
    m = result["meta"]
    fig.suptitle(f"vga-linear sweep - {m['device_name']} - torch {m['torch']}"
                 + (" - CPU FALLBACK" if m["cpu_fallback"] else ""))
    H.save_figure(fig, path)
    return None


def run(args, device: str) -> int:
    """The sweep, with bench.py's parsed arguments (--backward, --json, --plot, --layers, ...)."""
    t0 = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = bool(args.allow_tf32)
    torch.set_float32_matmul_precision("high" if args.allow_tf32 else "highest")
    op = H.load_op()
    if not op.available:
        print(f"error: the sweep needs the op: {op.error}", file=sys.stderr)
        return 2
    if args.require_kernels and device == "cuda" and not op.kernels_loaded:
        print(f"error: --require-kernels: vga_linear CUDA kernels not loaded ({op.error})", file=sys.stderr)
        return 2
    points = plan_points(args, device)
    timer = H.GpuTimer(args.flush_mib) if device == "cuda" else None
    mode = "fwd+bwd" if args.backward else "fwd"
    meta = {**H.environment(device, op, None), "mode": mode, "suite": "sweep",
            "timing": ("CUDA events, 256 MiB read-only L2 flush before each call, 2 interleaved rounds of "
                       f"vga/gemm_only/permute, {args.sweep_rep_ms:g} ms each, median" if device == "cuda"
                       else "time.perf_counter per call, median"),
            "layers": {k: dict(zip(("R", "H", "K"), v)) for k, v in LAYERS.items()}}
    print(f"vga-linear sweep ({mode}): {len(points)} points on {meta['device_name']}, torch {torch.__version__}, "
          f"vga_linear {op.version} kernels_loaded={op.kernels_loaded}" + ("  *** CPU FALLBACK ***" if device == "cpu" else ""))
    print(f"timing: {meta['timing']}; ratios are vga time / row time")
    print(HEADER, flush=True)
    result = {"meta": meta, "points": [], "errors": []}
    for dtype, layer, rows in points:
        try:
            p = measure_point(dtype, layer, rows, op, timer, device, args)
        except Exception as e:  # noqa: BLE001
            result["errors"].append({"layer": layer, "rows": rows, "dtype": dtype, "error": H.short_err(e)})
            print(f"{layer:<14} {dtype:<5} {rows:>6} ERROR {H.short_err(e)}", flush=True)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            continue
        result["points"].append(p)
        print(point_line(p), flush=True)
    result["summary"] = summarize(result["points"])
    meta["total_s"] = time.perf_counter() - t0
    print("\n" + "\n".join(summary_lines(result["summary"])))
    failed = [p for p in result["points"] if not p["passed"]]
    if failed:
        print("precision FAIL: " + ", ".join(f"{p['layer']}@{p['rows']}/{p['dtype']}" for p in failed))
    print(f"total {meta['total_s']:.1f} s{'  (CPU FALLBACK)' if device == 'cpu' else ''}")
    H.write_json(args.json, result)
    if args.plot and result["points"]:
        msg = plot(args.plot, result)
        print(msg or f"plot written: {args.plot}", file=sys.stderr if msg else sys.stdout)
    if args.strict and (failed or result["errors"]):
        return 1
    return 0


if __name__ == "__main__":
    import bench
    sys.exit(bench.main(["--suite", "sweep", *sys.argv[1:]]))
