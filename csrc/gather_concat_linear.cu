// CUDA entry points of the forward op: argument checks, the ForwardProblem, the
// choice of a kernel family, and the launch on the current stream. The kernels
// live in kernels/, one header per family.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <string>

#include "kernels/generic_gemm.cuh"
#include "kernels/simt_fp32.cuh"
#include "kernels/skinny.cuh"
#include "kernels/sm90_gemm.cuh"
#include "kernels/sm90_skinny.cuh"
#include "kernels/sm90_tf32x3.cuh"
#include "kernels/tiny.cuh"
#include "launch_context.h"

namespace vga {
namespace {

struct Family {
  const char* name;
  const char* (*refusal)(const ForwardProblem&);
  void (*forward)(const ForwardProblem&, cudaStream_t);
  // The configuration it would run, as a forced configuration spells it (nullptr: it has none).
  std::string (*config)(const ForwardProblem&) = nullptr;
};

// In preference order; generic, which accepts everything, comes last.
constexpr Family kFamilies[] = {
    {"tiny", tiny_refusal, tiny_forward},
    {"sm90_skinny", sm90_skinny_refusal, sm90_skinny_forward},
    {"skinny", skinny_refusal, skinny_forward},
    {"sm90_tf32x3", sm90_tf32x3_refusal, sm90_tf32x3_forward},
    {"simt_fp32", simt_fp32_refusal, simt_fp32_forward},
    {"sm90_gemm", sm90_gemm_refusal, sm90_gemm_forward, sm90_gemm_config},
    {"generic", generic_refusal, generic_forward},
};
constexpr size_t kGenericIndex = sizeof(kFamilies) / sizeof(kFamilies[0]) - 1;

std::string shape_of(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// The same rules, in the same words, as vga_linear/ops.py's check_forward_args.
void check_forward_args(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  STD_TORCH_CHECK(x.dim() == 3 || x.dim() == 4,
                  "gather_concat_linear: x must be (R, *batch, H) with one or two batch dims "
                  "(3 or 4 dims), got shape ",
                  shape_of(x));
  STD_TORCH_CHECK(weight.dim() == 2, "gather_concat_linear: weight must be 2-D (K, R*H), got shape ",
                  shape_of(weight));
  const int64_t R = x.size(0);
  const int64_t H = x.size(-1);
  STD_TORCH_CHECK(weight.size(1) == R * H, "gather_concat_linear: weight.shape[1] must equal R*H = ",
                  R, "*", H, " = ", R * H, ", got weight shape ", shape_of(weight));
  if (bias.has_value()) {
    STD_TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0),
                    "gather_concat_linear: bias must have shape (K,) = (", weight.size(0),
                    ",), got ", shape_of(*bias));
  }
  const ScalarType dtype = x.scalar_type();
  STD_TORCH_CHECK(kernel_dtype(dtype).has_value(), "gather_concat_linear: x has dtype ",
                  dtype_name(dtype),
                  "; supported dtypes are float32, float16, bfloat16 and float64");
  STD_TORCH_CHECK(weight.scalar_type() == dtype,
                  "gather_concat_linear: x, weight and bias must share one dtype, got x ",
                  dtype_name(dtype), " and weight ", dtype_name(weight.scalar_type()));
  if (bias.has_value()) {
    STD_TORCH_CHECK(bias->scalar_type() == dtype,
                    "gather_concat_linear: x, weight and bias must share one dtype, got x ",
                    dtype_name(dtype), " and bias ", dtype_name(bias->scalar_type()));
  }
  STD_TORCH_CHECK(same_cuda_device(x, weight), "gather_concat_linear: weight is on ",
                  device_name(weight), " but x is on ", device_name(x),
                  "; all tensors must be on one device");
  if (bias.has_value()) {
    STD_TORCH_CHECK(same_cuda_device(x, *bias), "gather_concat_linear: bias is on ",
                    device_name(*bias), " but x is on ", device_name(x),
                    "; all tensors must be on one device");
  }
  STD_TORCH_CHECK(H <= 1 || x.stride(-1) == 1,
                  "gather_concat_linear: x's last dim must have stride 1, got stride ",
                  x.stride(-1), "; pass x.contiguous() or a view whose rows are contiguous");
}

ForwardProblem describe_forward(const Tensor& x, const Tensor& weight,
                                const std::optional<Tensor>& bias, void* out) {
  ForwardProblem p = describe_shards(x, weight.size(0));
  p.weight = weight.const_data_ptr();
  p.bias = bias.has_value() ? bias->const_data_ptr() : nullptr;
  p.out = out;
  p.weight_stride_out = weight.stride(0);
  p.weight_stride_in = weight.stride(1);
  p.bias_stride = bias.has_value() ? bias->stride(0) : 0;
  return p;
}

// Only the generic family handles an empty reduction (R*H == 0: the output is the bias).
const char* refusal_of(const Family& family, const ForwardProblem& p) {
  if (p.reduction() == 0 && &family != &kFamilies[kGenericIndex]) return "empty reduction (R*H == 0)";
  return family.refusal(p);
}

// The dispatch rule (benchmarks/NOTES.md says where each threshold comes from):
// the first family in preference order that accepts the problem.
const Family& choose_family(const ForwardProblem& p) {
  for (const Family& family : kFamilies) {
    if (refusal_of(family, p) == nullptr) return family;
  }
  STD_TORCH_CHECK(false, "gather_concat_linear: no kernel family accepts this input (generic: ",
                  generic_refusal(p), ")");
}

const Family& family_named(const std::string& name) {
  for (const Family& family : kFamilies) {
    if (name == family.name) return family;
  }
  std::string known;
  for (const Family& family : kFamilies) known += std::string(known.empty() ? "" : ", ") + family.name;
  STD_TORCH_CHECK(false, "gather_concat_linear: unknown kernel family '", name, "'; known: ", known);
}

// The family that runs p: the forced one, which must accept p (or the call says why not), or the
// dispatch rule's.
const Family& resolve_family(const ForwardProblem& p, const Family* forced) {
  if (forced == nullptr) return choose_family(p);
  const char* why = refusal_of(*forced, p);
  STD_TORCH_CHECK(why == nullptr, "gather_concat_linear: kernel family '", forced->name, "' refuses this input: ", why);
  return *forced;
}

Tensor run_forward(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                   const Family* forced, ForcedConfig forced_config = {}) {
  check_forward_args(x, weight, bias);
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  // (*batch, K): x's batch dims, then K.
  std::array<int64_t, 3> out_sizes{};
  const size_t out_dims = static_cast<size_t>(x.dim() - 1);
  for (size_t d = 0; d + 1 < out_dims; ++d) out_sizes[d] = x.size(static_cast<int64_t>(d) + 1);
  out_sizes[out_dims - 1] = weight.size(0);
  Tensor out = empty_cuda_like(x, out_sizes, out_dims, device_index);
  if (out.numel() == 0) return out;
  ForwardProblem p = describe_forward(x, weight, bias, out.mutable_data_ptr());
  LaunchWorkspace workspace(device_index);
  p.workspace = workspace.request();
  p.forced = forced_config;
  const Family& family = resolve_family(p, forced);
  family.forward(p, current_stream(device_index));
  check_launch(family.name);
  return out;
}

Tensor gather_concat_linear_cuda(Tensor x, Tensor weight, std::optional<Tensor> bias) {
  return run_forward(x, weight, bias, nullptr);
}

// A forced family by name, with a configuration of the GEMM core after a slash ("sm90_gemm/n128/s4").
struct FamilySpec {
  const Family* family;
  ForcedConfig config;
};

FamilySpec family_spec(const std::string& spec) {
  const Family& family = family_named(forced_family_name(spec));
  return {&family, forced_config_of(spec, family.config != nullptr, "gather_concat_linear")};
}

// Tests and benchmarks force one family; it must accept the input or say why not.
Tensor gather_concat_linear_family_cuda(Tensor x, Tensor weight, std::optional<Tensor> bias,
                                        std::string family) {
  const FamilySpec spec = family_spec(family);
  return run_forward(x, weight, bias, spec.family, spec.config);
}

// The family the dispatcher would pick for these inputs (or, given `family`, that forced one) and,
// for one with configurations, the configuration it would run, in the names
// _gather_concat_linear_family forces them by ("sm90_gemm/n128/s2"); "" for an empty output.
std::string gather_concat_linear_choice_cuda(Tensor x, Tensor weight, std::optional<Tensor> bias,
                                             std::string family) {
  check_forward_args(x, weight, bias);
  const int64_t rows = x.size(1) * (x.dim() == 4 ? x.size(2) : 1);
  if (rows == 0 || weight.size(0) == 0) return "";
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());  // (the plan asks x's device)
  ForwardProblem p = describe_forward(x, weight, bias, nullptr);
  const Family* forced = nullptr;
  if (!family.empty()) {
    const FamilySpec spec = family_spec(family);
    forced = spec.family;
    p.forced = spec.config;
  }
  const Family& chosen = resolve_family(p, forced);
  if (chosen.config == nullptr) return chosen.name;
  return std::string(chosen.name) + "/" + chosen.config(p);
}

