"""Each CUDA kernel family forced through the private op vga::_gather_concat_linear_family on the
contract's shapes, layouts and dtypes (right or a refusal that says why), NaN/Inf semantics, the
dispatcher's choice, and 64-bit indexing. CUDA only; the device-independent contract is test_ops.py."""

import pytest
import torch

import vga_linear
from utils import (  # noqa: F401  (highest_fp32_precision: an autouse fixture)
    DTYPES,
    LAYER_SHAPES,
    SHAPES,
    TOLERANCE,
    TWO_GPUS,
    assert_close_to_float64,
    highest_fp32_precision,
    make_params,
    make_x,
    misaligned,
    run_op,
)

FAMILIES = vga_linear.ops.KERNEL_FAMILIES


def _cuda_inputs(shape, dtype):
    """x, W and bias on the GPU for a (R, batch, H, K) shape, fresh random values."""
    R, batch, H, K = shape
    return (make_x(R, batch, H, dtype, "cuda"), *make_params(R, H, K, dtype, "cuda"))


def _family_refuses(x, w, b, family):
    try:
        return run_op(x, w, b, family), None
    except RuntimeError as exc:
        message = str(exc)
        if "unknown kernel family" in message or "refuses this input" in message:
            return None, message
        raise


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + [(8, (64,), 1024, 520), (32, (16,), 128, 300),
                                            (4, (130,), 136, 200), (2, (300,), 64, 257),
                                            # packed shard tails (H % 64 = 16, 32) at decode and prefill rows;
                                            # a decode split whose slices cross into / start in the tail
                                            # k-blocks, one starting inside a shard (H = 144), 17-32 rows
                                            (3, (40,), 80, 200), (2, (33,), 96, 72), (5, (150,), 80, 136),
                                            (8, (16,), 80, 128), (4, (16,), 144, 128), (4, (24,), 96, 136),
                                            # decode splits whose K is no multiple of 4 (the split-K
                                            # finish's element-wise stores): S = 2 at 16 rows, 8 at 64
                                            (4, (16,), 64, 203), (16, (64,), 64, 130),
                                            # more 128 x 256 tiles than Hopper has SMs, tails in rows and K
                                            (2, (2050,), 64, 2312)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_each_family_is_right_or_refuses(family, dtype, shape, bias):
    R, batch, H, K = shape
    # x's layout, and whether W starts one element off: each alignment condition broken alone.
    strided = "sdpa" if len(batch) == 2 else "padded"
    for layout, w_misaligned in (("contiguous", False), (strided, False), ("misaligned", False),
                                 ("contiguous", True), ("odd_pitch", False)):
        x = make_x(R, batch, H, dtype, "cuda", layout)
        w, b = make_params(R, H, K, dtype, "cuda", bias=bias)
        if w_misaligned:
            w = misaligned(w)
        out, refusal = _family_refuses(x, w, b, family)
        if out is None:
            assert refusal, "a refusal must say why"
            continue
        assert_close_to_float64(out, x, w, b)


def _run_family_or_skip(x, w, b, family):
    """The family's output and the float64 reference; skips when the family refuses."""
    out, refusal = _family_refuses(x, w, b, family)
    if out is None:
        pytest.skip(refusal)
    return out, vga_linear.reference.gather_concat_linear_float64(x, w, b)


def _assert_same_nan_and_inf(out, ref):
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isposinf(), ref.isposinf()) and torch.equal(out.isneginf(), ref.isneginf())


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, (4,), 8, 6), (4, (40,), 64, 72), (4, (200,), 128, 136)], ids=str)
def test_each_family_propagates_nan_and_inf(family, dtype, shape):
    x, w, b = _cuda_inputs(shape, dtype)
    x[1, 2, 3] = float("nan")
    w[4, 1] = float("inf")
    w[5, 2] = float("-inf")
    out, ref = _run_family_or_skip(x, w, b, family)
    _assert_same_nan_and_inf(out, ref)


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_family_multiplies_inf_as_f_linear_does(family, dtype):
    # inf times a value exact in TF32 (a naive 3xTF32 split gives it a zero low half, and
    # inf * 0 = NaN), times 0, and times +-inf at the same reduction index.
    R, batch, H, K = 2, (40,), 64, 72
    x = make_x(R, batch, H, dtype, "cuda")
    w, b = make_params(R, H, K, dtype, "cuda")
    w[:, H + 5] = 0.5
    w[3, H + 5] = 0.0
    w[4, H + 5] = float("inf")
    w[6, H + 5] = float("-inf")
    x[1, 7, 5] = float("inf")
    x[1, 9, 5] = float("-inf")
    out, ref = _run_family_or_skip(x, w, b, family)
    _assert_same_nan_and_inf(out, ref)
    finite = ref.isfinite()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double()[finite], ref[finite], atol=tol, rtol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(8, (64,), 1024, 520), (32, (16,), 128, 300), (4, (16,), 144, 128)], ids=str)
