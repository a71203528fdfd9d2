// A kernel's opt-in to more than 48 KB of dynamic shared memory (host side). The attribute is
// per function and per device, so each (kernel, device) pair asks once, at the size of its first
// call (a kernel whose launches ask for different sizes opts in to its largest first): a second GPU
// in the process gets its own opt-in. `device` is the problem's, which the caller's device guard
// made the current one, the one the attribute is set on (PerCurrentDevice checks it; the launch path
// asks the driver nothing per call). A failure names the family and the size asked for.
#pragma once

#include <cuda_runtime.h>
#include <torch/headeronly/util/Exception.h>

#include "per_device.cuh"

namespace vga {

template <auto kKernel>
inline void opt_in_shared_memory(int bytes, int device, const char* family) {
  if (bytes <= 48 * 1024) return;
  static PerCurrentDevice<bool> done;  // one table per kernel
  done.get(device, [&] {
    const cudaError_t set = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    STD_TORCH_CHECK(set == cudaSuccess, "vga ", family, ": cannot reserve ", bytes,
                    " bytes of shared memory: ", cudaGetErrorString(set));
    return true;
  });
}

}  // namespace vga
