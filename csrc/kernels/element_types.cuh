// The element types the kernels handle, their accumulator types and conversions,
// and the switch from the runtime DType to a C++ type. Shared by every family.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "problem.cuh"

namespace vga {

template <typename T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};

template <typename Acc, typename T>
__device__ __forceinline__ Acc to_acc(T v) {
  return static_cast<Acc>(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// The bias of output columns n and n + 1 as fp32: 0 past the last of `columns`, or without bias.
template <typename T>
__device__ __forceinline__ float2 bias_pair(const T* bias, int64_t stride, int n, int64_t columns) {
  float2 pair = make_float2(0.f, 0.f);
  if (bias == nullptr) return pair;
  if (n < columns) pair.x = to_acc<float>(bias[static_cast<int64_t>(n) * stride]);
  if (n + 1 < columns) pair.y = to_acc<float>(bias[static_cast<int64_t>(n + 1) * stride]);
  return pair;
}

template <typename T, typename Acc>
__device__ __forceinline__ T from_acc(Acc v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_acc<__half, float>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls fn(T{}) with T the CUDA element type of `dtype`.
template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(__half{});
    case DType::kBFloat16:
      return fn(__nv_bfloat16{});
    case DType::kFloat64:
      return fn(double{});
  }
}

// Calls fn(T{}) with T = __half or __nv_bfloat16 for a 16-bit `dtype` (the tensor-core families).
template <typename Fn>
void visit_half_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::kBFloat16) return fn(__nv_bfloat16{});
  return fn(__half{});
}

}  // namespace vga