def test_each_family_is_bitwise_deterministic(family, dtype, shape):
    # The split-K clusters (S = 8, 8 and 4 slices here) sum their slices in a fixed order.
    x, w, b = _cuda_inputs(shape, dtype)
    first, refusal = _family_refuses(x, w, b, family)  # (no float64 reference: only the bits matter)
    if first is None:
        pytest.skip(refusal)
    for _ in range(3):
        assert torch.equal(run_op(x, w, b, family), first)


# An input each family must take (on Hopper for the sm90 ones): a family that refused everything
# would pass test_each_family_is_right_or_refuses.
ACCEPTED = [
    ("tiny", torch.float32, (2, (8,), 32, 24)),
    ("sm90_skinny", torch.bfloat16, (4, (16,), 64, 512)),
    ("skinny", torch.float16, (4, (16,), 64, 512)),
    ("sm90_tf32x3", torch.float32, (4, (256,), 128, 512)),
    ("simt_fp32", torch.float32, (4, (256,), 128, 512)),
    ("sm90_gemm", torch.bfloat16, (4, (256,), 128, 512)),
    ("sm90_gemm", torch.float16, (3, (333,), 80, 200)),
    ("generic", torch.float64, (2, (3,), 8, 4)),
]


@pytest.mark.skipif(not FAMILIES, reason="a source tree without built kernels")
def test_the_accepted_inputs_name_every_family_of_the_build():
    assert {f for f, _, _ in ACCEPTED} == set(FAMILIES)


@pytest.mark.cuda
@pytest.mark.parametrize("family, dtype, shape", ACCEPTED, ids=str)
def test_each_family_accepts_its_own_input(family, dtype, shape):
    if family.startswith("sm90_") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 families run on Hopper only")
    x, w, b = _cuda_inputs(shape, dtype)
    out, why = _family_refuses(x, w, b, family)
    assert why is None, why
    assert_close_to_float64(out, x, w, b)


@pytest.mark.cuda
def test_kernel_families_match_the_extension():
    x = make_x(2, (3,), 8, torch.float32, "cuda")
    w, b = make_params(2, 8, 4, torch.float32, "cuda")
    with pytest.raises(RuntimeError, match="known: " + ", ".join(FAMILIES) + "(?!,)"):
        torch.ops.vga._gather_concat_linear_family(x, w, b, "no_such_family")


@pytest.mark.cuda
def test_auto_dispatch_names_an_accepting_family():
    x = make_x(4, (12,), 32, torch.float32, "cuda")
    w, b = make_params(4, 32, 56, torch.float32, "cuda")
    family = torch.ops.vga._gather_concat_linear_choice(x, w, b)
    assert family in FAMILIES
    assert_close_to_float64(run_op(x, w, b, family), x, w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=str)
