// Epilogues of the GEMM core: a consumer warpgroup's 64 x kBlockN fp32 accumulators go to
//  * the output as Element (+ bias, forward only), 16-byte stores of 8 columns a lane after a
//    quad transpose wherever a 32-column strip lies inside the output, element stores at tails;
//  * or, for the swapped forward (M = W's rows = the output's columns, N = the tokens = its rows),
//    to the output transposed: 16-byte stores of 8 W rows of one token a lane after an 8 x 8
//    transpose across the lanes that hold a column's rows, element stores where K ends;
//  * or, for a split across the grid, to this split's fp32 slice of the partial sums; then
//    reduce_partials adds the slices in split order (+ bias) into the output;
//  * or, for a split in the cluster, to this CTA's shared memory as an fp32 partial tile; then
//    CTA q of the S in the cluster adds rows [q * 128 / S, (q + 1) * 128 / S) of the S partial
//    tiles in slice order through distributed shared memory (+ bias) and stores them.
// The slices are added in a fixed order either way, so the result is the same bits on every run.
// Output addresses: row m = outer * m_inner + inner, column = n_group * n_group_width + n, both
// from schedule.cuh's TileCoord; `out_ld` elements between rows, except kGradInput's stores
// (kScatter), which go through the OutputScatter of grad_x's layout (the split partial sums stay
// row-major with `out_ld` for every kind).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../element_types.cuh"
#include "ptx.cuh"
#include "schedule.cuh"

namespace vga {
namespace sm90 {

// The in-cluster split's partial tile: fp32 [kTileM][kLd], in the stage ring's memory
// (free once the tile's last k-block is consumed: a cluster walks one tile). The row pitch's 8
// extra floats put the 8 rows a store instruction writes in different banks. After it, the rows
// this CTA sums as the peers' partial tiles hold them: one slot of kTileM / S rows a peer, S - 1
// slots (kExchangeBytes: the tile and the slots of the largest cluster, S = 8).
template <int kBlockN, int kTileM = kBlockM>
struct PartialTile {
  static constexpr int kLd = kBlockN + 8;
  static constexpr int kBytes = kTileM * kLd * 4;
  static constexpr int kExchangeBytes = kBytes + 7 * (kTileM / 8) * kLd * 4;
};

#ifdef VGA_SM90A_DEVICE

// A kN x kN transpose across the kN lanes kLaneStep apart whose lane bits `index` are: before,
// register k of the lane with index i holds element (i, k); after, element (k, i). log2(kN) swaps
// of one index bit between lane and register; lanes that differ in other bits do not mix.
//  * kN = 4, kLaneStep = 1 (the quad of lanes t = lane % 4): word q holds columns 8q + 2t, 2t + 1
//    of a 32-column strip before, columns 8t + 2q, 2q + 1 after: 8 consecutive columns a lane.
//  * kN = 8, kLaneStep = 4 (the lanes g = lane / 4 of one t): the swapped forward's W rows.
template <int kN, int kLaneStep, typename T>
__device__ __forceinline__ void transpose_across_lanes(T (&v)[kN], int index) {
#pragma unroll
  for (int bit = 1; bit < kN; bit <<= 1) {
    const bool upper = (index & bit) != 0;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (i & bit) continue;
      const T send = upper ? v[i] : v[i | bit];
      const T received = __shfl_xor_sync(0xffffffffu, send, bit * kLaneStep);
      if (upper) {
        v[i] = received;
      } else {
        v[i | bit] = received;
      }
    }
  }
}

// The offset of an output row (m = outer * m_inner + inner), and of column `column0 + n` from
// the tile's base (out + column0 row-major, out for kScatter): row-major with `out_ld`, or for
// kGradInput (kScatter) through the OutputScatter of grad_x's layout.
template <bool kScatter>
__device__ __forceinline__ int64_t output_row_offset(int64_t m, const CoreArgs& a) {
  if constexpr (kScatter) {
    return scatter_row_offset(static_cast<int>(m), a.scatter);
  } else {
    return m * a.out_ld;
  }
}
template <bool kScatter>
__device__ __forceinline__ int64_t output_column_offset(int64_t column0, int n, const CoreArgs& a) {
  if constexpr (kScatter) {
    return scatter_column_offset(static_cast<int>(column0) + n, a.scatter);
  } else {
    return n;
  }
}

// The wgmma m64nNk16 fragment: acc[4j + 2*half + e] is row 16*warp + lane/4 + 8*half,
// column 8j + 2*(lane % 4) + e of the warpgroup's 64 x N block.
template <typename Element, int kBlockN, bool kScatter>
__device__ __forceinline__ void store_tile(const float (&acc)[kBlockN / 2], const float* tile_bias,
                                           const CoreArgs& a, const TileCoord& c, int consumer,
                                           int thread_in_wg) {
  if (!c.exists) return;
  const int warp = thread_in_wg / 32;
  const int lane = thread_in_wg % 32;
  const int quad_lane = lane % 4;
  const int row_in_tile = consumer * kConsumerRows + warp * 16 + lane / 4;
  int64_t row[2];
  int64_t out_row[2];  // row-major: also the split partial sums' row offsets
  bool row_valid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int inner = c.inner0 + row_in_tile + 8 * half;
    row_valid[half] = inner < a.m_inner;
    row[half] = static_cast<int64_t>(c.outer) * a.m_inner + inner;
    out_row[half] = row[half] * a.out_ld;
  }
  const int64_t column0 = static_cast<int64_t>(c.n_group) * a.n_group_width + c.n0;
  const int columns_left = a.n_group_width - c.n0;

