// The "sm90_gemm" family: y = cat(x[0..R-1], -1) @ W^T + bias on Hopper for fp16/bf16 once
// there are more rows than the skinny families take: the GEMM core (sm90/gemm.cuh) as kForward.
// A is x through its (H, rows, R) / (H, inner, outer, R) TMA view, B is W through (H, R, K),
// both K-major; the k-block (r, h0) of a tile is one bulk copy each, zero-filled past H, so the
// concat is never materialised. Where H % 64 is 16 or 32 (80-, 96-, 32-wide heads) the shards'
// tail columns are packed instead, 64 / (H % 64) shards' tails to a k-block after the shards'
// whole k-blocks (boxes of 32- or 64-byte rows, one shard's block after another: gemm.cuh). Other
// widths that are not a multiple of 64 may run the k-blocks along the concatenation instead (one
// reduction group of R * H, no zero fill): x's k-block, which may cross shards, copied by cp.async
// 16 bytes at a time (gemm.cuh, kSpanShards), W through its (R*H, 1, K) view; the plan takes it
// where its fewer k-blocks outweigh their dearer copies (sm90_gemm_plan: run 83 on an H100, -7 to
// -21% from 1024 rows, up to +49% at 100-256 rows where it had been taken for every shape). Packing
// keeps the 80- and 96-wide heads: it needs as few k-blocks as the concatenation and copies them
// by TMA (run 80: the concatenation's copies lost 1-14% there). Tile
// width (64, 128, 192 or 256) and reduction split (none, across the grid, or in a cluster) come
// from the core's plan (sm90/schedule.cuh): 128 x 256 tiles where they fill the GPU, narrower
// tiles and splits where they would leave SMs idle (100-1024 rows, small K), and 64 x 64 tiles
// ("m64", one consumer warpgroup) where an unsplit plan's 128-row tiles, or a 64-wide split in the
// cluster's, are too few for the SMs. Or the product runs
// transposed (kForwardSwapped: W's rows in 128-row tiles, the tokens in tiles of 96, 112, 176 or 240)
// where the plan model says the tokens' padding to 128-row tiles costs more than 3% (333 rows are
// 3 x 128 = 384 rows of work, 2 x 176 = 352 swapped): the rule compares the two orientations'
// cheapest plans. Shapes that pack shard tails keep the first one.
#pragma once

#include <string>

#include "problem.cuh"
#include "sm90/gemm.cuh"
#include "sm90/views.cuh"

