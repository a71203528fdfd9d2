// How the Hopper families launch (host side): cudaLaunchKernelEx with a cluster shape and, for the
// kernels that wait for the previous grid before touching memory (sm90::wait_for_previous_grid),
// programmatic dependent launch. With it a kernel is scheduled while the previous kernel of the
// stream is finishing (as soon as that one's CTAs have all exited, or all called
// sm90::allow_next_grid, as the core's, its split sum's and sm90_skinny's do right after their own
// wait for the grid before them), so
// its launch and its barrier setup, tensor-map prefetch and tile walk overlap the previous
// kernel's end instead of following it. CUDA graphs capture it as a programmatic edge (CUDA 12.3
// and later, runtime and driver: older ones launch without it). VGA_LINEAR_PDL=0 in the
// environment (exactly "0"; read once a process) launches without it.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace vga {

inline bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("VGA_LINEAR_PDL");
    if (value != nullptr && std::strcmp(value, "0") == 0) return false;
    int driver = 0;
    return CUDART_VERSION >= 12030 && cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12030;
  }();
  return enabled;
}

// One launch's configuration (not copyable: the config points at its own attributes).
// cluster_size 1: no cluster; programmatic: the kernel calls wait_for_previous_grid before its
// first global-memory access (a kernel that does not must never be launched so).
struct KernelLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attributes[2] = {};
  KernelLaunch(dim3 grid, int threads, int shared_bytes, cudaStream_t stream, int cluster_size, bool programmatic) {
    config.gridDim = grid;
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = attributes;
    int count = 0;
    if (cluster_size > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count].val.clusterDim.x = cluster_size;
      attributes[count].val.clusterDim.y = 1;
      attributes[count].val.clusterDim.z = 1;
      ++count;
    }
    if (programmatic && programmatic_launch_enabled()) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count].val.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    config.numAttrs = count;
  }
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;

  // (errors surface through cudaGetLastError, which the entry points check after the launches)
  template <typename... Params, typename... Args>
  void operator()(void (*kernel)(Params...), Args&&... args) {
    cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
};

}  // namespace vga
