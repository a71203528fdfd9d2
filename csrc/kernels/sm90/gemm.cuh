// The Hopper GEMM core: one warp-specialised, persistent TMA + wgmma kernel that runs the
// forward, grad_x and grad_weight products, each a GemmKind that fixes how a stage's operand
// tiles are loaded (views.cuh) and whether wgmma reads them K-major or MN-major.
//
//   kind          M x N, reduction        A (wgmma M side)              B (wgmma N side)
//   kForward      rows x K, over R*H      x, K-major: (H, rows, R)      W, K-major: (H, R, K)
//   kGradInput    rows x R*H, over K      grad_out, K-major: (K, rows)  W, MN-major: (R*H, K)
//   kGradWeight   K x R*H, over rows      grad_out, MN-major: (K, rows) x, MN-major: (H, rows, R)
//   kForwardSwapped  K x rows, over R*H   W, K-major: (H, R, K)         x, K-major: (H, rows, R)
//
// kForwardSwapped is the forward computed transposed, y^T = W x^T, for the row counts that
// 128-row tiles pad badly (100 -> 128, 333 -> 384): W's rows are M in 128-row tiles and the tokens
// are N in tiles of 96, 112, 176 or 240 (the widths problem.cuh's is_token_width names), with no
// reduction split and no packed shard tails; its epilogue stores the tile transposed.
//
// Tiling: 128 x kBlockN output tiles (kBlockN = 256: highest operand reuse that fits the
// registers, for outputs with waves of tiles; 192: 4/3 the tiles, for outputs whose 256-wide
// tiles fill the last round badly (1.2 rounds of them are 2 rounds) at almost the same reuse; 128
// and 64: two and four times the tiles, for the outputs whose wider tiles leave SMs idle: 100-1024
// rows, K or R*H <= ~1500, as cuBLAS picks its 128 x 64 tiles there; and the forward's 64 x 64 tiles,
// kTileM = kNarrowBlockM, one consumer warpgroup, where even those leave most SMs idle: twice the
// CTAs, each copying 16 instead of 24 KB a k-block, as such calls are bound by each SM's L2 -> SM
// traffic; unsplit, or split in the cluster where their clusters fit at once),
// k-blocks of 64 elements (one
// 128-byte swizzle row; a group's last k-block runs only the k steps that hold data; the forward
// packs shards' 16- or 32-column tails 4 or 2 to a k-block, as a stage costs what it copies, zero
// fill included, not the data it holds: kTailShards instantiations). Other widths that are not a
// multiple of 64 (112, 136, 48, ...) run the forward's k-blocks along the concatenation instead
// (kSpanShards instantiations): a TMA box cannot cross a shard, so the producer warpgroup copies
// those A tiles with cp.async, 16 bytes (8 columns of one shard) a copy, while W, whose rows are
// the concatenation already, stays one TMA box a half (R = 32, H = 112: 56 k-blocks a tile
// instead of 64). grad_weight's N tiles run along the concatenation the same way for those widths
// (its B columns by cp.async, A shared by a pair of column tiles), where a tile a shard would
// leave part of each tile empty (H = 80: 80 of 128 columns). Warpgroup 0
// is the producer (its first warp walks the tiles, one elected lane issues TMA), warpgroups 1-2
// (1 of a narrow tile) each own 64 rows of the tile (one m64nNk16 wgmma chain, N / 2 fp32
// accumulators a thread). As
// many stages as fit in 227 KB (4 at 256, 5 at 192, 7 at 128, 8 at 64) form a full/empty mbarrier
// ring. CTAs run in clusters of 2: along M, both tiles of a cluster use the same B panel, each CTA
// loads half of it (alternate boxes: 2 + 1 of a 192-wide MN-major panel) and multicasts it to both
// (L2 -> SM traffic per tile 48 -> 32 KB a k-block at 256, where the unshared panel would need
// ~9 TB/s of L2 bandwidth); along N (one or an odd number of row tiles, and always at 64 wide,
// where A is the larger tile, or as large, and an MN-major B is a single box) they share the A
// panel the same way (a narrow tile's single A box: the first CTA copies it to both). Or, for
// few tiles, in clusters of S = 2, 4 or 8 that split one tile's reduction (up to 192 wide) and
// add it up in distributed shared memory. The tile walk and the split of the reduction
// are schedule.cuh's; the stores are epilogue.cuh's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../element_types.cuh"
#include "../launch.cuh"
#include "../per_device.cuh"
#include "../problem.cuh"
#include "../shared_memory_opt_in.cuh"
#include "epilogue.cuh"
#include "ptx.cuh"
#include "schedule.cuh"
#include "views.cuh"

