// The GEMM core's tile scheduler: which output tile and which slice of the reduction a CTA works
// on next, and (host side) the plan: tile width and split count chosen per shape.
//
// A persistent grid of clusters of kClusterM CTAs walks "cluster tiles" in grouped order: kGroupM
// row tiles at a time, all their column tiles before the next group, so the clusters in flight
// share A and B panels in L2. A cluster tile is kClusterM vertically adjacent tiles sharing one B
// panel (each CTA loads part of it and multicasts it), or kClusterM horizontally adjacent tiles
// sharing one A panel the same way: where that leaves fewer CTAs idle (rows <= 128: a pair of row
// tiles would idle its second CTA) and at 64 wide, where A is the larger tile (pair_columns). A
// reduction split in two ways, both summed in a fixed order (epilogue.cuh), so results are bitwise
// deterministic:
//  * across the grid: the walk repeats per slice of k-blocks and each slice writes fp32 partial
//    sums to a workspace that a second launch adds up (long reductions, many tiles);
//  * in the cluster: the cluster's S CTAs (S = 2, 4 or 8) take the S slices of one tile and add
//    their partial tiles up through distributed shared memory (no workspace, no second launch;
//    few tiles, where the partials' traffic and launch would cost as much as the product).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "../problem.cuh"

namespace vga {
namespace sm90 {

// A consumer warpgroup's rows of a tile (one m64nNk16 wgmma chain, gemm.cuh).
constexpr int kConsumerRows = 64;
constexpr int kBlockM = 2 * kConsumerRows;  // two consumer warpgroups
// The forward's narrow tiles: one consumer warpgroup, for calls whose unsplit 128-row tiles are
// too few for the SMs (choose_plan; forced: sm90_gemm/m64).
constexpr int kNarrowBlockM = kConsumerRows;
constexpr int kBlockK = 64;   // one 128-byte swizzle row of 16-bit elements
constexpr int kClusterM = 2;
constexpr int kGroupM = 16;  // 16 beat 8 by 1-3% on the prefill shapes (less DRAM traffic under the power cap)
static_assert(kGroupM % kClusterM == 0, "a group holds whole clusters");

// A count the tile walk divides by, with the constants that make the division a multiply-high and
// a shift (Granlund and Montgomery's round-up method): exact for 0 <= n < 2^31 and 1 <= d < 2^31.
// As IMAD division sequences in one dependent chain the walk's divisions cost the producer ~0.8 µs
// before a call's first copy (run 50) and every consumer the same per tile. divisor 0: unset.
struct FastDivisor {
  int divisor;
  uint32_t multiplier;
  uint32_t shift;
};

inline FastDivisor make_fast_divisor(int divisor) {
  FastDivisor f{divisor, 0, 0};
  if (divisor <= 0) return f;
  uint32_t shift = 0;
  while ((uint64_t(1) << shift) < static_cast<uint64_t>(divisor)) ++shift;
  f.shift = shift;
  f.multiplier = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor)) / divisor + 1);
  return f;
}

#if defined(__CUDACC__)
__device__ __forceinline__ int fast_divide(int n, const FastDivisor& f) {
  const uint32_t u = static_cast<uint32_t>(n);
  return static_cast<int>((__umulhi(u, f.multiplier) + u) >> f.shift);
}
#endif

// kGradInput's output layout (GradXLayout, problem.cuh) with its divisions as FastDivisors: row m
// of the product is at (m / rows_inner) * outer_stride + (m % rows_inner) * inner_stride, column
// n at (n / shard_width) * shard_stride + n % shard_width. Unused (shard_width 0) by the other
// kinds. (The split partial sums stay a row-major (rows, out_ld) matrix either way.)
struct OutputScatter {
  FastDivisor rows_inner;
  int64_t inner_stride;
  int64_t outer_stride;
  FastDivisor shard_width;
  int64_t shard_stride;
};

inline OutputScatter make_output_scatter(const GradXLayout& l) {
  return OutputScatter{make_fast_divisor(static_cast<int>(l.rows_inner)), l.inner_stride, l.outer_stride,
                       make_fast_divisor(static_cast<int>(l.shard_width)), l.shard_stride};
}

