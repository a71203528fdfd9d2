"""Tests of the benchmark instrument: metric helpers (benchmarks/metrics.py), the inputs and
baselines of benchmarks/harness.py, the suites of bench.py, and CPU smoke runs of bench.py,
its sweep (sweep.py) and train_step.py."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "benchmarks")
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

import metrics as M  # noqa: E402
import bench  # noqa: E402
import harness  # noqa: E402
import sweep  # noqa: E402
from utils import gpu_ms  # noqa: E402


# --------------------------------------------------------------------------- flops / bytes

def test_gemm_flops_seed():
    # seed: R=4, B=12, H=32, K=56 -> 2 * 12 * 56 * 128
    assert M.gemm_flops(4, 12, 32, 56) == 2 * 12 * 56 * 128 == 172032
    assert M.gemm_flops(4, 12, 32, 56, backward=True) == 3 * 172032


def test_bytes_moved_forward():
    R, B, H, K = 4, 12, 32, 56
    x, w, b, y = R * B * H, K * R * H, K, B * K
    assert M.bytes_moved(R, B, H, K, 4) == 4 * (x + w + b + y) == 37728
    assert M.bytes_moved(R, B, H, K, 2, bias=False) == 2 * (x + w + y)


def test_bytes_moved_backward():
    R, B, H, K = 8, 64, 1024, 8192
    x, w, b, y = R * B * H, K * R * H, K, B * K
    fwd = x + w + b + y
    bwd = y + x + w + x + w + b       # read gy, x, W; write gx, gW, gb
    assert M.bytes_moved(R, B, H, K, 2, backward=True) == 2 * (fwd + bwd)


def test_shape_counts_and_two_batch_dims():
    s = M.parse_shape("32,4x1024,128,4096,bf16,sdpa")
    assert s.batch == (4, 1024) and s.B == 4096 and s.strided and s.bias
    assert s.x_shape == (32, 4, 1024, 128)
    assert M.shape_flops(s) == M.gemm_flops(32, 4096, 128, 4096)
    assert M.shape_bytes(s) == M.bytes_moved(32, 4096, 128, 4096, 2, True)
    assert M.shape_bytes(s, backward=True) == M.bytes_moved(32, 4096, 128, 4096, 2, True, True)


def test_parse_shape():
    s = M.parse_shape("2,3,8,5,fp32")
    assert (s.R, s.batch, s.H, s.K, s.dtype, s.bias, s.strided) == (2, (3,), 8, 5, "fp32", True, False)
    assert s.name == "custom_2_3_8_5_fp32"
    assert M.parse_shape("2, 3, 8, 5, bfloat16, nobias").dtype == "bf16"
    assert not M.parse_shape("2,3,8,5,half,nobias").bias
    assert M.parse_shape(s.spec()) == s or M.parse_shape(s.spec()).spec() == s.spec()
    for bad in ["2,3,8,5", "2,3,8,5,int8", "a,3,8,5,fp32", "2,3,8,5,fp32,what", "0,3,8,5,fp32",
                "2,1x2x3,8,5,fp32"]:
        with pytest.raises(ValueError):
            M.parse_shape(bad)


def test_parse_layers_and_counts():
    # the tools' --layers and --rows (graph_calls.py, core_configs.py, call_anatomy.py)
    assert M.parse_layers("32,128,4096;2,64,128") == [(32, 128, 4096), (2, 64, 128)]
    assert M.parse_counts("100,256,333") == [100, 256, 333]
    for bad in ["32,128", "32,128,4096,1", "32,128,4096;", "a,b,c"]:
        with pytest.raises(ValueError):
            M.parse_layers(bad)


def test_dtype_tables():
    assert M.elem_size("fp32") == 4 and M.elem_size("bf16") == 2 and M.elem_size("half") == 2
    assert M.tolerance_for("fp32") == 1e-4
    assert M.tolerance_for("fp16") == 1e-2 and M.tolerance_for("bf16") == 1e-2
    assert M.torch_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError):
        M.canon_dtype("int4")


# --------------------------------------------------------------------------- roofline

def test_roofline_compute_bound():
    # tp_gather on an H200-like device: 2*8192*8192*8192 flops at 750 TFLOP/s
    f = M.gemm_flops(8, 8192, 1024, 8192)
    nb = M.bytes_moved(8, 8192, 1024, 8192, 2)
    floor, bound = M.roofline_floor_s(f, nb, 750e12, 4.3e12)
    assert bound == "compute"
    assert floor == pytest.approx(f / 750e12)
    assert M.pct_of_roofline(floor, 2 * floor) == pytest.approx(50.0)


def test_roofline_memory_bound():
    # decode: the weight stream dominates
    f = M.gemm_flops(32, 16, 128, 4096)
    nb = M.bytes_moved(32, 16, 128, 4096, 2)
    floor, bound = M.roofline_floor_s(f, nb, 750e12, 4.3e12)
    assert bound == "memory"
    assert floor == pytest.approx(nb / 4.3e12)
    assert 7e-6 < floor < 9e-6          # ~33.7 MB at 4.3 TB/s


def test_roofline_missing_ceilings():
    assert M.roofline_floor_s(1e9, 1e6, None, 1e9) == (pytest.approx(1e-3), "memory")
    assert M.roofline_floor_s(1e9, 1e6, 1e12, None) == (pytest.approx(1e-3), "compute")
    assert M.roofline_floor_s(1e9, 1e6, None, None) == (None, "unknown")
    assert M.pct_of_roofline(None, 1.0) is None
    assert M.pct_of_roofline(1.0, 0) is None


def test_rates_and_speedup():
    assert M.tflops(2e12, 2.0) == pytest.approx(1.0)
    assert M.gbps(4e9, 2.0) == pytest.approx(2.0)
    assert M.tflops(1.0, 0) is None and M.gbps(1.0, None) is None
    assert M.speedup(10.0, 5.0) == pytest.approx(2.0)      # candidate twice as fast
    assert M.speedup(None, 5.0) is None and M.speedup(1.0, 0.0) is None
    assert M.ratio(3.0, 2.0) == 1.5 and M.ratio(1.0, 0) is None and M.ratio(None, 1) is None


def test_time_stats():
    st = M.time_stats([3.0, 1.0, 2.0, 10.0])
    assert st["median"] == 2.5 and st["min"] == 1.0 and st["max"] == 10.0 and st["n"] == 4
    assert st["mean"] == pytest.approx(4.0)
    assert st["std"] == pytest.approx(math.sqrt(((1 + 9 + 4 + 36)) / 3))
    assert M.time_stats([5.0])["std"] == 0.0
    with pytest.raises(ValueError):
        M.time_stats([])


# --------------------------------------------------------------------------- precision

def test_error_stats_exact():
    r = torch.randn(50, 7, dtype=torch.float64)
    st = M.error_stats(r.float(), r, 1e-4)
    assert st["passed"] and st["max_rel"] < 1e-6 and st["tol_ratio"] < 1e-2


def test_error_stats_definitions():
    ref = torch.tensor([0.0, 1.0, -3.0, 100.0], dtype=torch.float64)
    out = ref + torch.tensor([1e-5, 1e-4, -3e-4, 5e-3], dtype=torch.float64)
    st = M.error_stats(out, ref, 1e-4)
    d = torch.tensor([1e-5, 1e-4, 3e-4, 5e-3], dtype=torch.float64)
    assert st["max_abs"] == pytest.approx(5e-3)
    assert st["mean_abs"] == pytest.approx(float(d.mean()))
    # max_rel = max |d| / (|ref| + atol/rtol), atol = rtol = tol -> eps = 1
    assert st["max_rel"] == pytest.approx(max(1e-5 / 1, 1e-4 / 2, 3e-4 / 4, 5e-3 / 101))
    assert st["tol_ratio"] == pytest.approx(st["max_rel"] / 1e-4)
    assert st["passed"]          # every |d| <= 1e-4 + 1e-4 * |ref|


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-4), ("bf16", 1e-2), ("fp16", 1e-2)])
def test_error_stats_tolerance_boundary(dtype, tol):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 33, dtype=torch.float64, generator=g) * 10
    bound = tol + tol * ref.abs()
    sign = torch.where(torch.rand(ref.shape, generator=g) < 0.5, -1.0, 1.0).double()
    inside = M.error_stats(ref + 0.5 * bound * sign, ref, M.tolerance_for(dtype))
    assert inside["passed"] and inside["tol_ratio"] == pytest.approx(0.5)
    assert inside["max_rel"] <= tol
    out = ref + 0.5 * bound * sign
    out[3, 5] = ref[3, 5] + 2 * bound[3, 5]          # one element outside
    outside = M.error_stats(out, ref, tol)
    assert not outside["passed"] and outside["tol_ratio"] == pytest.approx(2.0)
    assert outside["max_rel"] > tol


def test_error_stats_nonfinite_and_shape():
    ref = torch.randn(4, 6, dtype=torch.float64)
    out = ref.float().clone()
    out[1, 2] = float("nan")
    st = M.error_stats(out, ref, 1e-2)
    assert not st["passed"] and math.isinf(st["max_rel"])
    # a (B, K) output is compared against a (b, s, K) reference by reshaping
    ref3 = torch.randn(2, 3, 5, dtype=torch.float64)
    assert M.error_stats(ref3.reshape(6, 5).float(), ref3, 1e-4)["passed"]


def test_merge_error_stats():
    a = {"max_abs": 1.0, "mean_abs": 0.1, "max_rel": 1e-5, "tol_ratio": 0.1, "passed": True, "tol": 1e-4}
    b = {"max_abs": 2.0, "mean_abs": 0.3, "max_rel": 3e-5, "tol_ratio": 0.3, "passed": False, "tol": 1e-4}
    m = M.merge_error_stats([a, b])
    assert m["max_abs"] == 2.0 and m["max_rel"] == 3e-5 and not m["passed"] and m["n"] == 2
    assert m["mean_abs"] == pytest.approx(0.2)
    assert M.merge_error_stats([]) is None


def test_formatting():
    assert M.fmt_us(None) == "-" and M.fmt_us(8.349) == "8.35" and M.fmt_us(128.94) == "128.9"
    assert M.fmt_us(16520.4) == "16520"
    assert M.fmt_sig(762.3) == "762" and M.fmt_sig(0.0123) == "0.012" and M.fmt_sig(2e-5) == "2e-05"
    assert M.fmt_x(1.234) == "1.23" and M.fmt_x(None) == "-"
    assert M.fmt_bytes(37728) == "37.73 KB" and M.fmt_flops(172032) == "172.03 KF"


def test_gpu_busy_time_is_the_union_of_intervals():
    # overlapping kernels count once, the gaps between them not at all, any order
    assert harness._union_us([(10.0, 20.0), (0.0, 5.0), (15.0, 30.0), (30.0, 31.0), (40.0, 41.0)]) == 27.0
    assert harness._union_us([(0.0, 10.0), (2.0, 3.0)]) == 10.0 and harness._union_us([]) == 0.0


@pytest.mark.cuda
def test_gpu_busy_time_of_a_call():
    a = torch.randn(2048, 2048, device="cuda")

    def call():
        torch.mm(a, a)
        torch.cuda._sleep(1_000_000)  # a kernel that spins ~0.5 ms or more: busy, not idle
    launches = harness.profile_call(call, None)
    assert launches["kernels"] >= 2  # (cuBLAS may add a kernel of its own)
    call_us = gpu_ms(call) * 1e3
    assert 0.5 * call_us < launches["busy_us"] <= 1.5 * call_us


# --------------------------------------------------------------------------- bench.py pieces

def test_named_suite_matches_issue():
    want = {
        "seed": "4,12,32,56,fp32",
        "decode_oproj": "32,16,128,4096,bf16",
        "tp_smallbatch": "8,64,1024,8192,bf16",
        "mid_fp32": "8,1024,256,1024,fp32",
        "prefill_oproj": "32,4096,128,4096,bf16",
        "prefill_fp16": "32,2048,128,4096,fp16",
        "tp_gather": "8,8192,1024,8192,bf16",
        "sdpa_strided": "32,4x1024,128,4096,bf16,sdpa",
        "sdpa_contig": "32,4x1024,128,4096,bf16",
    }
    got = {s.name: s.spec() for s in bench.suite_shapes("default")}
    assert got == want
    assert [s.name for s in bench.suite_shapes("decode_oproj")] == ["decode_oproj"]
    assert all(s.B * s.K <= 1 << 16 for s in bench.suite_shapes("cpu"))   # tiny on purpose
    with pytest.raises(SystemExit):
        bench.suite_shapes("nope")


@pytest.mark.parametrize("spec", ["3,5,8,7,fp32", "4,2x6,8,10,fp32,sdpa", "3,5,8,7,fp32,nobias,sdpa"])
def test_inputs_and_baselines_agree(spec):
    s = M.parse_shape(spec)
    inp = harness.make_inputs(s, "cpu", seed=1, requires_grad=False)
    x = inp["x"]
    assert tuple(x.shape) == s.x_shape and x.stride(-1) == 1
    if s.strided:                 # a view of a contiguous (b, R, s, H) tensor: R is not outermost
        assert not x.is_contiguous()
        assert x.transpose(0, 1).is_contiguous()
    assert (inp["b"] is None) == (not s.bias)
    assert bool((x != 0).any())
    a_ref = torch.cat([x[i] for i in range(s.R)], -1)      # (*batch, R*H)
    assert torch.equal(inp["a"], a_ref) and inp["a"].is_contiguous()
    y = harness.reference_fn(x, inp["w"], inp["b"])
    assert tuple(y.shape) == (*s.batch, s.K)
    torch.testing.assert_close(harness.permute_fn(x, inp["w"], inp["b"]), y)
    ref = harness.reference64(inp, backward=False)["y"]
    assert ref.dtype == torch.float64
    assert M.error_stats(y, ref, 1e-4)["passed"]


def test_reference64_backward_grads():
    s = M.parse_shape("3,2x4,8,5,fp32,sdpa")
    inp = harness.make_inputs(s, "cpu", seed=2, requires_grad=True)
    ref = harness.reference64(inp, backward=True)
    assert set(ref) == {"y", "grad_x", "grad_w", "grad_b"}
    assert ref["grad_x"].shape == inp["x"].shape
    torch.testing.assert_close(ref["grad_b"], inp["gy"].double().sum((0, 1)))


# --------------------------------------------------------------------------- smoke test

def _run_bench(args, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, os.path.join(BENCH_DIR, "bench.py"), *args],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240)


def test_bench_cpu_smoke(tmp_path):
    out_json = tmp_path / "r.json"
    out_csv = tmp_path / "r.csv"
    p = _run_bench(["--device", "cpu", "--shape", "2,3,8,5,fp32", "--json", str(out_json),
                    "--csv", str(out_csv), "--cpu-budget-s", "0.02"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "CPU FALLBACK" in p.stdout
    assert "med_us" in p.stdout and "x_gemm" in p.stdout and "summary" in p.stdout
    assert "[1/1]" in p.stderr                     # progress line
    res = json.loads(out_json.read_text())
    assert res["meta"]["cpu_fallback"] is True and res["meta"]["device"] == "cpu"
    assert res["ceilings"]["copy_GBps"] > 0 and res["ceilings"]["gemm_tflops"]["fp32"] > 0
    (blk,) = res["blocks"]
    assert blk["shape"]["spec"] == "2,3,8,5,fp32" and blk["mode"] == "fwd"
    assert blk["flops"] == M.gemm_flops(2, 3, 8, 5) and blk["bytes"] == M.bytes_moved(2, 3, 8, 5, 4)
    rows = {r["name"]: r for r in blk["rows"]}
    assert list(rows) == bench.ROW_ORDER
    for name in ("reference", "permute", "gemm_only"):
        r = rows[name]
        assert r["error"] is None, r
        assert r["time"]["median"] > 0 and r["time"]["n"] >= 5 and r["wall_us"] > 0
        assert r["precision"]["passed"] and r["precision"]["trials"] == 5
        assert r["precision"]["max_rel"] <= 1e-4
        assert r["pct_roofline"] > 0
    assert rows["reference"]["speedup"]["gemm_only"] > 0
    assert rows["compile"]["skip"]                 # off by default on CPU
    v = rows["vga"]
    if res["meta"]["op"]["available"]:
        assert v["error"] is None, v
        assert v["precision"]["passed"] and v["time"]["median"] > 0
        assert set(v["speedup"]) >= {"reference", "permute", "gemm_only"}
    else:
        assert v["skip"]
    lines = out_csv.read_text().strip().splitlines()
    assert lines[0].startswith("shape,mode,spec") and len(lines) == 1 + len(bench.ROW_ORDER)


def test_bench_cpu_backward_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out_json = tmp_path / "r.json"
    png = tmp_path / "r.png"
    p = _run_bench(["--device", "cpu", "--shape", "3,2x2,8,4,bf16,sdpa", "--backward", "--trials", "2",
                    "--json", str(out_json), "--plot", str(png), "--cpu-budget-s", "0.02"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out_json.read_text())
    assert [b["mode"] for b in res["blocks"]] == ["fwd", "fwd+bwd"]
    bwd = {r["name"]: r for r in res["blocks"][1]["rows"]}
    assert set(bwd["reference"]["precision"]["tensors"]) == {"y", "grad_x", "grad_w", "grad_b"}
    assert bwd["gemm_only"]["precision"]["passed"] and bwd["reference"]["precision"]["passed"]
    if res["meta"]["op"]["available"]:
        assert bwd["vga"]["precision"]["passed"], bwd["vga"]
    assert png.stat().st_size > 1000
    # the fwd+bwd time of vga against gemm_only, permute and reference, as ratios, per shape
    ratios = p.stdout[p.stdout.index("== ratios"):].splitlines()
    assert "/gemm_only" in ratios[1] and "/permute" in ratios[1] and "/reference" in ratios[1]
    assert any("fwd+bwd" in line for line in ratios[2:])


def test_suites():
    assert bench.SUITES["small"] != bench.SUITES["cpu"]
    got = {s.name: s.spec() for s in bench.suite_shapes("backward")}
    assert got["sdpa_train"] == "32,4x2048,128,4096,bf16,sdpa"          # issue 14's training layout
    assert {"seed", "decode_oproj", "mid_fp32", "prefill_oproj", "tp_gather"} <= set(got)


def test_sweep_plan():
    class Args:
        backward = False
        layers = rows = dtypes = None

    fwd = sweep.plan_points(Args, "cuda")
    bf16 = {(layer, n) for d, layer, n in fwd if d == "bf16"}
    assert bf16 == {(layer, n) for layer in sweep.LAYERS for n in sweep.ALL_ROWS}
    assert {d for d, _, _ in fwd} == {"bf16", "fp16", "fp32"} and len(fwd) < 250
    Args.backward = True
    bwd = sweep.plan_points(Args, "cuda")
    assert 0 < len(bwd) < len(fwd) and {d for d, _, _ in bwd} == {"bf16"}
    Args.backward, Args.layers, Args.rows, Args.dtypes = False, "vit_b_heads", "3,5", "fp16,fp32"
    assert sweep.plan_points(Args, "cuda") == [("fp16", "vit_b_heads", 3), ("fp16", "vit_b_heads", 5),
                                               ("fp32", "vit_b_heads", 3), ("fp32", "vit_b_heads", 5)]
    Args.layers = "nope"
    with pytest.raises(SystemExit):
        sweep.plan_points(Args, "cuda")


def test_sweep_distribution():
    pts = [{"layer": "l", "rows": n, "dtype": "bf16", "vga/gemm_only": r, "vga/permute": r / 2}
           for n, r in enumerate([0.9, 1.0, 1.2, 0.95, 1.3])]
    dist = sweep.distribution(pts)["vga/gemm_only"]
    assert dist["n"] == 5 and dist["median"] == 1.0 and dist["max"] == 1.3 and dist["above_1.1"] == 2
    assert dist["p90"] == pytest.approx(1.26) and dist["worst"] == "l rows=4 bf16"
    met = sweep.targets_met(sweep.distribution(pts))
    assert met["vga/gemm_only median <= 0.98"] is False and met["vga/permute max <= 1.05"] is True
    assert "gpu vga/gemm_only" not in sweep.distribution(pts)  # (the forward has no busy-time ratios)
    # --backward on a GPU: the busy-time ratios get their own distribution, and the targets stay on
    # the event times
    for pt, busy in zip(pts, [0.8, 0.9, 1.0, 1.1, 1.2]):
        pt["gpu vga/gemm_only"], pt["gpu vga/permute"] = busy, busy / 2
    dist = sweep.distribution(pts)
    assert dist["gpu vga/gemm_only"]["median"] == 1.0 and dist["gpu vga/gemm_only"]["worst"] == "l rows=4 bf16"
    assert sweep.targets_met(dist) == met
    assert sweep.point_line(dict(pts[0], family="f", vga_us=9.0, gemm_only_us=10.0, permute_us=18.0, max_rel=1e-3,
                                 passed=True)).endswith("gpu 0.80 / 0.40")


def test_sweep_summary_by_token_band():
    pts = [{"layer": "l", "rows": n, "dtype": d, "vga/gemm_only": r, "vga/permute": r}
           for d in ("bf16", "fp16") for n, r in [(1, 1.0), (64, 1.1), (100, 1.4), (1023, 1.2), (1024, 0.9), (8192, 1.0)]]
    summary = sweep.summarize(pts + [dict(pts[0], dtype="fp32", rows=256, **{"vga/gemm_only": 3.0})])
    bands = {name: dist["vga/gemm_only"] for name, dist in summary.items() if name.startswith("half, rows")}
    assert {name: (d["n"], d["max"]) for name, d in bands.items()} == {
        "half, rows 1-64": (4, 1.1), "half, rows 65-1023": (4, 1.4), "half, rows >= 1024": (4, 1.0)}
    assert summary["half (bf16+fp16)"]["vga/gemm_only"]["n"] == 12  # (fp32 in no band)
    assert any(line.startswith("half, rows 65-1023") for line in sweep.summary_lines(summary))
    # one band only: no breakdown to repeat the whole
    assert not [name for name in sweep.summarize(pts[:2]) if name.startswith("half, rows")]


def test_sweep_cpu_smoke(tmp_path):
    pytest.importorskip("matplotlib")
    out_json, png = tmp_path / "s.json", tmp_path / "s.png"
    p = _run_bench(["--device", "cpu", "--suite", "sweep", "--layers", "branch3_1000,vit_b_heads", "--rows", "1,16",
                    "--dtypes", "fp32", "--json", str(out_json), "--plot", str(png)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "CPU FALLBACK" in p.stdout and "distribution of time ratios" in p.stdout
    res = json.loads(out_json.read_text())
    assert res["meta"]["mode"] == "fwd" and len(res["points"]) == 4 and not res["errors"]
    for pt in res["points"]:
        assert pt["passed"] and pt["vga_us"] > 0 and pt["gemm_only_us"] > 0 and pt["permute_us"] > 0
        assert pt["vga/gemm_only"] == pytest.approx(pt["vga_us"] / pt["gemm_only_us"])
    assert res["summary"]["fp32"]["vga/permute"]["n"] == 4
    assert png.stat().st_size > 1000
    p = _run_bench(["--device", "cpu", "--suite", "sweep", "--backward", "--layers", "branch3_1000", "--rows", "16",
                    "--dtypes", "bf16", "--json", str(out_json)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out_json.read_text())
    assert res["meta"]["mode"] == "fwd+bwd" and len(res["points"]) == 1 and res["points"][0]["passed"]


def test_train_step_cpu_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out_json = tmp_path / "t.json"
    p = subprocess.run([sys.executable, os.path.join(BENCH_DIR, "train_step.py"), "--tiny", "--device", "cpu",
                        "--steps", "3", "--warmup-steps", "1", "--json", str(out_json)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    try:
        import transformers  # noqa: F401
    except ImportError:
        assert "transformers is not installed" in p.stdout and not out_json.exists()
        return
    res = json.loads(out_json.read_text())
    s = res["summary"]
    assert len(res["losses"]["stock"]) == len(res["losses"]["vga"]) == 3 and s["timed_steps"] == 2
    assert s["loss_rel_diff_step0"] <= 1e-2 and s["losses_within_tol"], s
    assert s["step_ms_median"]["vga"] > 0 and s["vga_over_stock"] > 0
    R, B, S, D = 4, 2, 32, 16                          # --tiny: 4 heads of 16, batch 2, seq 32
    assert res["op_input"] == [[R, B, S, D], [D, S * R * D, R * D, 1]]   # the head-major view, no copy


def test_bench_compile_cpu_smoke(tmp_path):
    import vga_linear.compile as vc

    if vc.supported() is not None:
        pytest.skip(f"rewrite not supported here: {vc.supported()}")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")

    def run(*args):
        out_json = tmp_path / "c.json"
        p = subprocess.run([sys.executable, os.path.join(BENCH_DIR, "bench_compile.py"), "--smoke", *args,
                            "--json", str(out_json)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                           timeout=240)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout, json.loads(out_json.read_text())

    _, res = run("--cases", "oproj_cat", "--modes", "fwd,train")
    assert [(r["case"], r["mode"], r["rewrites"]) for r in res["rows"]] == [("oproj_cat", "fwd", 1),
                                                                            ("oproj_cat", "train", 1)]
    # the sweep: at one token the permute form's reshape is a view (nothing to save: not rewritten)
    stdout, res = run("--sweep", "--rows", "1,16,40")
    points = {(r["case"], r["rows"]): r["rewrites"] for r in res["rows"]}
    assert points == {("7b_oproj cat", 1): 1, ("7b_oproj cat", 16): 1, ("7b_oproj cat", 40): 1,
                      ("7b_oproj permute", 1): 0, ("7b_oproj permute", 16): 1, ("7b_oproj permute", 40): 1}
    assert res["summary"]["points"] == 5 and "ratio over 5 rewritten points" in stdout


def test_bench_rejects_bad_shape(tmp_path):
    p = _run_bench(["--device", "cpu", "--shape", "1,2,3"], tmp_path)
    assert p.returncode == 2 and "bad --shape" in p.stderr


@pytest.mark.parametrize("script, args", [("floors.py", []),
                                           ("call_anatomy.py", ["--layers", "2,64,128", "--rows", "100"])])
def test_gpu_only_scripts_say_they_need_a_gpu(tmp_path, script, args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, os.path.join(BENCH_DIR, script), *args], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "needs a CUDA GPU" in p.stderr


# --------------------------------------------------------------------------- the core's plan

def _schedule_source():
    return open(os.path.join(ROOT, "csrc", "kernels", "sm90", "schedule.cuh")).read()


def _schedule_int_constants():
    """schedule.cuh's `constexpr int name = expression;` lines as values, each expression evaluated
    over the constants before it (integer literals, names and * + - / only)."""
    import re

    values = {}
    for name, expression in re.findall(r"constexpr int (\w+) = ([^;]+);", _schedule_source()):
        assert re.fullmatch(r"[\w\s*+/()-]+", expression), (name, expression)
        values[name] = int(eval(expression, {"__builtins__": {}}, values))
    return values


def _shipped_plan_constants():
    import re

    import core_configs

    values = re.search(r"kPlanConstants\{([^}]*)\}", _schedule_source()).group(1).split(",")
    assert len(values) == len(core_configs.CONSTANTS)
    return dict(zip(core_configs.CONSTANTS, (float(v) for v in values)))


def test_the_plan_model_splits_in_the_cluster_up_to_the_kernels_widest_tile():
    # core_configs.py's mirror of choose_plan skips the in-cluster splits schedule.cuh cannot run
    import core_configs

    assert _schedule_int_constants()["kWidestClusterSplit"] == core_configs.WIDEST_CLUSTER_SPLIT
    assert not any(c.startswith("sm90_gemm/n256/c") for c in core_configs.CONFIGS)


def test_the_plan_model_tiles_rows_as_the_kernels_do():
    # core_configs.py's tile rows are schedule.cuh's: kBlockM (two consumer warpgroups' rows) and the
    # narrow tiles' kNarrowBlockM (one)
    import core_configs

    constants = _schedule_int_constants()
    assert (core_configs.BLOCK_M, core_configs.NARROW_BLOCK_M) == (constants["kBlockM"], constants["kNarrowBlockM"])
    assert constants["kBlockM"] == 2 * constants["kConsumerRows"] == 2 * constants["kNarrowBlockM"]


def test_the_plan_model_weighs_the_narrow_tiles_and_the_packed_tails():
    # choose_plan's last step (mirrored by core_configs.pick): the 64-row tiles replace an unsplit
    # 128-row plan where the doubled tiles fit one round (run 151: 0.88-0.93x), split in the cluster
    # where their clusters fit at once (run 165: 0.83-0.99x the unsplit narrow tiles), never a split
    # plan unsplit (they lost to each split the plan took) nor where they take two rounds; a 64-wide
    # split in the cluster gives way to them split in the cluster by as many slices or more (run 165:
    # fewer slices, c2 of them for n64/c4, ran 1.03-1.18x); and a packed tail
    # k-block's copy makes several-round plans of the 80-wide heads take n256 (run 157), not a
    # one-round plan's slices
    import core_configs

    constants = _shipped_plan_constants()

    def picked(R, H, K, rows, p=constants):
        rec = dict(R=R, H=H, K=K, rows=rows)
        key, _ = core_configs.pick(rec, "fwd", p, core_configs.plan_keys(rec, "fwd"))
        return core_configs.dispatch_name(key)

    assert picked(12, 64, 768, 128) == "sm90_gemm/n64/c4/m64"  # 24 clusters of 4
    assert picked(12, 64, 768, 256) == "sm90_gemm/n64/c2/m64"  # 48 clusters of 2
    assert picked(12, 64, 768, 333) == "sm90_gemm/n64/s1/m64"  # 72 clusters of 2: not at once
    assert picked(12, 64, 768, 256, dict(constants, narrow_slice_us=constants["cluster_slice_us"])) == \
        "sm90_gemm/n64/s1/m64"  # the narrow tiles' sums priced as the 128-row tiles' are
    assert picked(12, 64, 768, 1024) == "sm90_gemm/n64/s1"  # two rounds of narrow tiles
    assert picked(16, 80, 1280, 100) == "sm90_gemm/n64/c2/m64"  # the split's narrow tiles: 40 clusters of 2
    assert picked(2, 1536, 768, 128) == "sm90_gemm/n64/c4/m64"  # 24 clusters of 4
    assert picked(2, 1536, 768, 192) == "sm90_gemm/n64/c4"  # 36 clusters of 4 do not fit; c2 of them not weighed
    assert picked(64, 96, 1000, 100) == "sm90_gemm/n64/c4"
    assert picked(16, 80, 1280, 256) == "sm90_gemm/n64/c2"  # 80 clusters of narrow tiles: not at once
    assert picked(16, 80, 1280, 8192) == "sm90_gemm/n256/s1"
    assert picked(16, 80, 1280, 8192, dict(constants, tail_kblock_us=0.0)) == "sm90_gemm/n128/s1"
    assert picked(16, 80, 1280, 1024) == "sm90_gemm/n128/s1"  # one round: the tails' copy is not charged
    assert picked(20, 64, 1280, 8192) == "sm90_gemm/n128/s1"  # no tails


def test_plan_keys_name_the_grid_splits_of_both_forward_layouts():
    # where the forward may run along the concatenation (H % 64 not 0, 16 or 32), choose_plan
    # enumerates grid splits on each layout's own k-blocks: R=40, H=112 has 80 of them a shard
    # (40 x 2, 4 a slice: s20) and 70 along the concatenation (4 a slice: s18)
    import core_configs

    def grid_splits(R, H, K):
        keys = core_configs.plan_keys(dict(R=R, H=H, K=K, rows=512), "fwd")
        return [int(k.rsplit("/s", 1)[1]) for k in keys if k.startswith("fwd_sm90_gemm/n128/s")]

    assert grid_splits(40, 112, 4480)[-3:] == [16, 18, 20]
    assert grid_splits(32, 128, 4096)[-3:] == [11, 13, 16]  # one layout: 64 k-blocks


def test_plan_constants_match_the_fitted_model():
    # schedule.cuh's kPlanConstants, run through core_configs.py's mirror of plan_cost, still pick
    # near the fastest forced configuration of the sweep they were fitted to (run 29), of one they
    # were not (run 28), and of the kernel that skips the zero-filled k steps and has 192-wide
    # tiles (run 37): the C++ constants, the Python model and the data agree.
    import core_configs

    constants = _shipped_plan_constants()
    for run, worst, mean, skips_fill in (("run29", 1.25, 1.01, False), ("run28", 1.10, 1.01, False),
                                         ("run37", 1.20, 1.015, True)):
        path = os.path.join(BENCH_DIR, "results", f"{run}-core-configs.jsonl")
        recs = [json.loads(line) for line in open(path)]
        # (all measured before the forward packed shard tails)
        regrets = core_configs.regrets(recs, constants, skips_fill=skips_fill, layout="per_shard")
        assert len(regrets) > 100
        assert max(regrets) <= worst and sum(regrets) / len(regrets) <= mean, run
    # and a model that ignores the tile width's cost picks far worse on run 37
    run37 = [json.loads(line) for line in open(os.path.join(BENCH_DIR, "results", "run37-core-configs.jsonl"))]
    flat = dict(constants, **{f"kblock_us_{n}": constants["kblock_us_256"] for n in (64, 128, 192)})
    assert max(core_configs.regrets(run37, flat, skips_fill=True, layout="per_shard")) > 1.3


@pytest.mark.cuda
def test_the_python_plan_model_picks_what_the_dispatch_runs():
    # core_configs.py refits the plan's constants through its own copy of plan_cost and
    # choose_plan's enumeration; on the sweep's layers at 100-8192 rows it must pick the
    # configuration the C++ dispatch names (_gather_concat_linear_choice), or the fit describes
    # another rule. Both count this device's resident clusters (_sm90_resident_clusters).
    import core_configs
    import vga_linear

    if not vga_linear.kernels_loaded() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernels")
    constants = _shipped_plan_constants()
    probe = torch.empty(1, 1, 8, dtype=torch.bfloat16, device="cuda")
    resident = core_configs.resident_of(torch.ops.vga._sm90_resident_clusters(probe))
    compared = 0
    # (and heads whose k-blocks may run along the concatenation: the "/span" choices)
    for R, H, K in core_configs.LAYERS + [(16, 48, 768), (8, 136, 1088), (32, 112, 3584), (40, 112, 4480)]:
        for rows in (100, 256, 333, 512, 1024, 2048, 8192):
            x = torch.randn(R, rows, H, dtype=torch.bfloat16, device="cuda")
            w = torch.randn(K, R * H, dtype=torch.bfloat16, device="cuda")
            choice = torch.ops.vga._gather_concat_linear_choice(x, w, None)
            if not choice.startswith("sm90_gemm/"):
                continue
            rec = dict(R=R, H=H, K=K, rows=rows)
            key, _ = core_configs.pick(rec, "fwd", constants, core_configs.plan_keys(rec, "fwd"), resident=resident)
            assert choice == core_configs.dispatch_name(key), (R, H, K, rows, resident)
            compared += 1
    assert compared > 50


def test_ab_compare_reads_an_alternated_device_call(tmp_path, capsys):
    import ab_compare

    path = os.path.join(BENCH_DIR, "results", "run69-cluster-arrive-early-ab.txt")
    with open(path) as f:
        runs, builds = ab_compare.parse(f)
    assert builds == ["main", "cae"]
    rows = {(kind, layer): points for kind, layer, points in ab_compare.compare(runs, "main", "cae")}
    assert len(rows) == 12 and all(len(points) == 3 for points in rows.values())
    # three runs a build: R=12, H=64, K=768's forward at 100 rows, 5.54/5.55/5.58 against 5.57/5.55/5.60 us
    base, other, ratio, base_spread, other_spread = rows[("fwd", "R=12 H=64 K=768")][0]
    assert abs(base - 5.5567) < 1e-3 and abs(other - 5.5733) < 1e-3 and abs(ratio - other / base) < 1e-12
    assert 1.0 <= base_spread < 1.01 and 1.0 <= other_spread < 1.01
    assert ab_compare.main([path, "--base", "cae", "--rows", "100,333,1024"]) == 0
    assert capsys.readouterr().out.startswith("main / cae")
    one_build = tmp_path / "one.txt"
    one_build.write_text("== main\nsm90_gemm fwd R=2 H=64 K=128:     1.00     2.00\n")
    assert ab_compare.main([str(one_build)]) == 1


def test_graph_calls_says_it_needs_a_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    script = os.path.join(BENCH_DIR, "graph_calls.py")
    p = subprocess.run([sys.executable, script, "--layers", "2,64,128", "--rows", "100"], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "needs a CUDA GPU" in p.stderr
    p = subprocess.run([sys.executable, script, "--layers", "2,64,128", "--rows", "100", "--kinds", "fwd,bw"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown products ['bw']" in p.stderr
    p = subprocess.run([sys.executable, script, "--layers", "2,64,128", "--rows", "100", "--timing", "flushed"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "needs a CUDA GPU" in p.stderr, p.stdout + p.stderr
    p = subprocess.run([sys.executable, script, "--layers", "2,64,128", "--rows", "100", "--timing", "warm"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--timing" in p.stderr
