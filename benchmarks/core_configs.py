"""Every configuration of the Hopper GEMM core, forced, against cuBLAS: the data behind the core's
plan rule (csrc/kernels/sm90/schedule.cuh, plan_cost) and how well the rule picks.

  python benchmarks/core_configs.py --json results/runN-core-configs.jsonl   # on an H200
  python benchmarks/core_configs.py --fit results/runN-core-configs.jsonl    # anywhere: fit the rule
  ncu --cache-control all --clock-control none -k 'regex:core_gemm|nvjet' python benchmarks/core_configs.py \
      --once --layers 32,128,4096 --rows 512 --configs 'sm90_gemm/n128/s1'  # ours and cuBLAS's kernels

For each layer shape x row count it times, with the bench's timer (CUDA events, median, the L2
flushed by a 256 MiB *read* before each call: do_bench's zeroing flush leaves ~60 MB of dirty lines
that the next call writes back, which cost the small points here up to 4x; benchmarks/NOTES.md,
"Method"), the forward, grad_x and grad_weight of each forced tile width / split ("sm90_gemm/n128/s2") and the rule's
own choice ("sm90_gemm"), next to cuBLAS on a pre-concatenated input (F.linear, grad_y @ W,
grad_y^T @ cat(x)). --fit searches plan_cost's constants for the least worst regret, then the least
mean (regret: time of the configuration the model picks over the fastest one measured), and prints
where it picks worse than 5%.
"""

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import metrics as M

LAYERS = [(32, 128, 4096), (40, 128, 5120), (64, 128, 8192), (8, 1024, 8192), (4, 2048, 8192), (8, 512, 4096),
          (12, 64, 768), (16, 80, 1280), (3, 256, 1000), (2, 1536, 768), (32, 96, 3072)]
# The forward's narrow tiles (64 rows, 64 wide): after an unsplit plan, weighed unsplit, then split
# in the cluster by 2, 4, 8; after a 64-wide split in the cluster by S, split in the cluster by S or more.
NARROW_CONFIG = "sm90_gemm/n64/s1/m64"
NARROW_KEY = "fwd_" + NARROW_CONFIG
NARROW_CLUSTER_SLICES = (2, 4, 8)
NARROW_CLUSTER_CONFIGS = [f"sm90_gemm/n64/c{slices}/m64" for slices in NARROW_CLUSTER_SLICES]
# s<count>: a split across the grid (workspace + a second launch); c<count>: in the cluster (DSMEM sum).
# (the in-cluster splits the rule can take at few tiles are all here: run 94's largest regret was the
# rule's n192/c4, which the list then lacked)
CONFIGS = ["sm90_gemm"] + [f"sm90_gemm/{c}" for c in (
    "n256/s1", "n256/s2", "n192/s1", "n192/s2", "n192/c2", "n192/c4", "n128/s1", "n128/s2",
    "n128/s4", "n128/c2", "n128/c4", "n128/c8", "n64/s1", "n64/s2", "n64/s4", "n64/c2", "n64/c4", "n64/c8", "n240/s1",
    "n176/s1", "n112/s1", "n96/s1")] + [NARROW_CONFIG] + NARROW_CLUSTER_CONFIGS
# The forward's token widths: it runs transposed (W's rows as M, the tokens as N; no split).
TOKEN_WIDTHS = (96, 112, 176, 240)
# A tile's rows (schedule.cuh: kBlockM, two consumer warpgroups) and the forward's narrow tiles' (kNarrowBlockM).
BLOCK_M = 128
NARROW_BLOCK_M = 64
# The widest tile whose reduction splits in the cluster (schedule.cuh, kWidestClusterSplit).
WIDEST_CLUSTER_SPLIT = 192
# Clusters resident at once by size, as the plan counts them (the extension asks the driver:
# torch.ops.vga._sm90_resident_clusters; these are its answers on an H200 of 132 SMs, where pairs
# leave some SMs of odd GPCs unpaired): the paired kernels', the in-cluster splits' by size, the
# swapped forward's pairs. The fit uses these; another chip's cut of its GPCs may answer otherwise.
RESIDENT = {"pairs": 66, 2: 66, 4: 30, 8: 15, "swapped_pairs": 66}


