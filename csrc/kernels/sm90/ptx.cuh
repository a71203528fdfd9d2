// Hopper (sm_90a) building blocks as raw PTX: mbarriers, TMA bulk tensor loads, wgmma
// shared-memory descriptors (K-major and MN-major, 128-byte swizzle), the m64n{64,128,192,256}k16 wgmma
// of the GEMM core with operand majorness as a parameter, the narrow m64n{16,32,64}k16 ones, the
// m64n64k8 TF32 one (A in registers), ldmatrix, warpgroup register reallocation.
//
// Every device helper is only meaningful inside an sm_90a body; callers guard
// their kernels with `#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)`
// and this header guards the asm the same way so the compute_80 PTX pass compiles.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include <torch/headeronly/util/Exception.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VGA_SM90A_DEVICE 1
#endif

namespace vga {
namespace sm90 {

// ---------------------------------------------------------------- device side
#if defined(__CUDACC__)
// These two also serve the pre-sm90 code of the skinny family (compute_80 PTX): a shared-memory
// address, and a cluster barrier that only sm_90+ has (a no-op below it, where clusters are 1 CTA).
__device__ __forceinline__ uint32_t smem_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte async copy global -> shared (sm_80+); src_bytes = 0 zero-fills (rows and columns past
// the operand).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// All threads of all CTAs in the cluster; orders shared-memory (and barrier) state across them.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// The same barrier for arrivals that publish nothing to the cluster: ptxas lowers a release
// arrival to MEMBAR.ALL.GPU, which waits until every store the thread has in flight is acknowledged.
// A relaxed arrival does not order the thread's earlier shared-memory writes before the others'
// reads after the wait, so it is only for where nothing needs that:
//  * after fence_barrier_init, which publishes the barriers' initialisation itself (CUTLASS's
//    cluster_arrive_relaxed);
//  * where a CTA waits for its peers to finish reading its shared memory before it exits: their
//    reads are done when they arrive, since each value read is used by a store issued before it;
//  * around the split-K sums whose partial rows travel by bulk copies (the core's in-cluster sum,
//    the decode families' finish): the copies complete on the receiver's mbarrier, which makes
//    their bytes visible; the barriers only say that every ring may receive, and that every copy
//    out of a CTA has landed before it exits. (A CTA's own rows, read by its other threads, need a
//    CTA-wide barrier besides.)
__device__ __forceinline__ void cluster_sync_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// cluster_sync_relaxed in two halves, so that a thread can work between them (each thread arrives
// once and waits once before it arrives again).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}

// Programmatic dependent launch (launch.cuh launches the kernels that call these with it): the
// kernel may start while the previous kernel of the stream is still finishing, so every thread
// waits for that grid (its completion and its memory) before its first global-memory access;
// what comes before (barrier setup, tensor-map prefetch, the tile walk) overlaps the previous
// kernel's end. In a kernel launched without the attribute the wait returns at once.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel of the stream, if that one is launched with the attribute, be scheduled
// onto SMs this grid leaves free once every CTA of this grid has called it or exited (the next
// kernel still waits for this grid's completion before touching memory): a hint that only moves
// its start earlier. The first call of a CTA counts; more are harmless. Every kernel here calls it
// after its own wait_for_previous_grid, never before (but the grad_weight grid that overlaps
// grad_x, which waits only at its exit: CoreArgs::overlaps_previous_grid). Two things hold then:
// a grid's completion implies the completion of every grid queued before it, and a grid that
// waits before its first access releases the next one only once every grid before it is complete
// (which is what lets the backward start grad_weight without waiting for grad_x).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Two fp32 values rounded to the element type and packed into one 32-bit word (low = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void store_global_8_bytes(void* dst, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(a), "r"(b) : "memory");
}

__device__ __forceinline__ void store_global_16_bytes(void* dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// The slot of `sender`'s rows at `receiver` in a split-K exchange (send_rows_to_peers): the other
// ranks in order.
__device__ __forceinline__ int cluster_slot(int sender, int receiver) { return sender < receiver ? sender : sender - 1; }
#endif

#ifdef VGA_SM90A_DEVICE


__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrival_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrival_count));
}

// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// One of the barrier's expected arrivals, made when this thread's cp.async copies issued so far
// have landed (their writes are then visible to the threads that wait on the barrier's phase).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_address(bar)) : "memory");
}

// True in one lane of the (converged) warp: the lane that issues for the warp.
__device__ __forceinline__ bool elect_one_lane() {
  uint32_t elected = 0;
  asm volatile(
      "{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(elected));
  return elected != 0;
}

// Spins until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Arrives on the barrier at the same shared-memory offset in CTA `cta_rank` of the
// cluster. Used to hand a consumed stage back (the wgmma reads are already complete),
// so it carries no cluster-scope release: that would cost a GPU-wide memory barrier.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(cta_rank)
      : "memory");
}

// Four fp32 values from this CTA's shared memory (16-byte aligned). Volatile: it stays after the
// barrier wait that makes the values there.
__device__ __forceinline__ float4 load_shared_float4(uint32_t address) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(address)
               : "memory");
  return v;
}

// One bulk copy of `bytes` (a multiple of 16; both offsets 16-byte aligned) from this CTA's shared
// memory at `src` to the shared memory of cluster CTA `cta_rank` at offset `dst`, completing `bytes`
// of transaction on that CTA's barrier at offset `bar`: as with a TMA load, the barrier's phase
// completing makes the bytes visible to the threads waiting on it, and the copy engine has then
// read the source. The source's generic-proxy writes need fence_proxy_async_shared before it.
__device__ __forceinline__ void bulk_copy_to_cluster_cta(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar,
                                                         uint32_t cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote_dst, remote_bar;\n"
      "mapa.shared::cluster.u32 remote_dst, %0, %4;\n"
      "mapa.shared::cluster.u32 remote_bar, %3, %4;\n"
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [remote_dst], [%1], %2, [remote_bar];\n"
      "}\n" ::"r"(dst),
      "r"(src), "r"(bytes), "r"(bar), "r"(cta_rank)
      : "memory");
}

// A split-K sum's exchange in a cluster of `slices` CTAs (the core's in-cluster sum, the decode
// families' finish): each CTA's partial tile holds, at `blocks` + q * `stride`, the rows rank q
// sums, and receives its peers' rows of its own in S - 1 slots at `slots` + slot * `stride`, the
// peers in rank order (cluster_slot). Thread 0 of each CTA calls this once: it expects the peers'
// `bytes` each on its own `received` barrier and sends each peer its block, completing on the
// peer's. The tiles' writes must be fenced for the async proxy, and every ring free to receive (a
// cluster barrier), before; the caller waits on `received` (its first phase: one tile a cluster).

__device__ __forceinline__ void send_rows_to_peers(uint64_t* received, uint32_t blocks, uint32_t slots, uint32_t stride,
                                                   uint32_t bytes, int rank, int slices) {
  mbarrier_arrive_expect_tx(received, (slices - 1) * bytes);
  for (int q = 0; q < slices; ++q) {
    if (q != rank) {
      bulk_copy_to_cluster_cta(slots + cluster_slot(rank, q) * stride, blocks + q * stride, bytes, smem_address(received),
                               q);
    }
  }
}

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}


__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One bulk tensor copy global -> shared, completing `bytes` of transaction on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// The same copy delivered to the same shared-memory offset (and barrier offset)
// of every CTA in `cta_mask`.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      uint16_t cta_mask, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5, %6}], [%2], %3;" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      uint16_t cta_mask, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5, %6, %7}], [%2], %3;" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

