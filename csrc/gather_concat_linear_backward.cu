// CUDA entry points of the backward ops (grad_x, grad_weight, and both in one op, which autograd
// calls): argument checks, the problem, the choice of a family (the first in preference order
// that accepts the input) and the launch on the current stream. Both products are GEMMs over the
// forward's virtual concat:
//   grad_x[r, m, h]   = sum_k grad_y[m, k] * W[k, r*H + h]   (in x's strides where x is given and
//                                                             dense, else the (R, *batch, H) view
//                                                             of a (rows, R*H) row-major result)
//   grad_W[k, r*H+h]  = sum_m grad_y[m, k] * x[r, m, h]
// (grad_bias is a plain column sum, left to torch in vga_linear/ops.py.)
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/generic_gemm.cuh"
#include "kernels/sm90_grad.cuh"
#include "kernels/sm90_tf32x3_grad.cuh"
#include "launch_context.h"

namespace vga {
namespace {

// The backward families, in preference order; generic, which accepts everything, comes last
// (refusal == nullptr) and runs from the tensors themselves.
template <typename Problem>
struct BackwardFamily {
  const char* name;
  const char* (*refusal)(const Problem&);
  void (*run)(const Problem&, cudaStream_t);
  bool takes_config = false;  // a forced configuration of the GEMM core ("sm90_gemm/n128/s4")
};
constexpr BackwardFamily<GradInputProblem> kGradInputFamilies[] = {
    {"sm90_gemm", sm90_grad_input_refusal, sm90_grad_input, /*takes_config=*/true},
    {"sm90_tf32x3", sm90_tf32x3_grad_input_refusal, sm90_tf32x3_grad_input},
    {"generic", nullptr, nullptr},
};
constexpr BackwardFamily<GradWeightProblem> kGradWeightFamilies[] = {
    {"sm90_gemm", sm90_grad_weight_refusal, sm90_grad_weight, /*takes_config=*/true},
    {"sm90_tf32x3", sm90_tf32x3_grad_weight_refusal, sm90_tf32x3_grad_weight},
    {"generic", nullptr, nullptr},
};

void check_same(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name, const char* op) {
  STD_TORCH_CHECK(kernel_dtype(a.scalar_type()).has_value(), op, ": ", a_name, " has dtype ",
                  dtype_name(a.scalar_type()), "; supported dtypes are float32, float16, bfloat16 and float64");
  STD_TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", a_name, " and ", b_name,
                  " must share one dtype, got ", dtype_name(a.scalar_type()), " and ", dtype_name(b.scalar_type()));
  STD_TORCH_CHECK(same_cuda_device(a, b), op, ": ", b_name, " is on ", device_name(b), " but ", a_name, " is on ",
                  device_name(a), "; all tensors must be on one device");
}

void check_grad_out(const Tensor& grad_out, const char* op) {
  STD_TORCH_CHECK(grad_out.dim() == 2 || grad_out.dim() == 3, op,
                  ": grad_out must be (*batch, K) with one or two batch dims, got ", grad_out.dim(), " dims");
}

int64_t batch_rows_count(const Tensor& grad_out) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < grad_out.dim(); ++d) rows *= grad_out.size(d);
  return rows;
}

BatchRows batch_rows_of(const Tensor& t, int64_t first_batch_dim) {
  const bool two = t.dim() - first_batch_dim == 3;
  return BatchRows{two ? t.size(first_batch_dim + 1) : 1, t.stride(first_batch_dim),
                   two ? t.stride(first_batch_dim + 1) : 0};
}

// The stride between grad_out's rows when its batch dims merge and its last dim is contiguous; -1 otherwise.
int64_t merged_row_stride(const Tensor& grad_out) {
  if (grad_out.size(-1) > 1 && grad_out.stride(-1) != 1) return -1;
  if (grad_out.dim() == 2) return grad_out.stride(0);
  if (grad_out.size(0) == 1) return grad_out.stride(1);
  if (grad_out.size(1) == 1) return grad_out.stride(0);
  return grad_out.stride(0) == grad_out.size(1) * grad_out.stride(1) ? grad_out.stride(1) : -1;
}