namespace vga {
namespace sm90 {

enum class GemmKind { kForward, kGradInput, kGradWeight, kForwardSwapped };

// A tile of kTileM rows (kBlockM, or the forward's kNarrowBlockM) has a consumer warpgroup a
// kConsumerRows rows (schedule.cuh).
template <int kTileM>
constexpr int kConsumersOf = kTileM / kConsumerRows;
template <int kTileM>
constexpr int kThreadsOf = 128 * (1 + kConsumersOf<kTileM>);
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
// A consumer's part of an A tile: its rows (or, MN-major, columns) x a k-block, one TMA box (8 KB).
constexpr int kAPartBytes = kConsumerRows * kBlockK * 2;
// An MN-major TMA box: 64 columns (one 128-byte swizzle row of 16-bit elements) x a k-block (8 KB).
constexpr int kMnBlockBytes = 64 * kBlockK * 2;

template <int kBlockN, int kTileM = kBlockM>
struct TileShape {
  static constexpr int kATileBytes = kTileM * kBlockK * 2;
  static constexpr int kBTileBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr int kBiasBytes = kConsumersOf<kTileM> * kBlockN * sizeof(float);
  static constexpr int kSharedBudget = 227 * 1024;
  // a full and an empty barrier a stage, and the in-cluster sum's (with one unused after it: the
  // bias rows stay 16-byte aligned)
  static constexpr int kBarrierBytes(int stages) { return (2 * stages + 2) * int(sizeof(uint64_t)); }
  static constexpr int kStages =
      std::min(8, (kSharedBudget - kSwizzleAlignment - kBarrierBytes(8) - kBiasBytes) / kStageBytes);
  static constexpr int kSharedBytes = kSwizzleAlignment + kStages * kStageBytes + kBarrierBytes(kStages) + kBiasBytes;
  static_assert(is_core_width(kBlockN) || is_token_width(kBlockN), "wgmma N of the core");
  static_assert(kStageBytes % kSwizzleAlignment == 0, "stages stay 1024-byte aligned");
  static_assert(PartialTile<kBlockN, kTileM>::kBytes <= kStages * kStageBytes, "the partial tile reuses the stages");
};

// The forward's views of its packed shard tails (unused by the other kinds): x and W through their
// usual views, with boxes of the tail columns (H % 64 = 16 or 32: 32- or 64-byte rows, swizzled as
// wide). A k-block of them holds 64 / (H % 64) shards: A is one box over those shards a 64-row
// part (a [shard][row][tail] block each), B one box a shard a half ([shard][row][tail] blocks of
// the whole tile width), so that each shard's k steps are one K-major tile for wgmma.
struct TailMaps {
  CUtensorMap a;
  CUtensorMap b;
};

// The operand that kSpanShards copies along the concatenation by cp.async: the forward's A or
// grad_weight's B (the other one stays TMA's).
template <GemmKind kKind, bool kSpanShards>
struct SpanCopies {
  static constexpr bool kA = kSpanShards && kKind == GemmKind::kForward;
  static constexpr bool kB = kSpanShards && kKind == GemmKind::kGradWeight;
};

// B's parts a stage: the forward's two K-major halves (W's rows, or the swapped forward's tokens),
// or kBlockN / 64 MN-major boxes; and each part's bytes.
template <GemmKind kKind, int kBlockN>
constexpr int kBPartsOf = kKind == GemmKind::kForward || kKind == GemmKind::kForwardSwapped ? 2 : kBlockN / 64;
template <GemmKind kKind, int kBlockN>
constexpr int kBPartBytesOf = TileShape<kBlockN>::kBTileBytes / kBPartsOf<kKind, kBlockN>;

template <GemmKind kKind>
struct Majorness {
  static constexpr int kTransA = kKind == GemmKind::kGradWeight ? 1 : 0;
  static constexpr int kTransB = kKind == GemmKind::kForward || kKind == GemmKind::kForwardSwapped ? 0 : 1;
};

#ifdef VGA_SM90A_DEVICE

// One TMA copy, to this CTA only or to the same offset of every CTA of the cluster.
__device__ __forceinline__ void copy_3d(bool multicast, void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                        int c2) {
  constexpr uint16_t kWholeCluster = (1u << kClusterM) - 1;
  if (multicast) {
    tma_load_3d_multicast(dst, map, bar, kWholeCluster, c0, c1, c2);
  } else {
    tma_load_3d(dst, map, bar, c0, c1, c2);
  }
}
__device__ __forceinline__ void copy_4d(bool multicast, void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                        int c2, int c3) {
  constexpr uint16_t kWholeCluster = (1u << kClusterM) - 1;
  if (multicast) {
    tma_load_4d_multicast(dst, map, bar, kWholeCluster, c0, c1, c2, c3);
  } else {
    tma_load_4d(dst, map, bar, c0, c1, c2, c3);
  }
}

// Where the producer's next k-block of a tile lies, advanced by additions: the producer is one
// warp, and its instructions a stage bound the stage rate (run 43: three integer divisions a
// stage made grad_weight's producer ~1.5x slower than grad_x's, and its consumers waited on it).
struct LoadCursor {
  int group;     // the reduction group: a shard (forward), an outer batch index (grad_weight), 0 (grad_x)
  int k;         // the k-block's first element within the group
  int b_shard;   // grad_weight: the shard and column within it of the tile's first B column
  int b_column;
};

// The first element of k-block `kb` within its reduction group (the producer's cursor starts
// there; the consumers count from it which k-block is a group's last, partly filled one).
__device__ __forceinline__ int k_in_group(int kb, int group, const CoreArgs& args) {
  return (kb - group * args.kblocks_per_group.divisor) * kBlockK;
}

__device__ __forceinline__ LoadCursor load_cursor(const TileCoord& c, const CoreArgs& args) {
  LoadCursor cur;
  cur.group = fast_divide(c.kb_begin, args.kblocks_per_group);
  cur.k = k_in_group(c.kb_begin, cur.group, args);
  cur.b_shard = c.n_group;
  cur.b_column = c.n0;
  if (args.b_shard_width.divisor > 0) {  // one group spanning the shards
    cur.b_shard = fast_divide(c.n0, args.b_shard_width);
    cur.b_column = c.n0 - cur.b_shard * args.b_shard_width.divisor;
  }
  return cur;
}

__device__ __forceinline__ void advance(LoadCursor& cur, int group_elements) {
  cur.k += kBlockK;
  if (cur.k == group_elements) {
    cur.k = 0;
    ++cur.group;
  }
}

// How many k-blocks' wgmma groups a consumer keeps in flight (a stage goes back to the producers
// that many k-blocks after its MMAs were issued). Two for the backward products' 64- and 128-wide
// tiles, whose operands are MN-major (wgmma's transpose path): graph_calls.py timed grad_x and
// grad_weight at 64 wide 4-14% faster with two (run 102, H200: R=40, H=128, K=5120 grad_x at 4096
// rows 450 -> 388 µs), and where the rule picks 64 or 128 wide up to 14% faster, nowhere slower
// beyond the runs' spread. One elsewhere: the forward (both operands K-major) lost 2-10% at 64 wide
// (run 101, H100), and the 4- and 5-stage rings of the 256- and 192-wide tiles, whose producers run
// a stage shorter with two, lost up to 9% (grad_weight at 256 wide).
template <GemmKind kKind>
constexpr int mma_groups_in_flight(int stages) {
  return (kKind == GemmKind::kGradInput || kKind == GemmKind::kGradWeight) && stages >= 7 ? 2 : 1;
}

// The next stage of the ring (and its phase after a wrap), for the producer and the consumers alike.
template <int kStages>
__device__ __forceinline__ void next_stage(int& stage, uint32_t& phase) {
  if (++stage == kStages) {
    stage = 0;
    phase ^= 1;
  }
}

// The stage `back` k-blocks before `stage` (a consumer walks the ring one stage a k-block).
template <int kStages>
__device__ __forceinline__ int stage_before(int stage, int back) {
  return stage >= back ? stage - back : stage - back + kStages;
}

// How many of a tile's operand parts (from the first) hold any of the product: A's 64-row boxes
// (two, or a narrow tile's one; rows of the tile past m_inner have none), and B's kBParts parts
// where the output's columns run along them (the forward's and grad_x's B; grad_weight's B columns
// may cross shards and are all copied). A box wholly past its extent is not copied: TMA would
// only zero-fill it, and that costs at least what a full box costs (run 125's forced timings,
// H100: at K = 8192, 64 rows took 26-30% longer than 100 or 128 with 64-wide tiles, 14-17% with
// 128-wide ones; the swapped forward's 176-token tiles 85-91 µs at 256 rows, whose last tile's
// second half is empty, against 66-73 at 333). Its part of the stage keeps stale data, which
// reaches only output rows (or columns) past the extent, which the epilogues never store; the
// in-cluster and grid splits sum them into rows (columns) equally unstored.
struct LiveParts {
  int a;
  int b;
};

template <GemmKind kKind, int kBlockN, int kTileM>
__device__ __forceinline__ LiveParts live_parts(const TileCoord& c, const CoreArgs& args) {
  constexpr int kBParts = kBPartsOf<kKind, kBlockN>;
  LiveParts live{kTileM > kConsumerRows && args.m_inner - c.inner0 > kConsumerRows ? 2 : 1, kBParts};
  if constexpr (kKind != GemmKind::kGradWeight) {
    constexpr int kPartWidth = kBlockN / kBParts;
    const int columns_left = args.n_group_width - c.n0;
    live.b = columns_left >= kBlockN ? kBParts : std::max(1, (columns_left + kPartWidth - 1) / kPartWidth);
  }
  return live;
}

// The producer's copies for k-block `kb` (at `cur`) of tile `c` into one stage (all complete on
// `bar`). A is a box a consumer (kAPartBytes: two, one of a narrow tile); B is two K-major halves (the
// forward's W rows) or kBlockN / 64 MN-major boxes. The operand the cluster shares is split
// between its CTAs, each multicasting its part; the other one each CTA loads whole for itself.
// The forward's packed tail k-blocks come through the tail maps, from shard (kb - first) * shards.
// With kSpanShards x's operand is not copied here (the forward's A: copy_span_kblock, pairs always of
// row tiles; grad_weight's B: copy_span_columns, pairs always of column tiles).
template <GemmKind kKind, int kBlockN, bool kInCluster, int kTailShards, bool kSpanShards>
__device__ __forceinline__ void load_stage(uint8_t* a_dst, uint8_t* b_dst, const CUtensorMap* a_map,
                                           const CUtensorMap* b_map, const TailMaps* tails, uint64_t* bar,
                                           const TileCoord& c, const LiveParts& live, const LoadCursor& cur, int kb,
                                           uint32_t cta_rank, const CoreArgs& args) {
  constexpr int kBParts = kBPartsOf<kKind, kBlockN>;
  constexpr bool kCopiesA = SpanCopies<kKind, kSpanShards>::kA;
  constexpr bool kCopiesB = SpanCopies<kKind, kSpanShards>::kB;
  constexpr int kBPartBytes = kBPartBytesOf<kKind, kBlockN>;
  const bool share_a = args.cluster_along_n != 0;
  const int rank = static_cast<int>(cta_rank);
  // The reduction coordinate: (shard, h0) of x and W, k0 of grad_out and W, (outer, row0) of grad_out and x.
  const int shard = cur.group, h0 = cur.k, k0 = cur.k, outer = cur.group, row0 = cur.k;
  const bool tail = kTailShards > 0 && kb >= args.tail_kblock_begin;
  const int tail_shard = (kb - args.tail_kblock_begin) * kTailShards;
  auto load_a = [&](int part, bool multicast) {  // part's consumer rows (or columns) of the tile
    uint8_t* dst = a_dst + part * kAPartBytes;
    if constexpr (kKind == GemmKind::kForward) {
      if (tail && args.x_4d) {
        copy_4d(multicast, dst, &tails->a, bar, args.tail_h, c.inner0 + kConsumerRows * part, c.outer, tail_shard);
      } else if (tail) {
        copy_3d(multicast, dst, &tails->a, bar, args.tail_h, c.inner0 + kConsumerRows * part, tail_shard);
      } else if (args.x_4d) {
        copy_4d(multicast, dst, a_map, bar, h0, c.inner0 + kConsumerRows * part, c.outer, shard);
      } else {
        copy_3d(multicast, dst, a_map, bar, h0, c.inner0 + kConsumerRows * part, shard);
      }
    } else if constexpr (kKind == GemmKind::kForwardSwapped) {  // W's rows
      copy_3d(multicast, dst, a_map, bar, h0, shard, c.inner0 + kConsumerRows * part);
    } else if constexpr (kKind == GemmKind::kGradInput) {
      copy_3d(multicast, dst, a_map, bar, k0, c.inner0 + kConsumerRows * part, 0);
    } else {
      copy_3d(multicast, dst, a_map, bar, c.inner0 + kConsumerRows * part, row0, outer);
    }
  };
  auto load_b = [&](int part, bool multicast) {
    uint8_t* dst = b_dst + part * kBPartBytes;
    if constexpr (kKind == GemmKind::kForward) {
      if (tail) {  // shard s's block of the tile's rows: [s][kBlockN][tail], this half at its half
        constexpr int kRowBytes = kTailShards > 0 ? 128 / kTailShards : 128;
#pragma unroll
        for (int s = 0; s < kTailShards; ++s) {
          copy_3d(multicast, b_dst + (s * kBlockN + part * (kBlockN / 2)) * kRowBytes, &tails->b, bar, args.tail_h,
                  tail_shard + s, c.n0 + part * (kBlockN / 2));
        }
      } else {
        copy_3d(multicast, dst, b_map, bar, h0, shard, c.n0 + part * (kBlockN / 2));
      }
    } else if constexpr (kKind == GemmKind::kForwardSwapped) {  // the tokens: x's rows (of one outer index)
      if (args.x_4d) {
        copy_4d(multicast, dst, b_map, bar, h0, c.n0 + part * (kBlockN / 2), c.n_group, shard);
      } else {
        copy_3d(multicast, dst, b_map, bar, h0, c.n0 + part * (kBlockN / 2), shard);
      }
    } else if constexpr (kKind == GemmKind::kGradInput) {
      copy_3d(multicast, dst, b_map, bar, c.n0 + 64 * part, k0, 0);
    } else {
      int column = cur.b_column + 64 * part;  // within the shard
      int b_shard = cur.b_shard;
      // One group spanning the shards: a 64-column box never straddles two (H % 64 == 0); without
      // it the columns past the group's width are past H, zero-filled.
      const int shard_width = args.b_shard_width.divisor;
      while (shard_width > 0 && column >= shard_width) {
        column -= shard_width;
        ++b_shard;
      }
      copy_4d(multicast, dst, b_map, bar, column, row0, outer, b_shard);
    }
  };
  if constexpr (kInCluster) {  // the cluster's CTAs share no operand
    if (!kCopiesA) {
      load_a(0, false);
      if (live.a > 1) load_a(1, false);
    }
    if (!kCopiesB) {
#pragma unroll
      for (int part = 0; part < kBParts; ++part) {
        if (part < live.b) load_b(part, false);
      }
    }
  } else if (share_a) {
    if (rank < live.a) load_a(rank, true);  // (never with the forward's kSpanShards: schedule.cuh's pair_columns)
    if (c.exists && !kCopiesB) {
#pragma unroll
      for (int part = 0; part < kBParts; ++part) {
        if (part < live.b) load_b(part, false);
      }
    }
  } else if constexpr (kBParts >= kClusterM && !kCopiesB) {
    if (c.exists && !kCopiesA) {
      load_a(0, false);
      if (live.a > 1) load_a(1, false);
    }
#pragma unroll
    for (int part = 0; part < kBParts; ++part) {  // parts rank, rank + kClusterM, ... (3 of 192 columns: 2 and 1)
      if (part % kClusterM == rank && part < live.b) load_b(part, true);
    }
  } else {
    // one MN-major box is not split between the pair, nor is a B copied by cp.async: such tiles
    // pair columns (schedule.cuh)
    __trap();
  }
}

// kSpanShards: the producer warpgroup's threads copy x along the concatenation, the forward's A or
// grad_weight's B, 16 bytes a copy into a 128-byte-swizzled row of 8 such chunks.
constexpr int kSpanCopyThreads = 128;
constexpr int kSpanRowsPerPass = kSpanCopyThreads / 8;  // 8 copies of 16 bytes a 128-byte row

// What a copying thread needs of its tile: thread t copies chunk t % 8 (columns 8 (t % 8) .. + 7
// of a k-block) of tile rows t / 8 + 16 i, i < 8, so a warp's copy instruction covers 4 whole
// 128-byte rows; `rows` of those 8 exist (none of an idle CTA's nonexistent tile).
struct SpanRows {
  int64_t first_row;  // element offset of the thread's first row in its shard
  int rows;
};

// Column `column` of the concatenation in x, from `row_base` (the row's offset as if in shard 0).
template <typename Element>
__device__ __forceinline__ const Element* concat_column(const Element* row_base, int column, const CoreArgs& args) {
  const int shard = fast_divide(column, args.x_shard_width);
  return row_base + static_cast<int64_t>(shard) * args.x_shard_stride + (column - shard * args.x_shard_width.divisor);
}

// A copying thread's 16-byte chunk of its first row in a 128-byte-swizzled tile: row r's chunk q
// lies at r * 128 + (q ^ r % 8) * 16, as a TMA box writes it.
__device__ __forceinline__ uint32_t span_copy_destination(const uint8_t* tile, int thread) {
  const int chunk = thread % 8;
  const int row = thread / 8;
  return smem_address(tile) + row * 128 + ((chunk ^ (row % 8)) * 16);
}

template <typename Element>
__device__ __forceinline__ SpanRows span_rows(const TileCoord& c, int thread, const CoreArgs& args) {
  const int inner = c.inner0 + thread / 8;
  SpanRows r;
  r.first_row = static_cast<int64_t>(c.outer) * args.x_outer_stride + static_cast<int64_t>(inner) * args.x_inner_stride;
  r.rows = c.exists ? max(0, min(kBlockM / kSpanRowsPerPass, (args.m_inner - inner + kSpanRowsPerPass - 1) / kSpanRowsPerPass)) : 0;
  return r;
}

// k-block `kb` of the tile's x rows, columns 64 kb .. + 63 of the concatenation (one or more
// shards; each 16-byte copy stays in one, as H % 8 == 0), into the 128-byte-swizzled K-major
// layout a TMA box gives (span_copy_destination); columns past R * H are zero-filled. The copies
// complete on the stage's full barrier (cp_async_arrive).
// (TMA boxes zero-fill rows past the tile too; here those rows keep stale data, which only the
// unstored output rows see.)
template <typename Element>
__device__ __forceinline__ void copy_span_kblock(uint8_t* a_dst, int kb, const SpanRows& r, int thread,
                                                 const CoreArgs& args) {
  const int column = kb * kBlockK + (thread % 8) * 8;
  const bool column_valid = column < args.x_columns;
  const Element* x = static_cast<const Element*>(args.x);
  const Element* src = concat_column(x + r.first_row, column, args);
  const int64_t pass_stride = kSpanRowsPerPass * args.x_inner_stride;
  const uint32_t dst = span_copy_destination(a_dst, thread);
  // Rows past the tile's last are not copied (their output rows are never stored); columns past
  // R * H are zero-filled, as they would add to every row (a zero-filled copy reads nothing: x).
#pragma unroll
  for (int i = 0; i < kBlockM / kSpanRowsPerPass; ++i) {
    if (i < r.rows) cp_async16(dst + i * kSpanRowsPerPass * 128, column_valid ? src : x, column_valid ? 16 : 0);
    src += pass_stride;
  }
}

// grad_weight's B with kSpanShards: k-block `cur` (x's rows cur.k .. + 63 of outer index
// cur.group) of the tile's columns n0 .. n0 + kBlockN - 1 of the concatenation (one or more shards;
// each 16-byte copy stays in one, as H % 8 == 0), into the kBlockN / 64 MN-major boxes a TMA copy
// gives (box p: columns 64 p .. + 63, each as span_copy_destination lays out). Thread t copies
// chunk t % 8 of k rows t / 8 + 16 i of every box. Rows past the group's are zero-filled: they
// would add to every output (A's rows there are TMA's zeros, and 0 * NaN is NaN); columns past R * H
// too (they reach only output columns that are never stored, but must not read past x).
template <typename Element, int kBlockN>
__device__ __forceinline__ void copy_span_columns(uint8_t* b_dst, const TileCoord& c, const LoadCursor& cur,
                                                  int thread, const CoreArgs& args) {
  const int row = thread / 8;
  const Element* x = static_cast<const Element*>(args.x);
  const int rows_left = args.k_group_width - cur.k - row;  // the group's rows from the thread's first
  const Element* row_base = x + static_cast<int64_t>(cur.group) * args.x_outer_stride +
                            static_cast<int64_t>(cur.k + row) * args.x_inner_stride;
  const int64_t pass_stride = kSpanRowsPerPass * args.x_inner_stride;
  const uint32_t dst = span_copy_destination(b_dst, thread);
#pragma unroll
  for (int part = 0; part < kBlockN / 64; ++part) {
    const int column = c.n0 + part * 64 + (thread % 8) * 8;
    const bool column_valid = column < args.x_columns;
    const Element* src = concat_column(row_base, column, args);
#pragma unroll
    for (int i = 0; i < kBlockK / kSpanRowsPerPass; ++i) {
      const bool valid = column_valid && i * kSpanRowsPerPass < rows_left;
      cp_async16(dst + part * kMnBlockBytes + i * kSpanRowsPerPass * 128, valid ? src : x, valid ? 16 : 0);
      src += pass_stride;
    }
  }
}

// Hands a consumed stage back to the producers that fill it: both CTAs' of a pair (the peer
// writes its part of the shared panel into this CTA's stage), or this CTA's alone.
template <bool kInCluster>
__device__ __forceinline__ void release_stage(uint64_t* empty) {
  if constexpr (kInCluster) {
    mbarrier_arrive(empty);
  } else {
#pragma unroll
    for (uint32_t peer = 0; peer < kClusterM; ++peer) mbarrier_arrive_cluster(empty, peer);
  }
}

// wgmma descriptors of a stage's tiles for k step 0; step kk adds kk * descriptor_step.
template <GemmKind kKind>
__device__ __forceinline__ uint64_t a_descriptor(const uint8_t* a_tile, int consumer) {
  if constexpr (Majorness<kKind>::kTransA) {
    static_assert(kAPartBytes == kMnBlockBytes, "a consumer's MN-major A part is one box");
    return mn_major_swizzle128_descriptor(a_tile + consumer * kAPartBytes, kMnBlockBytes);
  } else {
    return k_major_swizzle128_descriptor(a_tile + consumer * kAPartBytes);
  }
}
template <GemmKind kKind>
__device__ __forceinline__ uint64_t b_descriptor(const uint8_t* b_tile) {
  if constexpr (Majorness<kKind>::kTransB) {
    return mn_major_swizzle128_descriptor(b_tile, kMnBlockBytes);
  } else {
    return k_major_swizzle128_descriptor(b_tile);
  }
}
// A k step of 16 is 32 bytes along a K-major row, or 16 k rows (2048 bytes) of an MN-major box;
// descriptors count in 16-byte units.
template <int kTrans>
__host__ __device__ constexpr uint64_t descriptor_step() {
  return kTrans ? 2048 / 16 : 32 / 16;
}

// Evenly spaced k steps (every operand tile but the packed shard tails').
template <int kTrans>
__device__ __forceinline__ KSteps even_k_steps() {
  return {descriptor_step<kTrans>(), 2 * descriptor_step<kTrans>()};
}

// The k steps of one k-block, one committed wgmma group. Each step count is a straight chain with
// its own commit: a branch around single wgmmas, or a commit after the branches join, makes ptxas
// fence and track the wgmmas apart (info C7519) and wait for the current k-block's group.
template <int kSteps, GemmKind kKind, typename Element, int kBlockN>
__device__ __forceinline__ void mma_kblock(float (&acc)[kBlockN / 2], uint64_t desc_a, KSteps a_steps,
                                           uint64_t desc_b, KSteps b_steps, bool first) {
  constexpr int kTransA = Majorness<kKind>::kTransA;
  constexpr int kTransB = Majorness<kKind>::kTransB;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Wgmma<kBlockN, Element, kTransA, kTransB>::run(acc, desc_a + (kk & 1) * a_steps.odd + (kk >> 1) * a_steps.pair,
                                                   desc_b + (kk & 1) * b_steps.odd + (kk >> 1) * b_steps.pair,
                                                   (!first || kk != 0) ? 1u : 0u);
  }
  wgmma_commit_group();
}

#endif  // VGA_SM90A_DEVICE

// One stage ring, one persistent walk: the producer runs ahead into the next tile while the
// consumers run the epilogue. A stage's empty barrier collects the consumer warps of both CTAs of
// the cluster, because the peer's producer writes part of the shared panel into this CTA's stage
// (with the split in the cluster, nothing is shared: this CTA's consumer warps only). With the
// split in the cluster the grid has one cluster per tile, so after the tile's last k-block the
// ring's memory holds the CTA's partial tile for the cluster's sum, and the peers' rows of theirs.
// The split in the cluster is a separate instantiation (kInCluster): compiled into the paired
// kernel as runtime branches it cost that kernel 2-3% (up to 10% on 768-wide layers at 4096 rows;
// run 27's A/B). So is x's operand along the concatenation (kSpanShards: the forward's A k-blocks,
// grad_weight's B columns): its whole producer warpgroup copies that operand with cp.async, and a
// stage's full barrier counts those 128 threads' arrivals too. The forward's narrow tiles
// (kTileM = kNarrowBlockM) are a separate instantiation with one consumer warpgroup and A one
// 64-row box: for calls whose 128-row tiles leave most SMs idle, twice the CTAs, each copying 16
// instead of 24 KB a 64-wide k-block (such calls are bound by each SM's L2 -> SM traffic); with
// the split in the cluster, each CTA sums 64 / S rows of the tile.
template <GemmKind kKind, typename Element, int kBlockN, bool kInCluster, int kTailShards, bool kSpanShards,
          int kTileM = kBlockM>
__global__ void __launch_bounds__(kThreadsOf<kTileM>, 1)
    core_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                     const __grid_constant__ TailMaps tails, const CoreArgs args) {
#ifdef VGA_SM90A_DEVICE
  static_assert(kKind != GemmKind::kForwardSwapped || (!kInCluster && kTailShards == 0),
                "the swapped forward has no split and no packed tails");
  static_assert(!kSpanShards || ((kKind == GemmKind::kForward || kKind == GemmKind::kGradWeight) && kTailShards == 0),
                "only x's operand of the forward and grad_weight runs along the concatenation, unpacked");
  static_assert(kTileM == kBlockM || (kTileM == kNarrowBlockM && kKind == GemmKind::kForward && kBlockN == 64 &&
                                      !kSpanShards),
                "the narrow tiles are the forward's, 64 wide, a shard at a time");
  constexpr int kConsumers = kConsumersOf<kTileM>;
  constexpr bool kCopiesA = SpanCopies<kKind, kSpanShards>::kA;
  constexpr bool kCopiesB = SpanCopies<kKind, kSpanShards>::kB;
  using Tile = TileShape<kBlockN, kTileM>;
  constexpr int kStages = Tile::kStages;
  constexpr int kMmaGroupsInFlight = mma_groups_in_flight<kKind>(kStages);
  static_assert(kMmaGroupsInFlight == 1 || kMmaGroupsInFlight == 2, "the consumers release one or two stages late");
  static_assert(!kInCluster || (kBlockN <= kWidestClusterSplit &&
                                 PartialTile<kBlockN, kTileM>::kExchangeBytes <= kStages * Tile::kStageBytes),
                "the in-cluster sum's partial tile and its peers' rows fit the ring");
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + kSwizzleAlignment - 1) & ~uintptr_t(kSwizzleAlignment - 1));
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + kStages * Tile::kATileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * Tile::kStageBytes);
  uint64_t* empty = full + kStages;
  uint64_t* received = empty + kStages;  // the in-cluster sum's: the peers' rows of this CTA's have landed
  float* bias_rows = reinterpret_cast<float*>(empty + kStages + 2);  // kBlockN floats per consumer warpgroup

  const int warpgroup = threadIdx.x / 128;
  const uint32_t cta_rank = cluster_cta_rank();
  const int cluster_size = kInCluster ? args.cluster_size : kClusterM;
  const int cluster_id = blockIdx.x / cluster_size;
  const int num_clusters = gridDim.x / cluster_size;
  constexpr uint32_t releasing_ctas = kInCluster ? 1 : kClusterM;  // CTAs whose consumers free a stage
  // A lane of warp 1 initialises the barriers, so that the producer warp's path to its first copy
  // (warp 0: the register release, the first tile's walk, the cluster wait) does not include it.
  if (threadIdx.x == 32) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], kSpanShards ? 1 + kSpanCopyThreads : 1);
      mbarrier_init(&empty[s], releasing_ctas * kConsumers * 4);  // every such consumer warp
    }
    if (kInCluster) mbarrier_init(received, 1);  // the summing CTA's expect_tx; the peers' copies complete it
    fence_barrier_init();
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
    if (kTailShards > 0) {
      prefetch_tensor_map(&tails.a);
      prefetch_tensor_map(&tails.b);
    }
  }
  // The barriers are initialised (this CTA's and the peer's) before any thread waits on one, any
  // multicast or any remote arrival: every thread arrives here and waits before its first such
  // use; the producer walks to its first tile in between (run 51's probe: ~0.4 µs of a small
  // call went to the walk after the cluster barrier). All of this overlaps the previous kernel's
  // end under a programmatic launch (launch.cuh): global memory is touched only after
  // wait_for_previous_grid, or, where the previous grid writes nothing this one reads or writes
  // (args.overlaps_previous_grid), before it, with the wait at the exit. (A relaxed arrival:
  // fence_barrier_init published the initialisation, and nothing else is published here.)
  cluster_arrive_relaxed();

  if (warpgroup == 0) {
    warpgroup_release_registers<kProducerRegisters>();
    // The whole first warp walks the tiles, so the walk's values are warp-uniform (uniform
    // registers, no per-copy waterfall of moves into them); one elected lane issues the copies.
    // With kSpanShards the other three warps walk alongside and every thread copies its part of x.
    if (threadIdx.x < 32 || kSpanShards) {
      const bool issuer = threadIdx.x < 32 && elect_one_lane();
      int stage = 0;
      uint32_t phase = 0;
      const int group_elements = args.kblocks_per_group.divisor * kBlockK;
      bool cluster_ready = false;
      for (int tile = cluster_id; tile < args.num_cluster_tiles; tile += num_clusters) {
        const TileCoord c = tile_coord<kBlockN, kInCluster, kTileM>(tile, cta_rank, args);
        LoadCursor cur = load_cursor(c, args);
        SpanRows span{};
        if constexpr (kCopiesA) span = span_rows<Element>(c, threadIdx.x, args);
        if (!cluster_ready) {  // the first tile's walk is done: now the barriers are needed
          cluster_wait();
          cluster_ready = true;
          // Before the first copy, the previous kernel's outputs (unless this grid reads none of
          // them: then it waits at its exit instead). Only then is the next kernel released, so
          // that every grid before this one is complete when the next one starts (ptx.cuh).
          if (!args.overlaps_previous_grid) wait_for_previous_grid();
          allow_next_grid();
        }
        // A CTA receives the whole shared operand (its own part and its peer's) and, if its tile
        // exists, its own copy of the other one (with kSpanShards, only the operand that is TMA's):
        // the parts that hold any of the product (both CTAs of a pair count the shared operand's
        // alike: it is the same rows, or columns, for both).
        // (With kSpanShards every part is copied: its 128 copying threads have no registers to
        // spare for the count, which cost those kernels 4-9 more spilled accesses each.)
        constexpr LiveParts kAllParts{kConsumers, kBPartsOf<kKind, kBlockN>};
        const LiveParts live = kSpanShards ? kAllParts : live_parts<kKind, kBlockN, kTileM>(c, args);
        const uint32_t a_bytes = kCopiesA ? 0 : live.a * kAPartBytes;
        const uint32_t b_bytes = kCopiesB ? 0 : live.b * kBPartBytesOf<kKind, kBlockN>;
        const uint32_t stage_bytes = kInCluster             ? a_bytes + b_bytes
                                     : args.cluster_along_n ? a_bytes + (c.exists ? b_bytes : 0)
                                                            : (c.exists ? a_bytes : 0) + b_bytes;
        for (int kb = c.kb_begin; kb < c.kb_end; ++kb) {
          mbarrier_wait(&empty[stage], phase ^ 1);
          if (issuer) {
            mbarrier_arrive_expect_tx(&full[stage], stage_bytes);
            load_stage<kKind, kBlockN, kInCluster, kTailShards, kSpanShards>(a_tiles + stage * Tile::kATileBytes,
                                                   b_tiles + stage * Tile::kBTileBytes, &a_map, &b_map, &tails,
                                                   &full[stage], c, live, cur, kb, cta_rank, args);
          }
          if constexpr (kCopiesA) {
            copy_span_kblock<Element>(a_tiles + stage * Tile::kATileBytes, kb, span, threadIdx.x, args);
            cp_async_arrive(&full[stage]);
          } else if constexpr (kCopiesB) {
            copy_span_columns<Element, kBlockN>(b_tiles + stage * Tile::kBTileBytes, c, cur, threadIdx.x, args);
            cp_async_arrive(&full[stage]);
          }
          __syncwarp();
          advance(cur, group_elements);
          next_stage<kStages>(stage, phase);
        }
      }
      if (!cluster_ready) cluster_wait();  // a CTA without tiles
      if (!kInCluster && threadIdx.x < 32) {
        // Every stage filled has been released by the consumers of both CTAs: after this no
        // arrival from the peer targets this CTA's barriers, and no copy of the peer's lands in
        // its shared memory, so the CTA may exit without a cluster barrier (one fewer
        // cluster-wide wait at the end of every call).
        for (int s = 0; s < kStages; ++s) {
          mbarrier_wait(&empty[stage], phase ^ 1);
          next_stage<kStages>(stage, phase);
        }
      }
    } else {
      cluster_wait();
    }
    // the barrier before the in-cluster sum: every ring is free to receive the peers' rows (the
    // producers' part: they publish nothing)
    if constexpr (kInCluster) cluster_sync_relaxed();
  } else {
    cluster_wait();
    if (!args.overlaps_previous_grid) wait_for_previous_grid();  // (before the bias loads and the stores)
    warpgroup_claim_registers<kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const int thread_in_wg = threadIdx.x % 128;
    const bool warp_leader = (threadIdx.x % 32) == 0;
    float* tile_bias = bias_rows + consumer * kBlockN;
    if constexpr (kKind != GemmKind::kForward) {
      for (int i = thread_in_wg; i < kBlockN; i += 128) tile_bias[i] = 0.f;
      named_barrier_sync(1 + consumer, 128);
    }
    float acc[kBlockN / 2];
    int stage = 0;
    uint32_t phase = 0;
    for (int tile = cluster_id; tile < args.num_cluster_tiles; tile += num_clusters) {
      const TileCoord c = tile_coord<kBlockN, kInCluster, kTileM>(tile, cta_rank, args);
      // The tile's bias, loaded now so that its latency hides under the mainloop (fetched in the
      // epilogue, it cost several L2 round trips a tile while the tensor cores sat idle).
      float2 bias_value = make_float2(0.f, 0.f);  // columns 2t, 2t + 1 of the tile
      if constexpr (kKind == GemmKind::kForward) {
        const Element* bias = args.partials == nullptr ? static_cast<const Element*>(args.bias) : nullptr;
        if (2 * thread_in_wg < kBlockN) {
          bias_value = bias_pair(bias, args.bias_stride, c.n0 + 2 * thread_in_wg, args.n_group_width);
        }
      }
      float row_bias[2] = {0.f, 0.f};  // kForwardSwapped: the bias of the thread's two W rows (its M)
      if constexpr (kKind == GemmKind::kForwardSwapped) {
        const Element* bias = static_cast<const Element*>(args.bias);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int m =
              c.inner0 + consumer * kConsumerRows + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4 + 8 * half;
          if (bias != nullptr && m < args.m_inner) row_bias[half] = to_acc<float>(bias[m * args.bias_stride]);
        }
      }
      // Where the k-block lies in its group (a shard's h for the forward): the group's last k-block
      // runs only the k steps that hold data, not its zero fill (the last k-block of a 112-wide
      // head is 25% zeros; 80- and 96-wide heads pack their tails instead). The MMAs skipped save
      // little: the stage's copies cost the same (run 54).
      int k_in_tile_group = k_in_group(c.kb_begin, fast_divide(c.kb_begin, args.kblocks_per_group), args);
      for (int kb = c.kb_begin; kb < c.kb_end; ++kb) {
        const bool tail_block = kTailShards > 0 && kb >= args.tail_kblock_begin;
        int k_steps = kBlockK / 16;
        if (!tail_block) {
          const int k_left = args.k_group_width - k_in_tile_group;
          k_steps = k_left < kBlockK ? (k_left + 15) / 16 : kBlockK / 16;
          k_in_tile_group = k_left <= kBlockK ? 0 : k_in_tile_group + kBlockK;
        }
        mbarrier_wait(&full[stage], phase);
        // cp.async wrote x's operand through the generic proxy; wgmma reads it through the async one.
        if constexpr (kSpanShards) fence_proxy_async_shared();
        const bool first = kb == c.kb_begin;
        if (tail_block) {  // packed shard tails: a whole k-block (shards past R are zeros), a block a shard
          constexpr int kShards = kTailShards > 0 ? kTailShards : 1;
          constexpr int kRowBytes = 128 / kShards;
          mma_kblock<4, kKind, Element, kBlockN>(
              acc, k_major_swizzled_descriptor(a_tiles + stage * Tile::kATileBytes + consumer * kAPartBytes, kRowBytes),
              shard_tail_k_steps<kConsumerRows, kShards>(),
              k_major_swizzled_descriptor(b_tiles + stage * Tile::kBTileBytes, kRowBytes),
              shard_tail_k_steps<kBlockN, kShards>(), first);
        } else {
          // The steps are constants here, so these chains are what they were before the tails.
          const uint64_t desc_a = a_descriptor<kKind>(a_tiles + stage * Tile::kATileBytes, consumer);
          const uint64_t desc_b = b_descriptor<kKind>(b_tiles + stage * Tile::kBTileBytes);
          const KSteps a_steps = even_k_steps<Majorness<kKind>::kTransA>();
          const KSteps b_steps = even_k_steps<Majorness<kKind>::kTransB>();
          if (k_steps == 4) {
            mma_kblock<4, kKind, Element, kBlockN>(acc, desc_a, a_steps, desc_b, b_steps, first);
          } else if (k_steps == 3) {
            mma_kblock<3, kKind, Element, kBlockN>(acc, desc_a, a_steps, desc_b, b_steps, first);
          } else if (k_steps == 2) {
            mma_kblock<2, kKind, Element, kBlockN>(acc, desc_a, a_steps, desc_b, b_steps, first);
          } else {
            mma_kblock<1, kKind, Element, kBlockN>(acc, desc_a, a_steps, desc_b, b_steps, first);
          }
        }
        // (the k-block kMmaGroupsInFlight back has completed: its stage goes back to the producers)
        wgmma_wait_group<kMmaGroupsInFlight>();
        if (kb - c.kb_begin >= kMmaGroupsInFlight && warp_leader)
          release_stage<kInCluster>(&empty[stage_before<kStages>(stage, kMmaGroupsInFlight)]);
        next_stage<kStages>(stage, phase);
      }
      wgmma_wait_group<0>();
      // the stages of the tile's last k-blocks, still held, oldest first (a forced in-cluster slice
      // may have no k-blocks, so none)
      for (int back = kMmaGroupsInFlight; back >= 1; --back) {
        if (warp_leader && c.kb_end - c.kb_begin >= back) release_stage<kInCluster>(&empty[stage_before<kStages>(stage, back)]);
      }
      if constexpr (kKind == GemmKind::kForward) {
        named_barrier_sync(1 + consumer, 128);  // this warpgroup is done reading the previous tile's bias
        if (2 * thread_in_wg < kBlockN) reinterpret_cast<float2*>(tile_bias)[thread_in_wg] = bias_value;
        named_barrier_sync(1 + consumer, 128);
      }
      if constexpr (kInCluster) {
        named_barrier_sync(3, 128 * kConsumers);  // both warpgroups are done reading the ring
        // This CTA's ring may receive its peers' rows now (a relaxed arrival: its reads are complete,
        // the wgmma groups waited for, and nothing is published).
        cluster_arrive_relaxed();
        // (a forced split may leave a slice without k-blocks: its partial tile is zeros)
        float* partial = reinterpret_cast<float*>(shared);
        stage_partial_tile<kBlockN>(acc, c.kb_begin < c.kb_end, partial, consumer, thread_in_wg);
        fence_proxy_async_shared();  // the bulk copies (the async proxy) read what these stores wrote
        named_barrier_sync(3, 128 * kConsumers);
        cluster_wait();  // every CTA's ring is free
        sum_cluster_tile<Element, kBlockN, kTileM, kConsumers * 128, kKind == GemmKind::kGradInput>(
            partial, received, bias_rows, args, c, cta_rank, threadIdx.x - 128);
      } else if constexpr (kKind == GemmKind::kForwardSwapped) {
        store_tile_transposed<Element, kBlockN>(acc, row_bias, args, c, consumer, thread_in_wg);
      } else {
        store_tile<Element, kBlockN, kKind == GemmKind::kGradInput>(acc, tile_bias, args, c, consumer, thread_in_wg);
      }
    }
  }
  // With the split in the cluster, no CTA leaves while a bulk copy may still read its partial tile:
  // the exit barrier, at which the consumers arrived once their CTA's rows had landed (sum_slices)
  // and the producers arrive now; paired CTAs are held by their producer's wait on the last stages
  // instead.
  if constexpr (kInCluster) {
    if (warpgroup == 0) cluster_arrive_relaxed();
    cluster_wait();
  }
  // A grid that overlapped the previous one completes only after it, so that the kernels after
  // this one, which wait for this grid alone, see that one's outputs too.
  if (args.overlaps_previous_grid) wait_for_previous_grid();
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host