// Whether the scatter puts element (m, n) of a (rows, ld) product at m * ld + n (grad_x in the
// concat's layout, not x's): then a plain row-major store does the same.
inline bool scatters_row_major(const OutputScatter& s, int64_t rows, int64_t ld) {
  return s.shard_stride == s.shard_width.divisor && s.inner_stride == ld &&
         (s.rows_inner.divisor >= rows || s.outer_stride == s.rows_inner.divisor * ld);
}

#if defined(__CUDACC__)
__device__ __forceinline__ int64_t scatter_row_offset(int m, const OutputScatter& s) {
  const int outer = fast_divide(m, s.rows_inner);
  return outer * s.outer_stride + static_cast<int64_t>(m - outer * s.rows_inner.divisor) * s.inner_stride;
}
__device__ __forceinline__ int64_t scatter_column_offset(int n, const OutputScatter& s) {
  const int shard = fast_divide(n, s.shard_width);
  return shard * s.shard_stride + (n - shard * s.shard_width.divisor);
}
#endif

// The M dim is (outer, inner) rows, m = outer * m_inner + inner (outer = 1 unless a 4-D x view);
// the N dim is (group, column), n = group * n_group_width + column (groups = R shards for
// grad_weight, one group otherwise); the reduction is k-blocks, (kblocks_per_group)-long runs per
// group index (a shard's h for the forward, an outer batch index's rows for grad_weight).
struct CoreArgs {
  void* out;
  int64_t out_ld;           // elements between output rows
  float* partials;          // splits > 1: [split][rows][out_ld] fp32, else nullptr
  int64_t partial_stride;   // elements between splits
  const void* bias;         // forward only; added here when splits == 1
  int64_t bias_stride;
  int m_inner;
  FastDivisor m_inner_tiles;
  int m_tiles;
  int n_group_width;
  FastDivisor n_group_tiles;
  int n_tiles;
  int kblocks;
  FastDivisor kblocks_per_group;
  int k_group_width;  // reduction elements of a group: its last k-block holds the rest, zero-filled past it
  int kblocks_per_split;
  int cluster_along_n;  // 0: a cluster's CTAs are adjacent row tiles (B shared), 1: column tiles (A shared)
  int cluster_size;     // CTAs a cluster: kClusterM (the pairs), or the in-cluster split's slices (2, 4, 8)
  int m_units;          // cluster tiles along M: ceil(m_tiles / kClusterM), or m_tiles (along N, in-cluster split)
  int n_units;          // cluster tiles along N: n_tiles, or ceil(n_tiles / kClusterM) along N
  FastDivisor group_units;       // m units a raster group holds (kGroupM row tiles)
  FastDivisor last_group_units;  // ... and the last group, which may hold fewer
  FastDivisor group_tiles;       // cluster tiles of a raster group: group_units x n_units
  FastDivisor tiles_per_split;   // cluster tiles of one split
  int num_cluster_tiles;
  FastDivisor b_shard_width;  // grad_weight with H % 64 == 0: B's columns span shards of this width; 0 otherwise
  int tail_kblock_begin;  // the first k-block of the forward's packed shard tails (kblocks when there are none)
  int tail_shards;        // ... shards whose tail columns make one k-block (64 / (H % 64))
  int tail_h;             // ... the first tail column of a shard (H - H % 64)
  int x_4d;  // x's view is (H, inner, outer, R)
  // x copied along the concatenation by the producer warpgroup (gemm.cuh, kSpanShards): the
  // forward's A (its k-blocks, one reduction group of R * H) or grad_weight's B (its columns, one
  // group of R * H); strides in elements.
  int span_shards;
  const void* x;
  int64_t x_shard_stride, x_outer_stride, x_inner_stride;
  FastDivisor x_shard_width;  // H
  int x_columns;              // R * H
  OutputScatter scatter;  // kGradInput: where grad_x's rows and columns go (x's layout or the concat)
  int vector_store;  // every 16-byte store of 8 elements is aligned (run_core's conditions, by kind)
  // The previous kernel of the stream is one this grid neither reads from nor writes what it
  // reads (the backward's grad_weight right after its grad_x): the grid starts without waiting for
  // it and waits before it exits instead (gather_concat_linear_backward.cu says when that is safe).
  int overlaps_previous_grid;
};

