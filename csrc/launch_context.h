// What every CUDA entry point needs from torch through the stable ABI: the
// kernel dtype of a tensor, the current stream, and (cached) device properties.
#pragma once

#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <mutex>
#include <optional>
#include <string>

#include "kernels/problem.cuh"

namespace vga {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Double: return "float64";
    case ScalarType::Long: return "int64";
    case ScalarType::Int: return "int32";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    default: return "an unsupported dtype";
  }
}

inline std::optional<DType> kernel_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return DType::kFloat32;
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    case ScalarType::Double: return DType::kFloat64;
    default: return std::nullopt;
  }
}

inline std::string device_name(const Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return "cpu";
  return "a non-CUDA device";
}

// Both on one CUDA device. Compares indices only: the names are built when a check fails.
inline bool same_cuda_device(const Tensor& a, const Tensor& b) {
  return a.is_cuda() && b.is_cuda() && a.get_device_index() == b.get_device_index();
}

inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream) == AOTI_TORCH_SUCCESS,
                  "vga: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

struct DeviceTraits {
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

// Read once per device: cudaDeviceGetAttribute is cheap, but not free on the hot path.
inline const DeviceTraits& device_traits(int32_t device_index) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceTraits, kMaxDevices> cache{};
  static std::array<std::once_flag, kMaxDevices> filled;
  STD_TORCH_CHECK(device_index >= 0 && device_index < kMaxDevices, "vga: device index ",
                  device_index, " out of range");
  DeviceTraits& traits = cache[device_index];
  std::call_once(filled[device_index], [&] {
    STD_TORCH_CHECK(cudaDeviceGetAttribute(&traits.cc_major, cudaDevAttrComputeCapabilityMajor,
                                           device_index) == cudaSuccess &&
                        cudaDeviceGetAttribute(&traits.cc_minor, cudaDevAttrComputeCapabilityMinor,
                                               device_index) == cudaSuccess &&
                        cudaDeviceGetAttribute(&traits.sm_count, cudaDevAttrMultiProcessorCount,
                                               device_index) == cudaSuccess,
                    "vga: could not query CUDA device ", device_index);
  });
  return traits;
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "vga: ", what, " kernel launch failed: ",
                  cudaGetErrorString(err));
}

}  // namespace vga

namespace vga {

// A contiguous tensor of `sizes` with `like`'s dtype on CUDA device `device_index`,
// from torch's caching allocator (so it is CUDA-graph safe).
template <size_t N>
Tensor empty_cuda_like(const Tensor& like, const std::array<int64_t, N>& sizes, size_t ndim,
                       int32_t device_index) {
  std::array<int64_t, N> strides{};
  int64_t stride = 1;
  for (size_t i = ndim; i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i] > 0 ? sizes[i] : 1;
  }
  int32_t dtype = 0;
  STD_TORCH_CHECK(aoti_torch_get_dtype(like.get(), &dtype) == AOTI_TORCH_SUCCESS,
                  "vga: could not read a tensor's dtype");
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(
      aoti_torch_empty_strided(static_cast<int64_t>(ndim), sizes.data(), strides.data(), dtype,
                               aoti_torch_device_type_cuda(), device_index,
                               &handle) == AOTI_TORCH_SUCCESS,
      "vga: could not allocate the output");
  return Tensor(handle);
}

}  // namespace vga
