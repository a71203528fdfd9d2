// The fp32 backward on Hopper at fp32 accuracy: each product runs the sm90_tf32x3 forward kernel
// (3xTF32 on the tensor cores, see sm90_tf32x3.cuh) on operands it can read K-major. fp32 has no
// MN-major wgmma, so what the problem holds MN-major is first copied transposed (transpose.cuh):
//   grad_x = grad_out @ W:        A = grad_out (rows, K) as it is;   B = W^T (R*H, K), copied
//   grad_W = grad_out^T @ cat(x): A = grad_out^T (K, rows), copied; B = cat(x)^T (R*H, rows), copied
// The copies move (K*R*H) or (rows*(K + R*H)) fp32 elements twice: ~5 us at mid_fp32 against ~50 us
// for the product. Rows are padded to a multiple of 4 (16-byte TMA strides) with zeros. grad_x in
// x's layout is scattered into place by the epilogue.
#pragma once

#include "problem.cuh"
#include "sm90/schedule.cuh"
#include "sm90_tf32x3.cuh"
#include "transpose.cuh"

namespace vga {
namespace tf32x3_grad_detail {

// The refusals ask sm90_tf32x3 about a problem whose transposed operands do not exist yet; they
// will be fresh torch allocations (256-byte aligned), which this stands in for.
alignas(256) inline const float kAlignedStandIn[4] = {};

inline ForwardProblem grad_input_as_forward(const GradInputProblem& p, const float* weight_t) {
  ForwardProblem f{};
  f.x = p.grad_out;
  f.weight = weight_t;
  f.out = p.grad_x;
  f.num_shards = 1;
  f.batch_outer = p.rows;
  f.batch_inner = 1;
  f.shard_width = p.out_features;
  f.out_features = p.columns();
  f.x_stride_shard = p.rows * p.grad_out_stride;
  f.x_stride_outer = p.grad_out_stride;
  f.weight_stride_out = p.out_features;
  f.weight_stride_in = 1;
  f.dtype = p.dtype;
  f.sm_count = p.sm_count;
  f.cc_major = p.cc_major;
  f.device_index = p.device_index;
  return f;
}

inline ForwardProblem grad_weight_as_forward(const GradWeightProblem& g, const float* grad_out_t, const float* x_t,
                                             int64_t padded_rows) {
  const ForwardProblem& p = g.shards;
  ForwardProblem f{};
  f.x = grad_out_t;
  f.weight = x_t;
  f.out = g.grad_weight;
  f.num_shards = 1;
  f.batch_outer = p.out_features;
  f.batch_inner = 1;
  f.shard_width = padded_rows;
  f.out_features = p.reduction();
  f.x_stride_shard = p.out_features * padded_rows;
  f.x_stride_outer = padded_rows;
  f.weight_stride_out = padded_rows;
  f.weight_stride_in = 1;
  f.dtype = p.dtype;
  f.sm_count = p.sm_count;
  f.cc_major = p.cc_major;
  f.device_index = p.device_index;
  return f;
}

}  // namespace tf32x3_grad_detail

inline const char* sm90_tf32x3_grad_input_refusal(const GradInputProblem& p) {
  if (p.dtype != DType::kFloat32) return "dtype is not float32";
  if (p.grad_out_stride < 0) return "grad_out's batch dims do not merge into one row stride";
  if (p.weight_stride_in != 1) return "weight's input dim is not contiguous";
  if (p.rows <= 0 || p.out_features <= 0 || p.columns() <= 0) return "empty problem";
  return sm90_tf32x3_refusal(tf32x3_grad_detail::grad_input_as_forward(p, tf32x3_grad_detail::kAlignedStandIn));
}

// Where grad_x is not the (rows, R*H) concat (x's layout), the epilogue scatters it into place.
inline void sm90_tf32x3_grad_input(const GradInputProblem& p, cudaStream_t stream) {
  float* weight_t = static_cast<float*>(p.workspace.get(p.columns() * p.out_features * int64_t(sizeof(float))));
  const TransposeSource w{static_cast<const float*>(p.weight), p.out_features, p.out_features, 0, p.weight_stride_out,
                          p.columns(), 0, p.columns()};
  launch_transpose(w, weight_t, p.out_features, stream);
  const sm90::OutputScatter layout = sm90::make_output_scatter(p.layout);
  const bool scatter = !sm90::scatters_row_major(layout, p.rows, p.columns());
  sm90_tf32x3::launch(tf32x3_grad_detail::grad_input_as_forward(p, weight_t), stream,
                      scatter ? layout : sm90::OutputScatter{});
}

inline const char* sm90_tf32x3_grad_weight_refusal(const GradWeightProblem& g) {
  const ForwardProblem& p = g.shards;
  if (p.dtype != DType::kFloat32) return "dtype is not float32";
  if (g.grad_out_stride != p.out_features) return "grad_out is not a contiguous (rows, K) matrix";
  if (p.rows() <= 0 || p.out_features <= 0 || p.reduction() <= 0) return "empty problem";
  const int64_t padded_rows = ceil_div(p.rows(), 4) * 4;
  return sm90_tf32x3_refusal(tf32x3_grad_detail::grad_weight_as_forward(
      g, tf32x3_grad_detail::kAlignedStandIn, tf32x3_grad_detail::kAlignedStandIn, padded_rows));
}

inline void sm90_tf32x3_grad_weight(const GradWeightProblem& g, cudaStream_t stream) {
  const ForwardProblem& p = g.shards;
  const int64_t padded_rows = ceil_div(p.rows(), 4) * 4;
  float* grad_out_t = static_cast<float*>(p.workspace.get(p.out_features * padded_rows * int64_t(sizeof(float))));
  float* x_t = static_cast<float*>(p.workspace.get(p.reduction() * padded_rows * int64_t(sizeof(float))));
  const TransposeSource grad_out{static_cast<const float*>(g.grad_out), p.rows(), p.rows(), 0, p.out_features,
                                 p.out_features, 0, p.out_features};
  launch_transpose(grad_out, grad_out_t, padded_rows, stream);
  const bool two_dims = p.batch_inner > 1 || p.x_stride_inner != 0;
  const TransposeSource x{static_cast<const float*>(p.x), p.rows(), two_dims ? p.batch_inner : p.rows(),
                          two_dims ? p.x_stride_outer : 0, two_dims ? p.x_stride_inner : p.x_stride_outer,
                          p.shard_width, p.x_stride_shard, p.reduction()};
  launch_transpose(x, x_t, padded_rows, stream);
  sm90_tf32x3::launch(tf32x3_grad_detail::grad_weight_as_forward(g, grad_out_t, x_t, padded_rows), stream);
}

}  // namespace vga