  if (a.partials != nullptr) {  // a split: fp32 partial sums (row-major, any kind), no bias
    float* out = a.partials + static_cast<int64_t>(c.split) * a.partial_stride + column0;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int column = j * 8 + 2 * quad_lane;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (!row_valid[half]) continue;
        float* dst = out + out_row[half] + column;
        if (a.vector_store && column + 2 <= columns_left) {
          *reinterpret_cast<float2*>(dst) = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        } else {
          if (column < columns_left) dst[0] = acc[4 * j + 2 * half];
          if (column + 1 < columns_left) dst[1] = acc[4 * j + 2 * half + 1];
        }
      }
    }
    return;
  }

  if constexpr (kScatter) {
#pragma unroll
    for (int half = 0; half < 2; ++half) out_row[half] = row_valid[half] ? output_row_offset<kScatter>(row[half], a) : 0;
  }
  Element* out = static_cast<Element*>(a.out) + (kScatter ? 0 : column0);
#pragma unroll
  for (int strip = 0; strip < kBlockN / 32; ++strip) {
    if (a.vector_store && strip * 32 + 32 <= columns_left) {
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
        transpose_across_lanes<4, 1>(words, quad_lane);
        if (row_valid[half]) {
          store_global_16_bytes(out + out_row[half] + output_column_offset<kScatter>(column0, strip * 32 + quad_lane * 8, a),
                                words[0], words[1], words[2], words[3]);
        }
      }
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = strip * 4 + q;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int column = j * 8 + 2 * quad_lane + e;
          if (column >= columns_left) continue;
          const float bias = tile_bias[column];
          const int64_t column_offset = output_column_offset<kScatter>(column0, column, a);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            if (!row_valid[half]) continue;
            out[out_row[half] + column_offset] = from_acc<Element>(acc[4 * j + 2 * half + e] + bias);
          }
        }
      }
    }
  }
}