// One kernel's shared-memory opt-in on `device` (the current one), and how many clusters of
// `cluster_size` of its CTAs fit at once (GPCs may leave SMs unpaired).
template <GemmKind kKind, typename Element, int kBlockN, bool kInCluster, int kTileM = kBlockM>
int max_active_clusters(int cluster_size, int device) {
  using Tile = TileShape<kBlockN, kTileM>;
  constexpr auto kernel = core_gemm_kernel<kKind, Element, kBlockN, kInCluster, 0, false, kTileM>;
  opt_in_shared_memory<kernel>(Tile::kSharedBytes, device, "sm90_gemm");
  KernelLaunch launch(dim3(cluster_size), kThreadsOf<kTileM>, Tile::kSharedBytes, nullptr, cluster_size, false);
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
  STD_TORCH_CHECK(status == cudaSuccess && clusters > 0, "vga sm90_gemm: no cluster of ", cluster_size,
                  " CTAs fits: ", cudaGetErrorString(status));
  return clusters;
}

// The fewest clusters of `cluster_size` that fit at once among this kind's kernels of every width
// (the plan counts one number a size): the token widths' for the swapped forward, else the core
// widths' (those up to kWidestClusterSplit where the kernel splits in the cluster) and the
// forward's narrow tiles', paired or split in the cluster alike.
template <GemmKind kKind, typename Element, bool kInCluster>
int max_active_clusters_of_every_width(int cluster_size, int device) {
  int clusters = std::numeric_limits<int>::max();
  auto fewest = [&](auto width) {
    constexpr int kBlockN = decltype(width)::value;
    if constexpr (!kInCluster || kBlockN <= kWidestClusterSplit) {
      clusters = std::min(clusters, max_active_clusters<kKind, Element, kBlockN, kInCluster>(cluster_size, device));
    }
  };
  if constexpr (kKind == GemmKind::kForwardSwapped) {
    for_each_width<kTokenWidths>(fewest);
  } else {
    for_each_width<kCoreWidths>(fewest);
    if constexpr (kKind == GemmKind::kForward) {
      clusters = std::min(clusters, max_active_clusters<kKind, Element, 64, kInCluster, kNarrowBlockM>(cluster_size, device));
    }
  }
  return clusters;
}

