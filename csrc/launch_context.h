// What every CUDA entry point needs from torch through the stable ABI: the
// kernel dtype of a tensor, the current stream, and (cached) device properties.
#pragma once

#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <vector>
#include <optional>
#include <string>
#include <utility>

#include "kernels/per_device.cuh"
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
};

// Read once per device: cudaDeviceGetAttribute is cheap, but not free on the hot path.
inline const DeviceTraits& device_traits(int32_t device_index) {
  static PerDevice<DeviceTraits> cache;
  return cache.get(device_index, [&] {
    DeviceTraits traits;
    STD_TORCH_CHECK(cudaDeviceGetAttribute(&traits.cc_major, cudaDevAttrComputeCapabilityMajor,
                                           device_index) == cudaSuccess &&
                        cudaDeviceGetAttribute(&traits.sm_count, cudaDevAttrMultiProcessorCount,
                                               device_index) == cudaSuccess,
                    "vga: could not query CUDA device ", device_index);
    return traits;
  });
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "vga: ", what, " kernel launch failed: ",
                  cudaGetErrorString(err));
}

}  // namespace vga

namespace vga {

// A tensor of `sizes` and `strides` with `like`'s dtype on CUDA device `device_index`, from
// torch's caching allocator (so it is CUDA-graph safe).
template <size_t N>
Tensor empty_strided_cuda_like(const Tensor& like, const std::array<int64_t, N>& sizes,
                               const std::array<int64_t, N>& strides, size_t ndim, int32_t device_index) {
  int32_t dtype = 0;
  STD_TORCH_CHECK(aoti_torch_get_dtype(like.get(), &dtype) == AOTI_TORCH_SUCCESS,
                  "vga: could not read a tensor's dtype");
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(ndim), sizes.data(), strides.data(), dtype,
                                           aoti_torch_device_type_cuda(), device_index, &handle) == AOTI_TORCH_SUCCESS,
                  "vga: could not allocate the output");
  return Tensor(handle);
}

// A contiguous tensor of `sizes` with `like`'s dtype on CUDA device `device_index`.
template <size_t N>
Tensor empty_cuda_like(const Tensor& like, const std::array<int64_t, N>& sizes, size_t ndim,
                       int32_t device_index) {
  std::array<int64_t, N> strides{};
  int64_t stride = 1;
  for (size_t i = ndim; i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i] > 0 ? sizes[i] : 1;
  }
  return empty_strided_cuda_like(like, sizes, strides, ndim, device_index);
}

// The element type and device fields every family's problem carries (ForwardProblem,
// GradInputProblem): the dtype of `like`, the device's SM count and compute capability.
template <typename Problem>
void describe_device(Problem& p, const Tensor& like, int32_t device_index) {
  const DeviceTraits& traits = device_traits(device_index);
  p.dtype = *kernel_dtype(like.scalar_type());
  p.sm_count = traits.sm_count;
  p.cc_major = traits.cc_major;
  p.device_index = device_index;
}

// x (R, *batch, H) as the forward's problem sees it, with `out_features` outputs, on x's device:
// the shards, their batch dims and strides, the dtype and the device. The forward adds weight,
// bias and output; grad_weight reads it as its virtual concat.
inline ForwardProblem describe_shards(const Tensor& x, int64_t out_features) {
  const bool two_batch_dims = x.dim() == 4;
  ForwardProblem p{};
  p.x = x.const_data_ptr();
  p.num_shards = x.size(0);
  p.batch_outer = x.size(1);
  p.batch_inner = two_batch_dims ? x.size(2) : 1;
  p.shard_width = x.size(-1);
  p.out_features = out_features;
  p.x_stride_shard = x.stride(0);
  p.x_stride_outer = x.stride(1);
  p.x_stride_inner = two_batch_dims ? x.stride(2) : 0;
  describe_device(p, x, x.get_device_index());
  return p;
}

