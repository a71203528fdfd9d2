"""bench.py's report: the per-shape table, the summary, the CSV rows and the plot."""
from __future__ import annotations

import harness as H
import metrics as M

ROW_ORDER = ["vga", "reference", "permute", "gemm_only", "compile"]


COLS = [  # header, width
    ("row", 14), ("med_us", 9), ("mean_us", 9), ("std_us", 8), ("min_us", 9), ("graph_us", 9),
    ("wall_us", 9), ("gpu_us", 9), ("TFLOP/s", 8), ("GB/s", 7), ("%roof", 6), ("x_ref", 6), ("x_perm", 6),
    ("x_gemm", 6), ("x_comp", 6), ("max_rel", 8), ("ok", 4), ("peakMB", 8), ("mem_x", 5),
    ("launch", 6), ("fusion", 6),
]

LEGEND = """\
columns: med/mean/std/min_us = CUDA-event time per call, L2 flushed before each call (CPU: perf_counter);
  graph_us = median of CUDA-graph replays of one call (launch-bound shapes only); wall_us = eager host
  wall per call (N back-to-back calls + 1 sync, / N); gpu_us = the GPU's busy time per call (union of
  its kernels' intervals, torch.profiler, calls back to back without flush: what a host-bound row's
  eager time hides); TFLOP/s = 2*B*K*R*H / median (x3 fwd+bwd);
  GB/s = (x + W + bias + y) bytes once / median; %roof = roofline floor / median, floor = max(flops /
  GEMM ceiling of the dtype, bytes / copy bandwidth), ceilings measured in this run; x_<row> = that
  row's median / this row's median (>1: this row is faster); max_rel = max |out-ref64| / (|ref64| + 1)
  over all trials (fwd+bwd: over y and all grads); ok = allclose(atol=rtol=tol) on every trial;
  peakMB = peak device memory of one call above the inputs; mem_x = peakMB / reference's;
  launch = GPU kernels + memcpy/memset per call (torch.profiler); fusion = reference launches / row's."""

# On the CPU there is no CUDA-graph replay, device memory or kernel-launch figure: those
# columns are left out, and x_comp too unless --compile gave the compile row a time.
CUDA_ONLY_COLS = ("graph_us", "gpu_us", "peakMB", "mem_x", "launch", "fusion")

CPU_LEGEND = """\
columns (CPU): med/mean/std/min_us = time.perf_counter per call (host time, no cache flush);
  wall_us = N back-to-back calls / N; TFLOP/s = 2*B*K*R*H / median (x3 fwd+bwd); GB/s = (x + W +
  bias + y) bytes once / median; %roof = roofline floor / median, floor = max(flops / CPU GEMM
  ceiling of the dtype, bytes / CPU copy bandwidth), ceilings measured in this run; x_<row> = that
  row's median / this row's median (>1: this row is faster); max_rel = max |out-ref64| / (|ref64| + 1)
  over all trials (fwd+bwd: over y and all grads); ok = allclose(atol=rtol=tol) on every trial.
rows (CPU): vga(cpu) = the op's CPU path (the shards moved into one (*batch, R*H) copy, then F.linear);
  reference = cat + F.linear; permute = permute + reshape + F.linear; gemm_only = F.linear on an
  input concatenated beforehand (torch's CPU GEMM, the copy not timed); compile = torch.compile of the
  reference (--compile only)."""


def legend(cpu: bool = False) -> str:
    return CPU_LEGEND if cpu else LEGEND


def fmt_launch(v):
    if v is None:
        return "-"
    t = v["total"]
    return str(int(t)) if abs(t - round(t)) < 1e-9 else f"{t:.1f}"


def busy_us(d: dict):
    """The row's GPU busy time per call (harness.profile_call), or None."""
    return (d.get("launches") or {}).get("busy_us")


def row_cells(d: dict) -> list:
    t = d.get("time") or {}
    g = d.get("graph") or {}
    sp = d.get("speedup") or {}
    p = d.get("precision")
    pm = d.get("peak_mem_bytes")
    return [
        d["label"], M.fmt_us(t.get("median")), M.fmt_us(t.get("mean")), M.fmt_us(t.get("std")),
        M.fmt_us(t.get("min")), M.fmt_us(g.get("median")), M.fmt_us(d.get("wall_us")), M.fmt_us(busy_us(d)),
        M.fmt_sig(d.get("tflops")),
        M.fmt_num(d.get("gbps"), 0), M.fmt_num(d.get("pct_roofline"), 1),
        M.fmt_x(sp.get("reference")), M.fmt_x(sp.get("permute")), M.fmt_x(sp.get("gemm_only")),
        M.fmt_x(sp.get("compile")),
        M.fmt_sci(p["max_rel"]) if p else "-", ("pass" if p["passed"] else "FAIL") if p else "-",
        M.fmt_num(pm / 1e6, 1) if pm is not None else "-", M.fmt_x(d.get("mem_ratio")),
        fmt_launch(d.get("launches")), M.fmt_x(d.get("fusion_ratio")),
    ]


