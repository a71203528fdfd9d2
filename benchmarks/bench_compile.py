"""torch.compile with and without vga_linear.compile's rewrite, forward and training step, on CUDA.

Cases (bf16 by default):
  oproj_cat      F.linear(torch.cat(x.unbind(0), -1), W): R=32, rows 2048, H=128, K=4096 (issue 15's shape)
  oproj_permute  the same on attn (1, 32, 2048, 128).transpose(1, 2).reshape(1, 2048, 4096)
  attn_eager     a LlamaAttention-style block (hidden 4096, 32 heads, s 2048): eager attention,
                 whose output is contiguous (b, heads, s, d), so the o_proj gather copies
  attn_sdpa      the same block on SDPA (flash: output laid out (b, s, heads, d), nothing to
                 copy, so the pass declines; "forced" rows rewrite it anyway, require_copy=False)
  llama_eager    transformers LlamaForCausalLM from a LlamaConfig (1 layer, hidden 2048, 16
  llama_sdpa     heads, 2 x 1024 tokens, no download), eager / sdpa attention (skipped without
                 transformers; llama_sdpa and attn_sdpa are not in the default set)

Each row: CUDA-event median µs of the compiled model without the rewrite and with it, the
ratio (> 1: the rewrite is faster) and how many linears the pass rewrote. The two compiled
variants live side by side (each compiles its own copy of the calling code, so Dynamo keeps
both) and are timed alternately after 0.3 s of warm-up each, so clock and host drift fall on
both alike; a model with graph breaks (whose inner frames the variants would share) is timed one
variant after the other instead, marked "seq". "fwd" runs under
torch.no_grad(); "train" is forward + backward (no optimizer). The default set is sized to
run in under 90 s on an H200, most of it compiling (16 compiles); the total is printed.

--sweep: the two o_proj forms (cat, permute) over sweep.py's layer shapes x token counts, forward,
compiled without and with the rewrite: issue 15's "never slower at any shape the rewrite accepts"
checked beyond one shape. Each (layer, form) compiles both variants twice, at one token (Dynamo
specialises a size of 1) and with the token dim dynamic for the other counts, so that a point costs
no compile; the distribution of the ratio (min, median, max, points below 0.98) closes the table.

  python benchmarks/bench_compile.py [--cases a,b] [--modes fwd,train] [--forced] [--json PATH]
  python benchmarks/bench_compile.py --sweep [--layers 7b_oproj,vit_b_heads] [--rows 1,16,1024] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import vga_linear
import vga_linear.compile as vc


class OProjCat(nn.Module):
    def __init__(self, R, H, K, dtype, device):
        super().__init__()
        self.proj = nn.Linear(R * H, K, bias=False, dtype=dtype, device=device)

    def forward(self, x):
        return self.proj(torch.cat(x.unbind(0), dim=-1))


class OProjPermute(nn.Module):
    def __init__(self, R, H, K, dtype, device):
        super().__init__()
        self.proj = nn.Linear(R * H, K, bias=False, dtype=dtype, device=device)

    def forward(self, attn):
        b, h, s, d = attn.shape
        return self.proj(attn.transpose(1, 2).reshape(b, s, h * d))


class Attention(nn.Module):
    """transformers' LlamaAttention forward without rotary/cache (same views and projections)."""

    def __init__(self, hidden, heads, kv_heads, attention, dtype, device):
        super().__init__()
        self.head_dim = hidden // heads
        self.groups = heads // kv_heads
        self.attention = attention
        kw = {"bias": False, "dtype": dtype, "device": device}
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, **kw)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, **kw)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, **kw)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, **kw)

    def forward(self, hidden_states):
        input_shape = hidden_states.shape[:-1]
        shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2).repeat_interleave(self.groups, 1)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2).repeat_interleave(self.groups, 1)
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
            s = q.shape[2]
            mask = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
            w = F.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(w, v)
        out = out.transpose(1, 2).contiguous()
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


