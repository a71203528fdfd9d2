// The "skinny" family: y[m, n] = sum_{r,h} x[r, m, h] * W[n, r*H + h] + bias[n] for few rows
// (decode: rows() <= 64) and a large weight. Such a product is bound by HBM bandwidth: every W
// element is used rows() times, so the kernel's job is to stream W exactly once, at full speed.
//
// Tiling (both kernels below share it):
//   * A CTA (8 warps) owns a tile of out-features -- 128 rows of W for the half types (16 per
//     warp), 32 or 64 for fp32 -- times all rows() batch rows of y, over a slice of the
//     reduction dim. When K / tile rows alone gives too few CTAs for the SMs, the reduction dim
//     is cut into S slices (S = 2, 4, 8) and the S CTAs of one tile form a thread block cluster
//     (sm_90); each CTA sums its share of the tile's out-features over the S fp32 partial tiles
//     in a fixed rank order, the peers' rows sent into its shared memory by bulk copies
//     (finish_tile): deterministic, no workspace, no atomics. S is chosen with the clusters that
//     can actually be resident (a cluster lives inside one GPC: on the H200, 1-CTA/SM kernels
//     fit 66 clusters of 2 but only 30 of 4 and 15 of 8). Large K needs no split (S = 1);
//     before sm_90 S is always 1.
//   * x (rows() x R*H, small) is staged in shared memory chunk by chunk (cp.async ring of
//     kXStages chunks), gathered through the virtual concat (k -> shard r = k / H, h = k % H),
//     so the concat is never materialised. The chunk is shared by all warps of the CTA, so x is
//     read from L2 once per CTA: (K / tile rows) * bytes(x) in all, rows() / 128 of W's bytes.
//   * W goes straight from global memory into registers with 16-byte loads (no shared-memory
//     round trip; ld.global.nc.L1::no_allocate.L2::256B), kWDepth chunks ahead of their use:
//     8 warps x 16 rows x 128 B x 4 chunks = 64 KB in flight per SM.
//   * half types: tensor cores (mma.sync m16n8k16, fp32 accumulate), with W as the A operand
//     (16 out-features) and x as the B operand (8 batch rows). The reduction index inside a
//     64-wide chunk is permuted so that each thread's 16-byte W vector (8 consecutive k) IS its
//     A fragment for two k16 steps, and the same permutation applied to x makes each thread's
//     B fragment one 16-byte shared-memory load (rows XOR-swizzled to stay conflict-free).
//     rows() = 64 at HBM speed needs ~290 TFLOP/s: SIMT could not keep up, mma.sync can.
//   * fp32: SIMT FFMA (fp32 accuracy, no TF32). Lanes split the 128-wide chunk (4 k each, one
//     16-byte W load per row), each lane accumulates kRowsPerWarp x kBPad partial dot products,
//     and a butterfly reduce-scatter across the warp sums them at the end (fixed order).
//   * Epilogue: fp32 tile -> shared memory (transposed so that the final stores of y, which is
//     (rows, K) row-major, are coalesced along K) -> [cluster exchange] -> sum + bias -> dtype -> y.
//
// Refused (see skinny_refusal): fp64, rows() > 64 (fp32: > 16), weight_stride_in != 1, W rows
// not 16-byte aligned, sizes >= 2^31, compute capability < 8. Everything else runs: any R, H and
// K; x views with any strides (a 16-byte cp.async path when H and the x strides allow it, an
// element-wise gather otherwise); reduction tails are masked.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "element_types.cuh"
#include "launch.cuh"
#include "per_device.cuh"
#include "problem.cuh"
#include "shared_memory_opt_in.cuh"
#include "sm90/ptx.cuh"