struct TileCoord {
  int outer;        // outer index of the tile's rows
  int inner0;       // first row within that outer index
  int n_group;
  int n0;           // first column within the group
  int kb_begin;     // the tile's slice of the reduction
  int kb_end;
  int split;
  bool exists;  // false for the idle CTA of a cluster past the last row (or column) tile
};

#if defined(__CUDACC__)
template <int kBlockN, bool kInCluster, int kTileM>
__device__ __forceinline__ TileCoord tile_coord(int tile, uint32_t cta_rank, const CoreArgs& a) {
  const int rank = static_cast<int>(cta_rank);
  int split = rank;
  if constexpr (!kInCluster) {
    split = fast_divide(tile, a.tiles_per_split);
    tile -= split * a.tiles_per_split.divisor;
  }
  const int group = fast_divide(tile, a.group_tiles);
  const int first_unit = group * a.group_units.divisor;
  const bool full_group = a.m_units - first_unit >= a.group_units.divisor;
  const FastDivisor& group_m = full_group ? a.group_units : a.last_group_units;
  const int in_group = tile - group * a.group_tiles.divisor;
  const int n_unit = fast_divide(in_group, group_m);
  const int m_unit = first_unit + in_group - n_unit * group_m.divisor;
  const bool pairs_rows = !kInCluster && !a.cluster_along_n;
  const bool pairs_columns = !kInCluster && a.cluster_along_n;
  const int m_tile = pairs_rows ? m_unit * kClusterM + rank : m_unit;
  const int n_tile = pairs_columns ? n_unit * kClusterM + rank : n_unit;
  const int outer = fast_divide(m_tile, a.m_inner_tiles);
  const int n_group = fast_divide(n_tile, a.n_group_tiles);
  TileCoord c;
  c.outer = outer;
  c.inner0 = (m_tile - outer * a.m_inner_tiles.divisor) * kTileM;
  c.n_group = n_group;
  c.n0 = (n_tile - n_group * a.n_group_tiles.divisor) * kBlockN;
  c.kb_begin = split * a.kblocks_per_split;
  c.kb_end = min(a.kblocks, c.kb_begin + a.kblocks_per_split);
  c.split = split;
  c.exists = m_tile < a.m_tiles && n_tile < a.n_tiles;
  return c;
}
#endif

// ------------------------------------------------------------------ host: the plan

// Which operand, if any, the producer warpgroup copies along the concatenation with cp.async.
enum class SpanCopy { kNone, kA, kB };

// The shape of a core GEMM as the scheduler sees it.
struct CoreShape {
  int64_t m_outer, m_inner;        // rows = m_outer * m_inner
  int64_t n_groups, n_group_width;  // columns = n_groups * n_group_width
  int64_t k_groups, k_group_width;  // reduction = k_groups * k_group_width, each group's last k-block partial
  // The forward's packed shard tails: k-blocks after the groups', each the tail columns of several
  // shards, holding `tail_elements` of the reduction in all.
  int64_t tail_kblocks = 0, tail_elements = 0;
  // x along the concatenation, copied by cp.async (gemm.cuh): the forward's A (one reduction group
  // of R * H) or grad_weight's B (one column group of R * H); kNone: x by TMA, a box a shard.
  SpanCopy span_copy = SpanCopy::kNone;
  // The forward computed transposed (GemmKind::kForwardSwapped): M is W's rows, N the tokens, in
  // the token widths below and without a reduction split.
  bool token_tiles = false;
  // The forward a shard at a time (kForward without span_copy): it may run 64-row tiles (kNarrowBlockM).
  bool narrow_tiles = false;
  int64_t kblocks_per_group() const { return ceil_div(k_group_width, kBlockK); }
  int64_t kblocks() const { return k_groups * kblocks_per_group() + tail_kblocks; }
  // Output tiles along M and N at a tile's rows and width.
  int64_t m_tiles(int block_m) const { return m_outer * ceil_div(m_inner, block_m); }
  int64_t n_tiles(int block_n) const { return n_groups * ceil_div(n_group_width, block_n); }
};

