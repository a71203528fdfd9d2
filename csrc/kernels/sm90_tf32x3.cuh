// The "sm90_tf32x3" family: fp32 y = cat(x[0..R-1], -1) @ W^T + bias on Hopper's tensor cores
// at fp32 accuracy ("3xTF32"), without materialising the concat.
//
// Precision. Each fp32 operand v is split as v = big + small: big is a TF32 value strictly
// between 0 and v (v's low 13 mantissa bits cleared, or one TF32 ulp less when they are already
// clear), small = v - big, exact in fp32 and of v's sign, |small| <= 2^-10 |v|. Then
// a*b ~ big_a*big_b + big_a*small_b + small_a*big_b; the dropped small_a*small_b is <= 2^-20 |a*b|.
// Because big and small are never 0 for a finite v != 0 and both carry v's sign, no product is
// 0 * inf unless F.linear's is, and inf and NaN come out as F.linear gives them (split_tf32).
// (One exception: a subnormal times inf, which TF32 may see as 0 * inf = NaN.)
// Tensor cores add into their fp32 accumulator by truncation, so one long wgmma chain drifts
// with the reduction length (an earlier mma.sync version was off by 2e-4 at R*H = 8192). Here
// every k-block (32 deep, 12 wgmmas) goes into a fresh accumulator that is then added to the
// running fp32 sum with a rounded FADD: the truncation error is one k-block's, whatever R*H is.
//
// Tiling: a 128 x 64 output tile per CTA, k-blocks of 32 fp32 (one 128-byte swizzle row), read
// by TMA through the same 3-D / 4-D views of x and W as sm90_gemm (no concat, zero fill past H,
// the batch rows and K). Warp roles:
//   * warp 0: one thread issues the TMA copies of x's 128 x 32 and W's 64 x 32 block per stage;
//   * warps 1-2: split each landed W tile in place (big overwrites it, small goes into a tile of
//     the same layout beside it: the split is element-wise, so the swizzle is kept); warp 3
//     has no role (W's split is 8 KB a k-block, two warps keep ahead of the MMAs);
//   * warpgroups 1-2: 64 rows of x each. Per k-block a thread ldmatrix-loads its x fragments
//     from the TMA tile and splits them in registers, then issues 3 wgmma m64n64k8 per k8 step
//     (A = x halves from registers, B = W halves from shared memory) into a k-block
//     accumulator, added to the fp32 sum once retired; then the epilogue (+ bias, read into
//     registers before the first k-block; paired 8-byte stores).
// Why x in registers and W in shared memory: shared-memory bandwidth is what bounds 3xTF32 here.
// Splitting both in shared memory cost 192 KB of traffic a k-block (~1500 cycles at 128 B/clk
// against 768 cycles of MMA); x from registers removes x's split writes and wgmma's x reads.
// 128 x 64 tiles fill the GPU at 1024 x 1024 outputs (128 CTAs), and 64 columns keep the sum
// and the k-block accumulator (64 fp32 a thread) well inside a 384-thread CTA's 168 registers.
// Ring: full (TMA landed) -> split (W halves written) -> empty (wgmmas retired), 6 stages of
// 32 KB. One tile per CTA, tiles walked in groups of 8 row tiles so the CTAs in flight share x
// and W panels in L2.
//
// Refused (see sm90_tf32x3_refusal): dtype other than fp32, and anything the TMA views refuse
// (not Hopper, H % 4, 16-byte alignment of x, W and their strides, sizes >= 2^31).
#pragma once

#include <cstdint>

#include "problem.cuh"
#include "shared_memory_opt_in.cuh"
#include "skinny.cuh"
#include "sm90/ptx.cuh"
#include "sm90/schedule.cuh"
#include "sm90/views.cuh"