def resident_of(text):
    """The counts _sm90_resident_clusters reports ("pairs=66 of2=66 of4=30 of8=15 swapped_pairs=66")."""
    fields = dict(item.split("=") for item in text.split())
    return {"pairs": int(fields["pairs"]), 2: int(fields["of2"]), 4: int(fields["of4"]), 8: int(fields["of8"]),
            "swapped_pairs": int(fields["swapped_pairs"])}


def is_narrow(config):
    """A configuration (or key) of the forward's narrow tiles (m64)."""
    return config.endswith("/m64")


def forward_only(config):
    """A configuration of the forward alone: a token width, or the narrow tiles (m64)."""
    return is_narrow(config) or ("/" in config and int(config.split("/")[1][1:]) in TOKEN_WIDTHS)


def measure(args):
    import torch
    import torch.nn.functional as F

    import harness
    import vga_linear

    if not vga_linear.kernels_loaded():
        sys.exit(f"core_configs: the CUDA kernels are not loaded ({vga_linear.kernels_not_loaded_reason()})")
    ops = torch.ops.vga

    timer = harness.GpuTimer()

    def bench(fn):
        if args.once:  # one call, for a profiler to catch (ncu -k 'regex:core_gemm|nvjet|gemm')
            fn()
            torch.cuda.synchronize()
            return 0.0
        return statistics.median(timer.run(fn, warmup_ms=2.0, rep_ms=args.rep_ms, min_runs=10))  # us

    out = open(args.json, "w") if args.json else None
    start = time.time()
    for (R, H, K), rows in itertools.product(args.layers, args.rows):
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
        for c in args.configs:
            rec["fwd_" + c] = bench(lambda: ops._gather_concat_linear_family(x, w, b, c))
            if forward_only(c):
                continue
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


# The plan model of csrc/kernels/sm90/schedule.cuh (plan_cost), in Python, its constants a dict.
CONSTANTS = ("kblock_us_256", "kblock_us_192", "kblock_us_128", "kblock_us_64", "job_us", "hbm_bytes_per_us", "split_bytes_per_us",
             "split_launch_us", "cluster_slice_us", "cluster_unshared", "span_kblock_us", "span_b_kblock_us",
             "span_b_kblock_us_per_64", "tail_kblock_us", "narrow_slice_us")


def tile_counts(shape, block_n, block_m=BLOCK_M):
    return shape["m_outer"] * math.ceil(shape["m_inner"] / block_m), shape["n_groups"] * math.ceil(shape["width"] / block_n)


def kblock_us(block_n, p):
    """schedule.cuh's kblock_us_of: the fitted widths' constants, linear in between."""
    widths = (64, 128, 192, 256)
    if block_n in widths:
        return p[f"kblock_us_{block_n}"]
    i = 0 if block_n < 128 else 1 if block_n < 192 else 2
    lo, hi = p[f"kblock_us_{widths[i]}"], p[f"kblock_us_{widths[i + 1]}"]
    return lo + (hi - lo) * (block_n - widths[i]) / (widths[i + 1] - widths[i])


