// The generic family: a SIMT tiled GEMM  C[m, n] = sum_k A(m, k) * B(k, n)
// whose operands are read through index functors, so the same kernel serves the
// forward (A = the virtual concat of x), grad_x (C scattered back into the
// (R, batch, H) layout) and grad_weight (B = the virtual concat of x).
//
// Tiling: a 64x64 output tile per 256-thread CTA, 16-deep k-slices staged in
// shared memory (converted to the accumulator type on load), 4x4 outputs per
// thread at a 16-element stride so shared-memory reads are conflict-free.
// It accepts every input the op accepts (any strides, H, dtype incl. fp64,
// > 2^31 elements: all offsets are 64-bit) and is compiled for sm_80 PTX too,
// so it is the family of last resort, not the fast one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "element_types.cuh"
#include "problem.cuh"

namespace vga {

// A batch of rows spread over up to two strided dims: row m lives at
// (m / inner) * stride_outer + (m % inner) * stride_inner.
struct BatchRows {
  int64_t inner;
  int64_t stride_outer;
  int64_t stride_inner;
  __device__ __forceinline__ int64_t offset(int64_t m) const {
    if (inner == 1) return m * stride_outer;
    return (m / inner) * stride_outer + (m % inner) * stride_inner;
  }
};

// The virtual concat: column c of cat(x[0..R-1], -1) is (shard c / H, h = c % H).
struct VirtualConcatColumns {
  int64_t shard_width;
  int64_t stride_shard;
  __device__ __forceinline__ int64_t offset(int64_t c) const {
    return (c / shard_width) * stride_shard + c % shard_width;
  }
};

// x read as the (rows, R*H) virtual concat: element (m, c) = x[r, m, h]. It is the
// forward's A operand and grad_weight's B operand (there the rows are the reduction).
template <typename T>
struct VirtualConcatOperand {
  const T* base;
  BatchRows rows;
  VirtualConcatColumns cols;
  __device__ __forceinline__ T operator()(int64_t m, int64_t c) const {
    return base[rows.offset(m) + cols.offset(c)];
  }
};

// A plain strided matrix, optionally read transposed.
template <typename T>
struct StridedOperand {
  const T* base;
  int64_t stride_i;
  int64_t stride_j;
  __device__ __forceinline__ T operator()(int64_t i, int64_t j) const {
    return base[i * stride_i + j * stride_j];
  }
};

// grad_y read as (rows, K) through its batch strides; transposed reads (K, rows).
template <typename T, bool kTransposed>
struct BatchRowsMatrixOperand {
  const T* base;
  BatchRows rows;
  int64_t stride_col;
  __device__ __forceinline__ T operator()(int64_t i, int64_t j) const {
    if (kTransposed) return base[rows.offset(j) + i * stride_col];
    return base[rows.offset(i) + j * stride_col];
  }
};

// Row-major output with an optional bias per column.
template <typename T>
struct RowMajorStore {
  T* base;
  int64_t ld;
  const T* bias;
  int64_t bias_stride;
  template <typename Acc>
  __device__ __forceinline__ void operator()(int64_t m, int64_t n, Acc v) const {
    if (bias != nullptr) v += to_acc<Acc>(bias[n * bias_stride]);
    base[m * ld + n] = from_acc<T>(v);
  }
};

// grad_x's element (m, n) through its layout (x's strides, or the (rows, R*H) concat).
template <typename T>
struct GradXStore {
  T* base;
  GradXLayout layout;
  template <typename Acc>
  __device__ __forceinline__ void operator()(int64_t m, int64_t n, Acc v) const {
    base[layout.offset(m, n)] = from_acc<T>(v);
  }
};

constexpr int kGenericTile = 64;
constexpr int kGenericDepth = 16;
constexpr int kGenericThreads = 256;

template <typename T, typename AOperand, typename BOperand, typename Store>
__global__ void __launch_bounds__(kGenericThreads)
    generic_gemm_kernel(AOperand a, BOperand b, Store store, int64_t M, int64_t N, int64_t Kred,
                        int64_t n_tiles) {
  using Acc = typename AccumulatorOf<T>::type;
  __shared__ Acc a_tile[kGenericDepth][kGenericTile + 1];
  __shared__ Acc b_tile[kGenericDepth][kGenericTile + 1];

  const int64_t tile = blockIdx.x;
  const int64_t m0 = (tile / n_tiles) * kGenericTile;
  const int64_t n0 = (tile % n_tiles) * kGenericTile;
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;

  Acc acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = Acc(0);

  for (int64_t k0 = 0; k0 < Kred; k0 += kGenericDepth) {
#pragma unroll
    for (int i = 0; i < (kGenericTile * kGenericDepth) / kGenericThreads; ++i) {
      const int idx = threadIdx.x + i * kGenericThreads;
      const int kk = idx % kGenericDepth;
      const int rc = idx / kGenericDepth;
      const int64_t k = k0 + kk;
      const int64_t m = m0 + rc;
      const int64_t n = n0 + rc;
      a_tile[kk][rc] = (m < M && k < Kred) ? to_acc<Acc>(a(m, k)) : Acc(0);
      b_tile[kk][rc] = (n < N && k < Kred) ? to_acc<Acc>(b(k, n)) : Acc(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGenericDepth; ++kk) {
      Acc a_frag[4];
      Acc b_frag[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a_frag[i] = a_tile[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b_frag[j] = b_tile[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(a_frag[i], b_frag[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < N) store(m, n, acc[i][j]);
    }
  }
}

template <typename T, typename AOperand, typename BOperand, typename Store>
void launch_generic_gemm(const AOperand& a, const BOperand& b, const Store& store, int64_t M,
                         int64_t N, int64_t Kred, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const int64_t n_tiles = (N + kGenericTile - 1) / kGenericTile;
  const int64_t m_tiles = (M + kGenericTile - 1) / kGenericTile;
  generic_gemm_kernel<T><<<static_cast<unsigned>(m_tiles * n_tiles), kGenericThreads, 0, stream>>>(
      a, b, store, M, N, Kred, n_tiles);
}

inline const char* generic_refusal(const ForwardProblem& p) {
  // Every M/N tile must fit the 1-D grid (2^31 - 1 CTAs).
  const int64_t tiles = ((p.rows() + kGenericTile - 1) / kGenericTile) *
                        ((p.out_features + kGenericTile - 1) / kGenericTile);
  if (tiles > INT32_MAX) return "more than 2^31 output tiles";
  return nullptr;
}

template <typename T>
void generic_forward_typed(const ForwardProblem& p, cudaStream_t stream) {
  const BatchRows rows{p.batch_inner, p.x_stride_outer, p.x_stride_inner};
  const VirtualConcatColumns cols{p.shard_width, p.x_stride_shard};
  VirtualConcatOperand<T> a{static_cast<const T*>(p.x), rows, cols};
  StridedOperand<T> b{static_cast<const T*>(p.weight), p.weight_stride_in, p.weight_stride_out};
  RowMajorStore<T> store{static_cast<T*>(p.out), p.out_features, static_cast<const T*>(p.bias),
                         p.bias_stride};
  launch_generic_gemm<T>(a, b, store, p.rows(), p.out_features, p.reduction(), stream);
}

inline void generic_forward(const ForwardProblem& p, cudaStream_t stream) {
  visit_dtype(p.dtype, [&](auto element) { generic_forward_typed<decltype(element)>(p, stream); });
}

}  // namespace vga
