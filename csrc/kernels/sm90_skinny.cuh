// The "sm90_skinny" family: the skinny (decode, rows() <= 64) product on Hopper, streaming W
// with TMA instead of per-thread loads. Like `skinny` it is bound by HBM: every W element is
// used rows() times, so the kernel's job is to keep enough of W in flight to saturate HBM.
// ncu on skinny (per-thread 16-byte loads into a register ring, one __syncthreads per 128-byte
// chunk) measured 1.5-1.6 TB/s with 128 CTAs: the ring never held the bytes it was sized for.
// Here one producer thread keeps the whole ring full with bulk copies (no registers spent on
// bytes in flight, no CTA-wide barrier per chunk), and the tensor cores read shared memory.
//
// Tiling: the product is computed transposed, y^T = W x^T, so that the big dim (K, W's rows)
// is wgmma's M and the few batch rows are its N:
//   * A CTA owns 128 rows of W (two consumer warpgroups, one m64 each) times all batch rows
//     (N = 16, 32 or 64: rows() rounded up; the TMA box zero-fills rows past the batch), over
//     a slice of the reduction's k-blocks. k-blocks are (shard r, h0) pairs of 64 elements, so
//     W and x are read through the same 3-D tensor maps as sm90_gemm ((H, R, K) and (H, rows,
//     R)): one bulk copy each, zero-filled past H, and the concat is never materialised. Where
//     H % 64 is 16 or 32 the shards' tails are packed 4 or 2 to a k-block after the whole ones
//     (the kTailShards instantiations), as the GEMM core does.
//   * A stage is W's 128 x 64 block (16 KB) plus x's N x 64 block, 128-byte swizzled (a packed
//     tail k-block: a block a shard, 32- or 64-byte swizzled), both K-major: wgmma m64nNk16
//     with A = W, B = x straight from shared memory (the core's k-block chain, sm90/gemm.cuh's
//     mma_kblock, with both operands K-major as in its forward). As many stages as fit in 113 KB (4-6),
//     so two CTAs can share an SM and 64-96 KB of W is in flight per CTA.
//   * Warp 8 is the producer (one thread issues TMA); warps 0-7 consume and release each stage
//     through a full/empty mbarrier ring.
//   * Split-K over a thread-block cluster exactly as `skinny` does it (same launch plan, same
//     deterministic reduction of the fp32 partial tiles, each CTA's rows sent to their owner by
//     bulk copies, same epilogue: + bias, coalesced stores along K), because K / 128 alone rarely
//     fills 132 SMs at decode sizes. The tile and its slots reuse the ring.
//
// Refused (see sm90_skinny_refusal): anything sm90_gemm refuses (dtype not fp16/bf16, not
// Hopper, H % 8, 16-byte alignment of x and W and their strides, sizes >= 2^31), more than 64
// rows, and two batch dims that do not merge into one row stride.
#pragma once

#include <cstdint>

#include "skinny.cuh"
#include "sm90/ptx.cuh"
#include "sm90_gemm.cuh"
#include "sm90/views.cuh"

