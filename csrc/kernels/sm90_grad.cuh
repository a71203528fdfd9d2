// The backward products on Hopper for fp16/bf16: the GEMM core (sm90/gemm.cuh) as
//  * kGradInput:  grad_x = grad_out @ W, rows x R*H over K. A = grad_out (K-major), B = W read
//    along its rows (MN-major, wgmma's transpose bit), stored through grad_x's layout (x's own
//    strides where x is dense, else the (rows, R*H) matrix the (R, *batch, H) result is a view
//    of): each 8-column store lies in one shard, its address from the OutputScatter divisors.
//  * kGradWeight: grad_W = grad_out^T @ cat(x), K x R*H over the rows. A = grad_out^T (MN-major),
//    B = x through the forward's (H, inner, outer, R) view (MN-major), so the concat is never
//    materialised either; with H % 64 != 0 an N tile stays inside one shard (n = shard * H + h),
//    zero-filled past H, or, as by default there, the columns run along the concatenation,
//    copied by cp.async (sm90_grad_weight_plan).
// Training reductions are long (grad_weight: all rows) and the outputs may have few tiles: the
// core's plan splits the reduction where that fills the GPU and sums the fp32 slices in a fixed
// order, so gradients are bitwise identical run to run. Tile shapes: see sm90/gemm.cuh.
#pragma once

#include "problem.cuh"
#include "sm90/gemm.cuh"
#include "sm90/views.cuh"