namespace vga {
namespace skinny_detail {

constexpr int kMaxRows = 64;       // batch rows handled in one pass (n-tiles of 8, padded)
constexpr int kWarps = 8;          // warps per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kXStages = 4;        // x chunks in flight (cp.async ring)
constexpr int kMaxClusterSlices = 8;
// fp32 (SIMT) keeps 64 / rows accumulators per lane, so its CTA tile shrinks to 8 W rows at 64
// batch rows and x is re-read 8x W's bytes: measured 1.34 ms vs cuBLAS 0.21 ms at R,B,H,K =
// 8,64,1024,8192. Above 16 rows the GEMM families do better.
constexpr int kMaxFp32Rows = 16;

struct SkinnyParams {
  const void* x;
  const void* weight;
  const void* bias;
  void* out;
  int64_t x_stride_shard, x_stride_outer, x_stride_inner;
  int64_t weight_stride_out;
  int64_t bias_stride;
  int rows;          // rows() <= 64
  int batch_inner;
  int shard_width;   // H
  int reduction;     // R*H  (< 2^31, checked)
  int out_features;  // K
  int slice_len;     // reduction elements per slice (a multiple of the chunk)
  int x_vectorized;  // 1: x gathers as aligned 16-byte vectors (H % vec == 0, aligned strides)
  int out_vectorized;  // 1: four outputs of a row are one store (K % 4 == 0, out 4-element aligned)
};

// ---------------------------------------------------------------- small PTX helpers


// W is read exactly once: keep it out of L1, and ask L2 for 256-byte lines (HBM efficiency).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_shared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ void store_shared16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

using sm90::cp_async16;
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <typename T>
struct MmaOp;
template <>
struct MmaOp<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaOp<__half> {
  __device__ __forceinline__ static void run(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// Raw element bits (the x gather and the masked W tail move bits, not values).
template <typename T>
struct Bits {
  using type = uint16_t;
};
template <>
struct Bits<float> {
  using type = uint32_t;
};

// ---------------------------------------------------------------- shared pieces

// Byte offset of each batch row's x row (row m = outer * batch_inner + inner), in elements.
__device__ __forceinline__ void fill_row_offsets(const SkinnyParams& p, int64_t* row_offset,
                                                 int count) {
  for (int b = threadIdx.x; b < count; b += kThreads) {
    int64_t off = 0;
    if (b < p.rows) {
      const int outer = b / p.batch_inner;
      const int inner = b - outer * p.batch_inner;
      off = outer * p.x_stride_outer + inner * p.x_stride_inner;
    }
    row_offset[b] = off;
  }
}

// Stage x[:, k0 : k0 + kChunk] (virtual concat, rows padded to kBPad with zeros, k >= k_end
// zero) into a shared-memory stage laid out [kBPad][kChunk] with 16-byte vectors; with
// kSwizzle the vector j of row b sits at slot j ^ ((b & 1) << 2) (conflict-free B fragments).
template <typename T, int kChunk, int kBPad, bool kSwizzle>
__device__ __forceinline__ void stage_x_chunk(const SkinnyParams& p, const int64_t* row_offset,
                                              uint32_t stage, int k0, int k_end) {
  using B = typename Bits<T>::type;
  constexpr int kVecElems = 16 / sizeof(T);
  constexpr int kVecsPerRow = kChunk / kVecElems;
  const B* x = static_cast<const B*>(p.x);
  for (int i = threadIdx.x; i < kBPad * kVecsPerRow; i += kThreads) {
    const int b = i / kVecsPerRow;
    const int j = i - b * kVecsPerRow;
    const int slot = kSwizzle ? (j ^ ((b & 1) << 2)) : j;
    const uint32_t dst = stage + static_cast<uint32_t>((b * kVecsPerRow + slot) * 16);
    const int k = k0 + j * kVecElems;
    if (p.x_vectorized) {
      // H % kVecElems == 0 here, so a vector never straddles two shards nor the end.
      const bool valid = b < p.rows && k < k_end;
      const B* src = x;
      if (valid) {
        const int r = k / p.shard_width;
        const int h = k - r * p.shard_width;
        src = x + row_offset[b] + r * p.x_stride_shard + h;
      }
      cp_async16(dst, src, valid ? 16 : 0);
    } else {
      B e[kVecElems];
#pragma unroll
      for (int u = 0; u < kVecElems; ++u) {
        const int kk = k + u;
        e[u] = 0;
        if (b < p.rows && kk < k_end) {
          const int r = kk / p.shard_width;
          const int h = kk - r * p.shard_width;
          e[u] = x[row_offset[b] + r * p.x_stride_shard + h];
        }
      }
      uint4 v;
      if constexpr (sizeof(T) == 2) {
        v.x = e[0] | (uint32_t(e[1]) << 16);
        v.y = e[2] | (uint32_t(e[3]) << 16);
        v.z = e[4] | (uint32_t(e[5]) << 16);
        v.w = e[6] | (uint32_t(e[7]) << 16);
      } else {
        v.x = e[0];
        v.y = e[1];
        v.z = e[2];
        v.w = e[3];
      }
      store_shared16(dst, v);
    }
  }
}

// 16-byte W vector at element k of a row, masked against k_end (only the reduction's last,
// partial chunk takes the element-wise path; W rows are 16-byte aligned, so vectors are too).
template <typename T>
__device__ __forceinline__ uint4 load_w_vector(const T* row, int k, int k_end, bool full) {
  constexpr int kVecElems = 16 / sizeof(T);
  if (full || k + kVecElems <= k_end) return load_stream16(row + k);
  using B = typename Bits<T>::type;
  const B* rb = reinterpret_cast<const B*>(row);
  B e[kVecElems];
#pragma unroll
  for (int u = 0; u < kVecElems; ++u) e[u] = (k + u < k_end) ? rb[k + u] : B(0);
  uint4 v;
  if constexpr (sizeof(T) == 2) {
    v.x = e[0] | (uint32_t(e[1]) << 16);
    v.y = e[2] | (uint32_t(e[3]) << 16);
    v.z = e[4] | (uint32_t(e[5]) << 16);
    v.w = e[6] | (uint32_t(e[7]) << 16);
  } else {
    v.x = e[0];
    v.y = e[1];
    v.z = e[2];
    v.w = e[3];
  }
  return v;
}

// The split-K partial tile (fp32: kRowsPerCta out-features x kBPad batch rows) and, in a cluster
// of S slices (sm_90), the rows the peers send. Rank-major: the out-features rank q sums, q * R / S
// .. + R / S - 1 (R = kRowsPerCta), are one block [kBPad][R / S + 4] at q * kBPad * (R / S + 4)
// floats, so what a CTA sends a peer is one contiguous run: one bulk copy. After the S blocks come
// S - 1 slots of one block each, where the peers' copies of this rank's rows land. (The pitch's 4
// extra floats keep the partial tile's writes free of bank conflicts: R / S + 4 = 4 mod 32 words
// a batch row for R / S >= 32, 20 for 16, and the writers' batch rows are 2 apart.)
template <int kRowsPerCta, int kBPad>
struct PartialLayout {
  // (2S - 1) blocks of kBPad x (R / S + 4) floats = kBPad x (2R + 8S - R / S - 4) < kBPad x (2R + 64)
  static constexpr int kExchangeBytes = kBPad * (2 * kRowsPerCta + 8 * kMaxClusterSlices) * 4;
  static constexpr int kTileBytes = kBPad * (kRowsPerCta + 4) * 4;  // S = 1: the tile alone
  // shared memory the tile needs for a launch of `slices`
  static constexpr int bytes(int slices) { return slices > 1 ? kExchangeBytes : kTileBytes; }

  int rank_rows;   // R / S (a power of two, >= 4: plan_launch)
  int rank_shift;  // log2(R / S)
  int ld;          // R / S + 4

  __device__ __forceinline__ explicit PartialLayout(int slices)
      : rank_rows(kRowsPerCta / slices), rank_shift(log2_of(kRowsPerCta / slices)), ld(kRowsPerCta / slices + 4) {}
  static constexpr int log2_of(int power_of_two) {
    int shift = 0;
    while ((1 << shift) < power_of_two) ++shift;
    return shift;
  }
  // float offset of out-feature `row` of the tile, batch row `b`
  __device__ __forceinline__ int offset(int b, int row) const {
    const int q = row >> rank_shift;
    return (q * kBPad + b) * ld + (row - (q << rank_shift));
  }
  __device__ __forceinline__ int block(int q) const { return q * kBPad * ld; }  // floats
};

// Four outputs of one batch row: out[0 .. 3] (16-byte aligned for fp32, 8 for the half types).
template <typename T>
__device__ __forceinline__ void store_four(T* out, const float (&v)[4]) {
  if constexpr (sizeof(T) == 4) {
    sm90::store_global_16_bytes(out, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                                __float_as_uint(v[3]));
  } else {
    sm90::store_global_8_bytes(out, sm90::pack_pair<T>(v[0], v[1]), sm90::pack_pair<T>(v[2], v[3]));
  }
}

// The 4 consecutive out-features a thread finishes (n .. n + 3, of CTA `rank`'s R / S) and their
// bias, which finish_tile loads before the exchange so that the load's latency overlaps it (ncu,
// NOTES run 144: loaded after it, the bias's wait was 3-8% of a decode call's stall samples).
struct FinishColumns {
  int quad;  // which 4 of the rank's out-features
  int n;     // the first one's index in the output
  float bias[4];
};

template <typename T, int kRowsPerCta, int kBPad>
__device__ __forceinline__ FinishColumns finish_columns(const SkinnyParams& p,
                                                        const PartialLayout<kRowsPerCta, kBPad>& layout, int row0,
                                                        int rank) {
  FinishColumns c;
  c.quad = static_cast<int>(threadIdx.x) % (layout.rank_rows / 4);
  c.n = row0 + rank * layout.rank_rows + 4 * c.quad;
  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    c.bias[e] = bias != nullptr && c.n + e < p.out_features
                    ? to_acc<float>(bias[static_cast<int64_t>(c.n + e) * p.bias_stride])
                    : 0.f;
  }
  return c;
}

// CTA `rank`'s out-features of the tile, summed over the kSlices blocks in slice order (its own
// from its tile, the peers' from its slots), + bias, stored. A thread takes 4 consecutive
// out-features (`columns`: one 16-byte load a slice, neighbouring threads on neighbouring features:
// the stores are coalesced along K) and every (threads / (R / S / 4))-th batch row.
template <typename T, int kRowsPerCta, int kBPad, int kThreadCount, int kSlices>
__device__ __forceinline__ void sum_rank_rows(const SkinnyParams& p, uint32_t partial,
                                              const PartialLayout<kRowsPerCta, kBPad>& layout,
                                              const FinishColumns& columns, int rank) {
  const int quads = layout.rank_rows / 4;  // divides kThreadCount (<= 32 quads)
  const int quad = columns.quad;
  const int n = columns.n;
  if (n >= p.out_features) return;
  const float(&bias4)[4] = columns.bias;
  const bool vector = p.out_vectorized && n + 4 <= p.out_features;
  uint32_t source[kSlices];  // slice q's block of this rank's rows
#pragma unroll
  for (int q = 0; q < kSlices; ++q) {
    source[q] = partial + 4 * static_cast<uint32_t>(q == rank ? layout.block(rank)
                                                               : layout.block(kSlices + sm90::cluster_slot(q, rank)));
  }
  for (int b = static_cast<int>(threadIdx.x) / quads; b < p.rows; b += kThreadCount / quads) {
    const uint32_t offset = 4 * static_cast<uint32_t>(b * layout.ld + 4 * quad);
    uint4 part[kSlices];
#pragma unroll
    for (int q = 0; q < kSlices; ++q) part[q] = load_shared16(source[q] + offset);
    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int q = 0; q < kSlices; ++q) {
      v[0] += __uint_as_float(part[q].x);
      v[1] += __uint_as_float(part[q].y);
      v[2] += __uint_as_float(part[q].z);
      v[3] += __uint_as_float(part[q].w);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] += bias4[e];
    T* out = static_cast<T*>(p.out) + static_cast<int64_t>(b) * p.out_features + n;
    if (vector) {
      store_four<T>(out, v);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (n + e < p.out_features) out[e] = from_acc<T>(v[e]);
      }
    }
  }
}

// Sum the S partial tiles (S = gridDim.x, the CTAs of one cluster; 1 = this CTA alone), add the
// bias, convert, store. `partial` is the tile in `layout`'s order (the kernel's, for gridDim.x
// slices), written by every thread before the call, with room for the slots after it
// (PartialLayout::bytes(S)); CTA rank q finishes its rows, out-features q * R / S .. + R / S - 1.
// In a cluster the rows travel by bulk copies into their owner's slots: once every CTA's tile is
// written and fenced for the async proxy and every CTA's ring is free (one relaxed cluster barrier),
// thread 0 sends each peer its block with one cp.async.bulk, completing on the peer's `received`
// barrier (initialised at the kernel's start, before a cluster barrier), and every thread waits on
// its own. So no thread publishes its tile with a release (a cluster-scope release is a
// MEMBAR.ALL.GPU, ~0.5 µs: NOTES run 140), and the sum reads local shared memory only, 16 bytes a
// load (the DSMEM reads it replaces were 4 bytes each: 8192 a CTA at 64 batch rows). A CTA arrives
// at the exit barrier once its rows have landed and waits there before it exits: then every copy
// has completed, so none still reads a tile whose CTA has gone.
// Every thread of the CTA (kThreadCount of them) takes part; only the epilogue fields of `p`
// (out, bias, bias_stride, rows, out_features, out_vectorized) are read.
template <typename T, int kRowsPerCta, int kBPad, int kThreadCount = kThreads>
__device__ __forceinline__ void finish_tile(const SkinnyParams& p, uint32_t partial,
                                            const PartialLayout<kRowsPerCta, kBPad>& layout, uint64_t* received, int row0) {
  const int slices = gridDim.x;
  const int rank = static_cast<int>(blockIdx.x);
  const FinishColumns columns = finish_columns<T>(p, layout, row0, rank);
  if (slices == 1) {
    __syncthreads();
    sum_rank_rows<T, kRowsPerCta, kBPad, kThreadCount, 1>(p, partial, layout, columns, 0);
    return;
  }
#ifdef VGA_SM90A_DEVICE
  sm90::fence_proxy_async_shared();  // this thread's writes of the tile, for the copies that read it
  __syncthreads();                   // and for this CTA's own reads of its rows (a relaxed arrival orders none)
  sm90::cluster_arrive_relaxed();    // (publishes nothing to the peers: the tiles travel by the copies)
  sm90::cluster_wait();
  const uint32_t block_bytes = 4 * static_cast<uint32_t>(layout.block(1));
  const uint32_t rows_bytes = 4 * static_cast<uint32_t>(p.rows * layout.ld);  // the batch rows that exist
  if (threadIdx.x == 0) {
    sm90::send_rows_to_peers(received, partial, partial + slices * block_bytes, block_bytes, rows_bytes, rank, slices);
  }
  sm90::mbarrier_wait(received, 0);  // (one tile a cluster: the barrier's first phase)
  sm90::cluster_arrive_relaxed();    // this CTA's rows have landed
  if (slices == 2) {
    sum_rank_rows<T, kRowsPerCta, kBPad, kThreadCount, 2>(p, partial, layout, columns, rank);
  } else if (slices == 4) {
    sum_rank_rows<T, kRowsPerCta, kBPad, kThreadCount, 4>(p, partial, layout, columns, rank);
  } else {
    sum_rank_rows<T, kRowsPerCta, kBPad, kThreadCount, 8>(p, partial, layout, columns, rank);
  }
  sm90::cluster_wait();  // every CTA's rows have landed: no copy still reads this CTA's tile
#else
  (void)received;
  __trap();  // clusters are launched only where the sm_90a code runs (plan_launch)
#endif
}

// Thread 0 initialises the split-K finish's `received` barrier (one arrival: its own, with the
// bytes to expect) and fences it for the cluster; the __syncthreads after it and the cluster
// barrier in finish_tile order it before any peer's copy completes on it.
__device__ __forceinline__ void init_received(uint64_t* received) {
#ifdef VGA_SM90A_DEVICE
  if (gridDim.x > 1 && threadIdx.x == 0) {
    sm90::mbarrier_init(received, 1);
    sm90::fence_barrier_init();
  }
#else
  (void)received;
#endif
}

// A skinny kernel's shared memory: the row offset table and the `received` barrier, then the x
// ring, which the partial tile (and in a cluster its slots) reuses.
template <int kBPad>
constexpr int header_bytes() {
  return kBPad * 8 + 16;
}

template <int kRowsPerCta, int kBPad, int kStageBytes>
constexpr int smem_bytes(int slices) {
  constexpr int ring = kXStages * kStageBytes;
  const int partial = PartialLayout<kRowsPerCta, kBPad>::bytes(slices);
  return header_bytes<kBPad>() + (ring > partial ? ring : partial);
}

// ---------------------------------------------------------------- half types: mma.sync

// 128-row W tiles (one m16 tile a warp): they measured faster than 256-row tiles on every bench shape.
template <int kNTiles>
struct MmaConfig {
  static constexpr int kChunk = 64;  // reduction elements per step: 128 bytes of each W row
  static constexpr int kBPad = kNTiles * 8;
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kRowsPerCta = kWarps * kRowsPerWarp;
  static constexpr int kStageBytes = kBPad * kChunk * 2;
  // W chunks in flight per thread; each is 16 bytes * 4 (16 registers).
  static constexpr int kWDepth = kNTiles >= 16 ? 3 : 4;
  static constexpr int shared_bytes(int slices) { return smem_bytes<kRowsPerCta, kBPad, kStageBytes>(slices); }
};

template <typename T, int kNTiles>
__global__ void __launch_bounds__(kThreads, 1) skinny_mma_kernel(const SkinnyParams p) {
  using Cfg = MmaConfig<kNTiles>;
  constexpr int kChunk = Cfg::kChunk;
  constexpr int kBPad = Cfg::kBPad;
  constexpr int kDepth = Cfg::kWDepth;
  constexpr int kRowsPerCta = Cfg::kRowsPerCta;
  constexpr int kRowBytes = kChunk * 2;  // one staged x row

  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* row_offset = reinterpret_cast<int64_t*>(smem);
  uint64_t* received = reinterpret_cast<uint64_t*>(smem + kBPad * 8);
  unsigned char* body = smem + header_bytes<kBPad>();
  const uint32_t smem_base = sm90::smem_address(body);

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;   // mma "groupID": W row / x batch row within a tile
  const int quad = lane & 3;     // mma "threadID_in_group": which 16-byte vector of 32 k

  const int row0 = blockIdx.y * kRowsPerCta;
  const int k_begin = blockIdx.x * p.slice_len;
  const int k_end = min(p.reduction, k_begin + p.slice_len);
  const int span = max(0, k_end - k_begin);
  const int num_chunks = (span + kChunk - 1) / kChunk;
  const int full_chunks = span / kChunk;

  fill_row_offsets(p, row_offset, kBPad);
  init_received(received);
  __syncthreads();

  // This thread's W rows: half -> row warp*16 + group + 8*half; rows past K re-read row K-1
  // (valid memory; their results are never stored).
  const T* w_row[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int n = row0 + warp * Cfg::kRowsPerWarp + group + 8 * half;
    n = min(n, p.out_features - 1);
    w_row[half] = static_cast<const T*>(p.weight) + n * p.weight_stride_out;
  }

  // W registers: [depth][half][v] 16-byte vectors; vector v of a chunk covers k
  // [8 * (4v + quad), +8) -- the warp reads 64 contiguous bytes of each row per instruction.
  uint4 w_buf[kDepth][2][2];
  float acc[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  auto issue_w = [&](int chunk, uint4 (&dst)[2][2]) {
    const bool full = chunk < full_chunks;
    const int kc = k_begin + chunk * kChunk;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int v = 0; v < 2; ++v)
        dst[half][v] = load_w_vector<T>(w_row[half], kc + 8 * (4 * v + quad), k_end, full);
  };
  auto stage_x = [&](int chunk) {
    stage_x_chunk<T, kChunk, kBPad, true>(p, row_offset,
                                          smem_base + (chunk % kXStages) * Cfg::kStageBytes,
                                          k_begin + chunk * kChunk, k_end);
  };

  // Prologue: x chunks 0 .. kXStages-2 and W chunks 0 .. kDepth-1 in flight.
#pragma unroll
  for (int s = 0; s < kXStages - 1; ++s) {
    if (s < num_chunks) stage_x(s);
    cp_async_commit();
  }
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < num_chunks) issue_w(d, w_buf[d]);

