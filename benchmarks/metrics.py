"""Metric helpers for benchmarks/bench.py: shapes, flop/byte counts, roofline,
timing statistics, precision checks.

Pure Python + torch (CPU-safe); nothing here touches a GPU at import time, so
tests/test_bench.py imports this module directly.

Conventions (also printed by bench.py):
  * flops: 2*B*K*(R*H) for the forward GEMM (the bias add is not counted);
    forward+backward = 3x that (grad_x = gy @ W and grad_W = gy^T @ A, each
    2*B*K*(R*H); the grad_bias column sum is not counted).
  * bytes ("effective"): every tensor the op must touch, once:
    forward  = x + W + bias + y;
    backward = gy + x + W (read) + grad_x + grad_W + grad_bias (written);
    forward+backward = forward + backward.  The same count is used for every
    row, whatever the row really moves (the reference's cat writes and reads a
    copy of x: that is its inefficiency, not extra useful bytes).
  * roofline floor = max(flops / peak_flops(dtype), bytes / copy_bandwidth),
    where copy_bandwidth = (bytes read + bytes written) / time of a large
    device-to-device copy; % of roofline = 100 * floor / measured.
  * precision: torch.allclose-style pass, |out - ref| <= atol + rtol*|ref|
    elementwise with atol = rtol = tol, the op's tolerance for the dtype
    (vga_linear/_tolerance.py: 1e-4 fp32, 1e-2 fp16/bf16), against a float64
    reference computed from the same inputs.
    max_rel = max |out - ref| / (|ref| + atol/rtol): the relative error with
    the allclose floor eps = atol/rtol (= 1 here), so that near-zero outputs
    (cancellation) count absolutely and pass <=> max_rel <= tol exactly.
    tol_ratio = max |out - ref| / (atol + rtol*|ref|) = max_rel/tol; pass <=>
    tol_ratio <= 1 and every output finite.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, asdict
from typing import Iterable, Sequence

# --------------------------------------------------------------------------- dtypes

DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp64": "fp64", "float64": "fp64", "double": "fp64", "f64": "fp64",
}
ELEM_SIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}


def canon_dtype(name: str) -> str:
    key = str(name).strip().lower().replace("torch.", "")
    if key not in DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {name!r} (use fp32, fp16, bf16 or fp64)")
    return DTYPE_ALIASES[key]


def elem_size(dtype: str) -> int:
    return ELEM_SIZE[canon_dtype(dtype)]


def tolerance_for(dtype: str) -> float:
    """atol = rtol used for the pass/fail check of a dtype: the op's (vga_linear/_tolerance.py)."""
    from vga_linear._tolerance import tolerance
    return tolerance(torch_dtype(dtype))


def torch_dtype(dtype: str):
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp64": torch.float64}[canon_dtype(dtype)]


# --------------------------------------------------------------------------- shapes