template <uint32_t kRegisters>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <uint32_t kRegisters>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Shared-memory matrix descriptor for a K-major tile whose rows are 128 bytes
// (64 half-precision elements) written by TMA with 128-byte swizzle: 8-row core
// groups are 1024 bytes apart (stride byte offset), the leading byte offset is
// unused for swizzled layouts (1 by convention). `tile` must be 1024-byte aligned.
__device__ __forceinline__ uint64_t k_major_swizzle128_descriptor(const void* tile) {
  const uint64_t start = (smem_address(tile) & 0x3FFFF) >> 4;
  return start | (1ull << 16) | (uint64_t(1024 >> 4) << 32) | (1ull << 62);
}

// The same for rows of `row_bytes` = 128, 64 or 32 bytes written with the swizzle as wide (8-row
// core groups 8 * row_bytes apart; layout type 1, 2, 3). `tile` must be 8 * row_bytes aligned.
__device__ __forceinline__ uint64_t k_major_swizzled_descriptor(const void* tile, int row_bytes) {
  const uint64_t start = (smem_address(tile) & 0x3FFFF) >> 4;
  const uint64_t layout = row_bytes == 128 ? 1 : row_bytes == 64 ? 2 : 3;
  return start | (1ull << 16) | (uint64_t((8 * row_bytes) >> 4) << 32) | (layout << 62);
}

// Where k step kk of a stage's operand tile starts, in descriptor units: (kk & 1) * odd +
// (kk >> 1) * pair (the packed shard tails' steps are not evenly spaced: two 32-byte steps a
// 64-byte-wide shard block, then the next block).
struct KSteps {
  uint64_t odd, pair;
};
// The packed shard tails' k steps in a tile of `kRows` K-major rows of 128 / kShards bytes a shard.
template <int kRows, int kShards>
__device__ __forceinline__ constexpr KSteps shard_tail_k_steps() {
  constexpr uint64_t kBlock = static_cast<uint64_t>(kRows * (128 / kShards)) / 16;
  return kShards == 4 ? KSteps{kBlock, 2 * kBlock} : KSteps{32 / 16, kBlock};
}