  for (int base = 0; base < num_chunks; base += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int chunk = base + d;
      if (chunk >= num_chunks) break;
      cp_async_wait<kXStages - 2>();
      __syncthreads();  // x chunk `chunk` visible; every warp is done with chunk - 1's stage
      if (chunk + kXStages - 1 < num_chunks) stage_x(chunk + kXStages - 1);
      cp_async_commit();

      const uint32_t xs = smem_base + (chunk % kXStages) * Cfg::kStageBytes;
#pragma unroll
      for (int v = 0; v < 2; ++v) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const int b = nt * 8 + group;
          const int slot = (4 * v + quad) ^ ((group & 1) << 2);
          const uint4 xv = load_shared16(xs + b * kRowBytes + slot * 16);
          const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
          const uint4& lo = w_buf[d][0][v];  // row group
          const uint4& hi = w_buf[d][1][v];  // row group + 8
          const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w};
          const uint32_t wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            MmaOp<T>::run(acc[nt], wl[2 * s], wh[2 * s], wl[2 * s + 1], wh[2 * s + 1], xw[2 * s],
                          xw[2 * s + 1]);
          }
        }
      }
      if (chunk + kDepth < num_chunks) issue_w(chunk + kDepth, w_buf[d]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the x ring is free: reuse it for the partial tile

  // Partial tile, transposed (batch rows by out-features), in PartialLayout's order.
  const PartialLayout<kRowsPerCta, kBPad> layout(gridDim.x);
  float* partial = reinterpret_cast<float*>(body);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int row = warp * Cfg::kRowsPerWarp + group;
    const int b = nt * 8 + 2 * quad;
    partial[layout.offset(b, row)] = acc[nt][0];
    partial[layout.offset(b + 1, row)] = acc[nt][1];
    partial[layout.offset(b, row + 8)] = acc[nt][2];
    partial[layout.offset(b + 1, row + 8)] = acc[nt][3];
  }
  finish_tile<T, kRowsPerCta, kBPad>(p, smem_base, layout, received, row0);
}