namespace vga {

inline const char* sm90_grad_input_refusal(const GradInputProblem& p) {
  using namespace sm90;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype is not fp16/bf16";
  if (p.cc_major != 9) return "needs an sm_90 (Hopper) GPU";
  if (p.rows <= 0 || p.out_features <= 0 || p.columns() <= 0) return "empty problem";
  if (p.rows > kMaxCoordinate || p.out_features > kMaxCoordinate || p.columns() > kMaxCoordinate)
    return "a dimension is >= 2^31";
  if (p.grad_out_stride < 0) return "grad_out's batch dims do not merge into one row stride";
  if (const char* why = matrix_view_refusal(p.grad_out, p.dtype, p.grad_out_stride, p.rows)) return why;
  if (p.weight_stride_in != 1) return "weight's input dim is not contiguous";
  if (const char* why = matrix_view_refusal(p.weight, p.dtype, p.weight_stride_out, p.out_features)) return why;
  if (p.rows * p.columns() * 16 * 4 > (int64_t(1) << 40)) return "output too large for split partial sums";
  return nullptr;
}

inline void sm90_grad_input(const GradInputProblem& p, cudaStream_t stream) {
  using namespace sm90;
  const CUtensorMap grad_out_map = matrix_tensor_map(p.grad_out, p.dtype, p.out_features, p.rows, p.grad_out_stride,
                                                     1, 0, kBlockK, kConsumerRows);  // a box a consumer
  const CUtensorMap weight_map = matrix_tensor_map(p.weight, p.dtype, p.columns(), p.out_features,
                                                   p.weight_stride_out, 1, 0, 64, kBlockK);
  CoreShape shape;
  shape.m_outer = 1;
  shape.m_inner = p.rows;
  shape.n_groups = 1;
  shape.n_group_width = p.columns();
  shape.k_groups = 1;
  shape.k_group_width = p.out_features;
  CoreArgs args{};
  args.out = p.grad_x;
  args.out_ld = p.columns();  // the product's row-major ld (the split partial sums')
  args.scatter = make_output_scatter(p.layout);
  auto weight_map_for = [&](int) { return weight_map; };
  visit_half_dtype(p.dtype, [&](auto element) {
    using Element = decltype(element);
    const CorePlan plan = core_plan<GemmKind::kGradInput, Element>(shape, p.forced, p.device_index);
    run_core<GemmKind::kGradInput, Element>(shape, plan, args, grad_out_map, weight_map_for, p.workspace,
                                            p.device_index, stream);
  });
}

inline const char* sm90_grad_weight_refusal(const GradWeightProblem& g) {
  using namespace sm90;
  const ForwardProblem& p = g.shards;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype is not fp16/bf16";
  if (const char* why = tma_view_refusal(p)) return why;
  if (g.grad_out_stride != p.out_features) return "grad_out is not a contiguous (rows, K) matrix";
  if (const char* why = matrix_view_refusal(g.grad_out, p.dtype, p.out_features, p.rows())) return why;
  const RowView rows = row_view(p);
  const int64_t kblocks = rows.outer * ceil_div(rows.inner, kBlockK);
  if (rows.four_d && kblocks * kBlockK > 2 * p.rows())
    return "two unmergeable batch dims with the inner one too short for 64-row k-blocks";
  if (kblocks > kMaxCoordinate) return "reduction too long";
  if (p.out_features * p.reduction() * 16 * 4 > (int64_t(1) << 40)) return "output too large for split partial sums";
  return nullptr;
}

// grad_weight's N tiles. With H a multiple of 64, one column group of R * H by TMA: a 64-column
// box never straddles two shards, so 256-wide tiles serve 128-wide heads. Otherwise either a group
// a shard (a tile stays in its shard, zero-filled past H: an 80-wide head fills 80 of a 128-wide
// tile's columns, 2 tiles a shard at 64 wide) or one group of R * H whose B columns the producer
// warpgroup copies by cp.async (gemm.cuh, kSpanShards: no empty columns, dearer copies).
inline bool grad_weight_boxes_span_shards(const ForwardProblem& p) { return p.shard_width % sm90::kBlockK == 0; }

// grad_weight's product on the core: K x R*H over the batch rows (`copies_span`: its columns one
// group copied along the concatenation).
inline sm90::CoreShape grad_weight_core_shape(const GradWeightProblem& g, bool copies_span) {
  using namespace sm90;
  const ForwardProblem& p = g.shards;
  const RowView rows = row_view(p);
  const bool one_group = copies_span || grad_weight_boxes_span_shards(p);
  CoreShape shape;
  shape.m_outer = 1;
  shape.m_inner = p.out_features;
  shape.n_groups = one_group ? 1 : p.num_shards;
  shape.n_group_width = one_group ? p.reduction() : p.shard_width;
  shape.k_groups = rows.outer;
  shape.k_group_width = rows.inner;
  shape.span_copy = copies_span ? SpanCopy::kB : SpanCopy::kNone;
  return shape;
}

// What sm90_grad_weight runs: the column layout and the core's plan for it. The rule: where H is
// not a multiple of 64 (and R * H fits), the columns along the concatenation, unless "shards" is
// forced: run 88 (H100) timed them faster than tiles a shard on 34 of 35 points (7 layers with
// H = 48-136, 100-8192 rows), by 10-45% (the one exception +3%: R=40, H=112 at 8192 rows), as no
// tile holds empty columns (80-wide heads fill 80 of a 128-wide tile a shard) and the tiles are
// fewer, while the copies cost 1.5-2x TMA's a k-block. A forced width or split applies within
// the layout.
struct Sm90GradWeightPlan {
  bool copies_span;
  sm90::CoreShape shape;
  sm90::CorePlan plan;
};

template <typename Element>
Sm90GradWeightPlan sm90_grad_weight_plan(const GradWeightProblem& g) {
  using namespace sm90;
  const ForwardProblem& p = g.shards;
  const bool can_span = x_can_span(p);
  STD_TORCH_CHECK(p.forced.layout != kSpanLayout || can_span, "vga sm90_gemm: grad_weight's layout 'span' (columns "
                  "along the concatenation) needs H % 64 != 0 and R * H < 2^31 - 1024; H is ", p.shard_width,
                  ", R * H ", p.num_shards * p.shard_width);
  const bool copies_span = can_span && p.forced.layout != kShardLayout;
  const CoreShape shape = grad_weight_core_shape(g, copies_span);
  return {copies_span, shape, core_plan<GemmKind::kGradWeight, Element>(shape, p.forced, p.device_index)};
}

// The workspace sm90_grad_weight will ask for (its plan's split partials; 0 when it has none), so
// that a caller can allocate it ahead of other launches (gather_concat_linear_backward.cu).
inline int64_t sm90_grad_weight_workspace_bytes(const GradWeightProblem& g) {
  using namespace sm90;
  int64_t bytes = 0;
  visit_half_dtype(g.shards.dtype, [&](auto element) {
    const Sm90GradWeightPlan chosen = sm90_grad_weight_plan<decltype(element)>(g);
    bytes = grid_split_workspace_bytes(chosen.shape, chosen.plan, g.shards.reduction());
  });
  return bytes;
}

inline void sm90_grad_weight(const GradWeightProblem& g, cudaStream_t stream) {
  using namespace sm90;
  const ForwardProblem& p = g.shards;
  const RowView rows = row_view(p);
  // grad_out is contiguous (outer, inner, K): viewed as (K, inner, outer) it lines up with x's view.
  const CUtensorMap grad_out_map = matrix_tensor_map(g.grad_out, p.dtype, p.out_features, rows.inner,
                                                     p.out_features, rows.outer, rows.inner * p.out_features, 64,
                                                     kBlockK);
  // (with the columns copied along the concatenation, x_map is unused but for its prefetch)
  const CUtensorMap x_map = x_tensor_map(p, rows, 64, kBlockK, /*always_4d=*/true);
  CoreArgs args{};
  args.out = g.grad_weight;
  args.out_ld = p.reduction();
  args.overlaps_previous_grid = g.overlaps_previous_grid ? 1 : 0;
  auto x_map_for = [&](int) { return x_map; };
  visit_half_dtype(p.dtype, [&](auto element) {
    using Element = decltype(element);
    const Sm90GradWeightPlan chosen = sm90_grad_weight_plan<Element>(g);
    // (columns copied along the concatenation have H % 64 != 0: their boxes never span shards)
    args.b_shard_width = make_fast_divisor(grad_weight_boxes_span_shards(p) ? static_cast<int>(p.shard_width) : 0);
    if (chosen.copies_span) set_span_source(args, p, rows);
    run_core<GemmKind::kGradWeight, Element>(chosen.shape, chosen.plan, args, grad_out_map, x_map_for, p.workspace,
                                             p.device_index, stream);
  });
}

}  // namespace vga
