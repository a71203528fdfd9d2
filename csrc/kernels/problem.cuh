// The forward problem every kernel family receives: a description of
// y[m, n] = sum_{r,h} x[r, m, h] * W[n, r*H + h] + bias[n]  (m = flattened batch row)
// with all strides in elements. Host code fills it from the checked tensors; the
// families never see torch types, so each one can be read (and tested) on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

namespace vga {

enum class DType : int { kFloat32, kFloat16, kBFloat16, kFloat64 };

inline int dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether `ptr` is a multiple of `bytes` (a vector or TMA alignment).
inline bool is_aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Scratch memory a launch may ask for (split-K partial sums): the caller hands out torch
// allocations on the launch's stream, so a workspace is stream-ordered and CUDA-graph safe.
struct WorkspaceRequest {
  void* (*allocate)(void* context, int64_t bytes) = nullptr;
  void* context = nullptr;
  void* get(int64_t bytes) const { return allocate(context, bytes); }
};

// The GEMM core's tile widths (its kBlockN): the paired and split kernels' widths, and the swapped
// forward's token widths (sm90/schedule.cuh says what each is for), widest first, the order the
// plan weighs them in. The one list the config parser, the plan, the kernels' static_assert, their
// messages, the launch and the occupancy query take the widths from (for_each_width instantiates
// a list's kernels).
inline constexpr int kCoreWidths[] = {256, 192, 128, 64};
inline constexpr int kTokenWidths[] = {240, 176, 112, 96};

// Calls f(std::integral_constant<int, W>{}) for each width W of kWidths, in the list's order: a
// width as a compile-time constant, for the kernels' template argument.
template <const auto& kWidths, typename F, size_t... kIndex>
void for_each_width(F&& f, std::index_sequence<kIndex...>) {
  (f(std::integral_constant<int, kWidths[kIndex]>{}), ...);
}
template <const auto& kWidths, typename F>
void for_each_width(F&& f) {
  for_each_width<kWidths>(f, std::make_index_sequence<std::size(kWidths)>{});
}

// Calls f(std::integral_constant<int, block_n>{}) if kWidths lists block_n; false if it does not.
template <const auto& kWidths, typename F>
bool with_listed_width(int block_n, F&& f) {
  bool listed = false;
  for_each_width<kWidths>([&](auto width) {
    if (block_n != decltype(width)::value) return;
    listed = true;
    f(width);
  });
  return listed;
}

template <size_t kCount>
constexpr bool lists_width(const int (&widths)[kCount], int block_n) {
  for (int width : widths) {
    if (width == block_n) return true;
  }
  return false;
}
constexpr bool is_core_width(int block_n) { return lists_width(kCoreWidths, block_n); }
constexpr bool is_token_width(int block_n) { return lists_width(kTokenWidths, block_n); }

// A list's names for messages, narrowest first: "n64, n128, n192, n256".
template <size_t kCount>
inline std::string width_names(const int (&widths)[kCount]) {
  std::string names;
  for (size_t i = kCount; i-- > 0;) names += (names.empty() ? "n" : ", n") + std::to_string(widths[i]);
  return names;
}

// A tile configuration forced by family name (tests, benchmarks: "sm90_gemm/n128/s4",
// "sm90_gemm/n256/c4"); 0 = the dispatcher's rule.
struct ForcedConfig {
  int block_n = 0;         // is_core_width: the tile width; is_token_width: the swapped forward's
  int splits = 0;          // s<1..64>: the reduction split across the grid (fp32 workspace + a second launch)
  int cluster_splits = 0;  // c<2|4|8>: the reduction split over the CTAs of a cluster (DSMEM sum)
  // How x's operand is tiled, the forward's k-blocks and grad_weight's columns (grad_x has one
  // layout and ignores it): 0 the plan's, kShardLayout ("shards"), kSpanLayout ("span")
  int layout = 0;
  int block_m = 0;  // m64: the forward's 64-row tiles (one consumer warpgroup, 64 wide); 0 the plan's choice
};
constexpr int kShardLayout = 1;  // a shard at a time (a shard's last block partly zeros, or tails packed)
constexpr int kSpanLayout = 2;   // along the concatenation, copied by cp.async (H % 64 != 0 only)

struct ForwardProblem {
  const void* x;       // (R, B_outer, B_inner, H), last stride 1
  const void* weight;  // (K, R*H)
  const void* bias;    // (K,) or nullptr
  void* out;           // (B_outer * B_inner, K), contiguous