// ---------------------------------------------------------------- fp32: SIMT FFMA

template <int kBPad>
struct SimtConfig {
  static constexpr int kChunk = 128;                 // 32 lanes x 4 floats
  static constexpr int kRowsPerWarp = 64 / kBPad;    // 64 accumulators per lane
  static constexpr int kRowsPerCta = kWarps * kRowsPerWarp;
  static constexpr int kStageBytes = kBPad * kChunk * 4;
  static constexpr int kWDepth = kRowsPerWarp >= 4 ? 2 : 8 / kRowsPerWarp;
  static constexpr int shared_bytes(int slices) { return smem_bytes<kRowsPerCta, kBPad, kStageBytes>(slices); }
};

template <int kBPad>
__global__ void __launch_bounds__(kThreads, 1) skinny_fp32_kernel(const SkinnyParams p) {
  using Cfg = SimtConfig<kBPad>;
  constexpr int kChunk = Cfg::kChunk;
  constexpr int kRows = Cfg::kRowsPerWarp;
  constexpr int kDepth = Cfg::kWDepth;
  constexpr int kRowsPerCta = Cfg::kRowsPerCta;

  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* row_offset = reinterpret_cast<int64_t*>(smem);
  uint64_t* received = reinterpret_cast<uint64_t*>(smem + kBPad * 8);
  unsigned char* body = smem + header_bytes<kBPad>();
  const uint32_t smem_base = sm90::smem_address(body);

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = blockIdx.y * kRowsPerCta;
  const int k_begin = blockIdx.x * p.slice_len;
  const int k_end = min(p.reduction, k_begin + p.slice_len);
  const int span = max(0, k_end - k_begin);
  const int num_chunks = (span + kChunk - 1) / kChunk;
  const int full_chunks = span / kChunk;

  fill_row_offsets(p, row_offset, kBPad);
  init_received(received);
  __syncthreads();

  const float* w_row[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int n = min(row0 + warp * kRows + r, p.out_features - 1);
    w_row[r] = static_cast<const float*>(p.weight) + n * p.weight_stride_out;
  }
  uint4 w_buf[kDepth][kRows];
  float acc[kRows][kBPad];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int b = 0; b < kBPad; ++b) acc[r][b] = 0.f;

  auto issue_w = [&](int chunk, uint4 (&dst)[kRows]) {
    const bool full = chunk < full_chunks;
    const int k = k_begin + chunk * kChunk + 4 * lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) dst[r] = load_w_vector<float>(w_row[r], k, k_end, full);
  };
  auto stage_x = [&](int chunk) {
    stage_x_chunk<float, kChunk, kBPad, false>(p, row_offset,
                                               smem_base + (chunk % kXStages) * Cfg::kStageBytes,
                                               k_begin + chunk * kChunk, k_end);
  };

