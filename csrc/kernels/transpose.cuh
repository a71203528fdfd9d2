// A transposed fp32 copy: out[c * out_ld + b] = in(b, c) for b < rows (0 for rows <= b < out_ld),
// where in(b, c) addresses a (rows, R*H) matrix through x-like strides: row b = (outer, inner),
// column c = (shard r, h) with h contiguous. 32 x 32 tiles through shared memory (a padded row
// per tile row), so both the reads (along c) and the writes (along b) are coalesced.
// Used where a kernel needs an operand K-major that the problem holds MN-major (sm90_tf32x3_grad).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "problem.cuh"

namespace vga {

struct TransposeSource {
  const float* base;
  int64_t rows;          // b extent
  int64_t rows_inner;    // b = outer * rows_inner + inner
  int64_t outer_stride;
  int64_t inner_stride;
  int64_t shard_width;   // H: c = r * H + h
  int64_t shard_stride;
  int64_t columns;       // R * H
};

static __global__ void transpose_kernel(const TransposeSource s, float* __restrict__ out, int64_t out_ld) {
  __shared__ float tile[32][33];
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * 32; c0 < s.columns; c0 += static_cast<int64_t>(gridDim.y) * 32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t b = b0 + threadIdx.y + 8 * i;
      const int64_t c = c0 + threadIdx.x;
      float v = 0.f;
      if (b < s.rows && c < s.columns) {
        const int64_t outer = b / s.rows_inner;
        const int64_t shard = c / s.shard_width;
        v = s.base[shard * s.shard_stride + outer * s.outer_stride + (b - outer * s.rows_inner) * s.inner_stride +
                   (c - shard * s.shard_width)];
      }
      tile[threadIdx.y + 8 * i][threadIdx.x] = v;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c = c0 + threadIdx.y + 8 * i;
      const int64_t b = b0 + threadIdx.x;
      if (c < s.columns && b < out_ld) out[c * out_ld + b] = tile[threadIdx.x][threadIdx.y + 8 * i];
    }
    __syncthreads();
  }
}

static inline void launch_transpose(const TransposeSource& s, float* out, int64_t out_ld, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(out_ld, 32)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div(s.columns, 32), 65535)));
  transpose_kernel<<<grid, dim3(32, 8), 0, stream>>>(s, out, out_ld);
}

}  // namespace vga