  int64_t num_shards;    // R
  int64_t batch_outer;   // first batch dim (the only one when x is 3-D)
  int64_t batch_inner;   // second batch dim, 1 when x is 3-D
  int64_t shard_width;   // H
  int64_t out_features;  // K

  int64_t x_stride_shard;
  int64_t x_stride_outer;
  int64_t x_stride_inner;
  int64_t weight_stride_out;  // stride of W's K dim
  int64_t weight_stride_in;   // stride of W's R*H dim
  int64_t bias_stride;

  DType dtype;  // fp32 is always computed to fp32 accuracy (FFMA or 3xTF32), see README

  int sm_count;
  int cc_major;
  int device_index;
  WorkspaceRequest workspace;
  ForcedConfig forced;

  int64_t rows() const { return batch_outer * batch_inner; }
  int64_t reduction() const { return num_shards * shard_width; }
};

// Where element (row m, column n = r*H + h) of grad_x's (rows, R*H) product lives: in x's own
// strides where x is dense (so autograd need not copy it into a leaf x's layout), or the
// (rows, R*H) row-major concat that the (R, *batch, H) result is a strided view of (shard_stride
// = H, inner_stride = R*H; outer_stride = rows_inner * R*H with two batch dims, 0 with one). Rows
// split into (outer, inner) as x's batch dims: rows_inner is the inner batch dim's size (all rows
// with one batch dim).
struct GradXLayout {
  int64_t shard_width;   // H
  int64_t shard_stride;  // elements between shards
  int64_t rows_inner;    // rows of one outer batch index (all rows when the batch dims merge)
  int64_t inner_stride;  // elements between those rows
  int64_t outer_stride;  // elements between outer batch indices
#if defined(__CUDACC__)
  __host__ __device__
#endif
      int64_t offset(int64_t m, int64_t n) const {
    const int64_t outer = m / rows_inner, shard = n / shard_width;
    return outer * outer_stride + (m - outer * rows_inner) * inner_stride + shard * shard_stride +
           (n - shard * shard_width);
  }
};

// grad_x[r, m, h] = sum_k grad_out[m, k] * W[k, r*H + h], stored through `layout`.
struct GradInputProblem {
  const void* grad_out;  // (rows, K), rows grad_out_stride apart (-1: batch dims that do not merge), last dim contiguous
  const void* weight;    // (K, R*H)
  void* grad_x;          // (rows, R*H) through `layout`
  GradXLayout layout;
  int64_t rows;
  int64_t out_features;  // K
  int64_t num_shards;    // R
  int64_t shard_width;   // H
  int64_t grad_out_stride;
  int64_t weight_stride_out;
  int64_t weight_stride_in;
  DType dtype;
  int sm_count;
  int cc_major;
  int device_index;
  WorkspaceRequest workspace;
  ForcedConfig forced;

  int64_t columns() const { return num_shards * shard_width; }
};

// grad_W[k, r*H + h] = sum_m grad_out[m, k] * x[r, m, h]. `shards` describes x exactly as the
// forward does (its weight and bias fields are unused); grad_out is (rows, K).
struct GradWeightProblem {
  ForwardProblem shards;
  const void* grad_out;
  int64_t grad_out_stride;  // between rows; -1 when its batch dims do not merge or its last dim is strided
  void* grad_weight;        // (K, R*H), contiguous
  // The previous launches on the stream are this backward's grad_x, on the GEMM core: this product
  // may start while they finish (sm90/schedule.cuh, CoreArgs::overlaps_previous_grid).
  bool overlaps_previous_grid;
};

}  // namespace vga