#pragma unroll
  for (int s = 0; s < kXStages - 1; ++s) {
    if (s < num_chunks) stage_x(s);
    cp_async_commit();
  }
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < num_chunks) issue_w(d, w_buf[d]);

  for (int base = 0; base < num_chunks; base += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int chunk = base + d;
      if (chunk >= num_chunks) break;
      cp_async_wait<kXStages - 2>();
      __syncthreads();
      if (chunk + kXStages - 1 < num_chunks) stage_x(chunk + kXStages - 1);
      cp_async_commit();

      const uint32_t xs = smem_base + (chunk % kXStages) * Cfg::kStageBytes + lane * 16;
#pragma unroll
      for (int b = 0; b < kBPad; ++b) {
        const uint4 xv = load_shared16(xs + b * kChunk * 4);
        const float x0 = __uint_as_float(xv.x), x1 = __uint_as_float(xv.y);
        const float x2 = __uint_as_float(xv.z), x3 = __uint_as_float(xv.w);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint4& w = w_buf[d][r];
          float a = acc[r][b];
          a = fmaf(__uint_as_float(w.x), x0, a);
          a = fmaf(__uint_as_float(w.y), x1, a);
          a = fmaf(__uint_as_float(w.z), x2, a);
          a = fmaf(__uint_as_float(w.w), x3, a);
          acc[r][b] = a;
        }
      }
      if (chunk + kDepth < num_chunks) issue_w(chunk + kDepth, w_buf[d]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Butterfly reduce-scatter of the 64 accumulators over the 32 lanes: afterwards lane l holds
  // the warp totals of flat index 2l and 2l+1 (flat = r * kBPad + b). Fixed order.
  float v[64];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int b = 0; b < kBPad; ++b) v[r * kBPad + b] = acc[r][b];