// The tile widths of the swapped forward, whose N is the tokens: multiples of 16 (each half of a
// paired token panel is whole 8-row swizzle atoms) between the 128-row steps of the other
// orientation's M, so that 100, 333 or 700 rows pad to 112, 352 or 704 instead of 128, 384 or 768;
// and 96, whose four token tiles of up to 384 rows make 128 CTAs, one wave, where W has 32 row tiles
// (K = 4096: 112 makes 96 CTAs, 176 makes 64), the decomposition cuBLAS runs there (128 x 88 tiles).
// (kTokenWidths, problem.cuh, lists them.)

struct CorePlan {
  int block_n;  // 64, 128, 192 or 256; the swapped forward's 96, 112, 176 or 240
  int splits;   // 1: direct store; > 1: fp32 partial sums added in a fixed order
  int kblocks_per_split;
  bool in_cluster;  // splits > 1: the cluster's CTAs are the slices (DSMEM sum), else a workspace + launch
  double cost = 0;  // its plan_cost in microseconds (choose_plan's, with the device's resident clusters)
  int block_m = kBlockM;  // the tile's rows: kBlockM, or the forward's kNarrowBlockM
};

// Clusters that fit on the GPU at once, by cluster size (2: the paired tiles; 4, 8: in-cluster splits).
struct ResidentClusters {
  int pairs;          // the paired (operand-sharing) kernel's clusters of 2
  int of2, of4, of8;  // the in-cluster split kernel's, by cluster size
  int of(int size) const { return size == 8 ? of8 : size == 4 ? of4 : of2; }
};
constexpr int kClusterSplits[] = {2, 4, 8};
// The widest tile whose reduction splits in the cluster: the sum stages the CTA's partial tile and
// receives its peers' rows of it in the ring's memory, (2S - 1) / S partial tiles, which does not
// fit at 256 wide (135 KB a tile, a 192 KB ring). No 256-wide in-cluster split was the fastest
// forced configuration at any point of runs 125, 130 and 140 (results/*-core-configs.jsonl).
constexpr int kWidestClusterSplit = 192;

// Cluster tiles of one split: pairs of row tiles sharing B, unless pairing the column tiles leaves
// fewer CTAs idle (an odd or single row tile), then pairs of column tiles sharing A.
inline int64_t cluster_tiles(int64_t m_tiles, int64_t n_tiles, bool along_n) {
  return along_n ? m_tiles * ceil_div(n_tiles, kClusterM) : ceil_div(m_tiles, kClusterM) * n_tiles;
}
// 64-wide tiles always pair columns: their B tile is one MN-major box for the backward kinds (not
// split between two CTAs), and their A tile is the larger operand (as large, a narrow tile's: the
// narrow tiles are all 64 wide), so sharing it saves the most.
// Where both pairings leave as many CTAs idle, the pair shares the larger tile likewise: A (128
// rows) against the swapped forward's 96- and 112-token B (at 333 rows of K = 4096, n96: 20 KB of
// L2 reads a CTA a k-block instead of 22).
// An operand copied along the concatenation (CoreShape::span_copy) is each CTA's own cp.async copy,
// which a pair cannot share: the pair shares the other one (A copied: pairs of rows; B: of columns).
inline bool pair_columns(int64_t m_tiles, int64_t n_tiles, int block_n, SpanCopy span_copy) {
  if (span_copy != SpanCopy::kNone) return span_copy == SpanCopy::kB;
  const int64_t along_n = cluster_tiles(m_tiles, n_tiles, true);
  const int64_t along_m = cluster_tiles(m_tiles, n_tiles, false);
  return block_n == 64 || along_n < along_m || (along_n == along_m && block_n < kBlockM);
}