// The clusters of each size that fit at once (the persistent grid's size, the plan's rounds), and
// the shared-memory opt-in of every core kernel of this kind and type: once per device (the
// caller's device guard makes it the current one).
template <GemmKind kKind, typename Element>
const ResidentClusters& resident_clusters(int32_t device_index) {
  static PerCurrentDevice<ResidentClusters> cache;
  return cache.get(device_index, [device_index] {
    ResidentClusters asked{0, 0, 0, 0};
    if constexpr (kKind != GemmKind::kForwardSwapped) {  // (it has no split in the cluster)
      asked.of2 = max_active_clusters_of_every_width<kKind, Element, true>(2, device_index);
      asked.of4 = max_active_clusters_of_every_width<kKind, Element, true>(4, device_index);
      asked.of8 = max_active_clusters_of_every_width<kKind, Element, true>(8, device_index);
    }
    asked.pairs = max_active_clusters_of_every_width<kKind, Element, false>(2, device_index);
    return asked;
  });
}

// The kernels with packed shard tails are separate instantiations (the forward's only), by the
// shards a tail k-block holds: compiled into the others as runtime branches they made the n128
// forward 16-22% slower on every shape (run 57); so are those along the concatenation.
template <GemmKind kKind, typename Element, int kBlockN, bool kInCluster, int kTileM = kBlockM>
void launch_core_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const TailMaps& tails,
                        const CoreArgs& args, int clusters, int device, cudaStream_t stream) {
  using Tile = TileShape<kBlockN, kTileM>;
  KernelLaunch launch(dim3(clusters * args.cluster_size), kThreadsOf<kTileM>, Tile::kSharedBytes, stream,
                      args.cluster_size, true);
  auto launch_with = [&](auto tail_shards) {
    constexpr auto kernel =
        core_gemm_kernel<kKind, Element, kBlockN, kInCluster, decltype(tail_shards)::value, false, kTileM>;
    // (the unpacked kernels opted in when resident_clusters asked the driver about them)
    if constexpr (decltype(tail_shards)::value > 0) {
      opt_in_shared_memory<kernel>(Tile::kSharedBytes, device, "sm90_gemm");
    }
    launch(kernel, a_map, b_map, tails, args);
  };
  if constexpr ((kKind == GemmKind::kForward || kKind == GemmKind::kGradWeight) && kTileM == kBlockM) {
    if (args.span_shards) {
      constexpr auto kernel = core_gemm_kernel<kKind, Element, kBlockN, kInCluster, 0, true>;
      opt_in_shared_memory<kernel>(Tile::kSharedBytes, device, "sm90_gemm");
      return launch(kernel, a_map, b_map, tails, args);
    }
  }
  if constexpr (kKind == GemmKind::kForward) {
    if (args.tail_shards == 2) return launch_with(std::integral_constant<int, 2>{});
    if (args.tail_shards == 4) return launch_with(std::integral_constant<int, 4>{});
  }
  launch_with(std::integral_constant<int, 0>{});
}