#pragma unroll
  for (int step = 0; step < 5; ++step) {
    const int offset = 16 >> step;
    const int half_count = 32 >> step;
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      if (i < half_count) {
        const float send = upper ? v[i] : v[i + half_count];
        const float keep = upper ? v[i + half_count] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
      }
    }
  }
  const PartialLayout<kRowsPerCta, kBPad> layout(gridDim.x);
  float* partial = reinterpret_cast<float*>(body);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int flat = 2 * lane + i;
    const int r = flat / kBPad;
    const int b = flat - r * kBPad;
    partial[layout.offset(b, warp * kRows + r)] = v[i];
  }
  finish_tile<float, kRowsPerCta, kBPad>(p, smem_base, layout, received, row0);
}

// ---------------------------------------------------------------- host side

struct LaunchPlan {
  int row_tiles = 0;
  int slices = 1;     // cluster size along the reduction dim
  int slice_len = 0;  // multiple of the chunk
};

// Cluster split S in {1, 2, 4, 8}. A cluster must fit inside one GPC, so clusters of 4 or 8
// CTAs that each fill an SM can leave SMs idle (measured on the H200 for 1-CTA/SM kernels: 66
// clusters of 2 = 132 CTAs, but 30 of 4 = 120 and 15 of 8 = 120): `resident(S)` says how many
// CTAs fit at once (.ctas; 0: S unusable) and how many of them one to an SM (.one_per_sm). Take
// the smallest S whose parallelism per wave, CTAs / waves, reaches ~90% of the SMs; else the S
// with the most.
// With `one_cta_per_sm_rules` (sm90_skinny), an S whose CTAs would share SMs is not taken
//  * when its slices hold fewer than kMinDoubledSliceChunks k-blocks: a doubled SM carries two CTAs'
//    bytes and pays two ramps and exchanges, which a short slice does not amortise;
//  * at up to kMaxRowsOneCtaPerSm batch rows: so few rows leave a CTA's stream unslowed by its MMAs,
//    so the CTAs that run one an SM (half the SMs or more) already stream W at HBM speed.
// (Forced S and both rules measured: NOTES runs 145-146.) The skinny family plans without them: its
// CTAs hold a fixed depth of W register loads in flight, so at few rows two CTAs an SM stream faster
// than one (run 146: the rules took its half-type calls 1.04-1.22x at 1-16 rows).
constexpr int64_t kMinDoubledSliceChunks = 16;
constexpr int64_t kMaxRowsOneCtaPerSm = 16;

