"""The Hopper GEMM core (csrc/kernels/sm90/): every configuration of the forward (both orientations),
grad_x and grad_weight products forced through the private family ops against a float64 reference, on
fresh random inputs, poisoned outputs, tails in every dim, strided and 4-D x; refusals; bitwise
determinism; the grad_x layout; CUDA-graph capture of both split reductions; the backward op that runs
both products (grad_weight overlapping grad_x) against the two alone."""

import pytest
import torch

import vga_linear
from utils import (LAYER_SHAPES, TWO_GPUS, assert_close_scaled, assert_close_to_float64, make_params, make_x,
                   misaligned, poison_next_output, poison_next_outputs, reference_grads, run_op)

pytestmark = pytest.mark.cuda

HALF_TYPES = [torch.bfloat16, torch.float16]
# Tile width and split forced, and the rule's own choice.
# Splits across the grid (s: workspace + a second launch) and in the cluster (c: a DSMEM sum; c8 on
# the short reductions below leaves slices empty, which must add zeros).
CONFIGS = ["sm90_gemm", "sm90_gemm/n64", "sm90_gemm/n128", "sm90_gemm/n192", "sm90_gemm/n256", "sm90_gemm/n128/s3",
           "sm90_gemm/n256/s2", "sm90_gemm/n192/s2", "sm90_gemm/n192/c2",
           "sm90_gemm/n64/s5", "sm90_gemm/n128/s16", "sm90_gemm/n128/c2", "sm90_gemm/n192/c4", "sm90_gemm/n64/c4",
           "sm90_gemm/n128/c8"]
# The forward's token widths: the product computed transposed (W's rows as M, the tokens as N), its
# tile stored transposed; the backward products do not take them.
TOKEN_CONFIGS = ["sm90_gemm/n96", "sm90_gemm/n112", "sm90_gemm/n176", "sm90_gemm/n240"]
# The forward's narrow tiles (64 rows, one consumer warpgroup, 64 wide), unsplit, split across the
# grid and in the cluster (each CTA sums 64 / S rows); the backward products do not take them.
NARROW_CONFIGS = ["sm90_gemm/m64", "sm90_gemm/n64/s1/m64", "sm90_gemm/n64/s3/m64", "sm90_gemm/n64/c2/m64",
                  "sm90_gemm/c4/m64", "sm90_gemm/n64/c8/m64"]
# x's operand along the concatenation, forced ("span": H % 64 != 0 only): the forward's k-blocks
# and grad_weight's columns, at each width, split across the grid and in the cluster.
SPAN_CONFIGS = ["sm90_gemm/span", "sm90_gemm/n64/span", "sm90_gemm/n128/s3/span", "sm90_gemm/n192/span",
                "sm90_gemm/n192/c4/span", "sm90_gemm/n64/c2/span"]
# (R, batch, H, K): tails in rows (not a multiple of 128 or 64), K (not a multiple of 64, 128, 256),
# H (80, 96, 8), one batch row, odd tile counts for the clusters of 2, two batch dims; shards
# narrower than a k-block (16, 32, 48) and a 112-wide one whose reduction splits start inside a
# shard. H % 64 = 16 or 32 packs the shards' tail columns into k-blocks of 4 or 2 shards (80, 96,
# 16, 32; R not a multiple of that: the last such k-block reads shards past R as zeros). Forced
# "span" (SPAN_CONFIGS) runs the forward's k-blocks (A) and grad_weight's columns (B) along the
# concatenation instead, copied by cp.async across shard boundaries, on every width here that is
# not a multiple of 64.
SHAPES = [
    (4, (130,), 64, 200),
    (3, (77,), 80, 264),
    (2, (300,), 96, 136),
    (8, (65,), 8, 72),
    (1, (1,), 64, 64),
    (32, (200,), 128, 520),
    (4, (3, 100), 64, 128),
    (2, (2, 130), 136, 40),
    (3, (90,), 128, 1000),    # grad_weight tiles spanning shards (H % 64 == 0), an odd shard count
    (5, (128,), 192, 600),    # one row tile: the cluster pairs column tiles and shares A
    (7, (150,), 16, 104),
    (5, (2, 70), 48, 136),
    (9, (260,), 112, 264),
    (6, (2, 90), 32, 200),
    (17, (150,), 80, 392),
    (2, (2, 260), 64, 1000),  # two batch dims, K % 16 = 8: a swapped warp's last 16 W rows are half past K
]
# K odd: no 16-byte stores of output rows (or, swapped, of W rows); the backward kinds refuse it
# (grad_out's rows are not 16-byte multiples for TMA).
FORWARD_SHAPES = SHAPES + [(3, (333,), 64, 77)]