// The clusters of each size the GEMM core's forward kernels fit at once on x's device, for x's
// dtype (fp16/bf16), as the plan counts them: the paired kernels', the in-cluster splits' by
// size, the swapped forward's pairs ("pairs=66 of2=66 of4=30 of8=15 swapped_pairs=66" on an
// H200). benchmarks/core_configs.py's copy of the plan takes them from here.
std::string sm90_resident_clusters_cuda(Tensor x) {
  STD_TORCH_CHECK(x.is_cuda(), "_sm90_resident_clusters: x must be a CUDA tensor");
  const std::optional<DType> dtype = kernel_dtype(x.scalar_type());
  STD_TORCH_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16,
                  "_sm90_resident_clusters: x must be float16 or bfloat16, got ", dtype_name(x.scalar_type()));
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  STD_TORCH_CHECK(device_traits(device_index).cc_major == 9, "_sm90_resident_clusters: needs a Hopper GPU");
  std::string out;
  visit_half_dtype(*dtype, [&](auto element) {
    using Element = decltype(element);
    const sm90::ResidentClusters& r = sm90::resident_clusters<sm90::GemmKind::kForward, Element>(device_index);
    const sm90::ResidentClusters& swapped =
        sm90::resident_clusters<sm90::GemmKind::kForwardSwapped, Element>(device_index);
    out = "pairs=" + std::to_string(r.pairs) + " of2=" + std::to_string(r.of2) + " of4=" + std::to_string(r.of4) +
          " of8=" + std::to_string(r.of8) + " swapped_pairs=" + std::to_string(swapped.pairs);
  });
  return out;
}

}  // namespace
}  // namespace vga

STABLE_TORCH_LIBRARY_IMPL(vga, CUDA, m) {
  m.impl("gather_concat_linear", TORCH_BOX(&vga::gather_concat_linear_cuda));
  m.impl("_gather_concat_linear_family", TORCH_BOX(&vga::gather_concat_linear_family_cuda));
  m.impl("_gather_concat_linear_choice", TORCH_BOX(&vga::gather_concat_linear_choice_cuda));
  m.impl("_sm90_resident_clusters", TORCH_BOX(&vga::sm90_resident_clusters_cuda));
}
