// Host side of the Hopper TMA: the driver's tensor-map encoder (looked up through the runtime, so
// the extension needs no -lcuda) and the one swizzled tiled map every sm90 family builds its
// operand views from (sm90/views.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <torch/headeronly/util/Exception.h>

namespace vga {
namespace sm90 {

// cuTensorMapEncodeTiled from the driver the runtime already loaded (no -lcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
    STD_TORCH_CHECK(status == cudaSuccess && found == cudaDriverEntryPointSuccess && entry != nullptr,
                    "vga sm90 TMA: cuTensorMapEncodeTiled is unavailable from the CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return encoder;
}

// A tiled tensor map with 128-byte swizzle (or the swizzle as wide as a narrower box's rows) over
// a 16- or 32-bit tensor. dims/strides innermost first; strides in bytes for dims 1.. (dim 0 is
// dense).
inline CUtensorMap encode_swizzled_tensor_map(const void* base, CUtensorMapDataType type, int rank,
                                              const cuuint64_t* dims, const cuuint64_t* byte_strides,
                                              const cuuint32_t* box,
                                              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  // The encoder needs this thread's CUDA context current. A thread whose first CUDA work this is
  // (autograd's device threads run the backward) has none until a runtime call binds the primary
  // context: cudaFree(nullptr) does that, once per thread.
  thread_local const bool context_bound = cudaFree(nullptr) == cudaSuccess;
  (void)context_bound;
  CUtensorMap map;
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, byte_strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  STD_TORCH_CHECK(result == CUDA_SUCCESS, "vga sm90 TMA: cuTensorMapEncodeTiled failed with error ",
                  static_cast<int>(result));
  return map;
}

}  // namespace sm90
}  // namespace vga