// Shared-memory matrix descriptor for an MN-major tile of 16-bit elements written by TMA with
// 128-byte swizzle in boxes of 64 MN elements (one 128-byte row) by the k-block's rows: each
// k row is 128 bytes, 8 k rows make a 1024-byte swizzle atom (stride byte offset: the next 8 k),
// and the next 64 MN elements start `mn_block_bytes` further on (leading byte offset).
// `tile` must be 1024-byte aligned.
__device__ __forceinline__ uint64_t mn_major_swizzle128_descriptor(const void* tile, uint32_t mn_block_bytes) {
  const uint64_t start = (smem_address(tile) & 0x3FFFF) >> 4;
  return start | (uint64_t((mn_block_bytes >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) | (1ull << 62);
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads
// (wgmma operands, TMA) of the same bytes, once a barrier hands them over.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Barrier among `threads` threads (whole warps) of this CTA on hardware barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPendingGroups>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPendingGroups) : "memory");
}

// The wgmma wrappers' accumulator operands: VGA_ACCS_<n> is acc[0 .. n - 1] as "+f" operands,
// VGA_REGS_<n> the text "%0, ..., %<n - 1>" that names them in the instruction.
#define VGA_ACC8(i)                                                                                   \
  "+f"(acc[i + 0]), "+f"(acc[i + 1]), "+f"(acc[i + 2]), "+f"(acc[i + 3]), "+f"(acc[i + 4]), \
      "+f"(acc[i + 5]), "+f"(acc[i + 6]), "+f"(acc[i + 7])
#define VGA_REGS_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define VGA_ACCS_8 VGA_ACC8(0)
#define VGA_REGS_16 VGA_REGS_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define VGA_ACCS_16 VGA_ACCS_8, VGA_ACC8(8)
#define VGA_REGS_24 VGA_REGS_16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define VGA_ACCS_24 VGA_ACCS_16, VGA_ACC8(16)
#define VGA_REGS_32 VGA_REGS_24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define VGA_ACCS_32 VGA_ACCS_24, VGA_ACC8(24)
#define VGA_REGS_40 VGA_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define VGA_ACCS_40 VGA_ACCS_32, VGA_ACC8(32)
#define VGA_REGS_48 VGA_REGS_40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define VGA_ACCS_48 VGA_ACCS_40, VGA_ACC8(40)
#define VGA_REGS_56 VGA_REGS_48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define VGA_ACCS_56 VGA_ACCS_48, VGA_ACC8(48)
#define VGA_REGS_64 VGA_REGS_56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define VGA_ACCS_64 VGA_ACCS_56, VGA_ACC8(56)
#define VGA_REGS_72 VGA_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define VGA_ACCS_72 VGA_ACCS_64, VGA_ACC8(64)
#define VGA_REGS_80 VGA_REGS_72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define VGA_ACCS_80 VGA_ACCS_72, VGA_ACC8(72)
#define VGA_REGS_88 VGA_REGS_80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define VGA_ACCS_88 VGA_ACCS_80, VGA_ACC8(80)
#define VGA_REGS_96 VGA_REGS_88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define VGA_ACCS_96 VGA_ACCS_88, VGA_ACC8(88)
#define VGA_REGS_104 VGA_REGS_96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define VGA_ACCS_104 VGA_ACCS_96, VGA_ACC8(96)
#define VGA_REGS_112 VGA_REGS_104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define VGA_ACCS_112 VGA_ACCS_104, VGA_ACC8(104)
#define VGA_REGS_120 VGA_REGS_112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define VGA_ACCS_120 VGA_ACCS_112, VGA_ACC8(112)
#define VGA_REGS_128 VGA_REGS_120 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define VGA_ACCS_128 VGA_ACCS_120, VGA_ACC8(120)

// acc[64 x N] (fp32, the wgmma fragment layout) = A[64 x 16] * B[N x 16]^T (+ acc when
// `accumulate` != 0), N = 64, 128, 192 or 256, or the forward's token widths 96, 112, 176 and 240, or
// sm90_skinny's batch rows 16 and 32 (N / 2 floats a thread), both operands in shared memory:
// kTransA / kTransB = 0 for a K-major operand, 1 for an MN-major one (16-bit types only).
// Element is __nv_bfloat16 or __half.
template <int kN, typename Element, int kTransA, int kTransB>
struct Wgmma;

// One width's two specialisations: REGS names the N / 2 accumulators (%0 .., the trailing
// operands), and the operands after them are the descriptors (DESCS), the accumulate flag (PRED)
// and the transpose bits (TRANS).
#define VGA_WGMMA_WIDE_TYPE(N, TYPE, ELEMENT, REGS, DESCS, PRED, TRANS, ...)                             \
  template <int kTransA, int kTransB>                                                                    \
  struct Wgmma<N, ELEMENT, kTransA, kTransB> {                                                           \
    __device__ __forceinline__ static void run(float (&acc)[N / 2], uint64_t desc_a, uint64_t desc_b,    \
                                               uint32_t accumulate) {                                    \
      asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, " PRED ", 0;\n"                  \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" REGS "}, " DESCS \
                   ", accumulate, 1, 1, " TRANS ";\n}\n"                                                 \
                   : __VA_ARGS__                                                                         \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));             \
    }                                                                                                    \
  };
#define VGA_WGMMA_WIDE(N, REGS, DESCS, PRED, TRANS, ...)                                 \
  VGA_WGMMA_WIDE_TYPE(N, "bf16", __nv_bfloat16, REGS, DESCS, PRED, TRANS, __VA_ARGS__) \
  VGA_WGMMA_WIDE_TYPE(N, "f16", __half, REGS, DESCS, PRED, TRANS, __VA_ARGS__)