def plan_cost(shape, block_n, splits, per_split, in_cluster, p, resident=RESIDENT, block_m=BLOCK_M):
    m_tiles, n_tiles = tile_counts(shape, block_n, block_m)
    rows, columns = shape["m_outer"] * shape["m_inner"], shape["n_groups"] * shape["width"]
    reduction = reduction_elements(shape)
    step_fill = reduction / (kblocks(shape) * 64)
    hbm_us = 2.0 * (rows * reduction + columns * reduction + rows * columns) / p["hbm_bytes_per_us"]
    # an operand copied along the concatenation: the forward's A (16 KB a k-block), grad_weight's B
    # (block_n x 64: as many bytes per 128 columns)
    span_floor = {"A": p["span_kblock_us"],
                  "B": p["span_b_kblock_us"] + p["span_b_kblock_us_per_64"] * block_n / 64}.get(shape.get("span_copy"), 0.0)
    # a narrow tile's k-block copies (64 + N) operand rows instead of (128 + N)
    rows_ratio = (block_m + block_n) / (BLOCK_M + block_n)
    kb_us = max(kblock_us(block_n, p) * rows_ratio, span_floor)
    job_us = per_split * kb_us * step_fill + p["job_us"]
    if in_cluster:  # its CTAs share no operand: the unshared B tile's part of a k-block on top
        rounds = math.ceil(m_tiles * n_tiles / resident[splits])
        unshared = p["cluster_unshared"] * block_n / 256.0
        job_us += per_split * kb_us * step_fill * unshared
        slice_us = p["narrow_slice_us"] if block_m != BLOCK_M else p["cluster_slice_us"]
        return max(rounds * (job_us + slice_us * splits), hbm_us)
    pair_rows = math.ceil(m_tiles / 2) * n_tiles
    pair_columns = m_tiles * math.ceil(n_tiles / 2)
    copied = shape.get("span_copy")
    columns_paired = copied == "B" if copied else (block_n == 64 or pair_columns < pair_rows
                                                   or (pair_columns == pair_rows and block_n < BLOCK_M))
    jobs = (pair_columns if columns_paired else pair_rows) * splits
    rounds = math.ceil(jobs / resident["pairs"])
    # a packed tail k-block: its copy of 64 / tail times the box rows bounds it where a CTA walks
    # several tiles (schedule.cuh)
    tail_extra = 0.0
    if rounds > 1 and shape.get("tail_kblocks"):
        tail_us = p["tail_kblock_us"] * 16 * shape["k_groups"] / shape["tail_elements"] * rows_ratio
        tail_extra = min(shape["tail_kblocks"], per_split) * max(0.0, tail_us - kb_us)
    cost = max(rounds * (job_us + tail_extra), hbm_us)
    if splits > 1:
        cost += rows * columns * (8.0 * splits + 2) / p["split_bytes_per_us"] + p["split_launch_us"]
    return cost


# How the forward lays its reduction out where H % 64 != 0, by build: k-blocks a shard, the last
# zero-filled (runs 22-58); the tails of H % 64 = 16 or 32 packed 4 or 2 shards a k-block (runs
# 59-80); those packed and the other widths' k-blocks along the concatenation (one group of R * H,
# its pairs always of row tiles: run 81 on). core_shape's "span" is that layout's shape along the
# concatenation, for grad_weight too where H % 64 != 0 (its columns, B copied by cp.async, pairs
# of column tiles: run 88 on); pick weighs it against the shards' ("packed").
LAYOUTS = ("per_shard", "packed", "span")