namespace vga {
namespace sm90_tf32x3 {

constexpr int kBlockM = 128;  // two consumer warpgroups x m64
constexpr int kBlockN = 64;
constexpr int kBlockK = 32;  // fp32 elements in one 128-byte swizzle row
constexpr int kThreads = 384;
constexpr int kSplitterThreads = 64;  // warps 1-2
constexpr int kGroupM = 8;
constexpr int kStages = 6;
using sm90::kSwizzleAlignment;
// A stage: [x tile | W big | W small]; TMA writes the first two, the splitters the third.
constexpr int kATileBytes = kBlockM * kBlockK * 4;
constexpr int kBTileBytes = kBlockN * kBlockK * 4;
constexpr int kLoadBytes = kATileBytes + kBTileBytes;
constexpr int kStageBytes = kLoadBytes + kBTileBytes;
constexpr int kBarrierBytes = 3 * kStages * sizeof(uint64_t);
constexpr int kSharedBytes = kSwizzleAlignment + kStages * kStageBytes + kBarrierBytes;
static_assert(kBTileBytes % kSwizzleAlignment == 0, "every tile stays 1024-byte aligned");

struct Args {
  float* out;
  const float* bias;  // nullptr when absent
  int64_t bias_stride;
  int rows_inner;   // rows per outer batch index (all rows when x is a 3-D view)
  int inner_tiles;  // ceil(rows_inner / kBlockM)
  int m_tiles;
  int n_tiles;
  int out_features;
  int kblocks_per_shard;
  int num_kblocks;
  int a_is_4d;
  // The fp32 backward's grad_x in x's layout (sm90_tf32x3_grad.cuh): element (m, n) goes to
  // out[scatter_row_offset(m) + scatter_column_offset(n)]; shard width 0: the row-major out.
  sm90::OutputScatter scatter;
};

#ifdef VGA_SM90A_DEVICE

// v = big + small as described at the top; bits in, bits out. big = v minus its low 13 bits, or
// minus one TF32 ulp when those are 0 (towards zero: the bits are sign-magnitude); 0 stays 0.
// inf becomes the largest finite TF32 plus small = inf, and NaN leaves small a NaN, so every
// product that meets them comes out as F.linear's: inf * finite-non-zero = inf with the right
// sign, inf * 0 = NaN, NaN * anything = NaN.
__device__ __forceinline__ void split_tf32(uint32_t v, uint32_t& big, uint32_t& small) {
  const uint32_t low = v & 0x1fffu;
  const uint32_t step = low != 0 ? low : ((v & 0x7fffffffu) != 0 ? 0x2000u : 0u);
  big = v - step;
  small = __float_as_uint(__uint_as_float(v) - __uint_as_float(big));
}

// Warps 1-2: one stage's W tile becomes big in place and small beside it. Each thread's
// vectors go in batches of 8 loads, so 8 shared-memory round trips overlap.
__device__ __forceinline__ void split_w_tile(uint8_t* stage, int splitter) {
  constexpr int kVectors = kBTileBytes / 16 / kSplitterThreads;
  constexpr int kBatch = 8;
  static_assert(kBTileBytes / 16 % kSplitterThreads == 0 && kVectors % kBatch == 0, "whole batches");
  const uint32_t first = sm90::smem_address(stage + kATileBytes) + 16 * splitter;
#pragma unroll
  for (int batch = 0; batch < kVectors; batch += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) v[j] = skinny_detail::load_shared16(first + 16 * kSplitterThreads * (batch + j));
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const uint32_t at = first + 16 * kSplitterThreads * (batch + j);
      uint4 b, s;
      split_tf32(v[j].x, b.x, s.x);
      split_tf32(v[j].y, b.y, s.y);
      split_tf32(v[j].z, b.z, s.z);
      split_tf32(v[j].w, b.w, s.w);
      skinny_detail::store_shared16(at, b);
      skinny_detail::store_shared16(at + kBTileBytes, s);
    }
  }
}

// The three TF32 products of one k-block into `part`, which starts from zero. x's fragments
// come straight from the TMA tile (ldmatrix through the 128-byte swizzle) and are split in
// registers; W's halves are read by wgmma from shared memory.
__device__ __forceinline__ void mma_kblock(float (&part)[kBlockN / 2], uint8_t* stage, int lane_row, int lane) {
  const uint32_t a_row = sm90::smem_address(stage) + lane_row * 128;
  const uint64_t b_big = sm90::k_major_swizzle128_descriptor(stage + kATileBytes);
  const uint64_t b_small = sm90::k_major_swizzle128_descriptor(stage + kLoadBytes);
  uint32_t a_big[kBlockK / 8][4], a_small[kBlockK / 8][4];
#pragma unroll
  for (int kk = 0; kk < kBlockK / 8; ++kk) {
    // Matrix lane / 8 of the x4 load: rows +0 / +8 (bit 0), 16-byte chunks 2kk / 2kk + 1 (bit 1).
    const int chunk = 2 * kk + lane / 16;
    uint32_t v[4];
    sm90::load_matrix_x4(v, a_row + ((chunk ^ (lane_row % 8)) << 4));
#pragma unroll
    for (int q = 0; q < 4; ++q) split_tf32(v[q], a_big[kk][q], a_small[kk][q]);
  }
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockK / 8; ++kk) {
    // +32 bytes per k8 step inside the swizzled row, in 16-byte units.
    sm90::wgmma_tf32_m64n64k8_register_a(part, a_small[kk], b_big + 2 * kk, kk != 0);
    sm90::wgmma_tf32_m64n64k8_register_a(part, a_big[kk], b_small + 2 * kk, 1);
    sm90::wgmma_tf32_m64n64k8_register_a(part, a_big[kk], b_big + 2 * kk, 1);
  }
}

