// The simt_fp32 family: y[m, n] = sum_{r,h} x[r, m, h] * W[n, r*H + h] + bias[n] in fp32 at
// full fp32 accuracy (FFMA only: no TF32, no tensor cores) for mid-size and large problems,
// e.g. R,B,H,K = 8,1024,256,1024 (1024 x 1024 outputs, a 2048-deep reduction).
//
// Tiling: a classic register-blocked SGEMM.
//   * 256 threads per CTA own a 128 x BN output tile (128 batch rows x BN out-features), BN = 64
//     (8x4 outputs per thread) or 128 (8x8). 128x64 is the default because it fills the GPU at
//     M = N = 1024: 128 CTAs on 132 SMs, where 128x128 gives 64; 128x128 (twice the FFMAs per
//     shared-memory load) is used once there are >= 4 waves of it. CTAs are rastered in groups
//     of 8 row tiles so that concurrent CTAs share x and W tiles in L2.
//   * The reduction dim goes in 16-deep k-slices. Each thread loads 4 consecutive k of one row of
//     x (through the virtual concat: k -> shard r = k / H, h = k % H, tracked incrementally, so a
//     slice may cross shard boundaries) and of one row of W, as 16-byte loads when H % 4 == 0 and
//     every used pointer/stride is 16-byte aligned, element by element otherwise.
//   * Both operands are stored TRANSPOSED in shared memory (As[k][m], Bs[k][n]) so the inner loop
//     reads each thread's 8 A and 4 (8) B values as float4s; the column index is XOR-swizzled by
//     8 * ((k / 4) % 4), which makes the transposing 4-byte stores conflict-free while keeping
//     every float4 read contiguous. The warp's 32 lanes are 4 (m) x 8 (n) threads, so each float4
//     read is a single shared-memory wavefront: 3 LDS.128 per 32 FFMA (4 per 64 for 128x128).
//   * Two shared-memory stages; slice t+1 is loaded into registers before slice t is computed and
//     stored to the other stage after it: one __syncthreads per slice.
//   * Epilogue: + bias, masked row/column tails, float4 stores of the (rows, K) output when K % 4 == 0.
// All global offsets are 64-bit. Refused: dtype != fp32, weight_stride_in != 1, compute
// capability < 8, H >= 2^30, more than 2^31 - 1 tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "problem.cuh"

namespace vga {
namespace simt_fp32_detail {

constexpr int kThreads = 256;
constexpr int kBM = 128;    // batch rows per CTA
constexpr int kBK = 16;     // k-slice depth
constexpr int kGroupM = 8;  // row tiles per raster group
constexpr int64_t kMaxShardWidth = int64_t(1) << 30;

struct Params {
  const float* x;
  const float* weight;
  const float* bias;
  float* out;
  int64_t M, N, Kred;
  int64_t batch_inner, x_stride_outer, x_stride_inner, x_stride_shard;
  int64_t weight_stride;
  int64_t bias_stride;
  int64_t m_tiles, n_tiles;
  int H;
  bool out_vec;  // output rows can take float4 stores
};

// The swizzle of shared-memory columns for reduction index k (a multiple of 8 below 32).
__device__ __forceinline__ constexpr int swizzle(int k) { return ((k >> 2) & 3) << 3; }

template <int BN, bool kVec>
__global__ void __launch_bounds__(kThreads, BN == 64 ? 2 : 1) simt_fp32_kernel(const Params p) {
  constexpr int TN = BN / 16;        // out-features per thread: 4 or 8
  constexpr int kALoads = kBM / 64;  // float4s of x per thread per slice
  constexpr int kBLoads = BN / 64;   // float4s of W per thread per slice
  __shared__ __align__(16) float As[2][kBK][kBM];
  __shared__ __align__(16) float Bs[2][kBK][BN];

  // Grouped raster: kGroupM row tiles x all column tiles, column-major within a group.
  int64_t m_tile, n_tile;
  {
    const int64_t pid = blockIdx.x;
    const int64_t per_group = int64_t(kGroupM) * p.n_tiles;
    const int64_t first_m = (pid / per_group) * kGroupM;
    const int64_t group_rows = min(p.m_tiles - first_m, int64_t(kGroupM));
    const int64_t in_group = pid % per_group;
    m_tile = first_m + in_group % group_rows;
    n_tile = in_group / group_rows;
  }
  const int64_t m0 = m_tile * kBM;
  const int64_t n0 = n_tile * BN;

  const int tid = threadIdx.x;
  // Loader role: rows lrow + 64 i of the tile, reduction columns kq .. kq + 3 of the slice.
  const int kq = (tid & 3) * 4;
  const int lrow = tid >> 2;
  const int store_swizzle = swizzle(kq);

  const float* a_row[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int64_t m = m0 + lrow + 64 * i;
    int64_t off = 0;
    if (p.batch_inner == 1) {
      off = m * p.x_stride_outer;
    } else {
      off = (m / p.batch_inner) * p.x_stride_outer + (m % p.batch_inner) * p.x_stride_inner;
    }
    a_row[i] = m < p.M ? p.x + off : nullptr;
  }
  const float* b_row[kBLoads];
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int64_t n = n0 + lrow + 64 * i;
    b_row[i] = n < p.N ? p.weight + n * p.weight_stride : nullptr;
  }