namespace vga {

inline const char* sm90_gemm_refusal(const ForwardProblem& p) {
  using namespace sm90;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype is not fp16/bf16";
  if (const char* why = tma_view_refusal(p)) return why;
  const RowView rows = row_view(p);
  const int64_t m_tiles = rows.outer * ceil_div(rows.inner, kBlockM);
  if (rows.four_d && m_tiles * kBlockM > 2 * p.rows())
    return "two unmergeable batch dims with the inner one too short for 128-row tiles";
  if ((m_tiles + kClusterM) * ceil_div(p.out_features, 64) * 16 > kMaxCoordinate) return "too many output tiles";
  if (ceil_div(p.shard_width, kBlockK) * p.num_shards > kMaxCoordinate) return "reduction too long";
  if (p.rows() * p.out_features * 16 * 4 > (int64_t(1) << 40)) return "output too large for split partial sums";
  return nullptr;
}

// The shards' tail columns (H % 64 of them) packed 64 / (H % 64) shards to a k-block, where that
// divides: a k-block's cost is its boxes' rows and bytes, zero fill included, not the data it holds
// (benchmarks/NOTES.md, run 54), so an 80-wide head's k-block of 16 columns and 48 zeros costs
// what a full one costs; packed, four shards' tails are one full k-block. 0: no packing.
inline int64_t sm90_gemm_packed_tail(const ForwardProblem& p) {
  const int64_t tail = p.shard_width % sm90::kBlockK;
  return (tail == 16 || tail == 32) ? tail : 0;
}

// The views of those tails (for sm90_gemm and sm90_skinny alike): x and W through their usual
// views with boxes of the `tail` columns, swizzled as wide as those 32- or 64-byte rows; x's box
// spans the 64 / tail shards of a k-block for `x_rows` rows, W's one shard for `w_rows` rows.
inline sm90::TailMaps packed_tail_maps(const ForwardProblem& p, const sm90::RowView& rows, int64_t tail,
                                       cuuint32_t x_rows, cuuint32_t w_rows) {
  const cuuint32_t box_h = static_cast<cuuint32_t>(tail);
  const CUtensorMapSwizzle swizzle = tail == 16 ? CU_TENSOR_MAP_SWIZZLE_32B : CU_TENSOR_MAP_SWIZZLE_64B;
  return sm90::TailMaps{
      sm90::x_tensor_map(p, rows, box_h, x_rows, false, static_cast<cuuint32_t>(sm90::kBlockK / tail), swizzle),
      sm90::w_tensor_map(p, box_h, w_rows, swizzle)};
}

// The swapped forward's shape: M = W's rows, N = the tokens (groups = x's outer batch index,
// which a token tile never straddles), the reduction R shards of H (unpacked).
inline sm90::CoreShape sm90_gemm_token_tile_shape(const ForwardProblem& p, const sm90::RowView& rows) {
  sm90::CoreShape shape;
  shape.m_outer = 1;
  shape.m_inner = p.out_features;
  shape.n_groups = rows.outer;
  shape.n_group_width = rows.inner;
  shape.k_groups = p.num_shards;
  shape.k_group_width = p.shard_width;
  shape.token_tiles = true;
  return shape;
}

// The forward's own shape: rows x K over R shards of H (with packed tails, the shards' whole
// k-blocks and then the tail k-blocks), or over one group of R * H along the concatenation.
inline sm90::CoreShape sm90_gemm_shape(const ForwardProblem& p, const sm90::RowView& rows, int64_t tail,
                                       bool spans_shards) {
  sm90::CoreShape shape;
  shape.m_outer = rows.outer;
  shape.m_inner = rows.inner;
  shape.n_groups = 1;
  shape.n_group_width = p.out_features;
  shape.k_groups = spans_shards ? 1 : p.num_shards;
  // with packed tails, the shards' whole k-blocks only
  shape.k_group_width = spans_shards ? p.num_shards * p.shard_width : p.shard_width - tail;
  shape.span_copy = spans_shards ? sm90::SpanCopy::kA : sm90::SpanCopy::kNone;
  shape.narrow_tiles = !spans_shards;
  shape.tail_kblocks = tail > 0 ? ceil_div(p.num_shards, sm90::kBlockK / tail) : 0;
  shape.tail_elements = p.num_shards * tail;
  return shape;
}

// The forward's x view and its product in both orientations, and along the concatenation.
struct Sm90GemmShapes {
  sm90::RowView rows;
  int64_t tail;            // sm90_gemm_packed_tail
  bool can_span;           // sm90::x_can_span
  sm90::CoreShape shape;   // rows x K, k-blocks a shard (sm90_gemm_shape)
  sm90::CoreShape span;    // rows x K, k-blocks along the concatenation (where can_span)
  sm90::CoreShape swapped; // K x rows in token tiles (sm90_gemm_token_tile_shape)
};

inline Sm90GemmShapes sm90_gemm_shapes(const ForwardProblem& p) {
  const sm90::RowView rows = sm90::row_view(p);
  const int64_t tail = sm90_gemm_packed_tail(p);
  const bool can_span = sm90::x_can_span(p);  // (the plan weighs it where the tails do not pack either)
  return {rows, tail, can_span, sm90_gemm_shape(p, rows, tail, false), sm90_gemm_shape(p, rows, 0, true),
          sm90_gemm_token_tile_shape(p, rows)};
}

// What sm90_gemm_forward runs: the layout, the orientation and the core's plan for them. The rule:
// the cheapest of the shards' layout in either orientation and the concatenation's, a rival
// displacing the plan so far only if 3% cheaper (as between plans), unless a width, a split, a
// layout or the narrow tiles are forced (a token width forces the swapped orientation, "span" the
// concatenation, "m64" the shards' layout in the first orientation) or the shape packs shard
// tails (the shards' layout, first orientation). The concatenation's cost is weighed against the
// shards' layout with its zero fill charged: a stage costs what it copies, fill included (run 54),
// which plan_cost's fill discount leaves out between plans of one layout.
struct Sm90GemmPlan {
  bool swapped;
  bool spans_shards;
  sm90::CorePlan plan;
};

// The shape with each group's zero fill counted as reduction (plan_cost's fill discount off).
inline sm90::CoreShape with_fill_charged(sm90::CoreShape s) {
  s.k_group_width = s.kblocks_per_group() * sm90::kBlockK;
  return s;
}

template <typename Element>
Sm90GemmPlan sm90_gemm_plan(const ForwardProblem& p, const Sm90GemmShapes& s) {
  using namespace sm90;
  STD_TORCH_CHECK(p.forced.layout != kSpanLayout || s.can_span, "vga sm90_gemm: layout 'span' (k-blocks along the "
                  "concatenation) needs H % 64 != 0 and R * H < 2^31 - 1024; H is ", p.shard_width, ", R * H ",
                  p.num_shards * p.shard_width);
  STD_TORCH_CHECK(p.forced.layout != kSpanLayout || !is_token_width(p.forced.block_n),
                  "vga sm90_gemm: the token widths (", width_names(kTokenWidths), ") run k-blocks a shard, not 'span'");
  if (p.forced.layout == kSpanLayout) {
    return {false, true, core_plan<GemmKind::kForward, Element>(s.span, p.forced, p.device_index)};
  }
  if (is_token_width(p.forced.block_n)) {
    return {true, false, core_plan<GemmKind::kForwardSwapped, Element>(s.swapped, p.forced, p.device_index)};
  }
  const CorePlan plan = core_plan<GemmKind::kForward, Element>(s.shape, p.forced, p.device_index);
  const bool forced_other =
      p.forced.block_n != 0 || p.forced.splits > 1 || p.forced.cluster_splits != 0 || p.forced.layout != 0 ||
      p.forced.block_m != 0;
  if (forced_other || s.tail != 0) return {false, false, plan};
  const CorePlan swapped = core_plan<GemmKind::kForwardSwapped, Element>(s.swapped, p.forced, p.device_index);
  const Sm90GemmPlan shards = swapped.cost < 0.97 * plan.cost ? Sm90GemmPlan{true, false, swapped}
                                                              : Sm90GemmPlan{false, false, plan};
  if (!s.can_span) return shards;
  const CorePlan span = core_plan<GemmKind::kForward, Element>(s.span, p.forced, p.device_index);
  const ResidentClusters& resident = shards.swapped ? resident_clusters<GemmKind::kForwardSwapped, Element>(p.device_index)
                                                    : resident_clusters<GemmKind::kForward, Element>(p.device_index);
  const double shards_cost = plan_cost(with_fill_charged(shards.swapped ? s.swapped : s.shape), shards.plan, resident);
  return span.cost < 0.97 * shards_cost ? Sm90GemmPlan{false, true, span} : shards;
}

// The configuration the forward runs for p, as the forced-configuration names spell it
// ("n128/s2": 128-wide tiles, the reduction split in 2 across the grid; "n64/c4": in clusters of
// 4; "n176": the swapped forward's token width; "n64/s1/m64": the narrow tiles), so that forcing it
// runs the same plan.
inline std::string sm90_gemm_config(const ForwardProblem& p) {
  const Sm90GemmShapes shapes = sm90_gemm_shapes(p);
  Sm90GemmPlan chosen{};
  visit_half_dtype(p.dtype, [&](auto element) { chosen = sm90_gemm_plan<decltype(element)>(p, shapes); });
  std::string name = "n" + std::to_string(chosen.plan.block_n);
  if (!chosen.swapped) name += (chosen.plan.in_cluster ? "/c" : "/s") + std::to_string(chosen.plan.splits);
  if (chosen.spans_shards) name += "/span";
  if (chosen.plan.block_m == sm90::kNarrowBlockM) name += "/m64";
  return name;
}

inline void sm90_gemm_forward(const ForwardProblem& p, cudaStream_t stream) {
  using namespace sm90;
  const Sm90GemmShapes shapes = sm90_gemm_shapes(p);
  const RowView& rows = shapes.rows;
  const int64_t tail = shapes.tail;
  CoreArgs args{};
  args.out = p.out;
  args.out_ld = p.out_features;
  args.bias = p.bias;
  args.bias_stride = p.bias_stride;
  args.x_4d = rows.four_d ? 1 : 0;
  visit_half_dtype(p.dtype, [&](auto element) {
    using Element = decltype(element);
    const Sm90GemmPlan chosen = sm90_gemm_plan<Element>(p, shapes);
    if (chosen.swapped) {  // A is W (a box a consumer), B the tokens (half a token tile a box)
      const CUtensorMap w_rows_map = w_tensor_map(p, kBlockK, kConsumerRows);
      auto tokens_map_for = [&](int block_n) { return x_tensor_map(p, rows, kBlockK, block_n / kClusterM); };
      run_core<GemmKind::kForwardSwapped, Element>(shapes.swapped, chosen.plan, args, w_rows_map, tokens_map_for,
                                                   p.workspace, p.device_index, stream);
      return;
    }
    args.tail_shards = static_cast<int>(tail > 0 && !chosen.spans_shards ? kBlockK / tail : 0);
    args.tail_h = static_cast<int>(p.shard_width - tail);
    // an A tile is a box a consumer (a narrow tile's one)
    const CUtensorMap x_map = x_tensor_map(p, rows, kBlockK, kConsumerRows);
    // A by cp.async (x_map unused but for its prefetch), W along its rows
    if (chosen.spans_shards) set_span_source(args, p, rows);
    auto w_map_for = [&](int block_n) {
      return chosen.spans_shards ? w_concat_tensor_map(p, kBlockK, block_n / kClusterM)
                                 : w_tensor_map(p, kBlockK, block_n / kClusterM);
    };
    auto tail_maps_for = [&](int block_n) { return packed_tail_maps(p, rows, tail, kConsumerRows, block_n / kClusterM); };
    run_core<GemmKind::kForward, Element>(chosen.spans_shards ? shapes.span : shapes.shape, chosen.plan, args, x_map,
                                          w_map_for, p.workspace, p.device_index, stream, tail_maps_for);
  });
}

}  // namespace vga
