"""Every configuration of the Hopper GEMM core, forced, against cuBLAS: the data behind the core's
plan rule (csrc/kernels/sm90/schedule.cuh, plan_cost) and how well the rule picks.

  python benchmarks/core_configs.py --json results/runN-core-configs.jsonl   # on an H200
  python benchmarks/core_configs.py --fit results/runN-core-configs.jsonl    # anywhere: fit the rule

For each layer shape x row count it times, with triton.testing.do_bench (median, L2 flushed), the
forward, grad_x and grad_weight of each forced tile width / split ("sm90_gemm/n128/s2") and the rule's
own choice ("sm90_gemm"), next to cuBLAS on a pre-concatenated input (F.linear, grad_y @ W,
grad_y^T @ cat(x)). --fit searches plan_cost's constants for the least regret (time of the
configuration the model picks over the fastest one measured) and prints where it picks worse than 5%.
"""

import argparse
import itertools
import json
import math
import os
import sys
import time

LAYERS = [(32, 128, 4096), (40, 128, 5120), (64, 128, 8192), (8, 1024, 8192), (4, 2048, 8192), (8, 512, 4096),
          (12, 64, 768), (16, 80, 1280), (3, 256, 1000), (2, 1536, 768), (32, 96, 3072)]
CONFIGS = ["sm90_gemm", "sm90_gemm/n256/s1", "sm90_gemm/n128/s1", "sm90_gemm/n128/s2", "sm90_gemm/n128/s4",
           "sm90_gemm/n256/s2", "sm90_gemm/n256/s4"]


def measure(args):
    import torch
    import torch.nn.functional as F
    import triton

    import vga_linear

    if not vga_linear.kernels_loaded():
        sys.exit(f"core_configs: the CUDA kernels are not loaded ({vga_linear.kernels_not_loaded_reason()})")
    ops = torch.ops.vga

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=3, rep=15, return_mode="median") * 1e3  # us

    out = open(args.json, "w") if args.json else None
    start = time.time()
    for (R, H, K), rows in itertools.product(LAYERS, args.rows):
        dt = torch.bfloat16
        x = torch.randn(R, rows, H, device="cuda", dtype=dt)
        w = torch.randn(K, R * H, device="cuda", dtype=dt) / (R * H) ** 0.5
        b = torch.randn(K, device="cuda", dtype=dt)
        g = torch.randn(rows, K, device="cuda", dtype=dt)
        xc = torch.cat(x.unbind(0), -1)
        rec = {"R": R, "H": H, "K": K, "rows": rows,
               "fwd_gemm_only": bench(lambda: F.linear(xc, w, b)),
               "fwd_permute": bench(lambda: F.linear(x.permute(1, 0, 2).reshape(rows, R * H), w, b)),
               "gx_gemm_only": bench(lambda: g @ w), "gw_gemm_only": bench(lambda: g.t() @ xc)}
        for c in CONFIGS:
            rec["fwd_" + c] = bench(lambda: ops._gather_concat_linear_family(x, w, b, c))
            rec["gx_" + c] = bench(lambda: ops._gather_concat_linear_grad_x_family(g, w, R, c))
            rec["gw_" + c] = bench(lambda: ops._gather_concat_linear_grad_weight_family(g, x, c))
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        if time.time() - start > args.budget_s:
            print("core_configs: time budget reached", flush=True)
            break


# The plan model of csrc/kernels/sm90/schedule.cuh, in Python, with its constants as parameters.
def plan_cost(shape, block_n, splits, per_split, p, clusters=66):
    m_tiles = shape["m_outer"] * math.ceil(shape["m_inner"] / 128)
    n_tiles = shape["n_groups"] * math.ceil(shape["width"] / block_n)
    pair_rows = math.ceil(m_tiles / 2) * n_tiles
    pair_columns = m_tiles * math.ceil(n_tiles / 2)
    rounds = math.ceil(min(pair_rows, pair_columns) * splits / clusters)
    cost = rounds * (per_split * (1.0 if block_n == 256 else p["step_128"]) + p["tile_fixed"])
    if splits > 1:
        rows = shape["m_outer"] * shape["m_inner"]
        cost += rows * shape["n_groups"] * shape["width"] * (8.0 * splits + 2) / p["bytes_per_s"] / 0.8e-6
        cost += p["split_launch"]
    return cost


def core_shape(rec, kind):
    R, H, K, rows = rec["R"], rec["H"], rec["K"], rec["rows"]
    if kind == "fwd":
        return dict(m_outer=1, m_inner=rows, n_groups=1, width=K, kblocks=R * math.ceil(H / 64))
    if kind == "gx":
        return dict(m_outer=1, m_inner=rows, n_groups=1, width=R * H, kblocks=math.ceil(K / 64))
    span = H % 64 == 0
    return dict(m_outer=1, m_inner=K, n_groups=1 if span else R, width=R * H if span else H,
                kblocks=math.ceil(rows / 64))


def regrets(recs, p, report=False):
    out = []
    for rec, kind in itertools.product(recs, ("fwd", "gx", "gw")):
        shape = core_shape(rec, kind)
        measured = []
        for key, t in rec.items():
            if key.startswith(kind + "_sm90_gemm/") and isinstance(t, float):
                block_n, splits = (int(part[1:]) for part in key.split("/")[1:])
                per_split = math.ceil(shape["kblocks"] / splits)
                used = math.ceil(shape["kblocks"] / per_split)
                measured.append((plan_cost(shape, block_n, used, per_split, p), t, key))
        if not measured:
            continue
        picked = min(measured)
        regret = picked[1] / min(t for _, t, _ in measured)
        out.append(regret)
        if report and regret > 1.05:
            print(f"  {kind} R={rec['R']} H={rec['H']} K={rec['K']} rows={rec['rows']}: picks {picked[2]}, "
                  f"{regret:.2f}x the fastest")
    return out


def fit(path):
    recs = [json.loads(line) for line in open(path)]
    grid = dict(step_128=[0.5, 0.55, 0.6, 0.65], tile_fixed=[0.5, 1.5, 3.0], bytes_per_s=[1e12, 1.5e12, 3e12],
                split_launch=[2.0, 4.0, 8.0])
    best = None
    for values in itertools.product(*grid.values()):
        p = dict(zip(grid, values))
        r = regrets(recs, p)
        score = sum(r) / len(r)
        if best is None or score < best[0]:
            best = (score, max(r), p)
    print(f"best constants {best[2]}: mean regret {best[0]:.4f}, worst {best[1]:.2f}")
    regrets(recs, best[2], report=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write one JSON line a point here")
    parser.add_argument("--fit", metavar="JSONL", help="fit the plan model to a measured file instead")
    parser.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[100, 333, 1024, 4096])
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", "240")))
    args = parser.parse_args()
    if args.fit:
        fit(args.fit)
    else:
        measure(args)


if __name__ == "__main__":
    main()