// Which family runs: the forced one (it must accept the input or say why not), with the configuration
// the forced spec asks of it stored in `forced_config`, or the first that accepts.
template <typename Problem, size_t N>
const BackwardFamily<Problem>& pick_family(const BackwardFamily<Problem> (&families)[N], const std::string& forced,
                                           Problem& p, ForcedConfig& forced_config, const char* op) {
  if (forced.empty()) {
    for (const auto& family : families) {
      if (family.refusal == nullptr || family.refusal(p) == nullptr) return family;
    }
  }
  const std::string name = forced_family_name(forced);
  for (const auto& family : families) {
    if (name != family.name) continue;
    forced_config = forced_config_of(forced, family.takes_config, op);
    const char* why = family.refusal == nullptr ? nullptr : family.refusal(p);
    STD_TORCH_CHECK(why == nullptr, op, ": kernel family '", family.name, "' refuses this input: ", why);
    return family;
  }
  std::string known;
  for (const auto& family : families) known += std::string(known.empty() ? "" : ", ") + family.name;
  STD_TORCH_CHECK(false, op, ": unknown kernel family '", forced, "'; known: ", known);
}

// Whether a tensor's elements fill its storage span exactly once (torch's non-overlapping and
// dense: some order of its dims is row-major), with the last dim contiguous.
bool dense_with_contiguous_rows(const Tensor& t) {
  if (t.numel() == 0 || (t.size(-1) > 1 && t.stride(-1) != 1)) return false;
  std::array<int64_t, 4> dims{};
  int n = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) dims[n++] = d;
  }
  std::sort(dims.begin(), dims.begin() + n, [&](int64_t a, int64_t b) { return t.stride(a) < t.stride(b); });
  int64_t expected = 1;
  for (int i = 0; i < n; ++i) {
    if (t.stride(dims[i]) != expected) return false;
    expected *= t.size(dims[i]);
  }
  return true;
}

void check_grad_x_args(const Tensor& grad_out, const Tensor& weight, int64_t num_shards, const std::optional<Tensor>& x,
                       const char* op) {
  check_grad_out(grad_out, op);
  check_same(grad_out, "grad_out", weight, "weight", op);
  STD_TORCH_CHECK(weight.dim() == 2 && weight.size(0) == grad_out.size(-1), op,
                  ": weight must be (K, R*H) with K = grad_out.shape[-1] = ", grad_out.size(-1));
  STD_TORCH_CHECK(num_shards > 0 && weight.size(1) % num_shards == 0, op, ": weight.shape[1] = ", weight.size(1),
                  " is not a multiple of num_shards = ", num_shards);
  if (x.has_value()) {
    const int64_t out_dims = grad_out.dim() + 1;
    bool same = x->dim() == out_dims && x->size(0) == num_shards && x->size(-1) == weight.size(1) / num_shards;
    for (int64_t d = 1; same && d + 1 < out_dims; ++d) same = x->size(d) == grad_out.size(d - 1);
    STD_TORCH_CHECK(same, op, ": x must be (num_shards, *grad_out.shape[:-1], H) = the forward's input (", num_shards,
                    ", ..., ", weight.size(1) / num_shards, ") with ", out_dims, " dims, got ", x->dim(), " dims");
    STD_TORCH_CHECK(same_cuda_device(grad_out, *x), op, ": x is on ", device_name(*x), " but grad_out is on ",
                    device_name(grad_out), "; all tensors must be on one device");
  }
}

void check_grad_weight_args(const Tensor& grad_out, const Tensor& x, const char* op) {
  check_grad_out(grad_out, op);
  check_same(x, "x", grad_out, "grad_out", op);
  bool batch_matches = x.dim() == grad_out.dim() + 1;
  for (int64_t d = 0; batch_matches && d + 1 < grad_out.dim(); ++d) {
    batch_matches = x.size(d + 1) == grad_out.size(d);
  }
  STD_TORCH_CHECK(batch_matches, op, ": x must be (R, *batch, H) with the batch dims of grad_out (*batch, K)");
  STD_TORCH_CHECK(x.size(-1) <= 1 || x.stride(-1) == 1, op, ": x's last dim must have stride 1, got stride ",
                  x.stride(-1));
}