VGA_WGMMA_WIDE(16, VGA_REGS_8, "%8, %9", "%10", "%11, %12", VGA_ACCS_8)
VGA_WGMMA_WIDE(32, VGA_REGS_16, "%16, %17", "%18", "%19, %20", VGA_ACCS_16)
VGA_WGMMA_WIDE(64, VGA_REGS_32, "%32, %33", "%34", "%35, %36", VGA_ACCS_32)
VGA_WGMMA_WIDE(96, VGA_REGS_48, "%48, %49", "%50", "%51, %52", VGA_ACCS_48)
VGA_WGMMA_WIDE(112, VGA_REGS_56, "%56, %57", "%58", "%59, %60", VGA_ACCS_56)
VGA_WGMMA_WIDE(128, VGA_REGS_64, "%64, %65", "%66", "%67, %68", VGA_ACCS_64)
VGA_WGMMA_WIDE(176, VGA_REGS_88, "%88, %89", "%90", "%91, %92", VGA_ACCS_88)
VGA_WGMMA_WIDE(192, VGA_REGS_96, "%96, %97", "%98", "%99, %100", VGA_ACCS_96)
VGA_WGMMA_WIDE(240, VGA_REGS_120, "%120, %121", "%122", "%123, %124", VGA_ACCS_120)
VGA_WGMMA_WIDE(256, VGA_REGS_128, "%128, %129", "%130", "%131, %132", VGA_ACCS_128)
#undef VGA_WGMMA_WIDE
#undef VGA_WGMMA_WIDE_TYPE

// acc[64 x 64] = A[64 x 8] * B[64 x 8]^T (+ acc when `accumulate` != 0) on TF32 operands, A in
// registers, B K-major in shared memory (TF32 has no transposed form; a k8 step of fp32 is 32
// bytes, as a k16 step of half elements is, so B's descriptor advances alike). Per warp w of the
// warpgroup and lane (g = lane / 4, t = lane % 4),
// a[0..3] = A[16w + g][t], A[16w + g + 8][t], A[16w + g][t + 4], A[16w + g + 8][t + 4].
__device__ __forceinline__ void wgmma_tf32_m64n64k8_register_a(float (&acc)[32], const uint32_t (&a)[4],
                                                               uint64_t desc_b, uint32_t accumulate) {
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" VGA_REGS_32 "}, {%32, %33, %34, %35}, %36, "
               "accumulate, 1, 1;\n}\n"
               : VGA_ACCS_32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

#undef VGA_ACC8
#undef VGA_REGS_8
#undef VGA_ACCS_8
#undef VGA_REGS_16
#undef VGA_ACCS_16
#undef VGA_REGS_24
#undef VGA_ACCS_24
#undef VGA_REGS_32
#undef VGA_ACCS_32
#undef VGA_REGS_40
#undef VGA_ACCS_40
#undef VGA_REGS_48
#undef VGA_ACCS_48
#undef VGA_REGS_56
#undef VGA_ACCS_56
#undef VGA_REGS_64
#undef VGA_ACCS_64
#undef VGA_REGS_72
#undef VGA_ACCS_72
#undef VGA_REGS_80
#undef VGA_ACCS_80
#undef VGA_REGS_88
#undef VGA_ACCS_88
#undef VGA_REGS_96
#undef VGA_ACCS_96
#undef VGA_REGS_104
#undef VGA_ACCS_104
#undef VGA_REGS_112
#undef VGA_ACCS_112
#undef VGA_REGS_120
#undef VGA_ACCS_120
#undef VGA_REGS_128
#undef VGA_ACCS_128

// Four 8 x 8 matrices of 16-bit elements (each row 16 bytes at the address lane 8i + r gives
// for row r of matrix i); lane (g = lane / 4, t = lane % 4) receives row g, 32-bit word t of
// each. With 4-byte elements, that is the (row, column) = (g, t) element of four 8 x 4 blocks.
__device__ __forceinline__ void load_matrix_x4(uint32_t (&v)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(address));
}

#endif  // VGA_SM90A_DEVICE

}  // namespace sm90
}  // namespace vga