def _grad_x(grad_out, w, R, family, x=None):
    poison_next_output((grad_out.shape[:-1].numel(), w.shape[1]), grad_out.dtype, grad_out.device)
    return torch.ops.vga._gather_concat_linear_grad_x_family(grad_out, w, R, family, x)


def _grad_weight(grad_out, x, family):
    poison_next_output((grad_out.shape[-1], x.shape[0] * x.shape[-1]), grad_out.dtype, grad_out.device)
    return torch.ops.vga._gather_concat_linear_grad_weight_family(grad_out, x, family)


def _backward(grad_out, x, w, grad_x_family, grad_weight_family):
    """Both products by the backward op (grad_weight may start while grad_x finishes)."""
    poison_next_outputs([(grad_out.shape[:-1].numel(), w.shape[1]), tuple(w.shape)], grad_out.dtype, grad_out.device)
    return torch.ops.vga._gather_concat_linear_backward_family(grad_out, x, w, grad_x_family, grad_weight_family)


# Every configuration on every shape; "span" (SPAN_CONFIGS) on the widths that take it.
FORWARD_CASES = ([(c, s) for c in CONFIGS + TOKEN_CONFIGS + NARROW_CONFIGS for s in FORWARD_SHAPES]
                 + [(c, s) for c in SPAN_CONFIGS for s in FORWARD_SHAPES if s[2] % 64 != 0])