// Time of one plan in microseconds, from what limits it (benchmarks/NOTES.md, "GEMM core", has
// the measurements; benchmarks/core_configs.py --fit fits the constants to a forced-config sweep):
//  * rounds: the persistent grid of resident clusters runs ceil(jobs / clusters) rounds, a job
//    being one slice of one cluster tile; each round is as long as one job: its k-blocks at the
//    tile width's k-block time (a 128 x N x 64 step: tensor-core time for N = 256, the operands'
//    L2 -> SM traffic for the narrower tiles; a 64-row tile's by the operand rows it copies), plus a
//    job's fixed cost (pipeline fill, epilogue); a packed tail k-block at least its copy's time
//    where a CTA walks several tiles;
//  * HBM: no plan beats reading A and B and writing the output once (a floor, not a sum: the
//    streams overlap the MMAs);
//  * a split across the grid adds its fp32 partial sums' traffic (written and read once) and the
//    reducing launch;
//  * a split in the cluster adds the DSMEM sum per slice (narrow_slice_us for the 64-row tiles), and its CTAs share no operand (a
//    cluster tile is one output tile, in one round only: its grid is not persistent; the driver
//    fits 66 pairs, 30 clusters of 4 and 15 of 8 on an H200, fewer than 132 / S): each CTA copies
//    both operand tiles whole, so its k-blocks cost more than a pair's by a part that grows with
//    the unshared B tile, 1 + cluster_unshared * N / 256 (runs 45-63 refit: NOTES, "Runs 62-63").
// Fitted to run 29 (benchmarks/results/run29-core-configs.jsonl: 11 layers x 64-4096 rows, the
// forward, grad_x and grad_weight of 14 forced configurations): the picked configuration is 0.7%
// slower than the fastest measured one on average, 20% at worst (small-K forwards at 100-512 rows,
// where c2/c4 beat the picked n64/s1); on run 28's points, not fitted: 0.3% and 7%. The 192-wide
// k-block time, 0.45 (between the 256- and 128-wide ones, which scale with the width), is what
// --fit keeps on run 37's forced timings, which include the 192-wide configurations.
struct PlanConstants {
  double kblock_us_256, kblock_us_192, kblock_us_128, kblock_us_64;
  double job_us;
  double hbm_bytes_per_us;
  double split_bytes_per_us;
  double split_launch_us;
  double cluster_slice_us;
  double cluster_unshared;
  double span_kblock_us;          // the least a forward k-block along the concatenation takes: A's cp.async copy
  double span_b_kblock_us;        // the least a grad_weight k-block with its columns along the concatenation takes:
  double span_b_kblock_us_per_64; // this plus this per 64 columns of the tile (B's cp.async copy, 8 KB each)
  double tail_kblock_us;          // the least a packed tail k-block of 16-column tails takes (its copy)
  double narrow_slice_us;         // cluster_slice_us of the narrow tiles (each CTA sums 64 / S rows)
};
// narrow_slice_us: run 164 (H100, forced configurations at 100-333 rows, results/run164-h100-core-configs.jsonl)
// puts R=12 H=64 K=768's 12 k-blocks unsplit, c2 and c4 at 8.4, 7.6 and 7.4 µs: ~0.15 µs a narrow
// k-block and ~0.1 a slice, where the 128-row tiles' slices cost 0.75 (NOTES, "Runs 162-164").
constexpr PlanConstants kPlanConstants{0.6, 0.45, 0.3, 0.2, 2.0, 4.0e6, 1.5e6, 3.0, 0.75, 0.2, 0.4, 0.23, 0.16, 0.9, 0.1};