  // Where this thread's reduction column k (element 0 of its 4) lives: shard offset + h.
  const int H = p.H;
  int64_t k = kq;
  int h = kq % H;
  int64_t shard_off = int64_t(kq / H) * p.x_stride_shard;

  float ra[kALoads][4];
  float rb[kBLoads][4];

  auto load_slice = [&]() {
    if (kVec) {
      // H % 4 == 0 and Kred % 4 == 0: the 4 columns are in one shard and all in or all out.
      const bool k_in = k < p.Kred;
#pragma unroll
      for (int i = 0; i < kALoads; ++i) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k_in && a_row[i] != nullptr) v = __ldg(reinterpret_cast<const float4*>(a_row[i] + shard_off + h));
        ra[i][0] = v.x, ra[i][1] = v.y, ra[i][2] = v.z, ra[i][3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < kBLoads; ++i) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k_in && b_row[i] != nullptr) v = __ldg(reinterpret_cast<const float4*>(b_row[i] + k));
        rb[i][0] = v.x, rb[i][1] = v.y, rb[i][2] = v.z, rb[i][3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool k_in = k + j < p.Kred;
        int hj = h + j;
        int64_t off = shard_off;
        while (hj >= H) {
          hj -= H;
          off += p.x_stride_shard;
        }
#pragma unroll
        for (int i = 0; i < kALoads; ++i)
          ra[i][j] = (k_in && a_row[i] != nullptr) ? __ldg(a_row[i] + off + hj) : 0.f;
#pragma unroll
        for (int i = 0; i < kBLoads; ++i)
          rb[i][j] = (k_in && b_row[i] != nullptr) ? __ldg(b_row[i] + k + j) : 0.f;
      }
    }
  };
  auto advance = [&]() {
    k += kBK;
    h += kBK;
    while (h >= H) {
      h -= H;
      shard_off += p.x_stride_shard;
    }
  };
  auto store_slice = [&](int stage) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < kALoads; ++i) As[stage][kq + j][(lrow + 64 * i) ^ store_swizzle] = ra[i][j];
#pragma unroll
      for (int i = 0; i < kBLoads; ++i) Bs[stage][kq + j][(lrow + 64 * i) ^ store_swizzle] = rb[i][j];
    }
  };

  // Compute role: a warp is 4 (m) x 8 (n) threads; thread (tm, tn) owns rows {4 tm + i,
  // 64 + 4 tm + i} and columns {4 tn + j (, 64 + 4 tn + j)}, i, j < 4.
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int tm = (warp >> 1) * 4 + (lane >> 3);
  const int tn = (warp & 1) * 8 + (lane & 7);

  float acc[8][TN];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  const int64_t slices = (p.Kred + kBK - 1) / kBK;
  load_slice();
  store_slice(0);
  __syncthreads();
  for (int64_t t = 0; t < slices; ++t) {
    const int stage = static_cast<int>(t & 1);
    const bool more = t + 1 < slices;
    if (more) {
      advance();
      load_slice();
    }
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const int sw = swizzle(kk);
      float a[8], b[TN];
      const float4 a0 = *reinterpret_cast<const float4*>(&As[stage][kk][(4 * tm) ^ sw]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[stage][kk][64 + ((4 * tm) ^ sw)]);
      a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w;
      a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
#pragma unroll
      for (int g = 0; g < TN / 4; ++g) {
        const float4 bv = *reinterpret_cast<const float4*>(&Bs[stage][kk][64 * g + ((4 * tn) ^ sw)]);
        b[4 * g + 0] = bv.x, b[4 * g + 1] = bv.y, b[4 * g + 2] = bv.z, b[4 * g + 3] = bv.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) store_slice(stage ^ 1);
    __syncthreads();
  }

  // Epilogue: + bias, masked tails.
  float bias[TN];
