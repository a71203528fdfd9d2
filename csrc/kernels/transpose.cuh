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
  // Every extent is below 2^31 (the callers' TMA views refuse larger), so b and c split into their
  // (outer, inner) and (shard, h) parts by 32-bit division, c's once a tile: 64-bit division, one
  // per element and index, held this copy to a fifth of the copy bandwidth (run 119).
  const uint32_t rows = static_cast<uint32_t>(s.rows);
  const uint32_t rows_inner = static_cast<uint32_t>(s.rows_inner);
  const uint32_t shard_width = static_cast<uint32_t>(s.shard_width);
  const uint32_t b0 = blockIdx.x * 32u;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * 32; c0 < s.columns; c0 += static_cast<int64_t>(gridDim.y) * 32) {
    const uint32_t c = static_cast<uint32_t>(c0) + threadIdx.x;
    const uint32_t shard = c / shard_width;
    const float* column = s.base + shard * s.shard_stride + (c - shard * shard_width);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t b = b0 + threadIdx.y + 8 * i;
      float v = 0.f;
      if (b < rows && c < s.columns) {
        const uint32_t outer = b / rows_inner;
        v = column[outer * s.outer_stride + (b - outer * rows_inner) * s.inner_stride];
      }
      tile[threadIdx.y + 8 * i][threadIdx.x] = v;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c_out = c0 + threadIdx.y + 8 * i;
      const int64_t b = b0 + threadIdx.x;
      if (c_out < s.columns && b < out_ld) out[c_out * out_ld + b] = tile[threadIdx.x][threadIdx.y + 8 * i];
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