namespace vga {
namespace sm90_skinny {

constexpr int kBlockRows = 128;  // W rows per CTA: two consumer warpgroups x m64
constexpr int kBlockK = 64;      // one 128-byte swizzle row of half elements
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kWTileBytes = kBlockRows * kBlockK * 2;
using sm90::kSwizzleAlignment;
constexpr int kSharedBudget = 113 * 1024;  // two CTAs per SM (228 KB, 1 KB reserved per CTA)

template <int kN>
struct Config {
  static constexpr int kXTileBytes = kN * kBlockK * 2;
  static constexpr int kStageBytes = kWTileBytes + kXTileBytes;
  // room for up to 8 stages' full and empty barriers, and the split-K finish's `received`
  static constexpr int kBarrierBytes = (2 * 8 + 1) * sizeof(uint64_t);
  static constexpr int kStages = (kSharedBudget - kSwizzleAlignment - kBarrierBytes) / kStageBytes;
  static constexpr int kSharedBytes = kSwizzleAlignment + kStages * kStageBytes + kBarrierBytes;
  using Partial = skinny_detail::PartialLayout<kBlockRows, kN>;
  static_assert(kStages >= 2 && kStages <= 8, "stage count out of range");
  static_assert(Partial::kExchangeBytes <= kStages * kStageBytes, "the partial tile and its slots reuse the stages");
  static_assert(kXTileBytes % kSwizzleAlignment == 0, "x tiles stay 1024-byte aligned");
};

struct StreamArgs {
  skinny_detail::SkinnyParams epilogue;  // out, bias, bias_stride, rows, out_features
  int kblocks_per_shard;  // whole k-blocks a shard (with packed tails: H / 64, else ceil(H / 64))
  int num_kblocks;
  int kblocks_per_slice;
  int tail_kblock_begin;  // the first k-block of packed shard tails (num_kblocks when none)
  int tail_h;             // a shard's first tail column (H - H % 64)
};

// kTailShards 2 or 4: the shards' last H % 64 = 32 or 16 columns are packed that many shards to a
// k-block after the shards' whole k-blocks, as in the GEMM core (sm90/gemm.cuh): W's tail is one
// box a shard ([shard][128 rows][tail]), x's one box over the shards ([shard][kN][tail]), both
// swizzled as wide as their 32- or 64-byte rows, through the tail maps.
template <typename Element, int kN, int kTailShards>
__global__ void __launch_bounds__(kThreads, 1)
    skinny_stream_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                         const __grid_constant__ CUtensorMap x_tail_map,
                         const __grid_constant__ CUtensorMap w_tail_map, const StreamArgs args) {
#ifdef VGA_SM90A_DEVICE
  using namespace sm90;
  using Cfg = Config<kN>;
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAlignment - 1) & ~uintptr_t(kSwizzleAlignment - 1));
  uint8_t* w_tiles = shared;
  uint8_t* x_tiles = shared + Cfg::kStages * kWTileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Cfg::kStages * Cfg::kStageBytes);
  uint64_t* empty = full + Cfg::kStages;
  uint64_t* received = full + 16;  // (after room for 8 stages' full and empty barriers)

  const int row0 = blockIdx.y * kBlockRows;
  const int first_kblock = blockIdx.x * args.kblocks_per_slice;
  const int num_local = max(0, min(args.num_kblocks, first_kblock + args.kblocks_per_slice) - first_kblock);
  const int warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumerThreads / 32);  // one arrival per consumer warp
    }
    if (gridDim.x > 1) mbarrier_init(received, 1);  // the split-K finish's (skinny.cuh)
    fence_barrier_init();
  }
  __syncthreads();

  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;

  if (warp == kConsumerThreads / 32) {
    if (threadIdx.x % 32 == 0) {
      prefetch_tensor_map(&x_map);
      prefetch_tensor_map(&w_map);
      if (kTailShards > 0) {
        prefetch_tensor_map(&x_tail_map);
        prefetch_tensor_map(&w_tail_map);
      }
      wait_for_previous_grid();  // a programmatic launch (launch.cuh): the previous kernel's outputs
      allow_next_grid();         // (after the wait: ptx.cuh)
      int stage = 0;
      uint32_t phase = 0;
      // The whole k-blocks' (shard, h0), advanced by additions: one division a CTA, none a stage.
      const int shard_kblocks = max(args.kblocks_per_shard, 1);
      int shard = first_kblock / shard_kblocks;
      int h0 = (first_kblock - shard * shard_kblocks) * kBlockK;
      for (int i = 0; i < num_local; ++i) {
        const int kb = first_kblock + i;
        mbarrier_wait(&empty[stage], phase ^ 1);
        mbarrier_arrive_expect_tx(&full[stage], Cfg::kStageBytes);
        if (kTailShards > 0 && kb >= args.tail_kblock_begin) {
          constexpr int kRowBytes = 128 / (kTailShards > 0 ? kTailShards : 1);
          const int shard0 = (kb - args.tail_kblock_begin) * kTailShards;
#pragma unroll
          for (int s = 0; s < kTailShards; ++s) {
            tma_load_3d(w_tiles + stage * kWTileBytes + s * kBlockRows * kRowBytes, &w_tail_map, &full[stage],
                        args.tail_h, shard0 + s, row0);
          }
          tma_load_3d(x_tiles + stage * Cfg::kXTileBytes, &x_tail_map, &full[stage], args.tail_h, 0, shard0);
        } else {
          tma_load_3d(w_tiles + stage * kWTileBytes, &w_map, &full[stage], h0, shard, row0);
          tma_load_3d(x_tiles + stage * Cfg::kXTileBytes, &x_map, &full[stage], h0, 0, shard);
          h0 += kBlockK;
          if (h0 == args.kblocks_per_shard * kBlockK) {
            h0 = 0;
            ++shard;
          }
        }
        if (++stage == Cfg::kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    const int consumer = warp / 4;  // warpgroup: W rows [64 * consumer, +64) of the tile
    const bool warp_leader = threadIdx.x % 32 == 0;
    int stage = 0;
    uint32_t phase = 0;
    int previous_stage = 0;
    for (int i = 0; i < num_local; ++i) {
      mbarrier_wait(&full[stage], phase);
      if (kTailShards > 0 && first_kblock + i >= args.tail_kblock_begin) {  // a k-block of packed shard tails
        constexpr int kShards = kTailShards > 0 ? kTailShards : 1;
        constexpr int kRowBytes = 128 / kShards;
        mma_kblock<4, GemmKind::kForward, Element, kN>(
            acc, k_major_swizzled_descriptor(w_tiles + stage * kWTileBytes + consumer * 64 * kRowBytes, kRowBytes),
            shard_tail_k_steps<kBlockRows, kShards>(),
            k_major_swizzled_descriptor(x_tiles + stage * Cfg::kXTileBytes, kRowBytes), shard_tail_k_steps<kN, kShards>(),
            /*first=*/false);
      } else {
        mma_kblock<4, GemmKind::kForward, Element, kN>(
            acc, k_major_swizzle128_descriptor(w_tiles + stage * kWTileBytes + consumer * (kWTileBytes / 2)),
            even_k_steps<0>(), k_major_swizzle128_descriptor(x_tiles + stage * Cfg::kXTileBytes), even_k_steps<0>(),
            /*first=*/false);
      }
      wgmma_wait_group<1>();
      if (i > 0 && warp_leader) mbarrier_arrive(&empty[previous_stage]);
      previous_stage = stage;
      if (++stage == Cfg::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmma_wait_group<0>();
  }
  __syncthreads();  // every stage is consumed: the ring becomes the partial tile
  wait_for_previous_grid();  // (every thread, before the stores)

  // Partial tile, transposed (batch rows by out-features), in skinny's PartialLayout order.
  const typename Cfg::Partial layout(gridDim.x);
  float* partial = reinterpret_cast<float*>(shared);
  if (warp < kConsumerThreads / 32) {
    const int lane = threadIdx.x % 32;
    const int row = (warp / 4) * 64 + (warp % 4) * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int b = j * 8 + 2 * (lane % 4) + e;
          partial[layout.offset(b, row + 8 * half)] = acc[4 * j + 2 * half + e];
        }
  }
  skinny_detail::finish_tile<Element, kBlockRows, kN, kThreads>(args.epilogue, smem_address(partial), layout, received,
                                                               row0);
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host

template <typename Element, int kN, int kTailShards>
inline void launch_stream(const ForwardProblem& p, cudaStream_t stream) {
  using Cfg = Config<kN>;
  constexpr auto kKernel = skinny_stream_kernel<Element, kN, kTailShards>;
  const int64_t H = p.shard_width;
  const sm90::RowView rows = sm90::row_view(p);  // 3-D (checked by the refusal)
  const CUtensorMap x_map = sm90::x_tensor_map(p, rows, kBlockK, kN);
  const CUtensorMap w_map = sm90::w_tensor_map(p, kBlockK, kBlockRows);
  const int64_t tail = kTailShards > 0 ? kBlockK / kTailShards : 0;
  // (unused without packed tails: the main views again)
  const sm90::TailMaps tails = kTailShards > 0 ? packed_tail_maps(p, rows, tail, kN, kBlockRows) : sm90::TailMaps{x_map, w_map};

  StreamArgs args;
  args.kblocks_per_shard = static_cast<int>(kTailShards > 0 ? H / kBlockK : ceil_div(H, kBlockK));
  args.tail_kblock_begin = static_cast<int>(p.num_shards) * args.kblocks_per_shard;
  args.tail_h = static_cast<int>(H - tail);
  const int64_t tail_kblocks = kTailShards > 0 ? ceil_div(p.num_shards, kTailShards) : 0;
  args.num_kblocks = args.tail_kblock_begin + static_cast<int>(tail_kblocks);
  // The split: skinny's plan (slices chosen against the clusters that can be resident), with the rules
  // that keep a split from doubling CTAs on SMs where that measured slower (plan_launch).
  const skinny_detail::LaunchPlan plan =
      skinny_detail::plan_launch(p, kBlockRows, kBlockK, /*one_cta_per_sm_rules=*/true, [&](int slices) {
        return skinny_detail::resident_cluster_ctas<kKernel, kThreads>(Cfg::kSharedBytes, slices, p.device_index,
                                                                       "sm90_skinny");
      });
  args.kblocks_per_slice = static_cast<int>(ceil_div(args.num_kblocks, plan.slices));
  args.epilogue = skinny_detail::make_params(p, 0);

  skinny_detail::launch_skinny<kKernel, kThreads>("sm90_skinny", Cfg::kSharedBytes, p.device_index, plan, stream,
                                                  /*programmatic=*/true, x_map, w_map, tails.a, tails.b, args);
}

// Packed shard tails where H % 64 is 16 or 32 (sm90_gemm_packed_tail): 4 or 2 shards a k-block.
template <typename Element, int kN>
inline void launch_packed_or_not(const ForwardProblem& p, cudaStream_t stream) {
  const int64_t tail = sm90_gemm_packed_tail(p);
  if (tail == 16) return launch_stream<Element, kN, 4>(p, stream);
  if (tail == 32) return launch_stream<Element, kN, 2>(p, stream);
  return launch_stream<Element, kN, 0>(p, stream);
}

template <typename Element>
inline void launch_for_rows(const ForwardProblem& p, cudaStream_t stream) {
  const int64_t rows = p.rows();
  if (rows <= 16) return launch_packed_or_not<Element, 16>(p, stream);
  if (rows <= 32) return launch_packed_or_not<Element, 32>(p, stream);
  return launch_packed_or_not<Element, 64>(p, stream);
}

}  // namespace sm90_skinny

inline const char* sm90_skinny_refusal(const ForwardProblem& p) {
  if (p.rows() > skinny_detail::kMaxRows) return "more than 64 rows";
  if (const char* why = sm90_gemm_refusal(p)) return why;
  if (sm90::row_view(p).four_d) return "two batch dims that do not merge into one row stride";
  if (ceil_div(p.out_features, sm90_skinny::kBlockRows) > 65535) return "too many row tiles (grid.y)";
  if (p.sm_count < 1) return "unknown SM count";
  return nullptr;
}

inline void sm90_skinny_forward(const ForwardProblem& p, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16) {
    sm90_skinny::launch_for_rows<__nv_bfloat16>(p, stream);
  } else {
    sm90_skinny::launch_for_rows<__half>(p, stream);
  }
}

}  // namespace vga