// No packed shard tails (the kinds other than the forward, and heads that do not pack).
struct NoTailMaps {
  TailMaps operator()(int /*block_n*/) const { return TailMaps{}; }
};

// The plan of one product: `forced` checked against the kind (the swapped forward takes only the
// token widths, without a split; the other kinds only n64-n256, split in the cluster up to n192; the
// narrow tiles, m64, only the forward a shard at a time, 64 wide), then
// choose_plan over what it allows.
template <GemmKind kKind, typename Element>
CorePlan core_plan(const CoreShape& shape, ForcedConfig forced, int32_t device_index) {
  STD_TORCH_CHECK(shape.token_tiles == (kKind == GemmKind::kForwardSwapped), "vga sm90_gemm: core shape and kind disagree");
  STD_TORCH_CHECK(!shape.token_tiles || (forced.splits <= 1 && forced.cluster_splits == 0),
                  "vga sm90_gemm: the token widths (", width_names(kTokenWidths), ") take no reduction split (s1 only)");
  STD_TORCH_CHECK(forced.block_n == 0 || is_token_width(forced.block_n) == shape.token_tiles, "vga sm90_gemm: tile width n",
                  forced.block_n, shape.token_tiles ? " is not a token width (" + width_names(kTokenWidths) + ")"
                                                    : " is a token width of the forward; this product takes " +
                                                          width_names(kCoreWidths));
  STD_TORCH_CHECK(forced.cluster_splits == 0 || forced.block_n <= kWidestClusterSplit, "vga sm90_gemm: tile width n",
                  forced.block_n, " takes no split in the cluster (its partial tile and its peers' rows do not fit the "
                  "shared memory); c", forced.cluster_splits, " runs at widths up to n", kWidestClusterSplit);
  if (forced.block_m != 0) {
    const char* kind = kKind == GemmKind::kForwardSwapped ? "the swapped forward (a token width)"
                       : kKind == GemmKind::kGradInput    ? "grad_x"
                                                          : "grad_weight";
    STD_TORCH_CHECK(kKind == GemmKind::kForward, "vga sm90_gemm: m64 (64-row tiles) runs the forward only, not ", kind);
    STD_TORCH_CHECK(shape.narrow_tiles, "vga sm90_gemm: m64 (64-row tiles) runs the forward a shard at a time, not 'span'");
    STD_TORCH_CHECK(forced.block_n == 0 || forced.block_n == 64, "vga sm90_gemm: m64 (64-row tiles) runs 64 wide (n64), not n",
                    forced.block_n);
  }
  return choose_plan(shape, resident_clusters<kKind, Element>(device_index), forced);
}