// The bias of this thread's output columns n0 + 8 j + 2 (lane % 4) and the next one (0 past K), read
// before the mainloop: read in the epilogue, between stores that the compiler cannot move them past
// (out may alias bias), they would cost one L2 round trip per column pair while the tile waits.
__device__ __forceinline__ void load_block_bias(float2 (&bias)[kBlockN / 8], const Args& a, int n0, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    bias[j] = bias_pair(a.bias, a.bias_stride, n0 + j * 8 + 2 * (lane % 4), a.out_features);
  }
}

// One consumer warpgroup's 64 x 64 block (+ bias), fp32, paired stores when K is even (scattered
// through a.scatter one element at a time: a pair may straddle two shards).
__device__ __forceinline__ void store_block(const float (&acc)[kBlockN / 2], const float2 (&bias)[kBlockN / 8],
                                            const Args& a, int outer, int inner0, int n0, int consumer,
                                            int thread_in_wg) {
  const int warp = thread_in_wg / 32;
  const int lane = thread_in_wg % 32;
  const int row_in_tile = consumer * 64 + warp * 16 + lane / 4;
  const bool scattered = a.scatter.shard_width.divisor > 0;
  const bool paired = a.out_features % 2 == 0 && !scattered;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int inner = inner0 + row_in_tile + 8 * half;
    if (inner >= a.rows_inner) continue;
    const int64_t m = static_cast<int64_t>(outer) * a.rows_inner + inner;
    float* out_row = a.out + (scattered ? sm90::scatter_row_offset(static_cast<int>(m), a.scatter) : m * a.out_features);
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int n = n0 + j * 8 + 2 * (lane % 4);
      if (n >= a.out_features) continue;
      float v0 = acc[4 * j + 2 * half];
      float v1 = acc[4 * j + 2 * half + 1];
      if (a.bias != nullptr) {
        v0 += bias[j].x;
        v1 += bias[j].y;
      }
      if (scattered) {
        out_row[sm90::scatter_column_offset(n, a.scatter)] = v0;
        if (n + 1 < a.out_features) out_row[sm90::scatter_column_offset(n + 1, a.scatter)] = v1;
      } else if (paired) {
        *reinterpret_cast<float2*>(out_row + n) = make_float2(v0, v1);
      } else {
        out_row[n] = v0;
        if (n + 1 < a.out_features) out_row[n + 1] = v1;
      }
    }
  }
}

#endif  // VGA_SM90A_DEVICE