// The swapped forward's tile: acc[4j + 2*half + e] is W row 16*warp + g + 8*half of the
// warpgroup's 64 (an output column) for token 8j + 2t + e of the tile (an output row), g = lane / 4,
// t = lane % 4. Each chunk of 8 registers (j = 2c, 2c + 1; both halves; both e) is transposed
// across the 8 lanes of one t, after which lane g holds chunk register g's 8 consecutive W rows
// of its token: one 16-byte store. `row_bias` is the bias of the thread's rows g and g + 8.
template <typename Element, int kBlockN>
__device__ __forceinline__ void store_tile_transposed(const float (&acc)[kBlockN / 2], const float (&row_bias)[2],
                                                      const CoreArgs& a, const TileCoord& c, int consumer,
                                                      int thread_in_wg) {
  static_assert(kBlockN % 16 == 0, "whole chunks of 8 registers");
  if (!c.exists) return;
  const int warp = thread_in_wg / 32;
  const int lane = thread_in_wg % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int m_warp = c.inner0 + consumer * kConsumerRows + warp * 16;  // the warp's first W row (output column)
  const int tokens_left = a.n_group_width - c.n0;
  Element* out =
      static_cast<Element*>(a.out) + (static_cast<int64_t>(c.n_group) * a.n_group_width + c.n0) * a.out_ld;
  if (a.vector_store && m_warp + 16 <= a.m_inner) {  // warp-uniform: the shuffles need every lane
#pragma unroll
    for (int chunk = 0; chunk < kBlockN / 16; ++chunk) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = acc[8 * chunk + k] + row_bias[(k >> 1) & 1];
      transpose_across_lanes<8, 4>(v, g);
      const int token = 8 * (2 * chunk + (g >> 2)) + 2 * t + (g & 1);
      if (token < tokens_left) {
        store_global_16_bytes(out + token * a.out_ld + m_warp + 8 * ((g >> 1) & 1), pack_pair<Element>(v[0], v[1]),
                              pack_pair<Element>(v[2], v[3]), pack_pair<Element>(v[4], v[5]),
                              pack_pair<Element>(v[6], v[7]));
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    const int half = (i >> 1) & 1;
    const int m = m_warp + g + 8 * half;
    const int token = 8 * (i >> 2) + 2 * t + (i & 1);
    if (m < a.m_inner && token < tokens_left) out[token * a.out_ld + m] = from_acc<Element>(acc[i] + row_bias[half]);
  }
}

// Writes a consumer warpgroup's kConsumerRows x kBlockN accumulators (zeros unless `accumulated`)
// into its rows of the partial tile, from kConsumerRows * consumer.
template <int kBlockN>
__device__ __forceinline__ void stage_partial_tile(const float (&acc)[kBlockN / 2], bool accumulated, float* partial,
                                                   int consumer, int thread_in_wg) {
  constexpr int kLd = PartialTile<kBlockN>::kLd;  // (the width's pitch, whatever the tile's rows)
  const int warp = thread_in_wg / 32;
  const int lane = thread_in_wg % 32;
  const int row = consumer * kConsumerRows + warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const int column = j * 8 + 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      *reinterpret_cast<float2*>(partial + (row + 8 * half) * kLd + column) =
          accumulated ? make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]) : make_float2(0.f, 0.f);
    }
  }
}

// The largest divisor of `count` that is at most `limit` (at least 1).
constexpr int largest_divisor_at_most(int count, int limit) {
  int d = limit < count ? limit : count;
  while (d > 1 && count % d != 0) --d;
  return d < 1 ? 1 : d;
}

