// A kernel's opt-in to more than 48 KB of dynamic shared memory (host side). The attribute is
// per function and per device, so each (kernel, device) pair asks once, at the size of its first
// call (a kernel whose launches ask for different sizes opts in to its largest first): a second GPU
// in the process gets its own opt-in. `device` is the problem's, which the caller's device guard
// made the current one (the launch path asks the driver nothing per call); the attribute is set on
// the current device, so the first opt-in checks they agree: a caller without its guard would mark
// one device done and set another. The occupancy queries cached per device (resident_clusters,
// resident_cluster_ctas) opt in first, so the check covers them. A failure names the family and
// the size asked for.
#pragma once

#include <cuda_runtime.h>
#include <torch/headeronly/util/Exception.h>

#include "per_device.cuh"

namespace vga {

template <auto kKernel>
inline void opt_in_shared_memory(int bytes, int device, const char* family) {
  if (bytes <= 48 * 1024) return;
  static PerDevice<bool> done;  // one table per kernel
  done.get(device, [&] {
    int current = -1;
    const cudaError_t got = cudaGetDevice(&current);
    STD_TORCH_CHECK(got == cudaSuccess && current == device, "vga ", family, ": shared-memory opt-in for device ",
                    device, " while device ", current, " is current (", cudaGetErrorString(got), ")");
    const cudaError_t set = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    STD_TORCH_CHECK(set == cudaSuccess, "vga ", family, ": cannot reserve ", bytes,
                    " bytes of shared memory: ", cudaGetErrorString(set));
    return true;
  });
}

}  // namespace vga