def core_shape(rec, kind, skips_fill=True, layout="span", token_tiles=False):
    """schedule.cuh's CoreShape: the reduction is k_groups x k_group_width (+ the forward's packed
    shard tails). `skips_fill`: the kernel skips each group's zero-filled k steps (False for
    measurements before it did, runs 22-33); `layout`: the forward's, as the build that measured
    the data had it (LAYOUTS)."""
    R, H, K, rows = rec["R"], rec["H"], rec["K"], rec["rows"]
    if kind == "fwd" and token_tiles:  # the swapped forward: M = W's rows, N = the tokens, unpacked
        shape = dict(m_outer=1, m_inner=K, n_groups=1, width=rows, k_groups=R, k_group_width=H)
    elif kind == "fwd" and layout == "span" and H % 64 not in (0, 16, 32):
        shape = dict(m_outer=1, m_inner=rows, n_groups=1, width=K, k_groups=1, k_group_width=R * H,
                     span_copy="A")
    elif kind == "fwd":
        tail = H % 64 if layout != "per_shard" and H % 64 in (16, 32) else 0
        shape = dict(m_outer=1, m_inner=rows, n_groups=1, width=K, k_groups=R, k_group_width=H - tail,
                     tail_kblocks=math.ceil(R * tail / 64), tail_elements=R * tail)
    elif kind == "gx":
        shape = dict(m_outer=1, m_inner=rows, n_groups=1, width=R * H, k_groups=1, k_group_width=K)
    else:
        copies = layout == "span" and H % 64 != 0  # (pick asks for the shards' as "packed")
        one_group = H % 64 == 0 or copies
        shape = dict(m_outer=1, m_inner=K, n_groups=1 if one_group else R, width=R * H if one_group else H,
                     k_groups=1, k_group_width=rows, **({"span_copy": "B"} if copies else {}))
    return dict(shape, skips_fill=skips_fill)


def kblocks(shape):
    return shape["k_groups"] * math.ceil(shape["k_group_width"] / 64) + shape.get("tail_kblocks", 0)


def reduction_elements(shape):
    """The reduction the MMAs run: without each group's zero fill where the kernel skips it."""
    data = shape["k_groups"] * shape["k_group_width"] + shape.get("tail_elements", 0)
    return data if shape["skips_fill"] else kblocks(shape) * 64


def disturbed(rec):
    """The rule runs one of the forced configurations, so a point where it beats them all by 10% in
    some product was disturbed while it was measured (run 63 has one: every forced time from one
    configuration on ~10x, the rule's, measured first, not)."""
    for kind in ("fwd", "gx", "gw"):
        rule = rec.get(kind + "_sm90_gemm")
        forced = [t for key, t in rec.items() if key.startswith(kind + "_sm90_gemm/") and isinstance(t, float)]
        if isinstance(rule, float) and forced and rule < 0.9 * min(forced):
            return True
    return False


# choose_plan splits across the grid into slices of this many k-blocks or more (a shorter slice does
# not pay for its partial sums).
MIN_SLICE_KBLOCKS = 4


def grid_split_counts(total):
    """The split counts choose_plan enumerates across the grid for `total` k-blocks, fewest first:
    each count that its slice length gives back, until a slice is shorter than MIN_SLICE_KBLOCKS."""
    counts = []
    for splits in range(1, 65):
        per_split = math.ceil(total / splits)
        if per_split < MIN_SLICE_KBLOCKS and splits > 1:
            break
        if math.ceil(total / per_split) == splits:
            counts.append(splits)
    return counts


def plan_keys(rec, kind):
    """Every configuration choose_plan (schedule.cuh) weighs for this product, as the forced names
    spell them ("fwd_sm90_gemm/n128/s2"), in its order: per width 256, 192, 128, 64 the grid
    splits it enumerates (fewest first, until a slice is shorter than 4 k-blocks), then the cluster
    splits 2, 4, 8; the forward's token widths unsplit; its narrow tiles (NARROW_KEY, and split in
    the cluster). Where the forward may run along the concatenation (H % 64 not 0, 16 or 32), the
    grid splits are those of both layouts: pick weighs each key in the shards' layout and, as its
    "/span" variant, along the concatenation, whose k-block counts differ (R * ceil(H / 64)
    against ceil(R * H / 64))."""
    layouts = ("packed", "span") if kind == "fwd" else ("span",)
    totals = sorted({kblocks(core_shape(rec, kind, layout=layout)) for layout in layouts})
    keys = []
    for block_n in (256, 192, 128, 64):
        grid_splits = sorted({splits for total in totals for splits in grid_split_counts(total)})
        keys += [f"{kind}_sm90_gemm/n{block_n}/s{splits}" for splits in grid_splits]
        keys += [f"{kind}_sm90_gemm/n{block_n}/c{slices}" for slices in (2, 4, 8)]
    if kind == "fwd":
        keys += ([f"{kind}_sm90_gemm/n{block_n}/s1" for block_n in TOKEN_WIDTHS] + [NARROW_KEY]
                 + [f"{kind}_{c}" for c in NARROW_CLUSTER_CONFIGS])
    return keys