struct ClusterResidency {
  int64_t ctas;        // CTAs resident at once as clusters of S (0: S unusable)
  int64_t one_per_sm;  // of those, how many run one to an SM
};

template <typename Residency>
inline LaunchPlan plan_launch(const ForwardProblem& p, int rows_per_cta, int chunk, bool one_cta_per_sm_rules,
                              Residency resident) {
  LaunchPlan plan;
  plan.row_tiles = static_cast<int>(ceil_div(p.out_features, rows_per_cta));
  const int64_t chunks = ceil_div(p.reduction(), chunk);
  // Clusters only where the sm_90a code runs (Hopper): any other GPU runs the compute_80 PTX,
  // which has no cluster barrier or DSMEM, so each CTA would sum only its own partial tile.
  int max_slices = p.cc_major == 9 ? kMaxClusterSlices : 1;
  while (max_slices > 1 && (max_slices > rows_per_cta || chunks < 2 * max_slices)) max_slices /= 2;
  int slices = 1;
  const double want = 0.9 * p.sm_count;
  double best = -1.0;
  for (int s = 1; s <= max_slices; s *= 2) {
    const int64_t ctas = static_cast<int64_t>(plan.row_tiles) * s;
    const ClusterResidency fit = resident(s);
    const bool doubled = one_cta_per_sm_rules && ctas > fit.one_per_sm;
    const bool doubled_loses =
        doubled && (ceil_div(chunks, s) < kMinDoubledSliceChunks || p.rows() <= kMaxRowsOneCtaPerSm);
    if (fit.ctas <= 0 || doubled_loses) continue;
    const int64_t waves = ceil_div(ctas, fit.ctas);
    const double per_wave = static_cast<double>(ctas) / static_cast<double>(waves);
    if (per_wave >= want) {
      slices = s;
      break;
    }
    if (per_wave > best) {
      best = per_wave;
      slices = s;
    }
  }
  plan.slices = slices;
  plan.slice_len = static_cast<int>(ceil_div(chunks, slices) * chunk);
  return plan;
}

inline SkinnyParams make_params(const ForwardProblem& p, int slice_len) {
  SkinnyParams s;
  s.x = p.x;
  s.weight = p.weight;
  s.bias = p.bias;
  s.out = p.out;
  s.x_stride_shard = p.x_stride_shard;
  s.x_stride_outer = p.x_stride_outer;
  s.x_stride_inner = p.x_stride_inner;
  s.weight_stride_out = p.weight_stride_out;
  s.bias_stride = p.bias_stride;
  s.rows = static_cast<int>(p.rows());
  s.batch_inner = static_cast<int>(p.batch_inner);
  s.shard_width = static_cast<int>(p.shard_width);
  s.reduction = static_cast<int>(p.reduction());
  s.out_features = static_cast<int>(p.out_features);
  s.slice_len = slice_len;
  const int esize = dtype_size(p.dtype);
  const int vec = 16 / esize;
  auto stride_ok = [&](int64_t stride, int64_t extent) {
    return extent <= 1 || (stride * esize) % 16 == 0;
  };
  s.out_vectorized = is_aligned(p.out, 4 * esize) && p.out_features % 4 == 0;
  s.x_vectorized = is_aligned(p.x, 16) && (p.shard_width % vec == 0) &&
                   stride_ok(p.x_stride_shard, p.num_shards) &&
                   stride_ok(p.x_stride_outer, p.batch_outer) &&
                   stride_ok(p.x_stride_inner, p.batch_inner);
  return s;
}

// CTAs of kKernel resident at once as clusters of `slices` (cudaOccupancyMaxActiveClusters) and,
// over the CTAs an SM holds (cudaOccupancyMaxActiveBlocksPerMultiprocessor), how many of them one
// to an SM; asked once per kernel, device (the problem's, which the caller's device guard makes the
// current one) and cluster size. slices == 1: no limit that matters (extra CTAs form later waves,
// counted by the caller's own arithmetic only through waves = 1).
template <auto kKernel, int kThreadCount = kThreads>
inline ClusterResidency resident_cluster_ctas(int smem, int slices, int device, const char* family) {
  constexpr int64_t kUnlimited = int64_t(1) << 40;
  if (slices <= 1) return {kUnlimited, kUnlimited};
  // by device and log2(slices) - 1: {clusters, CTAs an SM}, -1 where the query failed
  static PerCurrentDevice<std::pair<int, int>, 3> cache;
  STD_TORCH_CHECK(slices == 2 || slices == 4 || slices == 8, "vga ", family, ": clusters of ", slices,
                  " CTAs; the split takes 2, 4 or 8");
  const int slot = slices == 2 ? 0 : slices == 4 ? 1 : 2;
  const auto [clusters, per_sm] = cache.get(device, slot, [&] {
    opt_in_shared_memory<kKernel>(smem, device, family);
    KernelLaunch launch(dim3(slices, 1, 1), kThreadCount, smem, nullptr, slices, false);
    int asked_clusters = 0;
    int asked_per_sm = 0;
    if (cudaOccupancyMaxActiveClusters(&asked_clusters, kKernel, &launch.config) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&asked_per_sm, kKernel, kThreadCount, smem) != cudaSuccess ||
        asked_clusters <= 0 || asked_per_sm <= 0) {
      cudaGetLastError();  // the query's failure is not the caller's error
      return std::pair<int, int>{-1, -1};
    }
    return std::pair<int, int>{asked_clusters, asked_per_sm};
  });
  if (clusters < 0 || per_sm < 0) {  // unknown: pairs only
    return slices == 2 ? ClusterResidency{kUnlimited, kUnlimited} : ClusterResidency{0, 0};
  }
  const int64_t ctas = static_cast<int64_t>(clusters) * slices;
  return {ctas, ctas / per_sm};
}