// A k-block's time at a tile width: the fitted widths' constants, linear in between (the token
// widths: 96 and 112 between 64 and 128, 176 between 128 and 192, 240 between 192 and 256).
inline double kblock_us_of(int block_n, const PlanConstants& k) {
  const int widths[4] = {64, 128, 192, 256};
  const double us[4] = {k.kblock_us_64, k.kblock_us_128, k.kblock_us_192, k.kblock_us_256};
  for (int i = 0; i < 4; ++i) {
    if (block_n == widths[i]) return us[i];
  }
  int i = 0;
  while (i < 2 && block_n > widths[i + 1]) ++i;
  return us[i] + (us[i + 1] - us[i]) * (block_n - widths[i]) / double(widths[i + 1] - widths[i]);
}

inline double plan_cost(const CoreShape& s, const CorePlan& plan, const ResidentClusters& resident,
                        const PlanConstants& k = kPlanConstants) {
  // An operand copied along the concatenation costs a k-block at least its cp.async copy: the
  // forward's 16 KB A tile ~0.4 µs whatever the width (run 79: 0.41-0.42 at 64-wide tiles on three
  // layers), so narrow tiles gain nothing there; grad_weight's kBlockN x 64 B tile 0.39, 0.52, 0.71,
  // 0.86 µs at 64, 128, 192, 256 wide (run 88, R=32, H=96, K=3072 at 8192 rows, rounds counted).
  const double span_floor_us = s.span_copy == SpanCopy::kA ? k.span_kblock_us
                               : s.span_copy == SpanCopy::kB
                                   ? k.span_b_kblock_us + k.span_b_kblock_us_per_64 * plan.block_n / 64.0
                                   : 0.0;
  // A narrow tile's k-block copies (64 + N) operand rows instead of (128 + N): its time by those bytes
  // (the narrow tiles' calls are bound by each SM's L2 -> SM traffic, not by the tensor cores).
  const double rows_ratio = static_cast<double>(plan.block_m + plan.block_n) / (kBlockM + plan.block_n);
  const double kblock_us = std::max(kblock_us_of(plan.block_n, k) * rows_ratio, span_floor_us);
  const int64_t m_tiles = s.m_tiles(plan.block_m);
  const int64_t n_tiles = s.n_tiles(plan.block_n);
  const double rows = static_cast<double>(s.m_outer * s.m_inner);
  const double columns = static_cast<double>(s.n_groups * s.n_group_width);
  // The reduction without the zero fill of each group's last k-block, whose empty k steps the
  // kernel skips (a 112-wide head: 7/8 of the padded k-blocks' steps run; 80- and 96-wide heads
  // pack their tails, ~1). Run 54 measured that a partly filled k-block costs what a full one
  // costs, so this term flatters unpacked odd widths; a refit needs data with them (NOTES).
  const double reduction = static_cast<double>(s.k_groups * s.k_group_width + s.tail_elements);
  const double step_fill = reduction / static_cast<double>(s.kblocks() * kBlockK);
  const double hbm_us = 2.0 * (rows * reduction + columns * reduction + rows * columns) / k.hbm_bytes_per_us;
  const double job_us = plan.kblocks_per_split * kblock_us * step_fill + k.job_us;
  if (plan.in_cluster) {
    const int64_t rounds = ceil_div(m_tiles * n_tiles, std::max(1, resident.of(plan.splits)));
    const double unshared = k.cluster_unshared * plan.block_n / 256.0;
    const double cluster_job_us = job_us + plan.kblocks_per_split * kblock_us * step_fill * unshared;
    const double slice_us = plan.block_m == kNarrowBlockM ? k.narrow_slice_us : k.cluster_slice_us;
    return std::max(static_cast<double>(rounds) * (cluster_job_us + slice_us * plan.splits), hbm_us);
  }
  const int64_t jobs =
      cluster_tiles(m_tiles, n_tiles, pair_columns(m_tiles, n_tiles, plan.block_n, s.span_copy)) * plan.splits;
  const int64_t rounds = ceil_div(jobs, std::max(1, resident.pairs));
  // A packed tail k-block (the forward's 80- and 96-wide heads) copies 64 / tail times the box rows
  // of a whole one, as 32- or 64-byte rows, and where a CTA walks several tiles (its producer
  // copying back to back) that copy, not its MMAs, bounds it: at least tail_kblock_us at 16-column
  // tails (half that at 32; a narrow tile's by the rows it copies), hidden only under a tile whose
  // MMAs take longer (run 155, H100: R=16 H=80 K=1280 at 8192 rows 60.4 µs at n128, 53.5 at n256,
  // where R=20 H=64, the same reduction without tails, ran 47.0 and 50.8). Not in one round (nor in
  // the in-cluster splits, one round each): priced there too, it moved 7 measured picks of 100-1024
  // rows to wider tiles or more slices, 5 of them 1.05-1.21x slower, 2 0.86-0.89x (run 156). A job
  // holds the tails its slice reaches (the last slice, at most per_split of them).
  double tail_extra_us = 0.0;
  if (rounds > 1 && s.tail_kblocks > 0) {
    const double tail_columns = static_cast<double>(s.tail_elements) / static_cast<double>(s.k_groups);  // a shard's
    const double tail_us = k.tail_kblock_us * 16.0 / tail_columns * rows_ratio;
    tail_extra_us = static_cast<double>(std::min<int64_t>(s.tail_kblocks, plan.kblocks_per_split)) *
                    std::max(0.0, tail_us - kblock_us);
  }
  double cost = std::max(static_cast<double>(rounds) * (job_us + tail_extra_us), hbm_us);
  if (plan.splits > 1) cost += rows * columns * (8.0 * plan.splits + 2.0) / k.split_bytes_per_us + k.split_launch_us;
  return cost;
}