def fmt_line(cells, keep=None) -> str:
    parts = []
    for (h, w), c in zip(COLS, cells):
        if keep is not None and h not in keep:
            continue
        c = str(c)
        parts.append(c.ljust(w) if h == "row" else c.rjust(w))
    return " ".join(parts).rstrip()


def cpu_columns(rows_cells: list) -> set:
    """The columns worth a place in a CPU table: none of the CUDA-only ones, none that is '-'
    on every row."""
    return {h for i, (h, _) in enumerate(COLS)
            if h not in CUDA_ONLY_COLS and (h == "row" or any(c[i] != "-" for c in rows_cells))}


def render_block(blk: dict, cpu: bool = False) -> str:
    sh = blk["shape"]
    lines = []
    # A GPU regime (launch-bound, HBM, tensor-core) says nothing about a CPU run.
    gpu_regime = sh.get("regime") in ("launch-bound", "weight-streaming (HBM)", "tensor-core")
    regime = f"  [{sh['regime']}]" if sh.get("regime") and not (cpu and gpu_regime) else ""
    lines.append(f"== {blk['name']} ({blk['mode']})  {M.Shape(**{k: sh[k] for k in ('name', 'R', 'batch', 'H', 'K', 'dtype', 'bias', 'strided')}).describe()}{regime}")
    floor = M.fmt_us(blk["floor_us"]) if blk["floor_us"] else "-"
    lines.append(f"   flops {M.fmt_flops(blk['flops'])}  bytes {M.fmt_bytes(blk['bytes'])}  "
                 f"roofline floor {floor} us ({blk['bound']}-bound; GEMM {M.fmt_sig(blk['peak_tflops'])} TFLOP/s "
                 f"{sh['dtype']}, copy {blk['copy_GBps']:.0f} GB/s)  tol {blk['tol']:g}"
                 + (f" (fp32 matmul '{blk.get('fp32_precision')}')" if sh["dtype"] == "fp32" else ""))
    shown = [d for d in blk["rows"] if not d.get("skip")]
    keep = cpu_columns([row_cells(d) for d in shown]) if cpu else None
    lines.append(fmt_line([h for h, _ in COLS], keep))
    notes = []
    for d in blk["rows"]:
        if d.get("skip"):
            notes.append(f"   {d['label']}: skipped - {d['skip']}")
            continue
        lines.append(fmt_line(row_cells(d), keep))
        if d.get("error"):
            notes.append(f"   {d['label']}: ERROR - {d['error']}")
        for k in ("graph_error", "wall_error", "mem_error", "launch_error"):
            if d.get(k):
                notes.append(f"   {d['label']}: {k.replace('_error', '')} n/a - {d[k]}")
        if d["name"] == "compile" and d.get("first_call_s"):
            notes.append(f"   compile: first call (compile) {d['first_call_s']:.1f} s")
    return "\n".join(lines + notes)


