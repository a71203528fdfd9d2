// sm90 GEMM family: y = cat(x[0..R-1], -1) @ W^T + bias for large batch on Hopper,
// without materialising the concat.
//
// The A operand is read through a TMA tensor map over x itself: dims (H, B, R)
// (or (H, B_inner, B_outer, R) when x's two batch dims cannot be merged), so the
// k-block (r, h0) of a 128-row tile is one bulk copy, zero-filled for h >= H and
// for rows past the batch. W is viewed as (H, R, K) so its h-tail is zero-filled
// the same way and never reaches into the next shard's columns (0 * NaN = NaN).
#pragma once

#include <algorithm>
#include <cstdint>

#include "element_types.cuh"
#include "problem.cuh"
#include "sm90_primitives.cuh"

namespace vga {
namespace sm90 {

// Tiling: 128 x 256 output tile per CTA, k-blocks of 64 half elements (one
// 128-byte swizzle row). Two consumer warpgroups each own 64 x 256 of the tile
// (one m64n256k16 wgmma chain, 128 fp32 accumulators a thread), which gives the
// highest operand reuse from shared memory that fits the register file; one
// producer warpgroup issues TMA. 4 stages of 48 KB fill the 227 KB of shared memory.
// CTAs run in clusters of 2 along M: the pair computes two vertically adjacent
// tiles with the same W panel, each CTA loads half of that panel and multicasts
// it to both, so L2 -> SM traffic per tile drops from 48 KB to 32 KB a k-block
// (at ~6 TFLOP/s per SM the unshared 48 KB would need ~9 TB/s of L2 bandwidth).
// The epilogue reads the tile's bias from shared memory, where each consumer thread put the
// two values it loaded at the start of the tile: read from global memory in the epilogue,
// the bias cost ~4 us a tile in L2 round trips while the tensor cores sat idle.
constexpr int kBlockM = 128;
constexpr int kBlockN = 256;
constexpr int kBlockK = 64;
constexpr int kStages = 4;
constexpr int kClusterM = 2;
constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
// Tiles are walked in groups of kGroupM row-tiles (all column tiles of a group
// before the next group) so the CTAs in flight share A and W panels in L2; 16 beat
// 8 by 1-3% on the prefill shapes (less DRAM traffic in a power-capped chip).
constexpr int kGroupM = 16;
static_assert(kGroupM % kClusterM == 0, "a group holds whole clusters");
static_assert(kBlockN == 2 * 128, "each consumer thread stages the bias of two of the tile's columns");

constexpr int kATileBytes = kBlockM * kBlockK * 2;
constexpr int kBTileBytes = kBlockN * kBlockK * 2;
constexpr int kBSliceBytes = kBTileBytes / kClusterM;  // the part of the W panel one CTA loads
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kSwizzleAlignment = 1024;
constexpr int kBarrierBytes = 2 * kStages * sizeof(uint64_t);
constexpr int kBiasBytes = kConsumerWarpgroups * kBlockN * sizeof(float);  // each consumer's copy of the tile's bias
constexpr int kSharedBytes = kSwizzleAlignment + kStages * kStageBytes + kBarrierBytes + kBiasBytes;

struct GemmArgs {
  void* out;
  const void* bias;  // nullptr when absent
  int64_t bias_stride;
  int rows_inner;   // rows per outer batch index (all rows when A is a 3-D view)
  int inner_tiles;  // ceil(rows_inner / kBlockM)
  int m_tiles;
  int n_tiles;
  int cluster_m_tiles;    // ceil(m_tiles / kClusterM)
  int num_cluster_tiles;  // cluster_m_tiles * n_tiles
  int out_features;
  int kblocks_per_shard;
  int num_kblocks;
  int a_is_4d;
  int vector_store;  // out is 16-byte aligned and K % 8 == 0
};

// How x's batch rows are addressed: one dim when the two batch dims merge
// (or one of them is 1), otherwise (inner, outer) and a 4-D tensor map.
struct RowView {
  bool four_d;
  int64_t outer;  // 1 for a 3-D view
  int64_t inner;
  int64_t outer_stride;
  int64_t inner_stride;
};

inline RowView row_view(const ForwardProblem& p) {
  if (p.batch_inner == 1) return {false, 1, p.batch_outer, 0, p.x_stride_outer};
  if (p.batch_outer == 1) return {false, 1, p.batch_inner, 0, p.x_stride_inner};
  if (p.x_stride_outer == p.batch_inner * p.x_stride_inner) return {false, 1, p.rows(), 0, p.x_stride_inner};
  return {true, p.batch_outer, p.batch_inner, p.x_stride_outer, p.x_stride_inner};
}

// ------------------------------------------------------------------ device

#ifdef VGA_SM90A_DEVICE

struct TileCoord {
  int outer;        // outer batch index of the tile's rows
  int inner0;       // first row within that outer index
  int n0;           // first output column
  bool rows_exist;  // false for the idle half of a cluster past the last row tile
};

// The tile this CTA (rank `cta_rank` in its cluster) computes for cluster tile `tile`.
__device__ __forceinline__ TileCoord tile_coord(int tile, uint32_t cta_rank, const GemmArgs& a) {
  constexpr int kGroupClusters = kGroupM / kClusterM;
  const int tiles_per_group = kGroupClusters * a.n_tiles;
  const int group = tile / tiles_per_group;
  const int first_cluster_m = group * kGroupClusters;
  const int group_cluster_m = min(a.cluster_m_tiles - first_cluster_m, kGroupClusters);
  const int in_group = tile - group * tiles_per_group;
  const int m_tile = (first_cluster_m + in_group % group_cluster_m) * kClusterM + static_cast<int>(cta_rank);
  const int n_tile = in_group / group_cluster_m;
  const int outer = m_tile / a.inner_tiles;
  return {outer, (m_tile - outer * a.inner_tiles) * kBlockM, n_tile * kBlockN, m_tile < a.m_tiles};
}

// Within each quad of lanes (t = lane % 4) word q holds columns 8*q + 2t, 2t+1 of a
// 32-column strip; afterwards word q holds columns 8*t + 2q, 2q+1, i.e. each lane
// owns 8 consecutive columns (one 16-byte store). A 4x4 transpose done as two
// swaps of one index bit between lane and register.
__device__ __forceinline__ void transpose_quad(uint32_t (&v)[4], int t) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = (t & bit) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i & bit) continue;
      const uint32_t send = upper ? v[i] : v[i | bit];
      const uint32_t received = __shfl_xor_sync(0xffffffffu, send, bit);
      if (upper) {
        v[i] = received;
      } else {
        v[i | bit] = received;
      }
    }
  }
}