// "name" or, for the GEMM core's family, "sm90_gemm/n128/s4": a forced tile width (n64, n128,
// n192, n256: is_core_width; or the forward's token widths, is_token_width, which run it swapped), reduction
// split, across the grid (s<count>) or in the cluster (c2, c4, c8), the layout of x's operand,
// the forward's k-blocks and grad_weight's columns (shards, span), and the forward's 64-row tiles
// (m64), so tests and benchmarks reach every configuration.
inline ForcedConfig parse_forced_config(const std::string& options, const std::string& spec, const char* op) {
  ForcedConfig forced;
  size_t start = 0;
  while (start < options.size()) {
    size_t end = options.find('/', start);
    if (end == std::string::npos) end = options.size();
    const std::string option = options.substr(start, end - start);
    int value = 0;
    const bool numeric = option.size() > 1 && option.find_first_not_of("0123456789", 1) == std::string::npos;
    if (numeric) value = std::stoi(option.substr(1));
    if (numeric && option[0] == 'n' && (is_core_width(value) || is_token_width(value))) {
      forced.block_n = value;
    } else if (numeric && option[0] == 's' && value >= 1 && value <= 64) {
      forced.splits = value;
    } else if (numeric && option[0] == 'c' && (value == 2 || value == 4 || value == 8)) {
      forced.cluster_splits = value;
    } else if (option == "m64") {
      forced.block_m = 64;
    } else if (option == "shards" || option == "span") {
      forced.layout = option == "span" ? kSpanLayout : kShardLayout;
    } else {
      STD_TORCH_CHECK(false, op, ": bad configuration '", option, "' in '", spec,
                      "'; expected ", width_names(kCoreWidths), ", ", width_names(kTokenWidths), ", s<1..64>, c2, c4, c8, m64, shards or span");
    }
    start = end + 1;
  }
  STD_TORCH_CHECK(forced.splits == 0 || forced.cluster_splits == 0, op, ": '", spec,
                  "' asks for both a split across the grid (s) and one in the cluster (c)");
  return forced;
}

// A forced family as tests and benchmarks name it: the family, then, for one with configurations
// (the GEMM core's), a configuration after a slash ("sm90_gemm/n128/s4").
inline std::string forced_family_name(const std::string& spec) { return spec.substr(0, spec.find('/')); }

// The configuration `spec` asks of its family, which names whether it has configurations.
inline ForcedConfig forced_config_of(const std::string& spec, bool family_takes_config, const char* op) {
  const size_t slash = spec.find('/');
  if (slash == std::string::npos) return {};
  STD_TORCH_CHECK(family_takes_config, op, ": kernel family '", spec.substr(0, slash),
                  "' takes no configuration, got '", spec, "'");
  return parse_forced_config(spec.substr(slash + 1), spec, op);
}

// The scratch memory of one launch (split-K partial sums): torch allocations from the caching
// allocator on the current stream, held until the entry point returns. Freed then, a block is
// reused only by work queued later on the same stream, so this is safe without a sync, and it
// is CUDA-graph capturable (captured allocations come from the graph's private pool).
class LaunchWorkspace {
 public:
  explicit LaunchWorkspace(int32_t device_index) : device_index_(device_index) {}
  WorkspaceRequest request() { return WorkspaceRequest{&LaunchWorkspace::allocate, this}; }

  // Allocates `bytes` now (none when 0) for this workspace's first request, which must ask for
  // exactly that: for a launch that must not allocate when it is queued (an allocation may queue
  // a kernel of its own: torch's deterministic mode fills new memory).
  void allocate_ahead(int64_t bytes) {
    if (bytes > 0) ahead_ = allocate(this, bytes), ahead_bytes_ = bytes;
  }

 private:
  static void* allocate(void* context, int64_t bytes) {
    auto* self = static_cast<LaunchWorkspace*>(context);
    if (self->ahead_ != nullptr) {
      STD_TORCH_CHECK(bytes == self->ahead_bytes_, "vga: a launch asked for ", bytes,
                      " workspace bytes where ", self->ahead_bytes_, " were allocated ahead for it");
      return std::exchange(self->ahead_, nullptr);
    }
    const int64_t sizes[1] = {bytes};
    const int64_t strides[1] = {1};
    AtenTensorHandle handle = nullptr;
    STD_TORCH_CHECK(aoti_torch_empty_strided(1, sizes, strides, aoti_torch_dtype_uint8(),
                                             aoti_torch_device_type_cuda(), self->device_index_,
                                             &handle) == AOTI_TORCH_SUCCESS,
                    "vga: could not allocate a ", bytes, "-byte workspace");
    self->held_.emplace_back(handle);
    return self->held_.back().mutable_data_ptr();
  }

  int32_t device_index_;
  std::vector<Tensor> held_;
  void* ahead_ = nullptr;  // allocated (and held) ahead of its request
  int64_t ahead_bytes_ = 0;
};

}  // namespace vga