#pragma unroll
  for (int g = 0; g < TN / 4; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + 64 * g + 4 * tn + j;
      bias[4 * g + j] = (p.bias != nullptr && n < p.N) ? __ldg(p.bias + n * p.bias_stride) : 0.f;
    }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + (i < 4 ? 4 * tm + i : 64 + 4 * tm + (i - 4));
    if (m >= p.M) continue;
    float* out_row = p.out + m * p.N;
#pragma unroll
    for (int g = 0; g < TN / 4; ++g) {
      const int64_t n = n0 + 64 * g + 4 * tn;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = acc[i][4 * g + j] + bias[4 * g + j];
      if (p.out_vec && n + 3 < p.N) {
        *reinterpret_cast<float4*>(out_row + n) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (n + j < p.N) out_row[n + j] = v[j];
      }
    }
  }
}

// 128x128 tiles once they make >= 4 waves (1 CTA/SM); 128x64 otherwise.
inline int choose_bn(const ForwardProblem& p) {
  const int64_t big_tiles = ceil_div(p.rows(), kBM) * ceil_div(p.out_features, 128);
  return big_tiles >= 4 * int64_t(p.sm_count > 0 ? p.sm_count : 132) ? 128 : 64;
}

// 16-byte loads need H % 4 == 0 (so 4 consecutive k share a shard and R*H % 4 == 0) and every
// pointer and used stride 16-byte aligned.
inline bool vector_loads_ok(const ForwardProblem& p) {
  if (p.shard_width % 4 != 0) return false;
  if (!is_aligned(p.x, 16) || !is_aligned(p.weight, 16)) return false;
  if (p.num_shards > 1 && p.x_stride_shard % 4 != 0) return false;
  if (p.batch_outer > 1 && p.x_stride_outer % 4 != 0) return false;
  if (p.batch_inner > 1 && p.x_stride_inner % 4 != 0) return false;
  if (p.out_features > 1 && p.weight_stride_out % 4 != 0) return false;
  return true;
}

template <int BN, bool kVec>
void launch(const Params& prm, cudaStream_t stream) {
  const int64_t tiles = prm.m_tiles * prm.n_tiles;
  simt_fp32_kernel<BN, kVec><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(prm);
}

}  // namespace simt_fp32_detail

inline const char* simt_fp32_refusal(const ForwardProblem& p) {
  using namespace simt_fp32_detail;
  if (p.dtype != DType::kFloat32) return "simt_fp32: dtype is not float32";
  if (p.cc_major < 8) return "simt_fp32: needs compute capability >= 8.0";
  if (p.rows() < 1 || p.out_features < 1 || p.reduction() < 1) return "simt_fp32: empty problem";
  if (p.reduction() > 1 && p.weight_stride_in != 1) return "simt_fp32: weight's inner stride must be 1";
  if (p.shard_width >= kMaxShardWidth) return "simt_fp32: H >= 2^30";
  if (p.reduction() >= (int64_t(1) << 62) || p.rows() >= (int64_t(1) << 62) ||
      p.out_features >= (int64_t(1) << 62))
    return "simt_fp32: sizes past 2^62";
  // The smallest tile (128x64) must give at most 2^31 - 1 CTAs in the 1-D grid.
  if (ceil_div(p.rows(), kBM) * ceil_div(p.out_features, 64) > INT32_MAX)
    return "simt_fp32: more than 2^31 - 1 tiles";
  return nullptr;
}

inline void simt_fp32_forward(const ForwardProblem& p, cudaStream_t stream) {
  using namespace simt_fp32_detail;
  const int bn = choose_bn(p);
  Params prm{};
  prm.x = static_cast<const float*>(p.x);
  prm.weight = static_cast<const float*>(p.weight);
  prm.bias = static_cast<const float*>(p.bias);
  prm.out = static_cast<float*>(p.out);
  prm.M = p.rows();
  prm.N = p.out_features;
  prm.Kred = p.reduction();
  prm.batch_inner = p.batch_inner;
  prm.x_stride_outer = p.x_stride_outer;
  prm.x_stride_inner = p.x_stride_inner;
  prm.x_stride_shard = p.x_stride_shard;
  prm.weight_stride = p.weight_stride_out;
  prm.bias_stride = p.bias_stride;
  prm.m_tiles = ceil_div(prm.M, kBM);
  prm.n_tiles = ceil_div(prm.N, bn);
  prm.H = static_cast<int>(p.shard_width);
  prm.out_vec = is_aligned(p.out, 16) && p.out_features % 4 == 0;
  const bool vec = vector_loads_ok(p);
  if (bn == 128) {
    vec ? launch<128, true>(prm, stream) : launch<128, false>(prm, stream);
  } else {
    vec ? launch<64, true>(prm, stream) : launch<64, false>(prm, stream);
  }
}

}  // namespace vga
