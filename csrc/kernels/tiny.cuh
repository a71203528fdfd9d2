// The tiny family: launch-latency-bound problems (a few rows, a short reduction; the
// seed shape 4,12,32,56). Their time is launch latency plus the memory round trip and
// the instructions in front of it, not flops or bytes, so the kernel makes exactly one
// round trip and keeps the work before its loads short: each lane reads its 4 columns
// of W's row n and, for every batch row, the matching 4 elements of the virtual concat
// of x, all as independent loads issued together (x is tiny and shared by every warp,
// so its re-reads hit L1/L2). No shared memory, no barrier; a warp shuffle reduces the
// per-row partial sums.
//
// Index math in front of the loads: lane m works out batch row m's offset (the only
// division by the inner batch dim) and hands it to the other lanes by shuffle; with
// kQuads (H % 4 == 0, W rows and x vector-aligned) a lane's 4 columns are adjacent, in
// one shard, and come in one vector load per row, otherwise they are lane + 32 j, each
// with its own shard. (A per-row 64-bit division and branch, as before, put ~2000
// instructions a warp in front of the last load: benchmarks/NOTES.md, tiny v3.)
//
// Tiling: one warp per output feature, one warp per CTA: the seed's 56 features run as
// 56 CTAs on 56 SMs, and with 32-thread launch bounds ptxas gives the kernel the registers
// (72 at fp32) to issue most of its loads before the first FMA. (256-thread bounds got 64
// registers and FMAs between the loads, ~1.3 µs slower at 12-16 rows: NOTES.md, tiny v3.)
// rows <= 16 and R*H <= 128 so that every load of a lane fits in registers at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "generic_gemm.cuh"
#include "problem.cuh"

namespace vga {

constexpr int kTinyMaxRows = 16;
constexpr int kTinyColumnsPerLane = 4;
constexpr int kTinyMaxReduction = 32 * kTinyColumnsPerLane;

// 4 adjacent elements, loaded as one vector.
template <typename T>
struct alignas(kTinyColumnsPerLane * sizeof(T)) TinyQuad {
  T v[kTinyColumnsPerLane];
};

template <typename T, bool kQuads>
__global__ void __launch_bounds__(32)
    tiny_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                T* __restrict__ out, BatchRows x_rows, VirtualConcatColumns x_cols, int rows,
                int reduction, int64_t out_features, int64_t weight_stride_out,
                int64_t weight_stride_in, int64_t bias_stride) {
  using Acc = typename AccumulatorOf<T>::type;
  constexpr int kCols = kTinyColumnsPerLane;
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x;  // one warp a CTA, one CTA an output feature

  // Batch row `lane`'s offset in x (rows <= 16, so the inner dim fits an int).
  const int inner = static_cast<int>(x_rows.inner);
  const int64_t my_row_offset =
      lane < rows ? (lane / inner) * x_rows.stride_outer + (lane % inner) * x_rows.stride_inner : 0;

  // This lane's columns, W[n, c] and where they live in x (offsets relative to the row).
  const int width = static_cast<int>(x_cols.shard_width);
  Acc w[kCols];
  int64_t column_offset[kCols];
  bool column_live[kCols];
  if constexpr (kQuads) {
    const int c = kCols * lane;  // c .. c + 3: one shard, since H % 4 == 0
    const int r = c / width;
    column_offset[0] = r * x_cols.stride_shard + (c - r * width);
    const bool live = c < reduction;
    TinyQuad<T> quad{};
    if (live) quad = *reinterpret_cast<const TinyQuad<T>*>(weight + n * weight_stride_out + c);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      w[j] = to_acc<Acc>(quad.v[j]);
      column_live[j] = live;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = lane + 32 * j;
      const int r = c / width;
      column_live[j] = c < reduction;
      column_offset[j] = r * x_cols.stride_shard + (c - r * width);
      w[j] = column_live[j] ? to_acc<Acc>(weight[n * weight_stride_out + c * weight_stride_in]) : Acc(0);
    }
  }
  const Acc b = bias != nullptr ? to_acc<Acc>(bias[n * bias_stride]) : Acc(0);

  // Every x load first (predicated, no branch between them), then the arithmetic.
  Acc x_values[kTinyMaxRows][kCols];
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) {
    const int64_t row_offset = __shfl_sync(0xffffffffu, my_row_offset, m);
    const T* x_row = x + row_offset;
    if constexpr (kQuads) {
      TinyQuad<T> quad{};
      if (m < rows && column_live[0]) quad = *reinterpret_cast<const TinyQuad<T>*>(x_row + column_offset[0]);
#pragma unroll
      for (int j = 0; j < kCols; ++j) x_values[m][j] = to_acc<Acc>(quad.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        x_values[m][j] = m < rows && column_live[j] ? to_acc<Acc>(x_row[column_offset[j]]) : Acc(0);
      }
    }
  }
  Acc acc[kTinyMaxRows];
#pragma unroll
  for (int m = 0; m < kTinyMaxRows; ++m) {
    acc[m] = Acc(0);
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[m] = fma(w[j], x_values[m][j], acc[m]);
  }

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
  if (p.out_features > INT32_MAX) return "more than 2^31 - 1 output features (one CTA each)";
  return nullptr;
}

// Whether every W row and every x row segment of 4 columns starts on a 4-element vector.
inline bool tiny_quads_aligned(const ForwardProblem& p) {
  const int64_t quad_bytes = kTinyColumnsPerLane * dtype_size(p.dtype);
  const auto multiple = [](int64_t stride) { return stride % kTinyColumnsPerLane == 0; };
  return p.shard_width % kTinyColumnsPerLane == 0 && p.weight_stride_in == 1 && is_aligned(p.weight, quad_bytes) &&
         is_aligned(p.x, quad_bytes) && multiple(p.weight_stride_out) && multiple(p.x_stride_shard) &&
         multiple(p.x_stride_outer) && multiple(p.x_stride_inner);
}

inline void tiny_forward(const ForwardProblem& p, cudaStream_t stream) {
  visit_dtype(p.dtype, [&](auto element) {
    using T = decltype(element);
    auto* kernel = tiny_quads_aligned(p) ? tiny_kernel<T, true> : tiny_kernel<T, false>;
    kernel<<<static_cast<unsigned>(p.out_features), 32, 0, stream>>>(
        static_cast<const T*>(p.x), static_cast<const T*>(p.weight), static_cast<const T*>(p.bias),
        static_cast<T*>(p.out), BatchRows{p.batch_inner, p.x_stride_outer, p.x_stride_inner},
        VirtualConcatColumns{p.shard_width, p.x_stride_shard}, static_cast<int>(p.rows()),
        static_cast<int>(p.reduction()), p.out_features, p.weight_stride_out, p.weight_stride_in,
        p.bias_stride);
  });
}

}  // namespace vga