// Writes one consumer warpgroup's 64 x 256 accumulator block (+ bias) as Element;
// tile_bias[j] is the bias of column c.n0 + j, in shared memory.
template <typename Element>
__device__ __forceinline__ void store_tile(const float (&acc)[128], const float* tile_bias, const GemmArgs& a,
                                           const TileCoord& c, int consumer, int thread_in_wg) {
  if (!c.rows_exist) return;
  const int warp = thread_in_wg / 32;
  const int lane = thread_in_wg % 32;
  const int quad_lane = lane % 4;
  const int row_in_tile = consumer * 64 + warp * 16 + lane / 4;
  Element* out = static_cast<Element*>(a.out);
  int64_t out_row[2];
  bool row_valid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int inner = c.inner0 + row_in_tile + 8 * half;
    row_valid[half] = inner < a.rows_inner;
    out_row[half] = static_cast<int64_t>(c.outer) * a.rows_inner + inner;
  }

  if (a.vector_store && c.n0 + kBlockN <= a.out_features) {
#pragma unroll
    for (int strip = 0; strip < kBlockN / 32; ++strip) {
      float2 bias[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        bias[q] = *reinterpret_cast<const float2*>(tile_bias + strip * 32 + q * 8 + 2 * quad_lane);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t words[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int j = strip * 4 + q;
          words[q] = pack_pair<Element>(acc[4 * j + 2 * half] + bias[q].x, acc[4 * j + 2 * half + 1] + bias[q].y);
        }
        transpose_quad(words, quad_lane);
        if (row_valid[half]) {
          Element* dst = out + out_row[half] * a.out_features + c.n0 + strip * 32 + quad_lane * 8;
          store_global_16_bytes(dst, words[0], words[1], words[2], words[3]);
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = j * 8 + 2 * quad_lane + e;
        const int n = c.n0 + column;
        if (n >= a.out_features) continue;
        const float bias = tile_bias[column];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (!row_valid[half]) continue;
          out[out_row[half] * a.out_features + n] = from_acc<Element>(acc[4 * j + 2 * half + e] + bias);
        }
      }
    }
  }
}

