// The tiny family: launch-latency-bound problems (a few rows, a short reduction; the
// seed shape 4,12,32,56). Their time is launch latency plus dependent memory round
// trips, not flops or bytes, so the kernel is built to make exactly one round trip:
// each lane reads its kTinyColumnsPerLane columns of W's row n and, for every batch
// row, the matching elements of the virtual concat of x, all as independent loads
// issued together (x is tiny and shared by every warp, so its re-reads hit L1/L2).
// No shared memory, no barrier; a warp shuffle reduces the per-row partial sums.
//
// Tiling: one warp per output feature, kTinyWarps features per CTA (K / 8 CTAs);
// rows <= 16 and R*H <= 128 so that every load of a lane fits in registers at once.
#pragma once

#include <cuda_runtime.h>

#include "generic_gemm.cuh"
#include "problem.cuh"

namespace vga {

constexpr int kTinyWarps = 8;
constexpr int kTinyMaxRows = 16;
constexpr int kTinyColumnsPerLane = 4;
constexpr int kTinyMaxReduction = 32 * kTinyColumnsPerLane;

template <typename T>
__global__ void __launch_bounds__(kTinyWarps * 32)
    tiny_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                T* __restrict__ out, BatchRows x_rows, VirtualConcatColumns x_cols, int rows,
                int reduction, int64_t out_features, int64_t weight_stride_out,
                int64_t weight_stride_in, int64_t bias_stride) {
  using Acc = typename AccumulatorOf<T>::type;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kTinyWarps + threadIdx.x / 32;
  if (n >= out_features) return;

  // This lane's columns c = lane + 32 j: W[n, c] and where column c lives in x.
  const int width = static_cast<int>(x_cols.shard_width);
  Acc w[kTinyColumnsPerLane];
  int64_t column_offset[kTinyColumnsPerLane];
#pragma unroll
  for (int j = 0; j < kTinyColumnsPerLane; ++j) {
    const int c = lane + 32 * j;
    const bool in_range = c < reduction;
    const int r = in_range ? c / width : 0;
    w[j] = in_range ? to_acc<Acc>(weight[n * weight_stride_out + c * weight_stride_in]) : Acc(0);
    column_offset[j] = in_range ? r * x_cols.stride_shard + (c - r * width) : 0;
  }

  // Every x load first (predicated, no branch between them), then the arithmetic: a
  // branch per row would let each row's FMAs stall the next row's loads.
  Acc x_values[kTinyMaxRows][kTinyColumnsPerLane];
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) {
    const T* x_row = x + (m < rows ? x_rows.offset(m) : 0);
#pragma unroll
    for (int j = 0; j < kTinyColumnsPerLane; ++j) {
      const bool in_range = m < rows && lane + 32 * j < reduction;
      x_values[m][j] = in_range ? to_acc<Acc>(x_row[column_offset[j]]) : Acc(0);
    }
  }
  Acc acc[kTinyMaxRows];
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) {
    acc[m] = Acc(0);
#pragma unroll
    for (int j = 0; j < kTinyColumnsPerLane; ++j) acc[m] = fma(w[j], x_values[m][j], acc[m]);
  }

  const Acc b = bias != nullptr ? to_acc<Acc>(bias[n * bias_stride]) : Acc(0);
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) {
    Acc v = acc[m];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0 && m < rows) out[static_cast<int64_t>(m) * out_features + n] = from_acc<T>(v + b);
  }
}

inline const char* tiny_refusal(const ForwardProblem& p) {
  if (p.rows() > kTinyMaxRows) return "more than 16 batch rows";
  if (p.reduction() > kTinyMaxReduction) return "R*H > 128";
  if (p.out_features > int64_t{INT32_MAX} * kTinyWarps) return "more output features than grid CTAs";
  return nullptr;
}

inline void tiny_forward(const ForwardProblem& p, cudaStream_t stream) {
  visit_dtype(p.dtype, [&](auto element) {
    using T = decltype(element);
    const unsigned ctas = static_cast<unsigned>((p.out_features + kTinyWarps - 1) / kTinyWarps);
    tiny_kernel<T><<<ctas, kTinyWarps * 32, 0, stream>>>(
        static_cast<const T*>(p.x), static_cast<const T*>(p.weight), static_cast<const T*>(p.bias),
        static_cast<T*>(p.out), BatchRows{p.batch_inner, p.x_stride_outer, p.x_stride_inner},
        VirtualConcatColumns{p.shard_width, p.x_stride_shard}, static_cast<int>(p.rows()),
        static_cast<int>(p.reduction()), p.out_features, p.weight_stride_out, p.weight_stride_in,
        p.bias_stride);
  });
}

}  // namespace vga
