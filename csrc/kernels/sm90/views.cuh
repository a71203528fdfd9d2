// The TMA views every Hopper family reads its operands through (host side). The concat is
// never materialised: x is viewed as (H, rows, R), or (H, inner, outer, R) when its two batch
// dims do not merge, so one box of a shard's h for consecutive rows is one bulk copy, zero-filled
// past H and past the rows. W is viewed as (H, R, K) along its rows (K-major, the forward) or as
// (R*H, K) along its columns (MN-major, grad_x); grad_out as (K, rows) both ways. The forward's
// packed shard tails use the same views of x and W with narrower boxes (32- or 64-byte swizzle);
// the forward whose k-blocks run along the concatenation reads W as (R*H, 1, K).
// (Names: csrc/kernels/README.md, "Glossary".)
#pragma once

#include <cstdint>

#include "../problem.cuh"
#include "tma.cuh"

namespace vga {
namespace sm90 {

constexpr int64_t kMaxCoordinate = (int64_t(1) << 31) - 1;  // TMA coordinates are int32
constexpr int64_t kMaxByteStride = int64_t(1) << 40;         // TMA global strides
constexpr int kSwizzleAlignment = 1024;                      // a 128-byte swizzle atom (8 rows)

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

inline CUtensorMapDataType tensor_map_type(DType t) {
  if (t == DType::kFloat32) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return t == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Bytes between consecutive entries of a dim; a dim of extent 1 is never stepped,
// so it gets the dense row size (any 16-byte multiple would do).
inline cuuint64_t tma_byte_stride(int64_t extent, int64_t stride_elements, int64_t row_elements, DType t) {
  return static_cast<cuuint64_t>((extent == 1 ? row_elements : stride_elements) * dtype_size(t));
}

// x as (H, rows, R) or (H, inner, outer, R); the box is box_h elements of one shard's h for
// box_rows consecutive rows (of box_shards consecutive shards, one after the other: the forward's
// packed shard tails, whose boxes are 32 or 64 bytes wide and swizzled as wide). With `always_4d`
// a merged view is still given as 4-D (outer = 1), so one kernel addresses both.
inline CUtensorMap x_tensor_map(const ForwardProblem& p, const RowView& rows, cuuint32_t box_h, cuuint32_t box_rows,
                                bool always_4d = false, cuuint32_t box_shards = 1,
                                CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const int64_t H = p.shard_width;
  if (rows.four_d || always_4d) {
    const cuuint64_t dims[4] = {cuuint64_t(H), cuuint64_t(rows.inner), cuuint64_t(rows.outer),
                                cuuint64_t(p.num_shards)};
    const cuuint64_t strides[3] = {tma_byte_stride(rows.inner, rows.inner_stride, H, p.dtype),
                                   tma_byte_stride(rows.outer, rows.outer_stride, H, p.dtype),
                                   tma_byte_stride(p.num_shards, p.x_stride_shard, H, p.dtype)};
    const cuuint32_t box[4] = {box_h, box_rows, 1, box_shards};
    return encode_swizzled_tensor_map(p.x, tensor_map_type(p.dtype), 4, dims, strides, box, swizzle);
  }
  const cuuint64_t dims[3] = {cuuint64_t(H), cuuint64_t(rows.inner), cuuint64_t(p.num_shards)};
  const cuuint64_t strides[2] = {tma_byte_stride(rows.inner, rows.inner_stride, H, p.dtype),
                                 tma_byte_stride(p.num_shards, p.x_stride_shard, H, p.dtype)};
  const cuuint32_t box[3] = {box_h, box_rows, box_shards};
  return encode_swizzled_tensor_map(p.x, tensor_map_type(p.dtype), 3, dims, strides, box, swizzle);
}

// W as (H, R, K) (the forward's K-major B): one box is box_h elements of one shard's h for
// box_rows output features, so a shard's h tail is zero-filled and never reads the next shard
// (0 * NaN = NaN). `swizzle`: as wide as the box's rows (the packed shard tails' 32 or 64 bytes).
inline CUtensorMap w_tensor_map(const ForwardProblem& p, cuuint32_t box_h, cuuint32_t box_rows,
                                CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const int64_t H = p.shard_width;
  const cuuint64_t dims[3] = {cuuint64_t(H), cuuint64_t(p.num_shards), cuuint64_t(p.out_features)};
  const cuuint64_t strides[2] = {cuuint64_t(H * dtype_size(p.dtype)),
                                 tma_byte_stride(p.out_features, p.weight_stride_out, H, p.dtype)};
  const cuuint32_t box[3] = {box_h, 1, box_rows};
  return encode_swizzled_tensor_map(p.weight, tensor_map_type(p.dtype), 3, dims, strides, box, swizzle);
}

// W as (R*H, 1, K): the forward's K-major B where its k-blocks run along the concatenation (W's
// rows are the concatenation already); box_h elements of a row for box_rows output features.
// Laid out as w_tensor_map's view of one shard, so the same copy coordinates (h0, 0, n) address it.
inline CUtensorMap w_concat_tensor_map(const ForwardProblem& p, cuuint32_t box_h, cuuint32_t box_rows) {
  const int64_t columns = p.num_shards * p.shard_width;
  const cuuint64_t dims[3] = {cuuint64_t(columns), 1, cuuint64_t(p.out_features)};
  const cuuint64_t strides[2] = {cuuint64_t(columns * dtype_size(p.dtype)),
                                 tma_byte_stride(p.out_features, p.weight_stride_out, columns, p.dtype)};
  const cuuint32_t box[3] = {box_h, 1, box_rows};
  return encode_swizzled_tensor_map(p.weight, tensor_map_type(p.dtype), 3, dims, strides, box,
                                    CU_TENSOR_MAP_SWIZZLE_128B);
}

// A row-major matrix (`inner` contiguous elements a row, `rows` rows `row_stride` apart, plus an
// optional third dim of `outer` blocks `outer_stride` apart) as a 3-D map with box
// (box_inner, box_rows, 1): grad_out as (K, rows) for either operand role, W as (R*H, K).
inline CUtensorMap matrix_tensor_map(const void* base, DType t, int64_t inner, int64_t rows, int64_t row_stride,
                                     int64_t outer, int64_t outer_stride, cuuint32_t box_inner, cuuint32_t box_rows) {
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(rows), cuuint64_t(outer)};
  const int64_t dense_row = ceil_div(inner, 8) * 8;  // the stride of a never-stepped dim: any 16-byte multiple
  const cuuint64_t strides[2] = {tma_byte_stride(rows, row_stride, dense_row, t),
                                 tma_byte_stride(outer, outer_stride, dense_row, t)};
  const cuuint32_t box[3] = {box_inner, box_rows, 1};
  return encode_swizzled_tensor_map(base, tensor_map_type(t), 3, dims, strides, box);
}

// Why a row-major matrix operand can't be a TMA view ("" when it can).
inline const char* matrix_view_refusal(const void* base, DType t, int64_t row_stride, int64_t rows) {
  const int64_t per_16_bytes = 16 / dtype_size(t);
  if (!is_aligned(base, 16)) return "not 16-byte aligned";
  if (rows > 1 && (row_stride % per_16_bytes != 0 || row_stride <= 0)) return "row stride is not a multiple of 16 bytes";
  if (row_stride * dtype_size(t) >= kMaxByteStride) return "row stride is >= 2^40 bytes";
  return nullptr;
}

// What the TMA views of x and W (dims (H, rows, R) or (H, inner, outer, R), and (H, R, K))
// need, for any element type: a Hopper GPU, 16-byte aligned bases and strides, coordinates
// below 2^31, byte strides below 2^40.
inline const char* tma_view_refusal(const ForwardProblem& p) {
  const int64_t element_bytes = dtype_size(p.dtype);
  const int64_t per_16_bytes = 16 / element_bytes;
  if (p.cc_major != 9) return "needs an sm_90 (Hopper) GPU";
  if (p.rows() <= 0 || p.out_features <= 0 || p.num_shards <= 0 || p.shard_width <= 0) return "empty problem";
  if (p.shard_width % per_16_bytes != 0) return "H * element size is not a multiple of 16 bytes (TMA strides)";
  if (p.weight != nullptr) {
    if (p.weight_stride_in != 1) return "weight's input dim is not contiguous";
    if (p.weight_stride_out % per_16_bytes != 0) return "weight row stride is not a multiple of 16 bytes";
    if (!is_aligned(p.weight, 16)) return "weight is not 16-byte aligned";
    if (p.weight_stride_out * element_bytes >= kMaxByteStride) return "weight row stride is >= 2^40 bytes";
  }
  if (!is_aligned(p.x, 16)) return "x is not 16-byte aligned";
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
  return nullptr;
}

}  // namespace sm90
}  // namespace vga