#endif  // VGA_SM90A_DEVICE

// Persistent, warp-specialised kernel: warpgroup 0 is the TMA producer (one
// thread), warpgroups 1..2 the wgmma consumers; a kStages-deep ring of
// full/empty mbarriers connects them. A stage's empty barrier collects the
// consumer warps of both CTAs of the cluster, because the peer's producer writes
// half of the W panel into this CTA's stage. Each cluster walks cluster tiles
// cluster_id, cluster_id + num_clusters, ... in grouped order; the producer runs
// ahead into the next tile while the consumers run the epilogue.
template <typename Element>
__global__ void __launch_bounds__(kThreads, 1)
    gather_concat_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                              const GemmArgs args) {
#ifdef VGA_SM90A_DEVICE
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAlignment - 1) & ~uintptr_t(kSwizzleAlignment - 1));
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + kStages * kATileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  float* bias_rows = reinterpret_cast<float*>(empty + kStages);  // kBlockN floats per consumer warpgroup

  const int warpgroup = threadIdx.x / 128;
  const uint32_t cta_rank = cluster_cta_rank();
  const int cluster_id = blockIdx.x / kClusterM;
  const int num_clusters = gridDim.x / kClusterM;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kClusterM * kConsumerWarpgroups * 4);  // every consumer warp of the cluster
    }
    fence_barrier_init();
    prefetch_tensor_map(&x_map);
    prefetch_tensor_map(&w_map);
  }
  cluster_sync();  // the peer's barriers are initialised before any multicast or remote arrival

  if (warpgroup == 0) {
    warpgroup_release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      constexpr uint16_t kWholeCluster = (1u << kClusterM) - 1;
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = cluster_id; tile < args.num_cluster_tiles; tile += num_clusters) {
        const TileCoord c = tile_coord(tile, cta_rank, args);
        const uint32_t stage_bytes = c.rows_exist ? kStageBytes : kBTileBytes;
        const int w_row = c.n0 + static_cast<int>(cta_rank) * (kBlockN / kClusterM);
        for (int kb = 0; kb < args.num_kblocks; ++kb) {
          const int shard = kb / args.kblocks_per_shard;
          const int h0 = (kb - shard * args.kblocks_per_shard) * kBlockK;
          mbarrier_wait(&empty[stage], phase ^ 1);
          mbarrier_arrive_expect_tx(&full[stage], stage_bytes);
          if (c.rows_exist) {
            uint8_t* a_dst = a_tiles + stage * kATileBytes;
            if (args.a_is_4d) {
              tma_load_4d(a_dst, &x_map, &full[stage], h0, c.inner0, c.outer, shard);
            } else {
              tma_load_3d(a_dst, &x_map, &full[stage], h0, c.inner0, shard);
            }
          }
          tma_load_3d_multicast(b_tiles + stage * kBTileBytes + cta_rank * kBSliceBytes, &w_map, &full[stage],
                                kWholeCluster, h0, shard, w_row);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    warpgroup_claim_registers<kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const int thread_in_wg = threadIdx.x % 128;
    const bool warp_leader = (threadIdx.x % 32) == 0;
    float acc[128];
    int stage = 0;
    uint32_t phase = 0;
    for (int tile = cluster_id; tile < args.num_cluster_tiles; tile += num_clusters) {
      const TileCoord c = tile_coord(tile, cta_rank, args);
      // Two bias values a thread, loaded now so that their latency hides under the mainloop
      // (fetched in the epilogue, they cost several L2 round trips a tile).
      const float2 tile_bias_pair = bias_pair(static_cast<const Element*>(args.bias), args.bias_stride,
                                              c.n0 + 2 * thread_in_wg, args.out_features);
      int previous_stage = 0;
      for (int kb = 0; kb < args.num_kblocks; ++kb) {
        mbarrier_wait(&full[stage], phase);
        const uint64_t desc_a =
            k_major_swizzle128_descriptor(a_tiles + stage * kATileBytes + consumer * (kATileBytes / 2));
        const uint64_t desc_b = k_major_swizzle128_descriptor(b_tiles + stage * kBTileBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {
          // +32 bytes per 16-element k step inside the swizzled row, in 16-byte units.
          wgmma_m64n256k16<Element>(acc, desc_a + 2 * kk, desc_b + 2 * kk, (kb | kk) != 0);
        }
        wgmma_commit_group();
        wgmma_wait_group<1>();
        if (kb > 0 && warp_leader) {
#pragma unroll
          for (uint32_t peer = 0; peer < kClusterM; ++peer) mbarrier_arrive_cluster(&empty[previous_stage], peer);
        }
        previous_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait_group<0>();
      if (warp_leader) {
#pragma unroll
        for (uint32_t peer = 0; peer < kClusterM; ++peer) mbarrier_arrive_cluster(&empty[previous_stage], peer);
      }
      float* tile_bias = bias_rows + consumer * kBlockN;
      named_barrier_sync(1 + consumer, 128);  // this warpgroup is done reading the previous tile's bias
      reinterpret_cast<float2*>(tile_bias)[thread_in_wg] = tile_bias_pair;
      named_barrier_sync(1 + consumer, 128);
      store_tile<Element>(acc, tile_bias, args, c, consumer, thread_in_wg);
    }
  }
  cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host

inline CUtensorMapDataType tensor_map_type(DType t) {
  if (t == DType::kFloat32) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return t == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Bytes between consecutive entries of a dim; a dim of extent 1 is never stepped,
// so it gets the dense row size (any 16-byte multiple would do).
inline cuuint64_t tma_byte_stride(int64_t extent, int64_t stride_elements, int64_t shard_width, DType t) {
  return static_cast<cuuint64_t>((extent == 1 ? shard_width : stride_elements) * dtype_size(t));
}

// x as a TMA tensor: (H, rows, R), or (H, inner, outer, R) when the batch dims do not merge;
// one box is box_k elements of one shard's h for box_rows consecutive rows (zero fill past H
// and past the rows). The k-block (r, h0) of a row tile is one copy: the concat is virtual.
inline CUtensorMap x_tensor_map(const ForwardProblem& p, const RowView& rows, cuuint32_t box_k,
                                cuuint32_t box_rows) {
  const int64_t H = p.shard_width;
  const cuuint32_t box[4] = {box_k, box_rows, 1, 1};
  if (rows.four_d) {
    const cuuint64_t dims[4] = {cuuint64_t(H), cuuint64_t(rows.inner), cuuint64_t(rows.outer),
                                cuuint64_t(p.num_shards)};
    const cuuint64_t strides[3] = {tma_byte_stride(rows.inner, rows.inner_stride, H, p.dtype),
                                   tma_byte_stride(rows.outer, rows.outer_stride, H, p.dtype),
                                   tma_byte_stride(p.num_shards, p.x_stride_shard, H, p.dtype)};
    return encode_swizzled_tensor_map(p.x, tensor_map_type(p.dtype), 4, dims, strides, box);
  }
  const cuuint64_t dims[3] = {cuuint64_t(H), cuuint64_t(rows.inner), cuuint64_t(p.num_shards)};
  const cuuint64_t strides[2] = {tma_byte_stride(rows.inner, rows.inner_stride, H, p.dtype),
                                 tma_byte_stride(p.num_shards, p.x_stride_shard, H, p.dtype)};
  return encode_swizzled_tensor_map(p.x, tensor_map_type(p.dtype), 3, dims, strides, box);
}

// W as a TMA tensor (H, R, K): one box is box_k elements of one shard's h for box_rows output
// features, so a shard's h tail is zero-filled and never reads the next shard (0 * NaN = NaN).
inline CUtensorMap w_tensor_map(const ForwardProblem& p, cuuint32_t box_k, cuuint32_t box_rows) {
  const int64_t H = p.shard_width;
  const cuuint64_t dims[3] = {cuuint64_t(H), cuuint64_t(p.num_shards), cuuint64_t(p.out_features)};
  const cuuint64_t strides[2] = {cuuint64_t(H * dtype_size(p.dtype)),
                                 tma_byte_stride(p.out_features, p.weight_stride_out, H, p.dtype)};
  const cuuint32_t box[3] = {box_k, 1, box_rows};
  return encode_swizzled_tensor_map(p.weight, tensor_map_type(p.dtype), 3, dims, strides, box);
}

template <typename Element>
inline void launch_gather_concat_gemm(const ForwardProblem& p, cudaStream_t stream) {
  const RowView rows = row_view(p);
  const int64_t H = p.shard_width;
  const CUtensorMap x_map = x_tensor_map(p, rows, kBlockK, kBlockM);
  const CUtensorMap w_map = w_tensor_map(p, kBlockK, kBlockN / kClusterM);

  GemmArgs args;
  args.out = p.out;
  args.bias = p.bias;
  args.bias_stride = p.bias_stride;
  args.rows_inner = static_cast<int>(rows.inner);
  args.inner_tiles = static_cast<int>(ceil_div(rows.inner, kBlockM));
  args.m_tiles = static_cast<int>(rows.outer * args.inner_tiles);
  args.n_tiles = static_cast<int>(ceil_div(p.out_features, kBlockN));
  args.cluster_m_tiles = static_cast<int>(ceil_div(args.m_tiles, kClusterM));
  args.num_cluster_tiles = args.cluster_m_tiles * args.n_tiles;
  args.out_features = static_cast<int>(p.out_features);
  args.kblocks_per_shard = static_cast<int>(ceil_div(H, kBlockK));
  args.num_kblocks = static_cast<int>(p.num_shards) * args.kblocks_per_shard;
  args.a_is_4d = rows.four_d ? 1 : 0;
  args.vector_store = (is_aligned(p.out, 16) && p.out_features % 8 == 0) ? 1 : 0;

  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster_shape;
  cluster_shape.id = cudaLaunchAttributeClusterDimension;
  cluster_shape.val.clusterDim.x = kClusterM;
  cluster_shape.val.clusterDim.y = 1;
  cluster_shape.val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  config.stream = stream;
  config.attrs = &cluster_shape;
  config.numAttrs = 1;

  // Once per process: the shared-memory opt-in, then how many clusters can be
  // resident at once (the persistent grid's size; GPCs may leave SMs unpaired).
  static const int resident_clusters = [&config] {
    cudaError_t status = cudaFuncSetAttribute(gather_concat_gemm_kernel<Element>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
    STD_TORCH_CHECK(status == cudaSuccess, "vga sm90 GEMM: cannot reserve ", kSharedBytes,
                    " bytes of shared memory: ", cudaGetErrorString(status));
    config.gridDim = dim3(kClusterM);
    int clusters = 0;
    status = cudaOccupancyMaxActiveClusters(&clusters, gather_concat_gemm_kernel<Element>, &config);
    STD_TORCH_CHECK(status == cudaSuccess && clusters > 0, "vga sm90 GEMM: no cluster of ", kClusterM,
                    " CTAs fits: ", cudaGetErrorString(status));
    return clusters;
  }();

  const int clusters = std::min({args.num_cluster_tiles, resident_clusters, std::max(1, p.sm_count / kClusterM)});
  config.gridDim = dim3(clusters * kClusterM);
  cudaLaunchKernelEx(&config, gather_concat_gemm_kernel<Element>, x_map, w_map, args);
}

}  // namespace sm90

namespace sm90 {

// What the TMA views of x and W (dims (H, rows, R) or (H, inner, outer, R), and (H, R, K))
// need, for any element type: a Hopper GPU, 16-byte aligned bases and strides, coordinates
// below 2^31, byte strides below 2^40, and 128-row tiles that a 4-D view does not mostly waste.
inline const char* tma_view_refusal(const ForwardProblem& p) {
  constexpr int64_t kMaxCoordinate = (int64_t(1) << 31) - 1;
  constexpr int64_t kMaxByteStride = int64_t(1) << 40;
  const int64_t element_bytes = dtype_size(p.dtype);
  const int64_t per_16_bytes = 16 / element_bytes;
  if (p.cc_major != 9) return "needs an sm_90 (Hopper) GPU";
  if (p.rows() <= 0 || p.out_features <= 0 || p.num_shards <= 0 || p.shard_width <= 0) return "empty problem";
  if (p.shard_width % per_16_bytes != 0) return "H * element size is not a multiple of 16 bytes (TMA strides)";
  if (p.weight_stride_in != 1) return "weight's input dim is not contiguous";
  if (p.weight_stride_out % per_16_bytes != 0) return "weight row stride is not a multiple of 16 bytes";
  if (!is_aligned(p.x, 16) || !is_aligned(p.weight, 16))
    return "x or weight is not 16-byte aligned";
  if (p.num_shards > kMaxCoordinate || p.shard_width > kMaxCoordinate || p.out_features > kMaxCoordinate ||
      p.batch_outer > kMaxCoordinate || p.batch_inner > kMaxCoordinate)
    return "a dimension is >= 2^31";

  const RowView rows = row_view(p);
  const int64_t used_strides[3] = {rows.inner > 1 ? rows.inner_stride : per_16_bytes,
                                   rows.outer > 1 ? rows.outer_stride : per_16_bytes,
                                   p.num_shards > 1 ? p.x_stride_shard : per_16_bytes};
  for (int64_t stride : used_strides) {
    if (stride <= 0) return "x has a broadcast (stride 0) dim";
    if (stride % per_16_bytes != 0) return "an x stride is not a multiple of 16 bytes";
    if (stride * element_bytes >= kMaxByteStride) return "an x stride is >= 2^40 bytes";
  }
  if (p.weight_stride_out * element_bytes >= kMaxByteStride) return "weight row stride is >= 2^40 bytes";

  const int64_t m_tiles = rows.outer * ceil_div(rows.inner, kBlockM);
  if (rows.four_d && m_tiles * kBlockM > 2 * p.rows())
    return "two unmergeable batch dims with the inner one too short for 128-row tiles";
  return nullptr;
}

}  // namespace sm90

inline const char* sm90_gemm_refusal(const ForwardProblem& p) {
  constexpr int64_t kMaxCoordinate = (int64_t(1) << 31) - 1;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype is not fp16/bf16";
  if (const char* why = sm90::tma_view_refusal(p)) return why;
  const sm90::RowView rows = sm90::row_view(p);
  const int64_t m_tiles = rows.outer * ceil_div(rows.inner, sm90::kBlockM);
  if ((m_tiles + 1) * ceil_div(p.out_features, sm90::kBlockN) > kMaxCoordinate) return "too many output tiles";
  if (ceil_div(p.shard_width, sm90::kBlockK) * p.num_shards > kMaxCoordinate) return "reduction too long";
  return nullptr;
}

inline void sm90_gemm_forward(const ForwardProblem& p, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16) {
    sm90::launch_gather_concat_gemm<__nv_bfloat16>(p, stream);
  } else {
    sm90::launch_gather_concat_gemm<__half>(p, stream);
  }
}

}  // namespace vga