// Whether x may be copied along the concatenation (kSpanShards: the forward's A k-blocks,
// grad_weight's B columns): H is not a multiple of 64 (else whole TMA boxes tile it), and the
// concatenation's column coordinate, R * H plus a pair of the widest tiles past it, fits the int
// the copies walk it in.
inline bool x_can_span(const ForwardProblem& p) {
  return p.shard_width % kBlockK != 0 && p.num_shards * p.shard_width <= kMaxCoordinate - 1024;
}

// The fields of `args` that copy x along the concatenation (strides in elements).
inline void set_span_source(CoreArgs& args, const ForwardProblem& p, const RowView& rows) {
  args.span_shards = 1;
  args.x = p.x;
  args.x_shard_stride = p.x_stride_shard;
  args.x_outer_stride = rows.outer_stride;
  args.x_inner_stride = rows.inner_stride;
  args.x_shard_width = make_fast_divisor(static_cast<int>(p.shard_width));
  args.x_columns = static_cast<int>(p.num_shards * p.shard_width);
}

// The bytes of fp32 partial sums that `plan` writes to its workspace: [split][rows][out_ld] for a
// split across the grid, none otherwise.
inline int64_t grid_split_workspace_bytes(const CoreShape& shape, const CorePlan& plan, int64_t out_ld) {
  if (plan.splits <= 1 || plan.in_cluster) return 0;
  return plan.splits * shape.m_outer * shape.m_inner * out_ld * static_cast<int64_t>(sizeof(float));
}