// A backward product with its output allocated and its family chosen, not yet queued: the
// backward op allocates both products' outputs before it queues either (see backward_impl).
template <typename Problem>
struct PreparedProduct {
  Tensor output;
  Problem problem;
  const BackwardFamily<Problem>* family;  // nullptr: the output is empty, nothing to launch
};

// grad_x (arguments checked by check_grad_x_args).
PreparedProduct<GradInputProblem> prepare_grad_x(const Tensor& grad_out, const Tensor& weight, int64_t num_shards,
                                                 const std::optional<Tensor>& x, const std::string& forced,
                                                 LaunchWorkspace& workspace, const char* op) {
  const int32_t device_index = grad_out.get_device_index();
  const int64_t H = weight.size(1) / num_shards;
  const int64_t columns = weight.size(1);
  // grad_x is (R, *batch, H): in x's strides where x is given and dense (so that autograd hands a
  // leaf x its gradient without a copy, and x's producer gets its own layout back), otherwise
  // with strides (H, <batch strides of a (*batch, R*H) matrix>, 1): what cat's autograd returns.
  const int64_t out_dims = grad_out.dim() + 1;
  const bool x_layout = x.has_value() && dense_with_contiguous_rows(*x);
  std::array<int64_t, 4> sizes{num_shards};
  std::array<int64_t, 4> strides{H};
  int64_t stride = columns;
  for (int64_t d = out_dims - 2; d >= 1; --d) {
    sizes[d] = grad_out.size(d - 1);
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  sizes[out_dims - 1] = H;
  strides[out_dims - 1] = 1;
  if (x_layout) {
    for (int64_t d = 0; d < out_dims; ++d) strides[d] = x->stride(d);
  }
  Tensor grad_x = empty_strided_cuda_like(grad_out, sizes, strides, static_cast<size_t>(out_dims), device_index);
  GradInputProblem p{};
  if (grad_x.numel() == 0) return {grad_x, p, nullptr};
  p.grad_out = grad_out.const_data_ptr();
  p.weight = weight.const_data_ptr();
  p.grad_x = grad_x.mutable_data_ptr();
  const bool two_batch_dims = out_dims == 4;
  p.rows = batch_rows_count(grad_out);
  p.layout.shard_width = H;
  p.layout.shard_stride = strides[0];
  p.layout.rows_inner = two_batch_dims ? sizes[2] : p.rows;
  p.layout.inner_stride = strides[out_dims - 2];
  p.layout.outer_stride = two_batch_dims ? strides[1] : 0;
  p.out_features = weight.size(0);
  p.num_shards = num_shards;
  p.shard_width = H;
  p.grad_out_stride = merged_row_stride(grad_out);
  p.weight_stride_out = weight.stride(0);
  p.weight_stride_in = weight.stride(1);
  describe_device(p, grad_out, device_index);
  p.workspace = workspace.request();
  const BackwardFamily<GradInputProblem>& family = pick_family(kGradInputFamilies, forced, p, p.forced, op);
  return {grad_x, p, &family};
}

void launch_grad_x(const PreparedProduct<GradInputProblem>& prepared, const Tensor& grad_out, const Tensor& weight,
                   cudaStream_t stream) {
  const GradInputProblem& p = prepared.problem;
  if (prepared.family == nullptr) return;
  if (prepared.family->run != nullptr) return prepared.family->run(p, stream);
  visit_dtype(p.dtype, [&](auto element) {
    using T = decltype(element);
    BatchRowsMatrixOperand<T, false> a{static_cast<const T*>(grad_out.const_data_ptr()), batch_rows_of(grad_out, 0),
                                       grad_out.stride(-1)};
    StridedOperand<T> b{static_cast<const T*>(weight.const_data_ptr()), weight.stride(0), weight.stride(1)};
    GradXStore<T> store{static_cast<T*>(p.grad_x), p.layout};
    launch_generic_gemm<T>(a, b, store, p.rows, p.columns(), p.out_features, stream);
  });
}

// grad_weight (arguments checked by check_grad_weight_args).
PreparedProduct<GradWeightProblem> prepare_grad_weight(const Tensor& grad_out, const Tensor& x,
                                                       const std::string& forced, LaunchWorkspace& workspace,
                                                       const char* op) {
  const int32_t device_index = x.get_device_index();
  const int64_t R = x.size(0);
  const int64_t H = x.size(-1);
  const int64_t K = grad_out.size(-1);
  std::array<int64_t, 2> sizes{K, R * H};
  Tensor grad_weight = empty_cuda_like(x, sizes, 2, device_index);
  GradWeightProblem g{};
  if (grad_weight.numel() == 0) return {grad_weight, g, nullptr};
  g.shards = describe_shards(x, K);
  ForwardProblem& p = g.shards;
  p.workspace = workspace.request();
  g.grad_out = grad_out.const_data_ptr();
  g.grad_out_stride = merged_row_stride(grad_out);
  g.grad_weight = grad_weight.mutable_data_ptr();
  const BackwardFamily<GradWeightProblem>& family = pick_family(kGradWeightFamilies, forced, g, p.forced, op);
  return {grad_weight, g, &family};
}

void launch_grad_weight(const PreparedProduct<GradWeightProblem>& prepared, const Tensor& grad_out, const Tensor& x,
                        cudaStream_t stream) {
  const GradWeightProblem& g = prepared.problem;
  if (prepared.family == nullptr) return;
  if (prepared.family->run != nullptr) return prepared.family->run(g, stream);
  visit_dtype(g.shards.dtype, [&](auto element) {
    using T = decltype(element);
    const int64_t R = g.shards.num_shards;
    const int64_t H = g.shards.shard_width;
    BatchRowsMatrixOperand<T, true> a{static_cast<const T*>(grad_out.const_data_ptr()), batch_rows_of(grad_out, 0),
                                      grad_out.stride(-1)};
    VirtualConcatOperand<T> b{static_cast<const T*>(x.const_data_ptr()), batch_rows_of(x, 1),
                              VirtualConcatColumns{H, x.stride(0)}};
    RowMajorStore<T> store{static_cast<T*>(g.grad_weight), R * H, nullptr, 0};
    launch_generic_gemm<T>(a, b, store, g.shards.out_features, R * H, batch_rows_count(grad_out), stream);
  });
}

Tensor grad_x_impl(const Tensor& grad_out, const Tensor& weight, int64_t num_shards, const std::optional<Tensor>& x,
                   const std::string& forced) {
  constexpr const char* op = "gather_concat_linear_grad_x";
  check_grad_x_args(grad_out, weight, num_shards, x, op);
  const int32_t device_index = grad_out.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  LaunchWorkspace workspace(device_index);
  const auto grad_x = prepare_grad_x(grad_out, weight, num_shards, x, forced, workspace, op);
  launch_grad_x(grad_x, grad_out, weight, current_stream(device_index));
  check_launch(op);
  return grad_x.output;
}

Tensor grad_weight_impl(const Tensor& grad_out, const Tensor& x, const std::string& forced) {
  constexpr const char* op = "gather_concat_linear_grad_weight";
  check_grad_weight_args(grad_out, x, op);
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  LaunchWorkspace workspace(device_index);
  const auto grad_weight = prepare_grad_weight(grad_out, x, forced, workspace, op);
  launch_grad_weight(grad_weight, grad_out, x, current_stream(device_index));
  check_launch(op);
  return grad_weight.output;
}

Tensor grad_x_cuda(Tensor grad_out, Tensor weight, int64_t num_shards, std::optional<Tensor> x) {
  return grad_x_impl(grad_out, weight, num_shards, x, "");
}
Tensor grad_weight_cuda(Tensor grad_out, Tensor x) { return grad_weight_impl(grad_out, x, ""); }

// Both products of one backward, grad_x then grad_weight, in one op. grad_weight reads grad_out
// and x only, neither of which grad_x writes, so when both run on the GEMM core (whose kernels
// launch programmatically, launch.cuh) grad_weight starts while grad_x's last wave finishes,
// on the SMs that wave leaves idle, and waits for grad_x only before it exits. That is safe
// because:
//  - grad_x's first kernel releases the next one only after its own wait for the kernel before it
//    (ptx.cuh), so grad_out's producer, and every kernel before it, is complete when grad_weight
//    starts (the producer's writes are complete and flushed then; grad_weight reads them through
//    TMA, from L2);
//  - grad_weight's completion implies grad_x's (it waits before it exits), and the kernels after
//    this op wait for grad_weight's grid alone;
//  - nothing is queued between the two: both outputs and grad_weight's split partials are allocated
//    before grad_x is queued (an allocation may queue a kernel: torch's deterministic mode fills
//    new memory), and nothing grad_x's kernels use is released to the allocator before this op
//    returns (its outputs and workspace are held until then). So grad_weight's stores land in
//    memory no running kernel reads or writes.
std::tuple<Tensor, Tensor> backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                         const std::string& grad_x_forced, const std::string& grad_weight_forced) {
  constexpr const char* op = "gather_concat_linear_backward";
  check_grad_weight_args(grad_out, x, op);  // (first: it checks x's dims, which the next one reads)
  check_grad_x_args(grad_out, weight, x.size(0), x, op);
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  LaunchWorkspace grad_x_workspace(device_index);
  LaunchWorkspace grad_weight_workspace(device_index);
  const auto grad_x = prepare_grad_x(grad_out, weight, x.size(0), x, grad_x_forced, grad_x_workspace, op);
  auto grad_weight = prepare_grad_weight(grad_out, x, grad_weight_forced, grad_weight_workspace, op);
  const bool overlap = grad_x.family != nullptr && grad_x.family->run == sm90_grad_input &&
                       grad_weight.family != nullptr && grad_weight.family->run == sm90_grad_weight;
  if (overlap) {
    grad_weight.problem.overlaps_previous_grid = true;
    grad_weight_workspace.allocate_ahead(sm90_grad_weight_workspace_bytes(grad_weight.problem));
  }
  const cudaStream_t stream = current_stream(device_index);
  launch_grad_x(grad_x, grad_out, weight, stream);
  check_launch(op);  // (a failed grad_x must not leave grad_weight reading grad_out unsynchronised)
  launch_grad_weight(grad_weight, grad_out, x, stream);
  check_launch(op);
  return {grad_x.output, grad_weight.output};
}