// Launch grid (slices, row_tiles) of kThreadCount-thread CTAs, as clusters of `slices` CTAs
// along grid x when slices > 1 (sm90_skinny launches through this too, programmatic: launch.cuh).
template <auto kKernel, int kThreadCount = kThreads, typename... Args>
inline void launch_skinny(const char* family, int smem, int device, const LaunchPlan& plan, cudaStream_t stream,
                          bool programmatic, const Args&... args) {
  opt_in_shared_memory<kKernel>(smem, device, family);
  KernelLaunch launch(dim3(plan.slices, plan.row_tiles, 1), kThreadCount, smem, stream, plan.slices, programmatic);
  launch(kKernel, args...);
}

// The shared memory a launch asks for depends on its split (a cluster's slots: PartialLayout), so
// the kernel opts in to the largest first.
template <auto kKernel, typename Cfg>
inline void plan_and_launch(const ForwardProblem& p, cudaStream_t stream) {
  opt_in_shared_memory<kKernel>(Cfg::shared_bytes(kMaxClusterSlices), p.device_index, "skinny");
  const LaunchPlan plan =
      plan_launch(p, Cfg::kRowsPerCta, Cfg::kChunk, /*one_cta_per_sm_rules=*/false, [&](int slices) {
        return resident_cluster_ctas<kKernel>(Cfg::shared_bytes(slices), slices, p.device_index, "skinny");
      });
  launch_skinny<kKernel>("skinny", Cfg::shared_bytes(plan.slices), p.device_index, plan, stream, /*programmatic=*/false,
                         make_params(p, plan.slice_len));
}

template <typename T>
inline void launch_mma(const ForwardProblem& p, cudaStream_t stream) {
  const int64_t rows = p.rows();
  const int n_tiles = rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
#define VGA_SKINNY_MMA_CASE(NT)                                                            \
  case NT:                                                                                 \
    plan_and_launch<skinny_mma_kernel<T, NT>, MmaConfig<NT>>(p, stream);                  \
    break;
  switch (n_tiles) {
    VGA_SKINNY_MMA_CASE(1)
    VGA_SKINNY_MMA_CASE(2)
    VGA_SKINNY_MMA_CASE(4)
    VGA_SKINNY_MMA_CASE(8)
  }
#undef VGA_SKINNY_MMA_CASE
}

// fp32 runs only up to kMaxFp32Rows rows (see skinny_refusal).
inline void launch_fp32(const ForwardProblem& p, cudaStream_t stream) {
  STD_TORCH_CHECK(p.rows() <= kMaxFp32Rows, "vga skinny: fp32 with more than ", kMaxFp32Rows,
                  " rows reached the launch (skinny_refusal refuses it)");
  if (p.rows() <= 8) {
    plan_and_launch<skinny_fp32_kernel<8>, SimtConfig<8>>(p, stream);
  } else {
    plan_and_launch<skinny_fp32_kernel<16>, SimtConfig<16>>(p, stream);
  }
}

}  // namespace skinny_detail

inline const char* skinny_refusal(const ForwardProblem& p) {
  if (p.dtype == DType::kFloat64) return "skinny: fp64 is not supported";
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return "skinny: unknown dtype";
  if (p.cc_major < 8) return "skinny: needs compute capability >= 8.0 (mma.sync, cp.async)";
  if (p.rows() < 1) return "skinny: no rows";
  if (p.rows() > skinny_detail::kMaxRows) return "skinny: more than 64 rows";
  if (p.dtype == DType::kFloat32 && p.rows() > skinny_detail::kMaxFp32Rows)
    return "skinny: fp32 with more than 16 rows";
  if (p.out_features < 1 || p.num_shards < 1 || p.shard_width < 1)
    return "skinny: empty K or reduction";
  if (p.reduction() >= (int64_t(1) << 31) - 1024 || p.out_features >= (int64_t(1) << 31) - 1024 ||
      p.batch_inner >= (int64_t(1) << 31))
    return "skinny: sizes past 2^31";
  const int64_t smallest_tile = p.dtype == DType::kFloat32 ? 32 : 128;  // rows of W per CTA
  if ((p.out_features + smallest_tile - 1) / smallest_tile > 65535)
    return "skinny: too many row tiles (grid.y)";
  if (p.weight_stride_in != 1) return "skinny: weight's inner stride must be 1";
  const int esize = dtype_size(p.dtype);
  if (!is_aligned(p.weight, 16) ||
      (p.out_features > 1 && (p.weight_stride_out * esize) % 16 != 0))
    return "skinny: weight rows not 16-byte aligned";
  if (p.sm_count < 1) return "skinny: unknown SM count";
  return nullptr;
}

inline void skinny_forward(const ForwardProblem& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kBFloat16:
      return skinny_detail::launch_mma<__nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return skinny_detail::launch_mma<__half>(p, stream);
    case DType::kFloat32:
      return skinny_detail::launch_fp32(p, stream);
    case DType::kFloat64:
      break;
  }
  STD_TORCH_CHECK(false, "vga skinny: float64 reached the launch (skinny_refusal refuses it)");
}

}  // namespace vga