// CTA `rank` of the kSlices in the cluster: its rows of the tile (rank * kTileM / S ..), summed over
// the slices' partial tiles in slice order, + bias, stored as Element (8-byte stores of 4 columns
// where the row allows). `thread` counts the consumer threads (kConsumerThreads of them). Every
// CTA's partial tile is staged and fenced for the async proxy, and every CTA's ring is free to
// receive (a cluster barrier), before; the peers' partial tiles stay until every CTA's rows have
// landed (the exit barrier: its consumers arrive here, the wait is the kernel's).
// The rows travel by bulk copies: this CTA's thread 0 pushes each peer's rows of its partial tile
// into that peer's slot for this rank, completing on the peer's `received` barrier, and waits on
// its own for theirs. So no thread publishes its tile with a release (a cluster-scope release is a
// MEMBAR.ALL.GPU, ~0.5 µs: run 140's probe), and every read of the sum is local. Consecutive
// threads read consecutive 16-byte chunks of a row (a warp's load: 2 x 256 contiguous bytes, no
// bank conflict); a thread issues the loads of several chunks before it adds any (kBatch chunks x
// kSlices loads, up to 8 in flight: 32 registers).
template <typename Element, int kBlockN, int kTileM, int kSlices, int kConsumerThreads, bool kScatter>
__device__ __forceinline__ void sum_slices(const float* partial, uint64_t* received, const float* tile_bias,
                                           const CoreArgs& a, const TileCoord& c, int rank, int thread) {
  constexpr int kLd = PartialTile<kBlockN, kTileM>::kLd;
  constexpr int kRows = kTileM / kSlices;
  constexpr uint32_t kSlotBytes = kRows * kLd * 4;  // a slice's rows of one CTA: one slot, one copy
  constexpr int kChunksPerRow = kBlockN / 4;
  constexpr int kChunksPerThread = kRows * kChunksPerRow / kConsumerThreads;
  static_assert(kRows * kChunksPerRow % kConsumerThreads == 0, "every consumer thread sums as many chunks");
  static_assert(kSlotBytes % 16 == 0, "bulk copies move 16-byte multiples");
  constexpr int kBatch = largest_divisor_at_most(kChunksPerThread, std::max(1, 8 / kSlices));
  const uint32_t partial_base = smem_address(partial);
  const uint32_t slots_base = partial_base + PartialTile<kBlockN, kTileM>::kBytes;
  if (thread == 0) send_rows_to_peers(received, partial_base, slots_base, kSlotBytes, kSlotBytes, rank, kSlices);
  mbarrier_wait(received, 0);  // (one tile a cluster: the barrier's first phase)
  // This CTA's rows have landed: its consumers' arrival at the exit barrier (relaxed: it publishes
  // nothing), whose wait is the kernel's last step, so the barrier's round trip and the slices' uneven
  // sums overlap instead of adding up.
  cluster_arrive_relaxed();
  const int64_t column0 = static_cast<int64_t>(c.n_group) * a.n_group_width + c.n0;
  const int columns_left = a.n_group_width - c.n0;
  Element* out = static_cast<Element*>(a.out) + (kScatter ? 0 : column0);
#pragma unroll 1
  for (int first = 0; first < kChunksPerThread; first += kBatch) {
    float4 part[kBatch][kSlices];
    bool stored[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {  // every load of the batch first (only of chunks that are stored)
      const int chunk = (first + b) * kConsumerThreads + thread;
      const int row_in_slice = chunk / kChunksPerRow;
      const int column = (chunk % kChunksPerRow) * 4;
      stored[b] = c.inner0 + rank * kRows + row_in_slice < a.m_inner && column < columns_left;
      const uint32_t offset = static_cast<uint32_t>((row_in_slice * kLd + column) * 4);
      if (stored[b]) {
#pragma unroll
        for (int q = 0; q < kSlices; ++q) {
          part[b][q] = load_shared_float4((q == rank ? partial_base + rank * kSlotBytes
                                                     : slots_base + cluster_slot(q, rank) * kSlotBytes) + offset);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (!stored[b]) continue;
      const int chunk = (first + b) * kConsumerThreads + thread;
      const int column = (chunk % kChunksPerRow) * 4;
      const int inner = c.inner0 + rank * kRows + chunk / kChunksPerRow;
      float v[4] = {part[b][0].x, part[b][0].y, part[b][0].z, part[b][0].w};
#pragma unroll
      for (int q = 1; q < kSlices; ++q) {
        v[0] += part[b][q].x;
        v[1] += part[b][q].y;
        v[2] += part[b][q].z;
        v[3] += part[b][q].w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = tile_bias[column + e] + v[e];
      Element* dst = out + output_row_offset<kScatter>(static_cast<int64_t>(c.outer) * a.m_inner + inner, a);
      if (a.vector_store && column + 4 <= columns_left) {  // (4 columns never straddle a shard then)
        store_global_8_bytes(dst + output_column_offset<kScatter>(column0, column, a), pack_pair<Element>(v[0], v[1]),
                             pack_pair<Element>(v[2], v[3]));
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (column + e < columns_left) dst[output_column_offset<kScatter>(column0, column + e, a)] = from_acc<Element>(v[e]);
        }
      }
    }
  }
}

// The same for the cluster's size (2, 4 or 8 slices); `tile_bias` is the tile's bias (zeros but
// for the forward).
template <typename Element, int kBlockN, int kTileM, int kConsumerThreads, bool kScatter>
__device__ __forceinline__ void sum_cluster_tile(const float* partial, uint64_t* received, const float* tile_bias,
                                                 const CoreArgs& a, const TileCoord& c, uint32_t cta_rank, int thread) {
  const int rank = static_cast<int>(cta_rank);
  if (a.cluster_size == 2) {
    sum_slices<Element, kBlockN, kTileM, 2, kConsumerThreads, kScatter>(partial, received, tile_bias, a, c, rank, thread);
  } else if (a.cluster_size == 4) {
    sum_slices<Element, kBlockN, kTileM, 4, kConsumerThreads, kScatter>(partial, received, tile_bias, a, c, rank, thread);
  } else {
    sum_slices<Element, kBlockN, kTileM, 8, kConsumerThreads, kScatter>(partial, received, tile_bias, a, c, rank, thread);
  }
}

#endif  // VGA_SM90A_DEVICE

// out[i] = sum over splits s = 0, 1, ... of partials[s][i] (+ bias[i % columns]), for the
// rows x columns output (a programmatic launch: it waits for the previous grid first); one
// thread a group of 4 elements (the row length is a multiple of 4 when `vector` is set), splits
// added in order. With `scatter` (kGradInput's layout: its shard width nonzero; no bias) element
// (m, n) goes to out[scatter_row_offset(m) + scatter_column_offset(n)] instead of out[i].
// `partials` and `bias` are not __restrict__: that would let the compiler read them through the
// non-coherent path, outside the memory model that wait_for_previous_grid's ordering is part of
// (the partials are the previous kernel's output).
template <typename Element>
__global__ void reduce_partials_kernel(const float* partials, int64_t split_stride, int splits,
                                       Element* __restrict__ out, int64_t total, int64_t columns,
                                       const Element* bias, int64_t bias_stride, int vector,
                                       OutputScatter scatter) {
  // Launched right behind the core kernel whose partials it sums (launch.cuh): it may be scheduled
  // as that one finishes, and waits for it here; then releases the next kernel (ptx.cuh).
  wait_for_previous_grid();
  allow_next_grid();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (scatter.shard_width.divisor > 0) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
      float sum = partials[i];
      for (int s = 1; s < splits; ++s) sum += partials[s * split_stride + i];
      const int64_t m = i / columns;
      const int n = static_cast<int>(i - m * columns);
      out[scatter_row_offset(static_cast<int>(m), scatter) + scatter_column_offset(n, scatter)] =
          from_acc<Element>(sum);
    }
    return;
  }
  if (vector) {
    for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < total; i += step * 4) {
      float4 sum = *reinterpret_cast<const float4*>(partials + i);
      for (int s = 1; s < splits; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(partials + s * split_stride + i);
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = values[e];
        if (bias != nullptr) v += to_acc<float>(bias[((i + e) % columns) * bias_stride]);
        out[i + e] = from_acc<Element>(v);
      }
    }
    return;
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    float sum = partials[i];
    for (int s = 1; s < splits; ++s) sum += partials[s * split_stride + i];
    if (bias != nullptr) sum += to_acc<float>(bias[(i % columns) * bias_stride]);
    out[i] = from_acc<Element>(sum);
  }
}

}  // namespace sm90
}  // namespace vga