std::tuple<Tensor, Tensor> backward_cuda(Tensor grad_out, Tensor x, Tensor weight) {
  return backward_impl(grad_out, x, weight, "", "");
}

// Tests and benchmarks force one family ("sm90_gemm", "sm90_gemm/n128/s4", "sm90_tf32x3", "generic").
Tensor grad_x_family_cuda(Tensor grad_out, Tensor weight, int64_t num_shards, std::string family,
                          std::optional<Tensor> x) {
  return grad_x_impl(grad_out, weight, num_shards, x, family);
}
Tensor grad_weight_family_cuda(Tensor grad_out, Tensor x, std::string family) {
  return grad_weight_impl(grad_out, x, family);
}
std::tuple<Tensor, Tensor> backward_family_cuda(Tensor grad_out, Tensor x, Tensor weight, std::string grad_x_family,
                                                std::string grad_weight_family) {
  return backward_impl(grad_out, x, weight, grad_x_family, grad_weight_family);
}

}  // namespace
}  // namespace vga

STABLE_TORCH_LIBRARY_IMPL(vga, CUDA, m) {
  m.impl("gather_concat_linear_grad_x", TORCH_BOX(&vga::grad_x_cuda));
  m.impl("gather_concat_linear_grad_weight", TORCH_BOX(&vga::grad_weight_cuda));
  m.impl("gather_concat_linear_backward", TORCH_BOX(&vga::backward_cuda));
  m.impl("_gather_concat_linear_grad_x_family", TORCH_BOX(&vga::grad_x_family_cuda));
  m.impl("_gather_concat_linear_grad_weight_family", TORCH_BOX(&vga::grad_weight_family_cuda));
  m.impl("_gather_concat_linear_backward_family", TORCH_BOX(&vga::backward_family_cuda));
}