def test_auto_dispatch_names_the_core_configuration_it_runs(shape):
    # sm90_gemm's choice names its plan (grid splits "n64/s10", cluster splits "n64/c8", token widths
    # "n176", packed tails, a 4-D x); forcing that name resolves to the same plan, and runs the same
    # kernels: the same bits as the dispatch's own call.
    x, w, b = _cuda_inputs(shape, torch.bfloat16)
    choice = torch.ops.vga._gather_concat_linear_choice(x, w, b)
    family, _, config = choice.partition("/")
    assert family == "sm90_gemm" and config, choice
    assert torch.ops.vga._gather_concat_linear_choice(x, w, b, choice) == choice
    out = run_op(x, w, b)
    assert_close_to_float64(out, x, w, b)
    assert torch.equal(run_op(x, w, b, choice), out), choice


@pytest.mark.cuda
def test_choice_of_a_forced_configuration_resolves_it():
    # A forced split count is what its slice length gives (choose_plan): 13 k-blocks in 5 slices of 3
    # are 5; in 6 of 3, also 5 slices (ceil(13 / 3)).
    x = make_x(13, (512,), 64, torch.bfloat16, "cuda")
    w, b = make_params(13, 64, 256, torch.bfloat16, "cuda")
    choice = torch.ops.vga._gather_concat_linear_choice
    assert choice(x, w, b, "sm90_gemm/n128/s5") == "sm90_gemm/n128/s5"
    assert choice(x, w, b, "sm90_gemm/n128/s6") == "sm90_gemm/n128/s5"
    assert choice(x, w, b, "sm90_gemm/n64/c4") == "sm90_gemm/n64/c4"
    # a forced s1 stays unsplit: the narrow tiles may replace it, but not split in the cluster
    # (R=12 H=64 K=768 at 128 rows, which the rule runs as n64/c4/m64)
    x12, (w12, b12) = make_x(12, (128,), 64, torch.bfloat16, "cuda"), make_params(12, 64, 768, torch.bfloat16, "cuda")
    assert choice(x12, w12, b12) == "sm90_gemm/n64/c4/m64"
    assert choice(x12, w12, b12, "sm90_gemm/s1") == "sm90_gemm/n64/s1/m64"
    assert choice(x, w, b, "sm90_gemm/n176") == "sm90_gemm/n176"
    assert choice(x, w, b, "generic") == "generic"
    with pytest.raises(RuntimeError, match="refuses this input"):
        choice(make_x(2, (3,), 8, torch.float64, "cuda"), *make_params(2, 8, 4, torch.float64, "cuda"), "sm90_gemm")


@pytest.mark.cuda
def test_more_than_2_pow_31_elements():
    R, B, H, K = 4, 2**21 + 3, 256, 8  # x holds 2^31 + 3072 bf16 elements
    torch.manual_seed(0)
    x = torch.randn(R, B, H, dtype=torch.bfloat16, device="cuda")
    assert x.numel() > 2**31
    w, b = make_params(R, H, K, torch.bfloat16, "cuda")
    out = run_op(x, w, b)
    rows = torch.cat([torch.arange(0, 64), torch.arange(B - 4096, B)]).cuda()
    assert_close_to_float64(out[rows], x[:, rows], w, b)
    assert not out.isnan().any()


@pytest.mark.cuda
@TWO_GPUS
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_on_a_second_gpu_in_the_same_process(family):
    # The launchers keep per-device state (the shared-memory opt-in, resident-cluster counts):
    # a family used on cuda:0 first must still opt in and size its grid on cuda:1, while the
    # current device stays cuda:0.
    accepted = {"cuda:0": 0, "cuda:1": 0}
    for device in ("cuda:0", "cuda:1"):
        for dtype in (torch.float32, torch.bfloat16):
            for R, batch, H, K in [(4, (12,), 32, 56), (8, (64,), 1024, 520), (32, (200,), 128, 520),
                                   (2, (2050,), 64, 2312)]:
                x = make_x(R, batch, H, dtype, device)
                w, b = make_params(R, H, K, dtype, device)
                out, _ = _family_refuses(x, w, b, family)
                if out is None:
                    continue
                assert out.device == torch.device(device) and torch.cuda.current_device() == 0
                assert_close_to_float64(out, x, w, b)
                accepted[device] += 1
    assert accepted["cuda:0"] == accepted["cuda:1"] > 0, accepted
