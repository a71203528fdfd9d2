// The GEMM core's tile scheduler: which output tile and which slice of the reduction a CTA works
// on next, and (host side) the plan: tile width and split count chosen per shape.
//
// A persistent grid of clusters of kClusterM CTAs walks "cluster tiles" in grouped order: kGroupM
// row tiles at a time, all their column tiles before the next group, so the clusters in flight
// share A and B panels in L2. A cluster tile is kClusterM vertically adjacent tiles sharing one B
// panel (each CTA loads part of it and multicasts it), or, where the row tiles are too few to pair
// (rows <= 128: the second CTA would idle), kClusterM horizontally adjacent tiles sharing one A
// panel the same way. With a split reduction the walk repeats per
// slice of k-blocks; each slice writes fp32 partial sums that one fixed-order pass adds up
// (epilogue.cuh), so results are bitwise deterministic.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../problem.cuh"

namespace vga {
namespace sm90 {

constexpr int kBlockM = 128;  // two consumer warpgroups of 64 rows
constexpr int kBlockK = 64;   // one 128-byte swizzle row of 16-bit elements
constexpr int kClusterM = 2;
constexpr int kGroupM = 16;  // 16 beat 8 by 1-3% on the prefill shapes (less DRAM traffic under the power cap)
static_assert(kGroupM % kClusterM == 0, "a group holds whole clusters");

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
  int m_inner_tiles;
  int m_tiles;
  int n_group_width;
  int n_group_tiles;
  int n_tiles;
  int kblocks;
  int kblocks_per_group;
  int kblocks_per_split;
  int cluster_along_n;  // 0: a cluster's CTAs are adjacent row tiles (B shared), 1: column tiles (A shared)
  int m_units;          // cluster tiles along M: ceil(m_tiles / kClusterM), or m_tiles along N
  int n_units;          // cluster tiles along N: n_tiles, or ceil(n_tiles / kClusterM)
  int group_units;      // m units a raster group holds (kGroupM row tiles)
  int tiles_per_split;  // cluster tiles of one split
  int num_cluster_tiles;
  int b_shard_width;    // grad_weight with H % 64 == 0: B's columns span shards of this width; 0 otherwise
  int a_4d;
  int vector_store;  // out (or the partials) 16-byte aligned and out_ld % 8 == 0
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
template <int kBlockN>
__device__ __forceinline__ TileCoord tile_coord(int tile, uint32_t cta_rank, const CoreArgs& a) {
  const int split = tile / a.tiles_per_split;
  tile -= split * a.tiles_per_split;
  const int tiles_per_group = a.group_units * a.n_units;
  const int group = tile / tiles_per_group;
  const int first_unit = group * a.group_units;
  const int group_m = min(a.m_units - first_unit, a.group_units);
  const int in_group = tile - group * tiles_per_group;
  const int m_unit = first_unit + in_group % group_m;
  const int n_unit = in_group / group_m;
  const int rank = static_cast<int>(cta_rank);
  const int m_tile = a.cluster_along_n ? m_unit : m_unit * kClusterM + rank;
  const int n_tile = a.cluster_along_n ? n_unit * kClusterM + rank : n_unit;
  const int outer = m_tile / a.m_inner_tiles;
  const int n_group = n_tile / a.n_group_tiles;
  TileCoord c;
  c.outer = outer;
  c.inner0 = (m_tile - outer * a.m_inner_tiles) * kBlockM;
  c.n_group = n_group;
  c.n0 = (n_tile - n_group * a.n_group_tiles) * kBlockN;
  c.kb_begin = split * a.kblocks_per_split;
  c.kb_end = min(a.kblocks, c.kb_begin + a.kblocks_per_split);
  c.split = split;
  c.exists = m_tile < a.m_tiles && n_tile < a.n_tiles;
  return c;
}
#endif

// ------------------------------------------------------------------ host: the plan

// The shape of a core GEMM as the scheduler sees it.
struct CoreShape {
  int64_t m_outer, m_inner;                 // rows = m_outer * m_inner
  int64_t n_groups, n_group_width;          // columns = n_groups * n_group_width
  int64_t kblocks, kblocks_per_group;
};

struct CorePlan {
  int block_n;  // 128 or 256
  int splits;   // 1: direct store; > 1: fp32 partials + a fixed-order reduction
  int kblocks_per_split;
  bool cluster_along_n;
};

// Cluster tiles of one split: pairs of row tiles sharing B, unless pairing the column tiles leaves
// fewer CTAs idle (an odd or single row tile), then pairs of column tiles sharing A.
inline int64_t cluster_tiles(int64_t m_tiles, int64_t n_tiles, bool along_n) {
  return along_n ? m_tiles * ceil_div(n_tiles, kClusterM) : ceil_div(m_tiles, kClusterM) * n_tiles;
}
inline bool pair_columns(int64_t m_tiles, int64_t n_tiles) {
  return cluster_tiles(m_tiles, n_tiles, true) < cluster_tiles(m_tiles, n_tiles, false);
}

// Time of one plan in units of one 128 x 256 x 64 tile step (~0.8 us on an H200 SM at the
// chip's ~700 TFLOP/s), from what limits it. The constants are fitted to run 23's forced-config
// sweep (benchmarks/core_configs.py --fit; mean regret 0.1%, worst 6%; benchmarks/NOTES.md, "GEMM core"):
//  * waves: a persistent grid of `resident_clusters` clusters runs ceil(cluster tiles / clusters)
//    rounds, each as long as one tile's k-blocks (the tail wave costs a full round);
//  * a 128 x 128 step costs 0.6 of a 128 x 256 one (each B byte feeds half the FLOPs);
//  * a tile's fixed cost (pipeline fill, epilogue stores) ~0.5 steps;
//  * a split adds its partial sums' fp32 traffic (written once, read once, ~3 TB/s) and the
//    reducing launch with its wait (~8 steps).
inline double plan_cost(const CoreShape& s, int block_n, int splits, int kblocks_per_split, int resident_clusters) {
  const double step = block_n == 256 ? 1.0 : 0.6;
  const int64_t m_tiles = s.m_outer * ceil_div(s.m_inner, kBlockM);
  const int64_t n_tiles = s.n_groups * ceil_div(s.n_group_width, block_n);
  const int64_t tiles = cluster_tiles(m_tiles, n_tiles, pair_columns(m_tiles, n_tiles)) * splits;
  const int64_t rounds = ceil_div(tiles, std::max(1, resident_clusters));
  double cost = static_cast<double>(rounds) * (kblocks_per_split * step + 0.5);
  if (splits > 1) {
    const double rows = static_cast<double>(s.m_outer * s.m_inner);
    const double bytes = rows * static_cast<double>(s.n_groups * s.n_group_width) * (8.0 * splits + 2.0);
    cost += bytes / 3.0e12 / 0.8e-6 + 8.0;
  }
  return cost;
}

inline CorePlan choose_plan(const CoreShape& s, int resident_clusters, int only_block_n = 0) {
  CorePlan best{256, 1, static_cast<int>(s.kblocks), false};
  double best_cost = 1e300;
  for (int block_n : {256, 128}) {
    if (only_block_n != 0 && block_n != only_block_n) continue;
    for (int splits = 1; splits <= 16; ++splits) {
      const int64_t per_split = ceil_div(s.kblocks, splits);
      if (per_split < 4 && splits > 1) break;  // a slice shorter than the ring does not pay for its partials
      const int used = static_cast<int>(ceil_div(s.kblocks, per_split));
      if (used != splits) continue;
      const double cost = plan_cost(s, block_n, used, static_cast<int>(per_split), resident_clusters);
      if (cost < best_cost * 0.97) {  // a rival must win by 3% to displace the simpler plan
        best_cost = cost;
        best = {block_n, used, static_cast<int>(per_split), false};
      }
    }
  }
  return best;
}

}  // namespace sm90
}  // namespace vga