@pytest.mark.parametrize("config,shape", FORWARD_CASES, ids=str)
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_forward_configs(config, dtype, shape, layout):
    R, batch, H, K = shape
    x = make_x(R, batch, H, dtype, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    for bias in (True, False):
        w, b = make_params(R, H, K, dtype, "cuda", bias=bias)
        assert_close_to_float64(run_op(x, w, b, config), x, w, b)


# grad_weight's columns a shard at a time where H % 64 != 0 (the rule runs them along the
# concatenation there: CONFIGS reach those kernels).
GRAD_WEIGHT_SHARD_CONFIGS = ["sm90_gemm/shards", "sm90_gemm/n64/shards", "sm90_gemm/n128/s3/shards",
                             "sm90_gemm/n192/c4/shards"]


@pytest.mark.parametrize("config", SPAN_CONFIGS + GRAD_WEIGHT_SHARD_CONFIGS)
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[2] % 64 != 0], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_grad_weight_column_layouts(config, dtype, shape, layout):
    R, batch, H, K = shape
    x = make_x(R, batch, H, dtype, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    w, _ = make_params(R, H, K, dtype, "cuda", bias=False)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    grad_w = _grad_weight(grad_out, x, config)
    assert grad_w.shape == w.shape and grad_w.is_contiguous()
    assert_close_scaled(grad_w, reference_grads(grad_out, x, w)[1])
    assert torch.equal(grad_w, _grad_weight(grad_out, x, config))  # bitwise deterministic


def test_the_widest_tile_takes_no_split_in_the_cluster():
    # (its partial tile and the peers' rows of it do not fit the shared memory: schedule.cuh)
    x = make_x(2, (130,), 64, torch.bfloat16, "cuda")
    w, b = make_params(2, 64, 72, torch.bfloat16, "cuda")
    g = torch.randn(130, 72, dtype=torch.bfloat16, device="cuda")
    for product in (lambda: run_op(x, w, b, "sm90_gemm/n256/c2"), lambda: _grad_x(g, w, 2, "sm90_gemm/n256/c4"),
                    lambda: _grad_weight(g, x, "sm90_gemm/n256/c8")):
        with pytest.raises(RuntimeError, match="n256 takes no split in the cluster .*up to n192"):
            product()


def test_narrow_tiles_are_the_forwards_64_wide():
    x = make_x(2, (130,), 64, torch.bfloat16, "cuda")
    w, b = make_params(2, 64, 72, torch.bfloat16, "cuda")
    g = torch.randn(130, 72, dtype=torch.bfloat16, device="cuda")
    cases = [  # (what the error says, the call)
        ("m64 .64-row tiles. runs 64 wide .n64., not n128", lambda: run_op(x, w, b, "sm90_gemm/n128/m64")),
        ("m64 .64-row tiles. runs the forward a shard at a time, not 'span'",
         lambda: run_op(make_x(2, (130,), 48, torch.bfloat16, "cuda"), *make_params(2, 48, 72, torch.bfloat16, "cuda"),
                        "sm90_gemm/span/m64")),
        ("m64 .64-row tiles. runs the forward only, not grad_x", lambda: _grad_x(g, w, 2, "sm90_gemm/m64")),
        ("m64 .64-row tiles. runs the forward only, not grad_weight", lambda: _grad_weight(g, x, "sm90_gemm/m64")),
        ("m64 .64-row tiles. runs the forward only, not the swapped forward", lambda: run_op(x, w, b, "sm90_gemm/n176/m64")),
    ]
    for match, call in cases:
        with pytest.raises(RuntimeError, match=match):
            call()


@pytest.mark.parametrize("config", ["sm90_gemm/n64/s1/m64", "sm90_gemm/n64/s3/m64", "sm90_gemm/n64/c4/m64"])
@pytest.mark.parametrize("shape", [(4, (1000,), 80, 1100), (3, (2, 700), 96, 900)], ids=str)
def test_narrow_tiles_walk_several_tiles_with_packed_tails(config, shape):
    # more 64-row tile pairs (or clusters) than fit at once (each CTA walks several; the in-cluster
    # split's grid takes several rounds), over packed shard tails of 4 and 2 shards a k-block, a 4-D
    # x among them
    R, batch, H, K = shape
    x = make_x(R, batch, H, torch.bfloat16, "cuda")
    w, b = make_params(R, H, K, torch.bfloat16, "cuda")
    out = run_op(x, w, b, config)
    assert_close_to_float64(out, x, w, b)
    assert torch.equal(run_op(x, w, b, config), out)


def test_span_needs_a_width_that_is_not_a_multiple_of_64():
    x = make_x(2, (130,), 64, torch.bfloat16, "cuda")
    w, b = make_params(2, 64, 72, torch.bfloat16, "cuda")
    with pytest.raises(RuntimeError, match="layout 'span'.*needs H % 64 != 0 .*; H is 64"):
        run_op(x, w, b, "sm90_gemm/span")
    with pytest.raises(RuntimeError, match="grad_weight's layout 'span'.*needs H % 64 != 0 .*; H is 64"):
        _grad_weight(torch.randn(130, 72, dtype=torch.bfloat16, device="cuda"), x, "sm90_gemm/span")
    with pytest.raises(RuntimeError, match="token widths.*not 'span'"):
        run_op(make_x(2, (130,), 48, torch.bfloat16, "cuda"), *make_params(2, 48, 72, torch.bfloat16, "cuda"),
               "sm90_gemm/n112/span")


@pytest.mark.parametrize("config", CONFIGS + ["generic"])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_backward_configs(config, dtype, shape, layout):
    R, batch, H, K = shape
    x = make_x(R, batch, H, dtype, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    w, _ = make_params(R, H, K, dtype, "cuda", bias=False)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    ref_x, ref_w = reference_grads(grad_out, x, w)
    # without x: the (rows, R*H) concat's view; with x: x's strides where x is dense (contiguous, the SDPA view)
    for like in (None, x):
        grad_x = _grad_x(grad_out, w, R, config, like)
        assert grad_x.shape == x.shape and grad_x.dtype == dtype
        if like is not None and vga_linear.ops.takes_x_layout(x):
            assert grad_x.stride() == x.stride()
        assert_close_scaled(grad_x, ref_x)
    grad_w = _grad_weight(grad_out, x, config)
    assert grad_w.shape == w.shape and grad_w.is_contiguous()
    assert_close_scaled(grad_w, ref_w)


# A tile's operand boxes wholly past the rows (or columns) are not copied (gemm.cuh, live_parts): those
# parts of a stage keep whatever an earlier tile left there, and only unstored rows (columns) read them.
# Both shapes have more tiles than CTAs, so a CTA reaches its last tiles with stages holding earlier
# tiles' data. The last row tile holds 24 rows (3-D x) or, per outer index of a 4-D x ("padded": the
# batch dims do not merge), 12: its second 64-row box is empty for the forward and grad_x; grad_weight's
# M is K, 1040 % 128 = 16 and 560 % 128 = 48. The forward's last column tile has an empty half at every
# width with K = 1040 (1040 % 64, 128, 192, 256 = 16, 16, 80, 16), at n128 and n256 with 560; grad_x's
# columns are R * H = 320 and 256, which leave whole 64-wide boxes empty at n128, n192, n256 and at
# n192. The token widths' last tile has an empty half for 9240 tokens (24, 56, 88, 120 of 96, 112, 176,
# 240: exactly at the half) and for 4620 an outer index (12, 28, 44, 60).
EMPTY_BOX_SHAPES = [(5, (9240,), 64, 1040, "contiguous"), (2, (2, 4620), 128, 560, "padded")]


@pytest.mark.parametrize("config", ["sm90_gemm/n64", "sm90_gemm/n128/s2", "sm90_gemm/n192", "sm90_gemm/n192/c2",
                                    "sm90_gemm/n64/c4"] + TOKEN_CONFIGS)
@pytest.mark.parametrize("shape", EMPTY_BOX_SHAPES, ids=str)
def test_boxes_past_the_operands_are_not_read_into_stored_outputs(config, shape):
    R, batch, H, K, layout = shape
    dtype = torch.bfloat16
    x = make_x(R, batch, H, dtype, "cuda", layout)
    w, b = make_params(R, H, K, dtype, "cuda", bias=True)
    assert_close_to_float64(run_op(x, w, b, config), x, w, b)
    if config in TOKEN_CONFIGS:
        return  # (the backward products take no token width)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    ref_x, ref_w = reference_grads(grad_out, x, w)
    assert_close_scaled(_grad_x(grad_out, w, R, config, x), ref_x)
    assert_close_scaled(_grad_weight(grad_out, x, config), ref_w)


# (grad_x's family, grad_weight's): grad_weight overlaps grad_x where both run on the core, after
# grad_x's last kernel of each kind: the core itself, the grid split's sum (s), the in-cluster sum (c);
# and the pairs where one product runs elsewhere, which launch one after the other.
BACKWARD_PAIRS = [("sm90_gemm", "sm90_gemm"), ("sm90_gemm/n128/s3", "sm90_gemm/n64/c4"),
                  ("sm90_gemm/n192/c2", "sm90_gemm/n128/s5"), ("sm90_gemm/n64", "sm90_gemm/n256"),
                  ("generic", "sm90_gemm"), ("sm90_gemm/n128/s2", "generic")]


# grad_weight's columns along the concatenation (its own kernel, overlapping grad_x's) on the widths
# that take it.
SPAN_BACKWARD_CASES = [(pair, shape) for pair in [("sm90_gemm", "sm90_gemm/n128/span"), ("sm90_gemm/n64/c4", "sm90_gemm/n64/s3/span")]
                       for shape in SHAPES if shape[2] % 64 != 0]


@pytest.mark.parametrize("pair,shape", [(p, s) for p in BACKWARD_PAIRS for s in SHAPES] + SPAN_BACKWARD_CASES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_backward_op_gives_the_bits_of_its_two_products(pair, shape, layout):
    R, batch, H, K = shape
    dtype = torch.bfloat16
    x = make_x(R, batch, H, dtype, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    w, _ = make_params(R, H, K, dtype, "cuda", bias=False)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    grad_x, grad_w = _backward(grad_out, x, w, *pair)
    ref_x, ref_w = reference_grads(grad_out, x, w)
    assert_close_scaled(grad_x, ref_x)
    assert_close_scaled(grad_w, ref_w)
    alone_x = _grad_x(grad_out, w, R, pair[0], x)
    assert grad_x.stride() == alone_x.stride() and torch.equal(grad_x, alone_x)
    assert torch.equal(grad_w, _grad_weight(grad_out, x, pair[1]))


@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_auto_dispatch_backward_at_layer_shapes(shape, layout):
    R, batch, H, K = shape
    dtype = torch.bfloat16
    x = make_x(R, batch, H, dtype, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    w, _ = make_params(R, H, K, dtype, "cuda", bias=False)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    ref_x, ref_w = reference_grads(grad_out, x, w)
    poison_next_outputs([x.shape, w.shape], dtype, "cuda")
    grad_x, grad_w = torch.ops.vga.gather_concat_linear_backward(grad_out, x, w)
    assert_close_scaled(grad_x, ref_x)
    assert_close_scaled(grad_w, ref_w)
    poison_next_output(x.shape, dtype, "cuda")
    assert torch.equal(torch.ops.vga.gather_concat_linear_grad_x(grad_out, w, R, x), grad_x)
    poison_next_output(w.shape, dtype, "cuda")
    assert torch.equal(torch.ops.vga.gather_concat_linear_grad_weight(grad_out, x), grad_w)


def test_backward_more_than_2_pow_31_elements():
    # x and grad_x hold 2^31 + 3072 bf16 elements (64-bit offsets in grad_x's stores, a reduction over
    # 2^21 rows for grad_weight): grad_x checked on sampled rows, grad_weight whole, in float64 by chunks.
    R, B, H, K = 4, 2**21 + 3, 256, 64
    torch.manual_seed(0)
    x = torch.randn(R, B, H, dtype=torch.bfloat16, device="cuda")
    assert x.numel() > 2**31
    w, _ = make_params(R, H, K, torch.bfloat16, "cuda", bias=False)
    grad_out = torch.randn(B, K, dtype=torch.bfloat16, device="cuda")
    poison_next_outputs([x.shape, w.shape], torch.bfloat16, "cuda")
    grad_x, grad_w = torch.ops.vga.gather_concat_linear_backward(grad_out, x, w)
    rows = torch.cat([torch.arange(0, 64), torch.arange(B - 4096, B)]).cuda()
    ref_x = (grad_out[rows].double() @ w.double()).view(len(rows), R, H).transpose(0, 1)
    assert_close_scaled(grad_x[:, rows], ref_x)
    assert not grad_x.isnan().any()
    ref_w = torch.zeros(K, R * H, dtype=torch.float64, device="cuda")
    for start in range(0, B, 1 << 16):
        chunk = slice(start, min(start + (1 << 16), B))
        ref_w += grad_out[chunk].double().t() @ x[:, chunk].transpose(0, 1).reshape(-1, R * H).double()
    assert_close_scaled(grad_w, ref_w)


@pytest.mark.parametrize("batch", [(5, 7), (64,)])
@pytest.mark.parametrize("x_layout", ["none", "contiguous", "sdpa", "padded"])
def test_grad_x_layout_matches_register_fake(batch, x_layout):
    # Without x (or with a non-dense x): the layout cat/transpose-reshape's autograd hands back;
    # with a dense x: x's strides. Either way what register_fake says.
    R, H, K = 4, 16, 24
    grad_out = torch.randn((*batch, K), dtype=torch.bfloat16, device="cuda")
    w, _ = make_params(R, H, K, torch.bfloat16, "cuda", bias=False)
    x = None if x_layout == "none" else make_x(R, batch, H, torch.bfloat16, "cuda", x_layout)
    grad_x = torch.ops.vga.gather_concat_linear_grad_x(grad_out, w, R, x)
    if x_layout in ("contiguous", "sdpa"):
        assert grad_x.stride() == x.stride()
    else:
        expected = vga_linear.ops.shards_of_concat(torch.empty((*batch, R * H), device="cuda"), R)
        assert grad_x.shape == expected.shape and grad_x.stride() == expected.stride()
    assert_close_scaled(grad_x, vga_linear.ops._grad_x_reference(grad_out.double(), w.double(), R))
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.vga.gather_concat_linear_grad_x(
            torch.empty(grad_out.shape, dtype=grad_out.dtype, device="cuda"),
            torch.empty(w.shape, dtype=w.dtype, device="cuda"), R,
            None if x is None else torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda"))
    assert fake.stride() == grad_x.stride()


def test_leaf_x_gets_its_gradient_without_a_copy():
    # AccumulateGrad keeps a gradient whose strides are the leaf's: x.grad is the op's own output.
    R, H, K = 4, 64, 96
    x = make_x(R, (3, 40), H, torch.bfloat16, "cuda", "sdpa").requires_grad_()
    w, _ = make_params(R, H, K, torch.bfloat16, "cuda", bias=False)
    seen = []
    handle = x.register_hook(lambda g: seen.append(g.data_ptr()))
    vga_linear.gather_concat_linear(x, w).sum().backward()
    handle.remove()
    assert x.grad.stride() == x.stride() and x.grad.data_ptr() == seen[0]


def test_backward_refusals_say_why():
    x = make_x(2, (40,), 64, torch.float32, "cuda")
    w, _ = make_params(2, 64, 32, torch.float32, "cuda", bias=False)
    g = torch.randn(40, 32, device="cuda")
    xb, wb, gb = x.bfloat16(), w.bfloat16(), g.bfloat16()
    # K odd: grad_out's rows are not 16-byte multiples, which TMA needs
    w_odd, _ = make_params(2, 64, 33, torch.bfloat16, "cuda", bias=False)
    g_odd = torch.randn(40, 33, dtype=torch.bfloat16, device="cuda")
    ops = torch.ops.vga
    cases = [  # (what the error says, the call)
        ("refuses this input: row stride is not a multiple of 16 bytes",
         lambda: ops._gather_concat_linear_grad_x_family(g_odd, w_odd, 2, "sm90_gemm")),
        ("refuses this input: row stride is not a multiple of 16 bytes",
         lambda: ops._gather_concat_linear_grad_weight_family(g_odd, xb, "sm90_gemm")),
        ("refuses this input: dtype is not fp16/bf16", lambda: ops._gather_concat_linear_grad_x_family(g, w, 2, "sm90_gemm")),
        ("refuses this input: dtype is not fp16/bf16", lambda: ops._gather_concat_linear_grad_weight_family(g, x, "sm90_gemm")),
        ("refuses this input: .*16-byte", lambda: ops._gather_concat_linear_grad_x_family(gb, misaligned(wb), 2, "sm90_gemm")),
        ("refuses this input: .*16-byte", lambda: ops._gather_concat_linear_grad_weight_family(gb, misaligned(xb), "sm90_gemm")),
        ("unknown kernel family", lambda: ops._gather_concat_linear_grad_x_family(gb, wb, 2, "no_such_family")),
        ("bad configuration 'n100'", lambda: ops._gather_concat_linear_grad_x_family(gb, wb, 2, "sm90_gemm/n100")),
        ("family 'sm90_tf32x3' takes no configuration",
         lambda: ops._gather_concat_linear_grad_weight_family(g, x, "sm90_tf32x3/n128")),
        ("family 'sm90_skinny' takes no configuration",
         lambda: ops._gather_concat_linear_family(xb, wb, None, "sm90_skinny/s2")),
        ("unknown kernel family 'no_such_family/n128'",
         lambda: ops._gather_concat_linear_grad_x_family(gb, wb, 2, "no_such_family/n128")),
        ("bad configuration 'c3'.*c2, c4, c8", lambda: ops._gather_concat_linear_grad_weight_family(gb, xb, "sm90_gemm/c3")),
        ("both a split across the grid .s. and one in the cluster .c.",
         lambda: ops._gather_concat_linear_family(xb, wb, None, "sm90_gemm/s2/c2")),
        ("n176 is a token width of the forward; this product takes n64",
         lambda: ops._gather_concat_linear_grad_x_family(gb, wb, 2, "sm90_gemm/n176")),
        ("n112 is a token width of the forward", lambda: ops._gather_concat_linear_grad_weight_family(gb, xb, "sm90_gemm/n112")),
        ("token widths .n96, n112, n176, n240. take no reduction split",
         lambda: ops._gather_concat_linear_family(xb, wb, None, "sm90_gemm/n240/s2")),
    ]
    for match, call in cases:
        with pytest.raises(RuntimeError, match=match):
            call()
    # What sm90 refuses, auto-dispatch still computes (generic), correctly.
    ref_x, ref_w = reference_grads(g_odd, xb, w_odd)
    assert_close_scaled(ops.gather_concat_linear_grad_x(g_odd, w_odd, 2), ref_x)
    assert_close_scaled(ops.gather_concat_linear_grad_weight(g_odd, xb), ref_w)
    gx = torch.ops.vga.gather_concat_linear_grad_x(gb, misaligned(wb), 2)
    assert_close_scaled(gx, reference_grads(gb, xb, wb)[0])


@pytest.mark.parametrize("config", ["sm90_gemm", "sm90_gemm/n128/s7", "sm90_gemm/n192/c4", "sm90_gemm/n128/c8"])
def test_gradients_are_bitwise_deterministic(config):
    R, batch, H, K = 8, (4096,), 128, 256  # a long reduction: the rule splits grad_weight
    x = make_x(R, batch, H, torch.bfloat16, "cuda")
    w, _ = make_params(R, H, K, torch.bfloat16, "cuda", bias=False)
    g = torch.randn((*batch, K), dtype=torch.bfloat16, device="cuda")
    first = (_grad_x(g, w, R, config).clone(), _grad_weight(g, x, config).clone(), run_op(x, w, None, config))
    for _ in range(3):
        again = (_grad_x(g, w, R, config), _grad_weight(g, x, config), run_op(x, w, None, config))
        for a, b in zip(first, again):
            assert torch.equal(a, b)
        for a, b in zip(first, _backward(g, x, w, config, config)):  # (grad_weight overlapping grad_x)
            assert torch.equal(a, b)


@pytest.mark.parametrize("config", ["sm90_gemm/n176", "sm90_gemm/n128/s3/span", "sm90_gemm/n64/c2/span",
                                    "sm90_gemm/n64/s3/m64", "sm90_gemm/n64/c4/m64"])
def test_token_span_and_narrow_configurations_are_bitwise_deterministic(config):
    # The swapped forward's transposed stores; the span copies (forward k-blocks, grad_weight's
    # columns) under both splits; the narrow tiles split across the grid and in the cluster.
    R, batch, H, K = 9, (1000,), 112, 264
    x = make_x(R, batch, H, torch.bfloat16, "cuda")
    w, b = make_params(R, H, K, torch.bfloat16, "cuda")
    g = torch.randn((*batch, K), dtype=torch.bfloat16, device="cuda")
    first = [run_op(x, w, b, config).clone()]
    if "span" in config:
        first.append(_grad_weight(g, x, config).clone())
    for _ in range(3):
        again = [run_op(x, w, b, config)] + ([_grad_weight(g, x, config)] if "span" in config else [])
        for a, c in zip(first, again):
            assert torch.equal(a, c)


def test_fp32_gradients_are_bitwise_deterministic():
    # sm90_tf32x3's backward: transposed copies, a split grad_weight summed in a fixed order.
    R, batch, H, K = 8, (2048,), 64, 256
    x = make_x(R, batch, H, torch.float32, "cuda")
    w, _ = make_params(R, H, K, torch.float32, "cuda", bias=False)
    g = torch.randn((*batch, K), dtype=torch.float32, device="cuda")
    family = "sm90_tf32x3"
    first = (_grad_x(g, w, R, family, x).clone(), _grad_weight(g, x, family).clone())
    for _ in range(3):
        for a, b in zip(first, (_grad_x(g, w, R, family, x), _grad_weight(g, x, family))):
            assert torch.equal(a, b)
        for a, b in zip(first, _backward(g, x, w, family, family)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("config", ["sm90_gemm/n128/s8", "sm90_gemm/n128/c8"])
def test_split_reductions_under_cuda_graph_capture(config):
    R, batch, H, K = 8, (2048,), 128, 128
    x = make_x(R, batch, H, torch.bfloat16, "cuda")
    w, _ = make_params(R, H, K, torch.bfloat16, "cuda", bias=False)
    g = torch.randn((*batch, K), dtype=torch.bfloat16, device="cuda")
    eager = _grad_weight(g, x, config).clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _grad_weight(g, x, config)  # warm-up outside the capture
        _backward(g, x, w, config, config)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    eager_x = _grad_x(g, w, R, config, x).clone()
    with torch.cuda.graph(graph):
        captured = torch.ops.vga._gather_concat_linear_grad_weight_family(g, x, config)
        both = torch.ops.vga._gather_concat_linear_backward_family(g, x, w, config, config)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(both[0], eager_x) and torch.equal(both[1], eager)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_training_through_the_sdpa_view(dtype):
    # The o_proj of an attention block: x is the (heads, b, s, d) view of SDPA's (b, heads, s, d)
    # output; gradients flow back through the view like the transpose(1, 2).reshape path's. Every
    # result is measured against a float64 run, and q's gradient (through SDPA's half-precision
    # backward, whose own rounding dominates) against the error of the stock path users write.
    b, heads, s, d, K = 2, 8, 192, 64, 320
    torch.manual_seed(0)
    q = torch.randn(b, heads, s, d, dtype=dtype, device="cuda", requires_grad=True)
    layer = vga_linear.VGALinear(heads, d, K, device="cuda", dtype=dtype)
    stock = torch.nn.Linear(heads * d, K, device="cuda", dtype=dtype)
    ref = torch.nn.Linear(heads * d, K, device="cuda", dtype=torch.float64)
    stock.load_state_dict(layer.state_dict())
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    q_stock = q.detach().clone().requires_grad_()
    q64 = q.detach().double().requires_grad_()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = layer(sdpa(q, q, q).transpose(0, 1))
    out_stock = stock(sdpa(q_stock, q_stock, q_stock).transpose(1, 2).reshape(b, s, heads * d))
    out64 = ref(sdpa(q64, q64, q64).transpose(1, 2).reshape(b, s, heads * d))
    grad = torch.randn_like(out)
    for o, g in ((out, grad), (out_stock, grad), (out64, grad.double())):
        o.backward(g)
    assert_close_scaled(out, out64.detach())
    assert_close_scaled(layer.weight.grad, ref.weight.grad)
    assert_close_scaled(layer.bias.grad, ref.bias.grad)
    assert not q.grad.isnan().any()
    error = (q.grad.double() - q64.grad).abs()
    stock_error = (q_stock.grad.double() - q64.grad).abs()
    floor = 1e-3 * q64.grad.abs().max().item()
    assert error.max().item() <= 2 * stock_error.max().item() + floor
    assert error.square().mean().sqrt().item() <= 2 * stock_error.square().mean().sqrt().item() + floor


@pytest.mark.parametrize("family", ["sm90_tf32x3", "generic"])
@pytest.mark.parametrize("shape", [(8, (1024,), 256, 1024), (3, (77,), 80, 264), (4, (3, 101), 64, 128),
                                   (2, (2, 130), 136, 40), (5, (13,), 12, 36)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_fp32_backward_at_fp32_accuracy(family, shape, layout):
    # 3xTF32 on transposed copies (rows padded to a multiple of 4): relative error <= 1e-4.
    R, batch, H, K = shape
    x = make_x(R, batch, H, torch.float32, "cuda", ("sdpa" if len(batch) == 2 else "padded") if layout == "strided" else "contiguous")
    w, _ = make_params(R, H, K, torch.float32, "cuda", bias=False)
    grad_out = torch.randn((*batch, K), dtype=torch.float32, device="cuda")
    ref_x, ref_w = reference_grads(grad_out, x, w)
    # grad_x also in x's layout (contiguous x: sm90_tf32x3 scatters its concat result into place)
    for got, ref in ((_grad_x(grad_out, w, R, family), ref_x), (_grad_x(grad_out, w, R, family, x), ref_x),
                     (_grad_weight(grad_out, x, family), ref_w)):
        assert not got.isnan().any()
        scale = ref.abs().max().item()
        assert (got.double() - ref).abs().max().item() <= 1e-4 * scale


def test_fp32_backward_picks_3xtf32_on_hopper():
    x = make_x(8, (256,), 64, torch.float32, "cuda")
    w, _ = make_params(8, 64, 128, torch.float32, "cuda", bias=False)
    g = torch.randn(256, 128, device="cuda")
    auto = torch.ops.vga.gather_concat_linear_grad_weight(g, x)
    assert torch.equal(auto, torch.ops.vga._gather_concat_linear_grad_weight_family(g, x, "sm90_tf32x3"))
    auto_x = torch.ops.vga.gather_concat_linear_grad_x(g, w, 8)
    assert torch.equal(auto_x, torch.ops.vga._gather_concat_linear_grad_x_family(g, w, 8, "sm90_tf32x3"))


@TWO_GPUS
@pytest.mark.parametrize("config", ["sm90_gemm/n128/c2", "sm90_gemm/n64/c4", "sm90_gemm/n128/c8",
                                    "sm90_gemm/n128/s3", "sm90_tf32x3"])
def test_backward_on_a_second_gpu_in_the_same_process(config):
    # The resident-cluster counts and the shared-memory opt-in are per device: cuda:0 first, then
    # cuda:1 with the current device left at cuda:0.
    R, batch, H, K = 5, (128,), 192, 600
    dtype = torch.float32 if config == "sm90_tf32x3" else torch.bfloat16
    for device in ("cuda:0", "cuda:1"):
        x = make_x(R, batch, H, dtype, device)
        w, _ = make_params(R, H, K, dtype, device, bias=False)
        grad_out = torch.randn((*batch, K), dtype=dtype, device=device)
        ref_x, ref_w = reference_grads(grad_out, x, w)
        for got, ref in ((_grad_x(grad_out, w, R, config), ref_x), (_grad_weight(grad_out, x, config), ref_w)):
            assert got.device == torch.device(device) and torch.cuda.current_device() == 0
            assert_close_scaled(got, ref)
