#!/usr/bin/env python
"""One training step of a small Llama model, stock against o_proj through the op (issue 14).

    python benchmarks/train_step.py [--steps 100] [--json t.json] [--plot t.png]
    python benchmarks/train_step.py --tiny --device cpu --steps 3     # a smoke run anywhere

Two copies of one randomly initialised transformers LlamaForCausalLM (built from a LlamaConfig:
hidden 2048, 16 heads of 128, 4 layers, sequence 1024, batch 4, bf16; no download) train on the
same token batches with AdamW, a step of each in turn. In the second copy every attention o_proj
is a vga_linear.VGALinear sharing the nn.Linear's parameters, fed the head-major (heads, b, s, d)
view of the attention output -- the view of what SDPA returned, no copy: transformers hands
o_proj attn_output.transpose(1, 2).reshape(b, s, heads*d), and the wrapper views it back as
(heads, b, s, d). Its backward hands the (b, s, heads*d) gradient back through the same views.

It reports the per-step time (CUDA events around zero_grad + forward + backward + optimizer
step; median over the steps after --warmup-steps) of both models and their ratio, and the losses
of both, step by step, against the bf16 tolerance of the op (atol = rtol = 1e-2); --json writes
every step, --plot draws both loss curves and the step times. The data: by default random blocks
of --period tokens from the first --data-vocab ids, repeated along the sequence (a copy task, so
the loss falls and the curves say something); --data random for i.i.d. tokens. Needs transformers (pip install transformers); skips
with a message without it.
"""
from __future__ import annotations

import argparse
import copy
import math
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