def dispatch_name(key):
    """A plan key ("fwd_sm90_gemm/n128/s2") as _gather_concat_linear_choice names the configuration
    ("sm90_gemm/n128/s2"; the swapped forward's token widths carry no split: "sm90_gemm/n176")."""
    name = key.split("_", 1)[1]
    return name.rsplit("/", 1)[0] if int(name.split("/")[1][1:]) in TOKEN_WIDTHS else name


def _plans(kind, p, keys, shapes, first_only, resident):
    """(cost, key, order) of each plan among `keys` that choose_plan weighs, on `shapes` ({swapped:
    CoreShape}); `order` is choose_plan's (the simpler plan first)."""
    candidates = []
    for key in keys:
        width, split = key.split("/")[1:3]
        block_n, splits, in_cluster = int(width[1:]), int(split[1:]), split[0] == "c"
        swapped = block_n in TOKEN_WIDTHS
        if swapped and first_only:
            continue  # the rule keeps packed or concatenation-long reductions in the first orientation
        shape = shapes[swapped]
        counts = dict(resident, pairs=resident["swapped_pairs"]) if swapped else resident
        total = kblocks(shape)
        per_split = math.ceil(total / splits)
        used = splits if in_cluster else math.ceil(total / per_split)
        if not in_cluster and splits > 1 and per_split < MIN_SLICE_KBLOCKS:
            continue  # choose_plan enumerates no grid split with slices under 4 k-blocks (a key from
            # the other forward layout's k-block count may ask for one)
        block_m = NARROW_BLOCK_M if is_narrow(key) else BLOCK_M
        if in_cluster and (block_n > WIDEST_CLUSTER_SPLIT or per_split * (splits - 1) >= total
                           or math.prod(tile_counts(shape, block_n, block_m)) > counts[splits]
                           or shape.get("span_copy") == "B"):
            continue  # the rule gives every CTA of the cluster a slice, all clusters in one round (no
            # in-cluster split for grad_weight's columns along the concatenation)
        cost = plan_cost(shape, block_n, used, per_split, in_cluster, p, counts, block_m)
        candidates.append((cost, key, (swapped, -block_n, in_cluster, splits)))
    return candidates


def _cheapest(candidates):
    """choose_plan's pick per orientation ({swapped: (cost, key, order)}): in its order, a rival
    displaces the plan so far only when it is 3% cheaper."""
    best = {}
    for c in sorted(candidates, key=lambda c: c[2]):
        if c[2][0] not in best or c[0] < best[c[2][0]][0] * 0.97:
            best[c[2][0]] = c
    return best


def _cheapest_along_concatenation(rec, kind, p, base_keys, skips_fill, resident):
    """choose_plan's pick among `base_keys` (forced names without "/span") for the product with x's
    operand along the concatenation, as _plans' (cost, key, order), or None."""
    shape = core_shape(rec, kind, skips_fill, "span")
    return _cheapest(_plans(kind, p, base_keys, {False: shape}, True, resident)).get(False)