@dataclass
class Shape:
    """One benchmark case: x (R, *batch, H), weight (K, R*H), bias (K,) or None."""
    name: str
    R: int
    batch: tuple
    H: int
    K: int
    dtype: str
    bias: bool = True
    strided: bool = False      # x = base.transpose(0, 1) of a contiguous (batch[0], R, *batch[1:], H)
    regime: str = ""           # free-text label: launch / hbm / tensor-core / strided ...

    def __post_init__(self):
        self.dtype = canon_dtype(self.dtype)
        self.batch = tuple(int(b) for b in self.batch)
        if not 1 <= len(self.batch) <= 2:
            raise ValueError("1 or 2 batch dims")
        for v in (self.R, self.H, self.K, *self.batch):
            if int(v) < 1:
                raise ValueError(f"dims must be >= 1: {self}")

    @property
    def B(self) -> int:
        return math.prod(self.batch)

    @property
    def x_shape(self) -> tuple:
        return (self.R, *self.batch, self.H)

    def spec(self) -> str:
        b = "x".join(str(v) for v in self.batch)
        s = f"{self.R},{b},{self.H},{self.K},{self.dtype}"
        if not self.bias:
            s += ",nobias"
        if self.strided:
            s += ",sdpa"
        return s

    def describe(self) -> str:
        b = "x".join(str(v) for v in self.batch)
        layout = "x=sdpa_out.transpose(0,1)" if self.strided else "x contiguous"
        return (f"R={self.R} B={b} H={self.H} K={self.K} {self.dtype} "
                f"{'bias' if self.bias else 'no-bias'} {layout}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batch"] = list(self.batch)
        d["B"] = self.B
        d["spec"] = self.spec()
        return d


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*,\s*([\dx*]+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*([A-Za-z0-9_.]+)\s*((?:,\s*\w+\s*)*)$")


def parse_shape(spec: str, name: str | None = None) -> Shape:
    """Parse 'R,B,H,K,dtype[,flag...]'.

    B may be '4x1024' (two batch dims).  Flags: 'bias' (default), 'nobias',
    'sdpa'/'strided' (x built as sdpa_out.transpose(0, 1) of a contiguous
    (b, R, s, H) tensor; with one batch dim a contiguous (B, R, H) transposed).
    """
    m = _SHAPE_RE.match(spec)
    if not m:
        raise ValueError(f"bad --shape {spec!r}; expected R,B,H,K,dtype[,nobias][,sdpa] (B may be bxs)")
    R, b, H, K, dt, flags = m.groups()
    batch = tuple(int(v) for v in re.split(r"[x*]", b) if v)
    bias, strided = True, False
    for f in [f.strip().lower() for f in flags.split(",") if f.strip()]:
        if f == "nobias":
            bias = False
        elif f == "bias":
            bias = True
        elif f in ("sdpa", "strided"):
            strided = True
        else:
            raise ValueError(f"unknown shape flag {f!r} in {spec!r}")
    sh = Shape(name or "", int(R), batch, int(H), int(K), dt, bias=bias, strided=strided, regime="custom")
    if not sh.name:
        sh.name = "custom_" + sh.spec().replace(",", "_")
    return sh


def parse_layers(text: str) -> list[tuple[int, int, int]]:
    """'R,H,K;R,H,K;...' (the tools' --layers) -> [(R, H, K), ...]."""
    layers = []
    for layer in text.split(";"):
        values = tuple(int(v) for v in layer.split(","))
        if len(values) != 3:
            raise ValueError(f"bad layer {layer!r}; expected R,H,K")
        layers.append(values)
    return layers


def parse_counts(text: str) -> list[int]:
    """'100,256,333' (the tools' --rows) -> [100, 256, 333]."""
    return [int(v) for v in text.split(",")]


# --------------------------------------------------------------------------- flops / bytes

def gemm_flops(R: int, B: int, H: int, K: int, backward: bool = False) -> int:
    """2*M*N*K of the virtual-concat GEMM (M=B, N=K, K_red=R*H); x3 with backward."""
    f = 2 * B * K * R * H
    return 3 * f if backward else f


def bytes_moved(R: int, B: int, H: int, K: int, esize: int, bias: bool = True,
                backward: bool = False) -> int:
    """Effective bytes, each tensor once (see module docstring)."""
    x = R * B * H
    w = K * R * H
    b = K if bias else 0
    y = B * K
    fwd = x + w + b + y
    if not backward:
        return fwd * esize
    bwd = y + x + w + x + w + b     # read gy, x, W; write grad_x, grad_W, grad_b
    return (fwd + bwd) * esize


def shape_flops(shape: Shape, backward: bool = False) -> int:
    return gemm_flops(shape.R, shape.B, shape.H, shape.K, backward)


def shape_bytes(shape: Shape, backward: bool = False) -> int:
    return bytes_moved(shape.R, shape.B, shape.H, shape.K, elem_size(shape.dtype), shape.bias, backward)


def roofline_floor_s(flops: float, nbytes: float, peak_flops: float | None,
                     bandwidth: float | None) -> tuple[float | None, str]:
    """(floor seconds, 'compute' | 'memory') = max(flops/peak, bytes/bw).

    peak_flops in FLOP/s, bandwidth in bytes/s; a missing ceiling drops that term.
    """
    tc = flops / peak_flops if peak_flops and peak_flops > 0 else None
    tm = nbytes / bandwidth if bandwidth and bandwidth > 0 else None
    if tc is None and tm is None:
        return None, "unknown"
    if tm is None or (tc is not None and tc >= tm):
        return tc, "compute"
    return tm, "memory"


def pct_of_roofline(floor_s: float | None, measured_s: float | None) -> float | None:
    if not floor_s or not measured_s or measured_s <= 0:
        return None
    return 100.0 * floor_s / measured_s


def tflops(flops: float, seconds: float | None) -> float | None:
    return flops / seconds / 1e12 if seconds and seconds > 0 else None


def gbps(nbytes: float, seconds: float | None) -> float | None:
    return nbytes / seconds / 1e9 if seconds and seconds > 0 else None


def speedup(baseline_s: float | None, candidate_s: float | None) -> float | None:
    """How many times faster the candidate is than the baseline (>1 = faster)."""
    if not baseline_s or not candidate_s or baseline_s <= 0 or candidate_s <= 0:
        return None
    return baseline_s / candidate_s


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --------------------------------------------------------------------------- timing stats

def time_stats(samples_us: Sequence[float]) -> dict:
    """median, mean, std (sample, ddof=1; 0 for one sample), min, max, n."""
    s = [float(v) for v in samples_us]
    if not s:
        raise ValueError("no samples")
    return {
        "median": statistics.median(s),
        "mean": statistics.fmean(s),
        "std": statistics.stdev(s) if len(s) > 1 else 0.0,
        "min": min(s),
        "max": max(s),
        "n": len(s),
    }


# --------------------------------------------------------------------------- precision

def error_stats(out, ref, tol: float, atol: float | None = None, rtol: float | None = None) -> dict:
    """Compare `out` against a (float64) reference; see the module docstring.

    Returns max_abs, mean_abs, max_rel (= max |d| / (|ref| + atol/rtol)),
    tol_ratio (= max |d| / (atol + rtol*|ref|)) and passed (torch.allclose
    with atol, rtol; default both = tol; NaN/Inf in out fails).
    """
    import torch
    atol = tol if atol is None else atol
    rtol = tol if rtol is None else rtol
    o = out.detach().to(torch.float64).reshape(ref.shape)
    r = ref.detach().to(torch.float64)
    res = {"tol": tol, "atol": atol, "rtol": rtol}
    if o.numel() == 0:
        return {**res, "max_abs": 0.0, "mean_abs": 0.0, "max_rel": 0.0, "tol_ratio": 0.0, "passed": True}
    if not bool(torch.isfinite(o).all()):
        inf = float("inf")
        return {**res, "max_abs": inf, "mean_abs": inf, "max_rel": inf, "tol_ratio": inf, "passed": False}
    d = (o - r).abs()
    ar = r.abs()
    eps = atol / rtol if rtol > 0 else 1.0
    return {
        **res,
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "max_rel": float((d / (ar + eps)).max()),
        "tol_ratio": float((d / (atol + rtol * ar)).max()),
        "passed": bool(torch.allclose(o, r, atol=atol, rtol=rtol)),
    }


def merge_error_stats(stats: Iterable[dict]) -> dict | None:
    """Worst case over trials / tensors: max of maxima, mean of means, all-pass."""
    stats = [s for s in stats if s]
    if not stats:
        return None
    return {
        "max_abs": max(s["max_abs"] for s in stats),
        "mean_abs": statistics.fmean(s["mean_abs"] for s in stats),
        "max_rel": max(s["max_rel"] for s in stats),
        "tol_ratio": max(s["tol_ratio"] for s in stats),
        "passed": all(s["passed"] for s in stats),
        "tol": stats[0]["tol"],
        "n": len(stats),
    }


# --------------------------------------------------------------------------- formatting

def fmt_us(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v < 100:
        return f"{v:.2f}"
    if v < 10000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def fmt_num(v: float | None, nd: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if abs(v) >= 10000:
        return f"{v:.0f}"
    return f"{v:.{nd}f}"


def fmt_sig(v: float | None) -> str:
    """~3 significant digits without going scientific above 1e-3 (TFLOP/s on CPU is tiny)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 1e-3 or a == 0:
        return f"{v:.3f}"
    return f"{v:.0e}"


def fmt_x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def fmt_sci(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.1e}"


def fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_flops(n: float) -> str:
    for unit, div in (("TF", 1e12), ("GF", 1e9), ("MF", 1e6), ("KF", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} F"
