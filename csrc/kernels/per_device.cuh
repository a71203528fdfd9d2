// A value computed once per CUDA device (host side), for the queries and opt-ins the launch path
// repeats on every call: the device's traits, a kernel's shared-memory opt-in, how many clusters of
// a kernel fit at once. Host threads may race on a device's first call: one computes under the
// table's mutex while the others wait for it, and every later call reads the value after one
// acquire load. A computation that throws stores nothing, so the next call runs it again (a mutex
// rather than std::call_once, whose exceptional path has hung on some libstdc++ targets). Each
// `static PerDevice<...>` is a table of its own; a table's computation may use other tables.
// A table whose values come from the current device rather than from the device index
// (cudaFuncSetAttribute, the occupancy queries) is a PerCurrentDevice: its first computation for a
// device checks that device is the current one, which every caller's device guard makes it, so the
// first caller without its guard fails there instead of filing one device's answer under another
// (a later one finds the value computed: the check costs nothing after the first call).
#pragma once

#include <cuda_runtime.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

namespace vga {

constexpr int kMaxDevices = 64;

template <typename T, int kSlots = 1, bool kFromCurrentDevice = false>
class PerDevice {
 public:
  // the value for (device, slot < kSlots), computed by `compute()` the first time
  template <typename Compute>
  const T& get(int device, int slot, Compute&& compute) {
    STD_TORCH_CHECK(device >= 0 && device < kMaxDevices && slot >= 0 && slot < kSlots, "vga: device index ", device,
                    " (slot ", slot, ") out of range");
    const int i = device * kSlots + slot;
    if (!ready_[i].load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ready_[i].load(std::memory_order_relaxed)) {
        if constexpr (kFromCurrentDevice) {
          int current = -1;
          const cudaError_t got = cudaGetDevice(&current);
          if (got != cudaSuccess) cudaGetLastError();  // (not a later launch's error)
          STD_TORCH_CHECK(got == cudaSuccess, "vga: cannot read the current CUDA device: ", cudaGetErrorString(got));
          STD_TORCH_CHECK(current == device, "vga: a query for CUDA device ", device, " while device ", current,
                          " is current (a caller without its device guard)");
        }
        values_[i] = std::forward<Compute>(compute)();
        ready_[i].store(true, std::memory_order_release);
      }
    }
    return values_[i];
  }
  template <typename Compute>
  const T& get(int device, Compute&& compute) {
    static_assert(kSlots == 1, "a table of several slots names the slot");
    return get(device, 0, std::forward<Compute>(compute));
  }

 private:
  std::mutex mutex_;
  std::array<std::atomic<bool>, kMaxDevices * kSlots> ready_{};
  std::array<T, kMaxDevices * kSlots> values_{};
};

template <typename T, int kSlots = 1>
using PerCurrentDevice = PerDevice<T, kSlots, true>;

}  // namespace vga