def pick(rec, kind, p, keys, skips_fill=True, layout="span", resident=RESIDENT):
    """The key among `keys` (forced names, "fwd_sm90_gemm/n128/s2") that the plan model picks for
    this product, and the keys the rule could pick at all ((None, []) if none): sm90_gemm_plan's
    rule. choose_plan's cheapest plan of each orientation, the swapped one only if 3% cheaper (the
    first orientation's unsplit plan giving way to the narrow tiles, NARROW_KEY or split in the
    cluster where their clusters fit at once, and its 64-wide split in the cluster to the narrow
    tiles split in the cluster by as many slices or more, each if 3% cheaper than the plan so far:
    choose_plan's last step);
    with the "span" layout, where H % 64 is not 0, 16 or 32, the cheapest plan along the concatenation
    ("fwd_sm90_gemm/n128/s1/span": each non-token key's span variant is weighed) if 3% cheaper than
    that one with its zero fill charged. grad_weight where H % 64 != 0: its columns along the
    concatenation always (sm90_grad_weight_plan), the cheapest such plan. `resident`: the cluster
    counts (RESIDENT's keys). The shapes are 3-D x's (one outer batch index)."""
    if kind == "gw" and layout == "span" and rec["H"] % 64 != 0:  # always the concatenation's columns
        span_keys = [k for k in keys if k.endswith("/span")]
        span = _cheapest_along_concatenation(rec, kind, p, [k.removesuffix("/span") for k in span_keys], skips_fill,
                                             resident)
        return (span[1] + "/span", span_keys) if span else (None, [])
    spans = kind == "fwd" and layout == "span" and rec["H"] % 64 not in (0, 16, 32)
    shard_layout = "packed" if layout == "span" else layout
    shapes = {False: core_shape(rec, kind, skips_fill, shard_layout),
              True: core_shape(rec, kind, skips_fill, shard_layout, token_tiles=True)}
    first_only = kind == "fwd" and shard_layout != "per_shard" and rec["H"] % 64 in (16, 32)
    shard_keys = [k for k in keys if not k.endswith("/span") and not is_narrow(k)]  # (the narrow tiles: below)
    candidates = _plans(kind, p, shard_keys, shapes, first_only, resident)
    if not candidates:
        return None, []
    best = _cheapest(candidates)
    # choose_plan's last step: the narrow tiles, unsplit or split in the cluster where their tiles fit
    # at once, replace an unsplit plan of the first orientation; split in the cluster by as many
    # slices or more, a 64-wide split in the cluster; each in that order if 3% cheaper than the plan so far
    width, split = best[False][1].split("/")[1:3] if False in best else ("", "")
    after_unsplit = split == "s1"
    if after_unsplit or (width == "n64" and split.startswith("c")):
        fewest = int(split[1:])
        narrow_keys = [NARROW_KEY] * after_unsplit + [
            f"{kind}_{c}" for slices, c in zip(NARROW_CLUSTER_SLICES, NARROW_CLUSTER_CONFIGS) if slices >= fewest]
        for plan in _plans(kind, p, [k for k in narrow_keys if k in keys], shapes, first_only, resident):
            candidates.append(plan)
            if plan[0] < 0.97 * best[False][0]:
                best[False] = plan
    swaps = True in best and (False not in best or best[True][0] < 0.97 * best[False][0])
    chosen, eligible = best[swaps][1], [c[1] for c in candidates]
    if spans:
        span_keys = sorted({k.removesuffix("/span") for k in keys if not forward_only(k)})
        span = _cheapest_along_concatenation(rec, kind, p, span_keys, skips_fill, resident)
        if span:
            charged = {sw: dict(shape, skips_fill=False) for sw, shape in shapes.items()}
            chosen_cost = _plans(kind, p, [chosen], charged, first_only, resident)[0][0]
            eligible += [k + "/span" for k in span_keys]
            if span[0] < 0.97 * chosen_cost:
                chosen = span[1] + "/span"
    return chosen, eligible


def regrets(recs, p, kinds=("fwd", "gx", "gw"), report=False, skips_fill=True, layout="span"):
    out = []
    for rec, kind in itertools.product(recs, kinds):
        if kind == "fwd" and rec["rows"] <= 64:
            continue  # the skinny families take these rows (the dispatch order)
        if disturbed(rec):
            if report and kind == kinds[0]:
                print(f"  skipped R={rec['R']} H={rec['H']} K={rec['K']} rows={rec['rows']}: disturbed while measured")
            continue
        measured = {key: t for key, t in rec.items() if key.startswith(kind + "_sm90_gemm/") and isinstance(t, float)}
        picked, eligible = pick(rec, kind, p, list(measured), skips_fill, layout)
        if picked is None:
            continue
        regret = measured[picked] / min(measured[key] for key in eligible)
        out.append(regret)
        if report and regret > 1.05:
            print(f"  {kind} R={rec['R']} H={rec['H']} K={rec['K']} rows={rec['rows']}: picks {picked}, "
                  f"{regret:.2f}x the fastest")
    return out