// Fills the tile counts of `args` (whose out, out_ld, bias, x_4d and, with packed shard tails,
// tail_shards and tail_h the family set) for `plan` (core_plan's), launches the core and, for a
// split across the grid, the fixed-order sum of the partials. `b_map_for(block_n)` builds the B
// view, whose box may depend on the tile width; `tail_maps_for(block_n)` the views of the shape's
// tail k-blocks.
template <GemmKind kKind, typename Element, typename BMapFor, typename TailMapsFor = NoTailMaps>
void run_core(const CoreShape& shape, const CorePlan& plan, CoreArgs args, const CUtensorMap& a_map,
              BMapFor&& b_map_for, const WorkspaceRequest& workspace, int32_t device_index, cudaStream_t stream,
              TailMapsFor tail_maps_for = {}) {
  const ResidentClusters& resident = resident_clusters<kKind, Element>(device_index);
  const int64_t rows = shape.m_outer * shape.m_inner;
  args.m_inner = static_cast<int>(shape.m_inner);
  args.m_inner_tiles = make_fast_divisor(static_cast<int>(ceil_div(shape.m_inner, plan.block_m)));
  args.m_tiles = static_cast<int>(shape.m_outer) * args.m_inner_tiles.divisor;
  args.n_group_width = static_cast<int>(shape.n_group_width);
  args.n_group_tiles = make_fast_divisor(static_cast<int>(ceil_div(shape.n_group_width, plan.block_n)));
  args.n_tiles = static_cast<int>(shape.n_groups) * args.n_group_tiles.divisor;
  args.kblocks = static_cast<int>(shape.kblocks());
  args.kblocks_per_group = make_fast_divisor(static_cast<int>(shape.kblocks_per_group()));
  args.tail_kblock_begin = static_cast<int>(shape.kblocks() - shape.tail_kblocks);
  args.k_group_width = static_cast<int>(shape.k_group_width);
  args.kblocks_per_split = plan.kblocks_per_split;
  args.cluster_size = plan.in_cluster ? plan.splits : kClusterM;
  args.cluster_along_n = !plan.in_cluster && pair_columns(args.m_tiles, args.n_tiles, plan.block_n, shape.span_copy) ? 1 : 0;
  int group_units = 0;  // m units a raster group holds
  if (plan.in_cluster) {
    args.m_units = args.m_tiles;
    args.n_units = args.n_tiles;
    group_units = kGroupM;
  } else {
    args.m_units = args.cluster_along_n ? args.m_tiles : static_cast<int>(ceil_div(args.m_tiles, kClusterM));
    args.n_units = args.cluster_along_n ? static_cast<int>(ceil_div(args.n_tiles, kClusterM)) : args.n_tiles;
    group_units = args.cluster_along_n ? kGroupM : kGroupM / kClusterM;
  }
  args.group_units = make_fast_divisor(group_units);
  args.last_group_units = make_fast_divisor(args.m_units - (args.m_units - 1) / group_units * group_units);
  args.group_tiles = make_fast_divisor(group_units * args.n_units);
  args.tiles_per_split = make_fast_divisor(args.m_units * args.n_units);
  const bool grid_split = plan.splits > 1 && !plan.in_cluster;
  args.num_cluster_tiles = args.tiles_per_split.divisor * (grid_split ? plan.splits : 1);
  args.partials = nullptr;
  args.partial_stride = 0;
  if (grid_split) {
    args.partial_stride = rows * args.out_ld;
    args.partials = static_cast<float*>(workspace.get(grid_split_workspace_bytes(shape, plan, args.out_ld)));
    args.vector_store = args.out_ld % 2 == 0 ? 1 : 0;
  } else if (kKind == GemmKind::kForwardSwapped) {  // 8 W rows (output columns) a store; the warp checks K
    args.vector_store = (is_aligned(args.out, 16) && args.out_ld % 8 == 0) ? 1 : 0;
  } else if (kKind == GemmKind::kGradInput) {  // 8 columns of one shard a store, in grad_x's layout
    const OutputScatter& s = args.scatter;
    args.vector_store = (is_aligned(args.out, 16) && s.shard_width.divisor % 8 == 0 && s.shard_stride % 8 == 0 &&
                         s.inner_stride % 8 == 0 && s.outer_stride % 8 == 0)
                            ? 1
                            : 0;
  } else {
    args.vector_store = (is_aligned(args.out, 16) && args.out_ld % 8 == 0 && shape.n_group_width % 8 == 0) ? 1 : 0;
  }
  const CUtensorMap b_map = b_map_for(plan.block_n);
  const TailMaps tails = shape.tail_kblocks > 0 ? tail_maps_for(plan.block_n) : TailMaps{};
  // A split in the cluster walks one tile a cluster (its partial tile takes the ring's memory).
  const int clusters = plan.in_cluster ? args.num_cluster_tiles : std::min(args.num_cluster_tiles, resident.pairs);
  auto launch_width = [&](auto width, auto in_cluster, auto tile_m) {
    launch_core_kernel<kKind, Element, decltype(width)::value, decltype(in_cluster)::value, decltype(tile_m)::value>(
        a_map, b_map, tails, args, clusters, device_index, stream);
  };
  using Paired = std::false_type;
  using InCluster = std::true_type;
  using WholeTile = std::integral_constant<int, kBlockM>;
  if constexpr (kKind == GemmKind::kForwardSwapped) {
    STD_TORCH_CHECK(plan.splits == 1 && !plan.in_cluster, "vga sm90_gemm: the swapped forward takes no split");
    const bool listed =
        with_listed_width<kTokenWidths>(plan.block_n, [&](auto width) { launch_width(width, Paired{}, WholeTile{}); });
    STD_TORCH_CHECK(listed, "vga sm90_gemm: no swapped kernel of width ", plan.block_n);
  } else if (plan.block_m == kNarrowBlockM) {
    STD_TORCH_CHECK(kKind == GemmKind::kForward && plan.block_n == 64 && !args.span_shards,
                    "vga sm90_gemm: the 64-row tiles are the forward's, 64 wide, a shard at a time");
    if constexpr (kKind == GemmKind::kForward) {
      using Width64 = std::integral_constant<int, 64>;
      using Narrow = std::integral_constant<int, kNarrowBlockM>;
      if (plan.in_cluster) {
        launch_width(Width64{}, InCluster{}, Narrow{});
      } else {
        launch_width(Width64{}, Paired{}, Narrow{});
      }
    }
  } else {
    const bool listed = with_listed_width<kCoreWidths>(plan.block_n, [&](auto width) {
      constexpr int kBlockN = decltype(width)::value;
      if constexpr (kBlockN <= kWidestClusterSplit) {
        if (plan.in_cluster) {
          launch_width(width, InCluster{}, WholeTile{});
          return;
        }
      } else {
        STD_TORCH_CHECK(!plan.in_cluster, "vga sm90_gemm: no in-cluster kernel of width ", kBlockN);
      }
      launch_width(width, Paired{}, WholeTile{});
    });
    STD_TORCH_CHECK(listed, "vga sm90_gemm: no kernel of width ", plan.block_n);
  }
  if (grid_split) {
    const int64_t total = rows * args.out_ld;
    const int vector = args.out_ld % 4 == 0 ? 1 : 0;
    const int64_t threads_needed = vector ? ceil_div(total, 4) : total;
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(threads_needed, 256), 132 * 16));
    const bool scatter = kKind == GemmKind::kGradInput && !scatters_row_major(args.scatter, rows, args.out_ld);
    KernelLaunch reduce(dim3(blocks), 256, 0, stream, 1, true);
    reduce(reduce_partials_kernel<Element>, args.partials, args.partial_stride, plan.splits,
           static_cast<Element*>(args.out), total, args.out_ld, static_cast<const Element*>(args.bias),
           args.bias_stride, vector, scatter ? args.scatter : OutputScatter{});
  }
}

}  // namespace sm90
}  // namespace vga