// static: this header is built into two translation units (the forward, and the fp32 backward
// of sm90_tf32x3_grad.cuh); each gets its own kernel and, in launch(), its own shared-memory opt-in.
static __global__ void __launch_bounds__(kThreads, 1)
    tf32x3_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                       const Args args) {
#ifdef VGA_SM90A_DEVICE
  using namespace sm90;
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAlignment - 1) & ~uintptr_t(kSwizzleAlignment - 1));
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * kStageBytes);
  uint64_t* split = full + kStages;
  uint64_t* empty = split + kStages;

  // Grouped raster: kGroupM row tiles x all column tiles, column-major within a group.
  const int tiles_per_group = kGroupM * args.n_tiles;
  const int first_m = static_cast<int>(blockIdx.x) / tiles_per_group * kGroupM;
  const int group_rows = min(args.m_tiles - first_m, kGroupM);
  const int in_group = static_cast<int>(blockIdx.x) % tiles_per_group;
  const int m_tile = first_m + in_group % group_rows;
  const int n0 = in_group / group_rows * kBlockN;
  const int outer = m_tile / args.inner_tiles;
  const int inner0 = (m_tile - outer * args.inner_tiles) * kBlockM;

  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&split[s], kSplitterThreads / 32);  // one arrival per splitter warp
      mbarrier_init(&empty[s], 8);                      // one arrival per consumer warp
    }
    fence_barrier_init();
    prefetch_tensor_map(&x_map);
    prefetch_tensor_map(&w_map);
  }
  __syncthreads();

  if (warp < 4) {
    int stage = 0;
    uint32_t phase = 0;
    if (warp == 0) {
      if (threadIdx.x == 0) {
        for (int kb = 0; kb < args.num_kblocks; ++kb) {
          const int shard = kb / args.kblocks_per_shard;
          const int h0 = (kb - shard * args.kblocks_per_shard) * kBlockK;
          uint8_t* dst = shared + stage * kStageBytes;
          mbarrier_wait(&empty[stage], phase ^ 1);
          mbarrier_arrive_expect_tx(&full[stage], kLoadBytes);
          if (args.a_is_4d) {
            tma_load_4d(dst, &x_map, &full[stage], h0, inner0, outer, shard);
          } else {
            tma_load_3d(dst, &x_map, &full[stage], h0, inner0, shard);
          }
          tma_load_3d(dst + kATileBytes, &w_map, &full[stage], h0, shard, n0);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    } else if (warp <= kSplitterThreads / 32) {
      const int splitter = threadIdx.x - 32;
      for (int kb = 0; kb < args.num_kblocks; ++kb) {
        mbarrier_wait(&full[stage], phase);
        split_w_tile(shared + stage * kStageBytes, splitter);
        fence_proxy_async_shared();  // the W halves are read by wgmma (the async proxy)
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbarrier_arrive(&split[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    const int consumer = warp / 4 - 1;
    const int lane = threadIdx.x % 32;
    const bool warp_leader = lane == 0;
    // The x row whose address this lane gives ldmatrix: warp's 16 rows, +8 for matrices 1 and 3.
    const int lane_row = consumer * 64 + (warp % 4) * 16 + lane % 8 + 8 * ((lane / 8) % 2);
    float sum[kBlockN / 2];
    float part[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) sum[i] = 0.f;
    float2 bias[kBlockN / 8];
    load_block_bias(bias, args, n0, lane);
    int stage = 0;
    uint32_t phase = 0;
    for (int kb = 0; kb < args.num_kblocks; ++kb) {
      mbarrier_wait(&full[stage], phase);   // x's tile (read here with ldmatrix)
      mbarrier_wait(&split[stage], phase);  // W's halves
      mma_kblock(part, shared + stage * kStageBytes, lane_row, lane);
      wgmma_commit_group();
      // Drained every k-block: ptxas serialises every wgmma of a chain whose accumulators are read
      // while another wgmma group is in flight, so the sum cannot overlap the next k-block's MMAs
      // within a warpgroup; the other consumer warpgroup keeps the tensor cores busy meanwhile.
      wgmma_wait_group<0>();
      if (warp_leader) mbarrier_arrive(&empty[stage]);
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) sum[i] += part[i];
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    store_block(sum, bias, args, outer, inner0, n0, consumer, threadIdx.x % 128);
  }
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host

static inline void launch(const ForwardProblem& p, cudaStream_t stream, const sm90::OutputScatter& scatter = {}) {
  const sm90::RowView rows = sm90::row_view(p);
  const int64_t H = p.shard_width;
  const CUtensorMap x_map = sm90::x_tensor_map(p, rows, kBlockK, kBlockM);
  const CUtensorMap w_map = sm90::w_tensor_map(p, kBlockK, kBlockN);

  Args args;
  args.out = static_cast<float*>(p.out);
  args.bias = static_cast<const float*>(p.bias);
  args.bias_stride = p.bias_stride;
  args.rows_inner = static_cast<int>(rows.inner);
  args.inner_tiles = static_cast<int>(ceil_div(rows.inner, kBlockM));
  args.m_tiles = static_cast<int>(rows.outer * args.inner_tiles);
  args.n_tiles = static_cast<int>(ceil_div(p.out_features, kBlockN));
  args.out_features = static_cast<int>(p.out_features);
  args.kblocks_per_shard = static_cast<int>(ceil_div(H, kBlockK));
  args.num_kblocks = static_cast<int>(p.num_shards) * args.kblocks_per_shard;
  args.a_is_4d = rows.four_d ? 1 : 0;
  args.scatter = scatter;

  opt_in_shared_memory<tf32x3_gemm_kernel>(kSharedBytes, p.device_index, "sm90_tf32x3");
  // The group raster ends on a partial group: grid = all tiles, every CTA maps to one of them.
  const int64_t tiles = static_cast<int64_t>(args.m_tiles) * args.n_tiles;
  tf32x3_gemm_kernel<<<static_cast<unsigned>(tiles), kThreads, kSharedBytes, stream>>>(x_map, w_map, args);
}

}  // namespace sm90_tf32x3

inline const char* sm90_tf32x3_refusal(const ForwardProblem& p) {
  if (p.dtype != DType::kFloat32) return "dtype is not float32";
  if (const char* why = sm90::tma_view_refusal(p)) return why;
  const sm90::RowView rows = sm90::row_view(p);
  const int64_t m_tiles = rows.outer * ceil_div(rows.inner, sm90_tf32x3::kBlockM);
  if (rows.four_d && m_tiles * sm90_tf32x3::kBlockM > 2 * p.rows())
    return "two unmergeable batch dims with the inner one too short for 128-row tiles";
  if ((m_tiles + 1) * (ceil_div(p.out_features, sm90_tf32x3::kBlockN) + 1) * sm90_tf32x3::kGroupM > INT32_MAX)
    return "too many output tiles";
  if (ceil_div(p.shard_width, sm90_tf32x3::kBlockK) * p.num_shards > INT32_MAX) return "reduction too long";
  return nullptr;
}

static inline void sm90_tf32x3_forward(const ForwardProblem& p, cudaStream_t stream) { sm90_tf32x3::launch(p, stream); }

}  // namespace vga
