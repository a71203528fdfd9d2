// The tiny family: launch-latency-bound problems (a few rows, a small weight; the
// seed shape 4,12,32,56). Time there is memory round trips, not flops, so the
// kernel makes exactly two dependent trips: every thread first issues its loads of
// the whole (rows x R*H) virtual concat into shared memory (fp32), then each warp
// owns one output feature n, streams W's row n once (coalesced over the lanes) and
// keeps one partial sum per batch row in registers; a warp shuffle reduces them.
//
// Tiling: one warp per output feature, kTinyWarps features per CTA, so K / 8 CTAs
// spread the weight reads over many SMs; rows <= kTinyMaxRows (a register per row).
#pragma once

#include <cuda_runtime.h>

#include "generic_gemm.cuh"
#include "problem.cuh"

namespace vga {

constexpr int kTinyWarps = 8;
constexpr int kTinyMaxRows = 16;
constexpr int64_t kTinyMaxSharedBytes = 48 * 1024;  // no opt-in needed
constexpr int64_t kTinyMaxWeightElements = 1 << 20;  // beyond this, streaming W needs the skinny family

template <typename T>
__global__ void __launch_bounds__(kTinyWarps * 32)
    tiny_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                T* __restrict__ out, BatchRows x_rows, VirtualConcatColumns x_cols, int rows,
                int reduction, int64_t out_features, int64_t weight_stride_out,
                int64_t weight_stride_in, int64_t bias_stride) {
  using Acc = typename AccumulatorOf<T>::type;
  extern __shared__ unsigned char tiny_shared[];
  Acc* x_tile = reinterpret_cast<Acc*>(tiny_shared);  // [rows][reduction]

  // reduction < 2^20 here (tiny_refusal), so the shard/column split is 32-bit arithmetic.
  const int width = static_cast<int>(x_cols.shard_width);
  for (int m = 0; m < rows; ++m) {
    const T* x_row = x + x_rows.offset(m);
    for (int c = threadIdx.x; c < reduction; c += blockDim.x) {
      const int r = c / width;
      x_tile[m * reduction + c] = to_acc<Acc>(x_row[r * x_cols.stride_shard + (c - r * width)]);
    }
  }
  __syncthreads();

  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kTinyWarps + threadIdx.x / 32;
  if (n >= out_features) return;
  const T* w_row = weight + n * weight_stride_out;

  Acc acc[kTinyMaxRows];
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) acc[m] = Acc(0);
#pragma unroll 4
  for (int c = lane; c < reduction; c += 32) {
    const Acc w = to_acc<Acc>(w_row[c * weight_stride_in]);
#pragma unroll
    for (int m = 0; m < kTinyMaxRows; ++m) {
      if (m < rows) acc[m] = fma(w, x_tile[m * reduction + c], acc[m]);
    }
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

inline int64_t tiny_shared_bytes(const ForwardProblem& p) {
  const int64_t acc_size = p.dtype == DType::kFloat64 ? 8 : 4;
  return p.rows() * p.reduction() * acc_size;
}

inline const char* tiny_refusal(const ForwardProblem& p) {
  if (p.rows() > kTinyMaxRows) return "more than 16 batch rows";
  if (tiny_shared_bytes(p) > kTinyMaxSharedBytes) return "the x tile exceeds 48 KB of shared memory";
  if (p.out_features * p.reduction() > kTinyMaxWeightElements) return "weight larger than 2^20 elements";
  return nullptr;
}

inline void tiny_forward(const ForwardProblem& p, cudaStream_t stream) {
  visit_dtype(p.dtype, [&](auto element) {
    using T = decltype(element);
    const unsigned ctas = static_cast<unsigned>((p.out_features + kTinyWarps - 1) / kTinyWarps);
    tiny_kernel<T><<<ctas, kTinyWarps * 32, tiny_shared_bytes(p), stream>>>(
        static_cast<const T*>(p.x), static_cast<const T*>(p.weight), static_cast<const T*>(p.bias),
        static_cast<T*>(p.out), BatchRows{p.batch_inner, p.x_stride_outer, p.x_stride_inner},
        VirtualConcatColumns{p.shard_width, p.x_stride_shard}, static_cast<int>(p.rows()),
        static_cast<int>(p.reduction()), p.out_features, p.weight_stride_out, p.weight_stride_in, p.bias_stride);
  });
}

}  // namespace vga
