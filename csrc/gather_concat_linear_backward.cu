// CUDA entry points of the two backward ops. Both are GEMMs over the same virtual
// concat as the forward, run by the generic family's kernel with other operands:
//   grad_x[r, m, h]   = sum_k grad_y[m, k] * W[k, r*H + h]   (the "virtual scatter")
//   grad_W[k, r*H+h]  = sum_m grad_y[m, k] * x[r, m, h]
// (grad_bias is a plain column sum, left to torch in vga_linear/ops.py.)
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include "kernels/generic_gemm.cuh"
#include "launch_context.h"

namespace vga {
namespace {

void check_same(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                const char* op) {
  STD_TORCH_CHECK(kernel_dtype(a.scalar_type()).has_value(), op, ": ", a_name, " has dtype ",
                  dtype_name(a.scalar_type()),
                  "; supported dtypes are float32, float16, bfloat16 and float64");
  STD_TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", a_name, " and ", b_name,
                  " must share one dtype, got ", dtype_name(a.scalar_type()), " and ",
                  dtype_name(b.scalar_type()));
  STD_TORCH_CHECK(same_cuda_device(a, b), op, ": ",
                  b_name, " is on ", device_name(b), " but ", a_name, " is on ", device_name(a),
                  "; all tensors must be on one device");
}

void check_grad_out(const Tensor& grad_out, const char* op) {
  STD_TORCH_CHECK(grad_out.dim() == 2 || grad_out.dim() == 3, op,
                  ": grad_out must be (*batch, K) with one or two batch dims, got ",
                  grad_out.dim(), " dims");
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

Tensor grad_x_cuda(Tensor grad_out, Tensor weight, int64_t num_shards) {
  constexpr const char* op = "gather_concat_linear_grad_x";
  check_grad_out(grad_out, op);
  check_same(grad_out, "grad_out", weight, "weight", op);
  STD_TORCH_CHECK(weight.dim() == 2 && weight.size(0) == grad_out.size(-1), op,
                  ": weight must be (K, R*H) with K = grad_out.shape[-1] = ", grad_out.size(-1));
  STD_TORCH_CHECK(num_shards > 0 && weight.size(1) % num_shards == 0, op,
                  ": weight.shape[1] = ", weight.size(1), " is not a multiple of num_shards = ",
                  num_shards);
  const int32_t device_index = grad_out.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  const int64_t H = weight.size(1) / num_shards;
  const size_t out_dims = static_cast<size_t>(grad_out.dim() + 1);
  std::array<int64_t, 4> sizes{num_shards};
  for (size_t d = 1; d + 1 < out_dims; ++d) sizes[d] = grad_out.size(static_cast<int64_t>(d) - 1);
  sizes[out_dims - 1] = H;
  Tensor grad_x = empty_cuda_like(grad_out, sizes, out_dims, device_index);
  if (grad_x.numel() == 0) return grad_x;
  const BatchRows rows = batch_rows_of(grad_out, 0);
  const int64_t batch = batch_rows_count(grad_out);
  visit_dtype(*kernel_dtype(grad_out.scalar_type()), [&](auto element) {
    using T = decltype(element);
    BatchRowsMatrixOperand<T, false> a{static_cast<const T*>(grad_out.const_data_ptr()), rows,
                                       grad_out.stride(-1)};
    StridedOperand<T> b{static_cast<const T*>(weight.const_data_ptr()), weight.stride(0),
                        weight.stride(1)};
    ScatterToShardsStore<T> store{static_cast<T*>(grad_x.mutable_data_ptr()), batch, H};
    launch_generic_gemm<T>(a, b, store, batch, weight.size(1), weight.size(0),
                           current_stream(device_index));
  });
  check_launch("gather_concat_linear_grad_x");
  return grad_x;
}

Tensor grad_weight_cuda(Tensor grad_out, Tensor x) {
  constexpr const char* op = "gather_concat_linear_grad_weight";
  check_grad_out(grad_out, op);
  check_same(x, "x", grad_out, "grad_out", op);
  bool batch_matches = x.dim() == grad_out.dim() + 1;
  for (int64_t d = 0; batch_matches && d + 1 < grad_out.dim(); ++d) {
    batch_matches = x.size(d + 1) == grad_out.size(d);
  }
  STD_TORCH_CHECK(batch_matches, op, ": x must be (R, *batch, H) with the batch dims of grad_out (*batch, K)");
  STD_TORCH_CHECK(x.size(-1) <= 1 || x.stride(-1) == 1, op, ": x's last dim must have stride 1, got stride ", x.stride(-1));
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  const int64_t R = x.size(0);
  const int64_t H = x.size(-1);
  const int64_t K = grad_out.size(-1);
  std::array<int64_t, 2> sizes{K, R * H};
  Tensor grad_weight = empty_cuda_like(x, sizes, 2, device_index);
  if (grad_weight.numel() == 0) return grad_weight;
  visit_dtype(*kernel_dtype(x.scalar_type()), [&](auto element) {
    using T = decltype(element);
    BatchRowsMatrixOperand<T, true> a{static_cast<const T*>(grad_out.const_data_ptr()),
                                      batch_rows_of(grad_out, 0), grad_out.stride(-1)};
    VirtualConcatOperand<T> b{static_cast<const T*>(x.const_data_ptr()), batch_rows_of(x, 1),
                              VirtualConcatColumns{H, x.stride(0)}};
    RowMajorStore<T> store{static_cast<T*>(grad_weight.mutable_data_ptr()), R * H, nullptr, 0};
    launch_generic_gemm<T>(a, b, store, K, R * H, batch_rows_count(grad_out), current_stream(device_index));
  });
  check_launch("gather_concat_linear_grad_weight");
  return grad_weight;
}

}  // namespace
}  // namespace vga

STABLE_TORCH_LIBRARY_IMPL(vga, CUDA, m) {
  m.impl("gather_concat_linear_grad_x", TORCH_BOX(&vga::grad_x_cuda));
  m.impl("gather_concat_linear_grad_weight", TORCH_BOX(&vga::grad_weight_cuda));
}