def _llama(attention, dtype, device, smoke=False):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128 if smoke else 4096,
        hidden_size=64 if smoke else 2048,
        intermediate_size=128 if smoke else 5632,
        num_hidden_layers=1,
        num_attention_heads=4 if smoke else 16,
        num_key_value_heads=2 if smoke else 4,
        max_position_embeddings=2048,
    )
    config._attn_implementation = attention
    torch.manual_seed(0)
    inner = transformers.LlamaForCausalLM(config).to(dtype=dtype, device=device)

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids, use_cache=False).logits

    return Logits()


def make_case(name, dtype, device, smoke=False):
    torch.manual_seed(0)
    # smoke: the same code on small CPU shapes, to check the script without a GPU
    R, rows, H, K = (4, 16, 16, 32) if smoke else (32, 2048, 128, 4096)
    if name == "oproj_cat":
        return OProjCat(R, H, K, dtype, device), torch.randn(R, rows, H, dtype=dtype, device=device)
    if name == "oproj_permute":
        return OProjPermute(R, H, K, dtype, device), torch.randn(1, R, rows, H, dtype=dtype, device=device)
    if name in ("attn_eager", "attn_sdpa"):
        model = Attention(R * H, R, R // 4, name.split("_")[1], dtype, device)
        return model, torch.randn(1, rows, R * H, dtype=dtype, device=device)
    if name in ("llama_eager", "llama_sdpa"):
        model = _llama(name.split("_")[1], dtype, device, smoke)
        return model, torch.randint(0, 128 if smoke else 4096, (2, 16 if smoke else 1024), device=device)
    raise SystemExit(f"unknown case {name}")


def _event_us(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


def _warm(fn, seconds=0.3):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
    torch.cuda.synchronize()


def paired_median_us(fns, iters=40):
    """Median µs of each of `fns`, timed alternately (one call of each a round)."""
    if not torch.cuda.is_available():  # --smoke on CPU
        out = []
        for fn in fns:
            fn()
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return out
    for fn in fns:
        _warm(fn)
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, t in zip(fns, times):
            t.append(_event_us(fn))
    return [statistics.median(t) for t in times]


def _own_code(model, tag):
    """A function calling model(x) whose code object is its own: Dynamo caches compiled code per
    code object, so two such functions compiled under different passes keep both results."""
    def call(inp):
        return model(inp)

    code = call.__code__.replace(co_name=f"bench_{tag}")
    return types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)


def compile_variant(model, x, mode, rewrite, pass_options, tag):
    """(step, rewrites, first-call seconds, graph breaks) of the torch.compile'd model in mode."""
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(_own_code(model, tag))
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(mode != "fwd")
    if mode == "fwd":
        def step(inp=x):  # (another input of x's dims: the sweep's other token counts)
            with torch.no_grad():
                return compiled(inp)
    else:
        inp = x.detach().clone().requires_grad_(x.is_floating_point())
        grad = None

        def step():
            nonlocal grad
            for p in params:
                p.grad = None
            out = compiled(inp)
            if grad is None:
                grad = torch.randn_like(out) / out.numel() ** 0.5
            out.backward(grad)
            return out

    with vc.enabled(**pass_options) if rewrite else contextlib.nullcontext():
        t0 = time.perf_counter()
        step()  # compiles, under the pass when rewrite
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
    return step, counters["vga_linear"]["rewritten"], first, sum(counters["graph_break"].values())


def time_variants(model, x, mode, variants, check=False):
    """[(µs, rewrites, first-call s, output if check)] of each (rewrite, pass_options) variant, and
    whether they were timed one after the other (graph breaks) rather than alternately."""
    output = lambda step: step().detach().float() if check else None

    def compiled_variant(i, tag):
        rewrite, opts = variants[i]
        step, n, first, breaks = compile_variant(model, x, mode, rewrite, opts, tag)
        if not rewrite and n:
            raise RuntimeError(f"the variant compiled without the pass rewrote {n} linears")
        return step, n, first, breaks

    torch._dynamo.reset()
    compiled = [compiled_variant(0, "v0")]
    if compiled[0][3] == 0:
        compiled += [compiled_variant(i, f"v{i}") for i in range(1, len(variants))]
    if all(breaks == 0 for *_, breaks in compiled):
        # timed outside the pass: a recompile now would drop it, so it must not happen
        with torch._dynamo.config.patch(error_on_recompile=True):
            us = paired_median_us([step for step, *_ in compiled])
        return [(t, n, first, output(step)) for t, (step, n, first, _) in zip(us, compiled)], False
    # graph breaks: the variants' resumed inner frames would share one cache, so one at a time
    out = []
    for i in range(len(variants)):
        if i > 0:
            torch._dynamo.reset()
        step, n, first, _ = compiled[0] if i == 0 else compiled_variant(i, "seq")
        out.append((paired_median_us([step])[0], n, first, output(step)))
    return out, True


SWEEP_ROWS = (1, 16, 64, 256, 1024, 4096)
SLOWER = 0.98  # a sweep point whose ratio is below this: the rewrite lost there


def sweep_oproj(layers, rows_list, dtype, device, pass_options):
    """[row dict] of each (layer, form, token count) of `layers` ({name: (R, H, K)}), forward: the
    compiled model without and with the rewrite, timed alternately."""
    rows_out = []
    for name, (R, H, K) in layers.items():
        for form, cls in (("cat", OProjCat), ("permute", OProjPermute)):
            torch.manual_seed(0)
            model = cls(R, H, K, dtype, device)
            token_dim = 1 if form == "cat" else 2

            def make_input(tokens):
                shape = (R, tokens, H) if form == "cat" else (1, R, tokens, H)
                return torch.randn(shape, dtype=dtype, device=device)

            for group in ([r for r in rows_list if r == 1], [r for r in rows_list if r != 1]):
                if not group:
                    continue
                torch._dynamo.reset()
                first = make_input(group[0])
                if group[0] != 1:
                    torch._dynamo.mark_dynamic(first, token_dim)
                (step, _, _, _), (rewrite_step, rewrites, _, _) = (
                    compile_variant(model, first, "fwd", rewrite, pass_options, f"sweep_{form}_{int(rewrite)}")
                    for rewrite in (False, True))
                for tokens in group:
                    x = first if tokens == group[0] else make_input(tokens)
                    # timed outside the pass: a recompile now would drop it, so it must not happen
                    with torch._dynamo.config.patch(error_on_recompile=True):
                        base_us, us = paired_median_us([lambda: step(x), lambda: rewrite_step(x)])
                    row = {"case": f"{name} {form}", "layer": [R, H, K], "rows": tokens, "mode": "fwd",
                           "dtype": str(dtype).removeprefix("torch."), "compile_us": base_us, "rewrite_us": us,
                           "ratio": base_us / us, "rewrites": rewrites}
                    rows_out.append(row)
                    print(f"{row['case']:<22}{tokens:>7}{base_us:>12.1f}{us:>13.1f}{row['ratio']:>7.2f}x"
                          f"{rewrites:>10}" + ("  <" if row["ratio"] < SLOWER else ""))
            del model
    return rows_out


def summarise_sweep(rows):
    """The ratio's distribution over the sweep's points where the pass rewrote."""
    ratios = sorted(r["ratio"] for r in rows if r["rewrites"])
    if not ratios:
        print("no point rewritten")
        return {}
    summary = {"points": len(ratios), "min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1],
               f"below_{SLOWER}": sum(r < SLOWER for r in ratios)}
    worst = min((r for r in rows if r["rewrites"]), key=lambda r: r["ratio"])
    print(f"ratio over {summary['points']} rewritten points: min {summary['min']:.3f} ({worst['case']}, "
          f"{worst['rows']} rows), median {summary['median']:.3f}, max {summary['max']:.3f}; "
          f"{summary[f'below_{SLOWER}']} below {SLOWER}")
    return summary


def run_cases(args, dtype, device, pass_options):
    """[row dict] of each named case and mode: the compiled model without and with the rewrite."""
    rows = []
    print(f"{'case':<22}{'mode':<7}{'compile µs':>12}{'+rewrite µs':>13}{'ratio':>8}{'rewrites':>10}{'compile s':>11}")
    for name in [c for c in args.cases.split(",") if c]:
        try:
            model, x = make_case(name, dtype, device, args.smoke)
        except ImportError as exc:
            print(f"{name:<22}skipped ({exc})")
            continue
        variants = [("", dict(pass_options))]
        if args.forced and name.endswith("sdpa"):
            variants.append((" forced", {**pass_options, "require_copy": False}))
        for mode in [m for m in args.modes.split(",") if m]:
            timed, sequential = time_variants(model, x, mode, [(False, {})] + [(True, o) for _, o in variants],
                                              check=args.check)
            (base_us, _, base_first, base_out), results = timed[0], timed[1:]
            for (suffix, _), (us, n, first, out) in zip(variants, results):
                row = {
                    "case": name + suffix,
                    "mode": mode,
                    "dtype": args.dtype,
                    "compile_us": base_us,
                    "rewrite_us": us,
                    "ratio": base_us / us,
                    "rewrites": n,
                    "first_call_s": [base_first, first],
                    "timed": "one after the other" if sequential else "alternately",
                }
                if args.check:
                    row["max_abs_diff"] = (out - base_out).abs().max().item()
                rows.append(row)
                print(
                    f"{row['case']:<22}{mode:<7}{base_us:>12.1f}{us:>13.1f}{row['ratio']:>7.2f}x{n:>10}"
                    f"{base_first + first:>11.1f}"
                    + (f"  max|diff| {row['max_abs_diff']:.3g}" if args.check else "")
                    + ("  seq" if sequential else "")
                )
        del model, x
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="oproj_cat,oproj_permute,attn_eager,llama_eager",
                    help="comma-separated; attn_sdpa and llama_sdpa are also available")
    ap.add_argument("--modes", default="fwd,train")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--forced", action="store_true", help="also rows with require_copy=False for the sdpa cases")
    ap.add_argument("--check", action="store_true", help="compare the two variants' outputs")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script, times nothing)")
    ap.add_argument("--sweep", action="store_true", help="the o_proj forms over layer shapes x token counts (fwd)")
    ap.add_argument("--layers", help="--sweep: comma-separated sweep.py layer names (default all)")
    ap.add_argument("--rows", type=lambda v: tuple(int(t) for t in v.split(",")), default=SWEEP_ROWS,
                    help=f"--sweep: token counts (default {','.join(map(str, SWEEP_ROWS))})")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench_compile.py needs a CUDA GPU (--smoke runs tiny CPU shapes)")
    pass_options = {"devices": ("cpu", "cuda")} if args.smoke else {}
    if args.smoke:
        dtype_name = "float32"
        args.dtype = dtype_name
    dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = True
    # every variant compiles here: a graph loaded from the FX graph cache would skip the pass, so the
    # rewrite count and the compile time would read 0
    torch._inductor.config.fx_graph_cache = False
    why = vc.supported()
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"
    print(
        f"vga_linear {vga_linear.__version__}, torch {torch.__version__}, {device_name}, "
        f"kernels loaded: {vga_linear.kernels_loaded()}, rewrite supported: {why or 'yes'}"
    )
    t_start = time.perf_counter()
    summary = None
    if args.sweep:
        from sweep import LAYERS

        names = args.layers.split(",") if args.layers else list(LAYERS)[: 1 if args.smoke else None]
        layers = {name: (4, 16, 32) if args.smoke else LAYERS[name] for name in names}
        print(f"{'case':<22}{'rows':>7}{'compile µs':>12}{'+rewrite µs':>13}{'ratio':>8}{'rewrites':>10}")
        rows = sweep_oproj(layers, args.rows, dtype, device, pass_options)
        summary = summarise_sweep(rows)
    else:
        rows = run_cases(args, dtype, device, pass_options)
    total = time.perf_counter() - t_start
    print(f"total {total:.1f} s. ratio = compiled without / with the rewrite (> 1: the rewrite is faster)")
    if args.json:
        meta = {
            "torch": torch.__version__,
            "vga_linear": vga_linear.__version__,
            "device": device_name,
            "kernels_loaded": vga_linear.kernels_loaded(),
            "total_s": total,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, **({"summary": summary} if summary else {})}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