// The cheapest plan by plan_cost, among those `forced` allows (0 fields: any).
inline CorePlan choose_plan(const CoreShape& s, const ResidentClusters& resident, const ForcedConfig& forced) {
  const int64_t kblocks = s.kblocks();
  // A forced split count is the count its slice length gives (12 k-blocks in 5 slices: 4 of 3).
  const int forced_splits =
      forced.splits > 0 ? static_cast<int>(ceil_div(kblocks, ceil_div(kblocks, forced.splits))) : 0;
  // The widths of this orientation, widest first (problem.cuh).
  const int* const widths = s.token_tiles ? kTokenWidths : kCoreWidths;
  const size_t width_count = s.token_tiles ? std::size(kTokenWidths) : std::size(kCoreWidths);
  // Narrow tiles forced (m64): 64 wide; split in the cluster only where that is forced too (c<S>/m64),
  // so that a forced m64 alone keeps its paired kernel, unsplit or split across the grid.
  const int block_m = forced.block_m != 0 ? forced.block_m : kBlockM;
  const bool narrow = block_m == kNarrowBlockM;
  CorePlan best{forced.block_n != 0 ? forced.block_n : narrow ? 64 : widths[0], 1, static_cast<int>(kblocks), false};
  best.block_m = block_m;
  double best_cost = 1e300;
  auto consider_tiles = [&](CorePlan plan, int tile_m) {
    plan.block_m = tile_m;
    const double cost = plan_cost(s, plan, resident);
    if (cost < best_cost * 0.97) {  // a rival must win by 3% to displace the simpler plan
      best_cost = cost;
      best = plan;
      best.cost = cost;
    }
  };
  auto consider = [&](const CorePlan& plan) { consider_tiles(plan, block_m); };
  // The rule's split in the cluster: every CTA of the cluster gets a slice, and all of `tiles`'
  // clusters fit at once (one round: plan_cost's note).
  auto one_round_in_cluster = [&](int64_t tiles, int slices) {
    return ceil_div(kblocks, slices) * (slices - 1) < kblocks && tiles <= resident.of(slices);
  };
  for (size_t w = 0; w < width_count; ++w) {
    const int block_n = widths[w];
    if ((forced.block_n != 0 && block_n != forced.block_n) || (narrow && block_n != 64)) continue;
    if (s.token_tiles) {  // no split: the tokens' tiles are few only where the product is small
      consider({block_n, 1, static_cast<int>(kblocks), false});
      continue;
    }
    if (forced_splits != 0) {  // its slices are ceil(kblocks / forced_splits) long, whatever their length
      consider({block_n, forced_splits, static_cast<int>(ceil_div(kblocks, forced_splits)), false});
      continue;
    }
    for (int splits = 1; splits <= 64 && forced.cluster_splits == 0; ++splits) {
      const int64_t per_split = ceil_div(kblocks, splits);
      // A slice shorter than the ring does not pay for its partials; slices only get shorter from here.
      if (per_split < 4 && splits > 1) break;
      if (ceil_div(kblocks, per_split) == splits) consider({block_n, splits, static_cast<int>(per_split), false});
    }
    if (narrow && forced.cluster_splits == 0) continue;
    const int64_t tiles = s.m_tiles(block_m) * s.n_tiles(block_n);
    for (int slices : kClusterSplits) {
      const int64_t per_split = ceil_div(kblocks, slices);
      // The rule's splits take one round (one_round_in_cluster); forced, the last slices may sum
      // zero tiles and the clusters may take several rounds. grad_weight's
      // columns along the concatenation take no in-cluster split by the rule: run 89 timed the
      // ones the model picked 1.1-1.7x the unsplit plans at 1024 rows (a slice's few k-blocks
      // cannot hide its cp.async copies) and no faster than them (within 7%) at 4096-8192.
      const bool skip = block_n > kWidestClusterSplit ||
                        (forced.cluster_splits != 0 ? forced.cluster_splits != slices
                                                    : !one_round_in_cluster(tiles, slices) || s.span_copy == SpanCopy::kB);
      if (!skip) consider({block_n, slices, static_cast<int>(per_split), true});
    }
  }
  // The forward's narrow tiles, unsplit, against an unsplit plan only: twice the CTAs at 2/3 of the
  // bytes a 64-wide k-block, where the plan's CTAs are too few to fill the SMs. A split already
  // doubles the CTAs, and where the model splits, the narrow tiles lost to the split (run 151, H100:
  // R=16 H=80 K=1280 at 100-333 rows 1.06-1.07x its n64/c2, R=32 H=96 K=3072 at 100-128 rows 1.25x
  // its n64/c2) while they won 7-12% over unsplit n64 (R=12 H=64 K=768 and R=3 H=256 K=1000 at
  // 100-512 rows, R=8 H=80 K=2048 at 100-256) and lost where their twice the tiles take two rounds.
  // The narrow tiles split in the cluster are weighed after them (an unsplit plan) or alone (a
  // 64-wide split in the cluster, by as many slices or more), each split where its clusters fit at
  // once (the rule's one round), unless s1 is forced: a CTA's k-blocks copy 2/3 of the bytes and it
  // sums 64 / S rows, which cost far less than the 128-row tiles' sums (narrow_slice_us). Run 165
  // (H100, 12 layers at 100-333 rows): c2 / c4 of them in place of the unsplit narrow tiles ran
  // 0.83-0.99x, c4 of them in place of c2 of them 0.93-0.95x; c2 of them in place of n64/c4 (twice
  // the k-blocks a CTA) 1.03-1.18x where the model had them cheaper, so fewer slices are not weighed.
  const bool plan_free = forced.block_n == 0 && forced.splits <= 1 && forced.cluster_splits == 0 && forced.block_m == 0;
  const bool after_unsplit = best.splits == 1;
  if (plan_free && s.narrow_tiles && (after_unsplit || (best.in_cluster && best.block_n == 64))) {
    const int fewest_slices = best.splits;
    if (after_unsplit) consider_tiles({64, 1, static_cast<int>(kblocks), false}, kNarrowBlockM);
    const int64_t narrow_tile_count = s.m_tiles(kNarrowBlockM) * s.n_tiles(64);
    for (int slices : kClusterSplits) {
      if (forced.splits == 0 && slices >= fewest_slices && one_round_in_cluster(narrow_tile_count, slices)) {
        consider_tiles({64, slices, static_cast<int>(ceil_div(kblocks, slices)), true}, kNarrowBlockM);
      }
    }
  }
  return best;
}

}  // namespace sm90
}  // namespace vga