def fit(path, kinds, layout="span"):
    """Coordinate descent over each constant's grid (a few sweeps), scoring a constant set by its worst
    regret (rounded to 0.01: a cliff costs more than 2% everywhere), then its mean regret."""
    recs = [json.loads(line) for line in open(path)]
    grid = dict(kblock_us_256=[0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8], kblock_us_192=[0.3, 0.38, 0.42, 0.45, 0.48, 0.52, 0.6],
                kblock_us_128=[0.2, 0.25, 0.28, 0.3, 0.33, 0.36, 0.4],
                kblock_us_64=[0.12, 0.15, 0.18, 0.2, 0.22, 0.25, 0.3], job_us=[0.0, 1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0],
                hbm_bytes_per_us=[1.5e6, 2e6, 2.5e6, 3e6, 3.5e6, 4e6, 5e6], split_bytes_per_us=[0.5e6, 1e6, 1.5e6, 2e6, 3e6],
                split_launch_us=[1.0, 2.0, 3.0, 4.0, 6.0], cluster_slice_us=[0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
                cluster_unshared=[0.0, 0.1, 0.2, 0.3, 0.5], span_kblock_us=[0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6],
                span_b_kblock_us=[0.15, 0.2, 0.23, 0.3], span_b_kblock_us_per_64=[0.1, 0.13, 0.16, 0.2],
                tail_kblock_us=[0.0, 0.45, 0.7, 0.9, 1.2], narrow_slice_us=[0.0, 0.1, 0.2, 0.4, 0.75])
    p = {k: v[len(v) // 2] for k, v in grid.items()}

    def score(q):
        r = regrets(recs, q, kinds, layout=layout)
        return (round(max(r), 2), sum(r) / len(r))

    best = score(p)
    for _ in range(4):
        for name, values in grid.items():
            for v in values:
                q = dict(p, **{name: v})
                sc = score(q)
                if sc < best:
                    best, p = sc, q
    print(f"best constants {p}: worst regret {best[0]:.2f}, mean {best[1]:.4f}")
    regrets(recs, p, kinds, report=True, layout=layout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write one JSON line a point here")
    parser.add_argument("--fit", metavar="JSONL", help="fit the plan model to a measured file instead")
    parser.add_argument("--rows", type=M.parse_counts, default=[100, 333, 1024, 4096])
    parser.add_argument("--layers", type=M.parse_layers, default=LAYERS,
                        help="R,H,K;R,H,K;... (default: the 11 sweep layers)")
    parser.add_argument("--configs", type=lambda s: s.split(";"), default=CONFIGS)
    parser.add_argument("--kinds", type=lambda s: tuple(s.split(",")), default=("fwd", "gx", "gw"),
                        help="--fit: the products to fit (fwd, gx, gw)")
    parser.add_argument("--layout", choices=LAYOUTS, default="span",
                        help="--fit: the forward's layout where H %% 64 != 0 in the build that measured the file "
                             "(per_shard: runs up to 58, packed: 59-80, span: 81 on)")
    parser.add_argument("--once", action="store_true",
                        help="run every product once, untimed: the launches for ncu to profile side by side")
    parser.add_argument("--rep-ms", type=float, default=15.0, help="time budget of one median")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", "240")))
    args = parser.parse_args()
    if args.fit:
        fit(args.fit, args.kinds, layout=args.layout)
    else:
        measure(args)


if __name__ == "__main__":
    main()