TINY = {"hidden": 64, "heads": 4, "layers": 2, "seq": 32, "batch": 2, "vocab": 256, "intermediate": 128}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps of each model (default 100)")
    p.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the time median (default 5)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default: Llama's ~8/3 x hidden)")
    p.add_argument("--tiny", action="store_true", help=f"a tiny model for a smoke run: {TINY}")
    p.add_argument("--dtype", default="bf16", help="parameters and activations (default bf16)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--data", choices=["repeat", "random"], default="repeat")
    p.add_argument("--period", type=int, default=64, help="--data repeat: length of the repeated block")
    p.add_argument("--data-vocab", type=int, default=1024,
                   help="tokens are drawn from the first N ids (default 1024), so the loss falls from ln(vocab) "
                        "within the first steps, then further as the model learns to copy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PATH", help="PNG: both loss curves and the per-step times")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
        args.period = min(args.period, args.seq // 2)
        args.data_vocab = min(args.data_vocab, args.vocab)
    if args.intermediate is None:
        args.intermediate = 256 * math.ceil(8 * args.hidden / 3 / 256)
    args.data_vocab = min(args.data_vocab, args.vocab)
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    return args


def head_major_oproj_class():
    import vga_linear

    class HeadMajorOProj(vga_linear.VGALinear):
        """o_proj on the head-major view: (b, s, heads*d) -> x = (heads, b, s, d) -> the op."""

        def forward(self, attn):
            x = attn.unflatten(-1, (self.num_shards, self.shard_features)).movedim(-2, 0)
            return super().forward(x)

    return HeadMajorOProj


def build_models(args, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=max(args.seq, 128), attention_dropout=0.0, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    with torch.device(device):
        stock = LlamaForCausalLM(config)
    stock = stock.to(dtype).train()
    vga = copy.deepcopy(stock)
    oproj_cls = head_major_oproj_class()
    for layer in vga.model.layers:
        attn = layer.self_attn
        attn.o_proj = oproj_cls.from_linear(attn.o_proj, num_shards=args.heads)
    return config, stock, vga


def make_batches(args, device) -> torch.Tensor:
    """(steps, batch, seq) token ids, the same for both models."""
    g = torch.Generator().manual_seed(args.seed + 1)
    if args.data == "random":
        ids = torch.randint(0, args.data_vocab, (args.steps, args.batch, args.seq), generator=g)
    else:
        reps = -(-args.seq // args.period)
        block = torch.randint(0, args.data_vocab, (args.steps, args.batch, args.period), generator=g)
        ids = block.repeat(1, 1, reps)[..., : args.seq]
    return ids.to(device)


class StepTimer:
    """Per-step time: CUDA events (read at the end, no sync in the loop) or perf_counter."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        self.marks = []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, start):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((start, e))
        else:
            self.marks.append((start, time.perf_counter()))

    def ms(self) -> list:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]


def train(args, device, dtype):
    config, stock, vga = build_models(args, device, dtype)
    batches = make_batches(args, device)
    models = {"stock": stock, "vga": vga}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0) for k, m in models.items()}
    timers = {k: StepTimer(device) for k in models}
    losses = {k: torch.empty(args.steps, dtype=torch.float32, device=device) for k in models}
    probe = {}

    def record_x(module, inputs, output):   # once: the shape and strides the op received
        x = inputs[0].unflatten(-1, (module.num_shards, module.shard_features)).movedim(-2, 0)
        probe.setdefault("x", (tuple(x.shape), tuple(x.stride())))

    hook = vga.model.layers[0].self_attn.o_proj.register_forward_hook(record_x)
    for step in range(args.steps):
        ids = batches[step]
        for name, model in models.items():
            t = timers[name].start()
            opts[name].zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opts[name].step()
            timers[name].stop(t)
            losses[name][step] = loss.detach().float()
        if step == 0:
            hook.remove()
    times = {k: t.ms() for k, t in timers.items()}
    return config, {k: v.tolist() for k, v in losses.items()}, times, probe


def summarize(args, losses, times) -> dict:
    tol = M.tolerance_for(args.dtype)
    keep = slice(min(args.warmup_steps, max(args.steps - 1, 0)), None)
    med = {k: statistics.median(v[keep]) for k, v in times.items()}
    diffs = [abs(a - b) for a, b in zip(losses["vga"], losses["stock"])]
    rel = [d / max(abs(b), 1e-12) for d, b in zip(diffs, losses["stock"])]
    within = [d <= tol + tol * abs(b) for d, b in zip(diffs, losses["stock"])]
    return {
        "step_ms_median": med, "vga_over_stock": med["vga"] / med["stock"],
        "timed_steps": len(times["stock"][keep]),
        "loss_first": {k: v[0] for k, v in losses.items()}, "loss_last": {k: v[-1] for k, v in losses.items()},
        "loss_abs_diff_max": max(diffs), "loss_rel_diff_max": max(rel), "loss_rel_diff_step0": rel[0],
        "loss_tol": tol, "losses_within_tol": all(within), "steps_outside_tol": len(within) - sum(within),
    }


def plot(path, args, losses, times, summary, meta) -> str | None:
    plt, why = H.pyplot()
    if plt is None:
        return f"--plot skipped: {why}"
    fig, axes = plt.subplots(2, 1, figsize=(10, 8), constrained_layout=True)
    steps = range(1, args.steps + 1)
    colors = {"stock": "tab:blue", "vga": "tab:red"}
    for name in ("stock", "vga"):
        label = "stock (nn.Linear o_proj)" if name == "stock" else "vga (VGALinear on the head-major view)"
        axes[0].plot(steps, losses[name], color=colors[name], lw=1.2, label=label,
                     ls="-" if name == "stock" else "--")
        axes[1].plot(steps, times[name], color=colors[name], lw=1.0,
                     label=f"{name}: median {summary['step_ms_median'][name]:.1f} ms")
    axes[0].set_ylabel("training loss")
    axes[0].set_title(f"loss, same seed and data (max |diff| {summary['loss_abs_diff_max']:.3g}, "
                      f"max rel {summary['loss_rel_diff_max']:.2g}; bf16 tol {summary['loss_tol']:g})")
    axes[1].set_ylabel("step time (ms)")
    axes[1].set_xlabel("step")
    axes[1].set_title(f"per-step time: vga / stock = {summary['vga_over_stock']:.3f} (median after "
                      f"{args.warmup_steps} warm-up steps)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle(f"train_step: Llama hidden {args.hidden}, {args.heads} heads, {args.layers} layers, "
                 f"seq {args.seq}, batch {args.batch}, {args.dtype} - {meta['device_name']}")
    H.save_figure(fig, path)
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("train_step.py: transformers is not installed (pip install transformers); nothing was run.")
        return 0
    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = "cuda" if (args.device == "cuda" or (args.device == "auto" and has_cuda)) else "cpu"
    dtype = M.torch_dtype(args.dtype)
    args.dtype = M.canon_dtype(args.dtype)
    op = H.load_op()
    if not op.available:
        print(f"error: train_step.py needs vga_linear: {op.error}", file=sys.stderr)
        return 2
    meta = {**H.environment(device, op, argv), "transformers": transformers.__version__}
    print(f"train_step: Llama hidden {args.hidden}, {args.heads} heads x {args.hidden // args.heads}, "
          f"{args.layers} layers, MLP {args.intermediate}, vocab {args.vocab}, seq {args.seq}, batch {args.batch}, "
          f"{args.dtype}, AdamW lr {args.lr:g}, {args.steps} steps, data {args.data}"
          + (f" (period {args.period})" if args.data == "repeat" else "") + f" over {args.data_vocab} ids"
          + f"  on {meta['device_name']}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"vga_linear {op.version} kernels_loaded={op.kernels_loaded}"
          + ("  *** CPU FALLBACK ***" if device == "cpu" else ""), flush=True)
    t0 = time.perf_counter()
    config, losses, times, probe = train(args, device, dtype)
    summary = summarize(args, losses, times)
    meta["total_s"] = time.perf_counter() - t0
    if "x" in probe:
        print(f"o_proj input to the op: x shape {probe['x'][0]} strides {probe['x'][1]} (head-major view)")
    every = max(1, args.steps // 10)
    print(f"{'step':>5} {'loss stock':>11} {'loss vga':>11} {'ms stock':>9} {'ms vga':>9}")
    for i in list(range(0, args.steps, every)) + ([args.steps - 1] if (args.steps - 1) % every else []):
        print(f"{i + 1:>5} {losses['stock'][i]:>11.4f} {losses['vga'][i]:>11.4f} {times['stock'][i]:>9.2f} "
              f"{times['vga'][i]:>9.2f}")
    s = summary
    print(f"step time (median of {s['timed_steps']} steps after {args.warmup_steps} warm-up): "
          f"stock {s['step_ms_median']['stock']:.2f} ms, vga {s['step_ms_median']['vga']:.2f} ms, "
          f"vga/stock {s['vga_over_stock']:.3f} (target <= 1.0)")
    print(f"losses: step 1 rel diff {s['loss_rel_diff_step0']:.2e}; max |diff| {s['loss_abs_diff_max']:.3g}, "
          f"max rel {s['loss_rel_diff_max']:.2e}; within bf16 tolerance (atol = rtol = {s['loss_tol']:g}) at "
          f"{args.steps - s['steps_outside_tol']}/{args.steps} steps -> {'pass' if s['losses_within_tol'] else 'FAIL'}")
    print(f"total {meta['total_s']:.1f} s")
    result = {"meta": meta, "args": vars(args), "model": config.to_dict(), "summary": summary,
              "losses": losses, "step_ms": times, "op_input": probe.get("x")}
    H.write_json(args.json, result)
    if args.plot:
        msg = plot(args.plot, args, losses, times, summary, meta)
        print(msg or f"plot written: {args.plot}", file=sys.stderr if msg else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