def summary_lines(blocks: list, cpu: bool = False) -> list:
    """The summary and the ratio tables. cpu: leave out the CUDA-only columns (graph replay,
    fusion) and the compile column where no compile row ran; name the CPU GEMM."""
    def compile_med(b):
        return next((((r.get("time") or {}).get("median")) for r in b["rows"] if r["name"] == "compile"), None)
    with_compile = not cpu or any(compile_med(b) is not None for b in blocks)
    cuda_only = {"graph_us", "fusion", "gpu/gemm", "gpu/perm"}
    drop = (cuda_only if cpu else set()) | (set() if with_compile else {"x_comp", "/compile"})
    baseline = ("F.linear (torch's CPU GEMM) on a pre-concatenated input; CUDA kernels not in use"
                if cpu else "cuBLAS on a pre-concatenated input")

    def line(cells):  # (header, width, text, left-aligned)
        return " ".join(f"{t:<{w}}" if left else f"{t:>{w}}" for h, w, t, left in cells if h not in drop)

    def summary_cells(b, head=False):
        if head:
            vals = dict.fromkeys(("shape", "mode", "vga_us", "graph_us", "ref_us", "gemm_us", "x_ref", "x_perm",
                                  "x_gemm", "x_comp", "%roof", "max_rel", "ok", "fusion"))
            vals = {k: k for k in vals}
        else:
            rows = {r["name"]: r for r in b["rows"]}
            v = rows.get("vga") or {}
            sp = v.get("speedup") or {}
            p = v.get("precision")

            def med(n):
                return ((rows.get(n) or {}).get("time") or {}).get("median")
            vals = {"shape": b["name"][:20], "mode": b["mode"], "vga_us": M.fmt_us(med("vga")),
                    "graph_us": M.fmt_us((v.get("graph") or {}).get("median")), "ref_us": M.fmt_us(med("reference")),
                    "gemm_us": M.fmt_us(med("gemm_only")), "x_ref": M.fmt_x(sp.get("reference")),
                    "x_perm": M.fmt_x(sp.get("permute")), "x_gemm": M.fmt_x(sp.get("gemm_only")),
                    "x_comp": M.fmt_x(sp.get("compile")), "%roof": M.fmt_num(v.get("pct_roofline")),
                    "max_rel": M.fmt_sci(p["max_rel"]) if p else "-",
                    "ok": ("pass" if p["passed"] else "FAIL") if p else "-", "fusion": M.fmt_x(v.get("fusion_ratio"))}
        widths = {"shape": 20, "mode": 7, "vga_us": 9, "graph_us": 9, "ref_us": 9, "gemm_us": 9, "x_ref": 6,
                  "x_perm": 6, "x_gemm": 6, "x_comp": 6, "%roof": 6, "max_rel": 8, "ok": 4, "fusion": 6}
        return [(h, widths[h], vals[h], h in ("shape", "mode")) for h in widths]

    out = [f"== summary (vga row; x_gemm > 1 means faster than {baseline})", line(summary_cells(None, head=True))]
    out += [line(summary_cells(b)) for b in blocks]
    out += ["", "== ratios: vga time / row time (< 1: vga faster; the form the issues' targets take; gpu/<row>:"
                " the same of the GPU's busy time, gpu_us, which a host-bound row's time hides)",
            line([("shape", 20, "shape", True), ("mode", 7, "mode", True), ("vga_us", 9, "vga_us", False),
                  ("/gemm_only", 10, "/gemm_only", False), ("/permute", 9, "/permute", False),
                  ("/reference", 10, "/reference", False), ("/compile", 9, "/compile", False),
                  ("gpu/gemm", 9, "gpu/gemm", False), ("gpu/perm", 9, "gpu/perm", False)])]
    for b in blocks:
        rows = {r["name"]: r for r in b["rows"]}
        t = {n: ((rows.get(n) or {}).get("time") or {}).get("median") for n in ROW_ORDER}
        busy = {n: busy_us(rows.get(n) or {}) for n in ("vga", "gemm_only", "permute")}
        cells = [M.fmt_x(M.ratio(t["vga"], t[n])) for n in ("gemm_only", "permute", "reference", "compile")]
        out.append(line([("shape", 20, b["name"][:20], True), ("mode", 7, b["mode"], True),
                         ("vga_us", 9, M.fmt_us(t["vga"]), False), ("/gemm_only", 10, cells[0], False),
                         ("/permute", 9, cells[1], False), ("/reference", 10, cells[2], False),
                         ("/compile", 9, cells[3], False),
                         ("gpu/gemm", 9, M.fmt_x(M.ratio(busy["vga"], busy["gemm_only"])), False),
                         ("gpu/perm", 9, M.fmt_x(M.ratio(busy["vga"], busy["permute"])), False)]))
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
              "median_us", "mean_us", "std_us", "min_us", "n_runs", "graph_us", "wall_us", "gpu_busy_us", "tflops",
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
                "wall_us": d.get("wall_us"), "gpu_busy_us": busy_us(d), "tflops": d.get("tflops"),
                "gbps": d.get("gbps"),
                "pct_roofline": d.get("pct_roofline"), "floor_us": b["floor_us"], "bound": b["bound"],
                **{f"speedup_vs_{k}": sp.get(k) for k in ROW_ORDER},
                "max_abs": p.get("max_abs"), "mean_abs": p.get("mean_abs"), "max_rel": p.get("max_rel"),
                "tol": b["tol"], "passed": p.get("passed"),
                "peak_mem_mb": pm / 1e6 if pm is not None else None, "mem_ratio": d.get("mem_ratio"),
                "kernels": ln.get("kernels"), "memops": ln.get("memops"), "launches": ln.get("total"),
                "fusion_ratio": d.get("fusion_ratio"), "skip": d.get("skip"), "error": d.get("error"),
            }


def plot(path: str, result: dict) -> str | None:
    plt, why = H.pyplot()
    if plt is None:
        return f"--plot skipped: {why}"
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
    H.save_figure(fig, path)
    return None




def write_outputs(args, result):
    H.write_json(args.json, result)
    if args.csv:
        import csv
        import os
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for row in csv_rows(result["blocks"]):
                w.writerow(row)
