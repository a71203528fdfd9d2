// The tf32x3 family: fp32 y = cat(x[0..R-1], -1) @ W^T + bias at fp32 accuracy on tensor cores,
// without materialising the concat.
//
// 3xTF32: every fp32 operand is split as a = a_hi + a_lo with both halves tf32 (a_hi = a
// truncated to tf32, a_lo = rna(a - a_hi); see split_tf32), and a*b is accumulated in fp32 as
// a_lo*b_hi + a_hi*b_lo + a_hi*b_hi (the dropped a_lo*b_lo is < 2^-20 relative): fp32-level
// error (~1e-6) at tensor-core speed, three mma.sync.m16n8k8 tf32 per product instead of one.
//
// Tiling: a 128 x 64 output tile per 256-thread CTA, k-blocks of 32, 8 warps as 4 (M) x 2 (N) of
// 32 x 32 each (2 x 4 mma tiles, 24 mma per k8 step). 128 x 64 rather than 128 x 128 so that
// mid-sized GEMMs fill the SMs in one wave (1024 x 1024 outputs: 128 CTAs on 132 SMs).
//   * global -> shared: a 3-stage cp.async ring (16-byte copies, zero-filled past the rows, the
//     out-features and the reduction). Each thread copies one fixed 16-byte column vector of a
//     k-block for 4 A rows and 2 W rows. A row m is x + (m / B_inner) * stride_outer +
//     (m % B_inner) * stride_inner; the column vector's shard r = c / H and h = c % H are
//     tracked incrementally (H % 4 == 0 keeps each vector inside one shard, so a k-block may
//     straddle shards for any H).
//   * shared layout: one 128-byte row per tile row (32 floats), its 16-byte vectors XOR-swizzled
//     (vector v of row r lives at v ^ (r % 8)): cp.async writes and ldmatrix reads (8 rows of one
//     vector each) are both free of bank conflicts.
//   * fragments: ldmatrix.x4 (b16 view) hands lane (g, t) the 32-bit element (row g, column t) of
//     four 8 x 4 fp32 blocks, which is the tf32 fragment layout: one ldmatrix.x4 is a whole A
//     fragment (rows 0-7 / 8-15 x k 0-3 / 4-7) or the B fragments of two n8 tiles, already in
//     the register order the mma wants (plain 32-bit or 128-bit loads would need register moves).
//   * split hi/lo in registers right before the mma; fp32 bias added in the epilogue; paired
//     (8-byte) stores of y when K is even.
// Tiles are walked in groups of kGroupM row-tiles (all column tiles of a group, then the next
// group), so the CTAs in flight share x and W panels in L2.
//
// Refused (see tf32x3_gemm_refusal): dtype other than fp32, compute capability < 8, an empty
// problem, H % 4 != 0, x / W not 16-byte aligned or with strides that are not multiples of 4
// elements, weight_stride_in != 1, sizes >= 2^31.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "problem.cuh"

namespace vga {
namespace tf32x3_detail {

constexpr int kBlockM = 128;
constexpr int kBlockN = 64;
constexpr int kBlockK = 32;
constexpr int kStages = 3;
constexpr int kWarpsM = 4;
constexpr int kWarpsN = 2;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpTileM = kBlockM / kWarpsM;  // 32
constexpr int kWarpTileN = kBlockN / kWarpsN;  // 32
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 8;
constexpr int kMTiles = kWarpTileM / kMmaM;  // 2
constexpr int kNTiles = kWarpTileN / kMmaN;  // 4
constexpr int kSteps = kBlockK / kMmaK;  // 4 k8 steps per k-block

constexpr int kVecFloats = 4;                        // one 16-byte cp.async / ldmatrix row
constexpr int kVecsPerRow = kBlockK / kVecFloats;    // 8
constexpr int kRowBytes = kBlockK * 4;               // 128: one swizzle row
constexpr int kRowsPerPass = kThreads / kVecsPerRow;  // 32 tile rows copied per pass of the CTA
constexpr int kAVecsPerThread = kBlockM / kRowsPerPass;  // 4
constexpr int kBVecsPerThread = kBlockN / kRowsPerPass;  // 2
constexpr int kATileBytes = kBlockM * kRowBytes;
constexpr int kBTileBytes = kBlockN * kRowBytes;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kSharedBytes = kStages * kStageBytes;  // 72 KB
constexpr int kGroupM = 8;

static_assert(kVecsPerRow == 8, "the swizzle permutes the 8 vectors of a 128-byte row");
static_assert(kRowsPerPass % 8 == 0, "a thread's copy rows share one swizzle");
static_assert(kNTiles % 2 == 0, "one ldmatrix.x4 loads the B fragments of two n8 tiles");

struct GemmArgs {
  const float* x;
  const float* weight;
  const float* bias;  // nullptr when absent
  float* out;         // (rows, out_features) row-major
  int64_t rows;
  int64_t batch_inner;
  int64_t x_stride_outer;
  int64_t x_stride_inner;
  int64_t x_stride_shard;
  int64_t weight_stride_out;
  int64_t bias_stride;
  int shard_width;   // H
  int reduction;     // R * H
  int out_features;  // K
  int num_kblocks;
  int m_tiles;
  int n_tiles;
  bool paired_stores;  // K even and out 8-byte aligned: store y two columns at a time
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const float* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Four 8 x 4 fp32 blocks; lane l gives the address of row l % 8 of block l / 8 and receives
// (row l / 4, column l % 4) of block j in r[j].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Byte offset of the 16-byte vector `vec` of tile row `row` within that row.
__device__ __forceinline__ uint32_t swizzled_vec_offset(int row, int vec) {
  return static_cast<uint32_t>((vec ^ (row % 8)) * 16);
}

// a = hi + lo, both tf32: hi = a truncated to tf32 (one LOP; a - hi is exact in fp32),
// lo = cvt.rna(a - hi). |a - hi| < 2^-10 |a|, |a - hi - lo| < 2^-21 |a|. The split of CUTLASS's
// FastF32 (big: round toward zero, small: round half ulp); three ALU ops fewer per element than
// rounding hi as well, and the split's ALU work is what competes with the mma for issue slots.
__device__ __forceinline__ void split_tf32(uint32_t a_bits, uint32_t& hi, uint32_t& lo) {
  hi = a_bits & 0xffffe000u;
  // Inf must come out as F.linear gives it, so no lo product may be 0 * inf:
  // for a = +-inf, a - hi is NaN and lo becomes 0 (the other operand's lo is never 0);
  // for an a that tf32 holds exactly, lo becomes +-2^-126 with a's sign instead of 0
  // (an absolute error of 2^-126 * |b|, far below fp32 rounding of any sum).
  const float a = __uint_as_float(a_bits);
  float rest = a - __uint_as_float(hi);
  if (rest != rest) {
    rest = 0.0f;
  } else if (rest == 0.0f) {
    rest = copysignf(1.17549435e-38f, a);
  }
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(rest));
}

// d += a * b, m16n8k8, tf32 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__global__ void __launch_bounds__(kThreads, 2) tf32x3_gemm_kernel(const GemmArgs args) {
  extern __shared__ __align__(128) unsigned char shared[];
  const uint32_t shared_base = shared_address(shared);

  // Grouped tile order: kGroupM row-tiles x all column tiles per group.
  const int tile = static_cast<int>(blockIdx.x);
  const int tiles_per_group = kGroupM * args.n_tiles;
  const int group = tile / tiles_per_group;
  const int first_m_tile = group * kGroupM;
  const int group_m_tiles = min(args.m_tiles - first_m_tile, kGroupM);
  const int in_group = tile - group * tiles_per_group;
  const int64_t m0 = static_cast<int64_t>(first_m_tile + in_group % group_m_tiles) * kBlockM;
  const int n0 = (in_group / group_m_tiles) * kBlockN;

  // ---- copy role: vector copy_vec of tile rows copy_row + i * kRowsPerPass, every k-block.
  const int copy_vec = static_cast<int>(threadIdx.x) % kVecsPerRow;
  const int copy_row = static_cast<int>(threadIdx.x) / kVecsPerRow;
  const uint32_t copy_offset = copy_row * kRowBytes + swizzled_vec_offset(copy_row, copy_vec);

  const float* a_rows[kAVecsPerThread];  // nullptr past the last row
#pragma unroll
  for (int i = 0; i < kAVecsPerThread; ++i) {
    const int64_t m = m0 + copy_row + i * kRowsPerPass;
    const int64_t offset = args.batch_inner == 1 ? m * args.x_stride_outer
                                                 : (m / args.batch_inner) * args.x_stride_outer +
                                                       (m % args.batch_inner) * args.x_stride_inner;
    a_rows[i] = m < args.rows ? args.x + offset : nullptr;
  }
  const float* w_rows[kBVecsPerThread];  // nullptr past the last out-feature
#pragma unroll
  for (int i = 0; i < kBVecsPerThread; ++i) {
    const int n = n0 + copy_row + i * kRowsPerPass;
    w_rows[i] = n < args.out_features ? args.weight + n * args.weight_stride_out : nullptr;
  }

  // The copy column c (the next k-block's, advanced by kBlockK per issue) as shard offset + h.
  int column = copy_vec * kVecFloats;
  int column_h = column;
  int64_t column_shard_offset = 0;
  auto normalize_column = [&] {
    while (column_h >= args.shard_width) {
      column_h -= args.shard_width;
      column_shard_offset += args.x_stride_shard;
    }
  };
  normalize_column();

  // Copies the next k-block into `stage` and advances the copy column.
  auto issue_copies = [&](int stage) {
    const bool column_valid = column < args.reduction;
    const uint32_t a_dst = shared_base + stage * kStageBytes + copy_offset;
#pragma unroll
    for (int i = 0; i < kAVecsPerThread; ++i) {
      const bool valid = column_valid && a_rows[i] != nullptr;
      cp_async16(a_dst + i * kRowsPerPass * kRowBytes,
                 valid ? a_rows[i] + column_shard_offset + column_h : args.x, valid ? 16 : 0);
    }
    const uint32_t w_dst = shared_base + stage * kStageBytes + kATileBytes + copy_offset;
#pragma unroll
    for (int i = 0; i < kBVecsPerThread; ++i) {
      const bool valid = column_valid && w_rows[i] != nullptr;
      cp_async16(w_dst + i * kRowsPerPass * kRowBytes, valid ? w_rows[i] + column : args.weight,
                 valid ? 16 : 0);
    }
    column += kBlockK;
    column_h += kBlockK;
    normalize_column();
  };

  // ---- mma role: warp (warp_m, warp_n) owns rows warp_m * 32 + [0, 32), columns warp_n * 32 + [0, 32).
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;
  const int group_id = lane / 4;         // fragment row (A, C) / column (B)
  const int thread_in_group = lane % 4;  // fragment k (A, B) / column pair (C)
  // ldmatrix rows: A blocks (rows 0-7, k 0-3), (rows 8-15, k 0-3), (rows 0-7, k 4-7), (rows 8-15,
  // k 4-7) = a0..a3; W blocks (n 0-7, k 0-3), (n 0-7, k 4-7), (n 8-15, k 0-3), (n 8-15, k 4-7) =
  // b0, b1 of n tile 2p, then of n tile 2p + 1. Step s reads k vectors 2s (k 0-3) and 2s + 1.
  const int ldmatrix_row = lane % 8;  // every tile row this lane addresses is = lane (mod 8)
  const int a_ldmatrix_row = warp_m * kWarpTileM + ldmatrix_row + 8 * ((lane / 8) % 2);
  const int w_ldmatrix_row = warp_n * kWarpTileN + ldmatrix_row + 8 * (lane / 16);
  const uint32_t a_ldmatrix_offset = a_ldmatrix_row * kRowBytes;
  const uint32_t w_ldmatrix_offset = kATileBytes + w_ldmatrix_row * kRowBytes;
  uint32_t a_step_offset[kSteps], w_step_offset[kSteps];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    a_step_offset[step] = swizzled_vec_offset(ldmatrix_row, 2 * step + lane / 16);
    w_step_offset[step] = swizzled_vec_offset(ldmatrix_row, 2 * step + (lane / 8) % 2);
  }

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  // ---- the ring: stage kb % kStages holds k-block kb; one barrier per k-block.
#pragma unroll
  for (int kb = 0; kb < kStages - 1; ++kb) {
    if (kb < args.num_kblocks) issue_copies(kb);
    cp_async_commit();
  }
  int read_stage = 0;
  int write_stage = kStages - 1;
  for (int kb = 0; kb < args.num_kblocks; ++kb) {
    // k-block kb has landed (this thread's copies), and after the barrier everyone's; the
    // barrier also retires all reads of write_stage (k-block kb - 1) before it is refilled.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kb + kStages - 1 < args.num_kblocks) issue_copies(write_stage);
    cp_async_commit();
    write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;

    const uint32_t stage_base = shared_base + read_stage * kStageBytes;
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      // A: a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4); B: b0 = (t, g), b1 = (t + 4, g).
      uint32_t a_bits[kMTiles][4], w_bits[kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(a_bits[mt], stage_base + a_ldmatrix_offset + mt * kMmaM * kRowBytes + a_step_offset[step]);
#pragma unroll
      for (int pair = 0; pair < kNTiles / 2; ++pair) {
        uint32_t blocks[4];
        ldmatrix_x4(blocks, stage_base + w_ldmatrix_offset + pair * 2 * kMmaN * kRowBytes + w_step_offset[step]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          w_bits[2 * pair][r] = blocks[r];
          w_bits[2 * pair + 1][r] = blocks[2 + r];
        }
      }

      uint32_t a_hi[kMTiles][4], a_lo[kMTiles][4], w_hi[kNTiles][2], w_lo[kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) split_tf32(a_bits[mt][r], a_hi[mt][r], a_lo[mt][r]);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) split_tf32(w_bits[nt][r], w_hi[nt][r], w_lo[nt][r]);
      // Small terms first, then the big one; 8 independent accumulators between dependent mma.
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mma_tf32(acc[mt][nt], a_lo[mt], w_hi[nt]);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mma_tf32(acc[mt][nt], a_hi[mt], w_lo[nt]);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mma_tf32(acc[mt][nt], a_hi[mt], w_hi[nt]);
    }
  }

  // ---- epilogue: c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = (g + 8, 2t), (g + 8, 2t + 1).
  const int n_first = n0 + warp_n * kWarpTileN + 2 * thread_in_group;
  float bias_pair[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = n_first + nt * kMmaN + j;
      bias_pair[nt][j] =
          args.bias != nullptr && n < args.out_features ? args.bias[n * args.bias_stride] : 0.0f;
    }
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t m = m0 + warp_m * kWarpTileM + mt * kMmaM + half * 8 + group_id;
      if (m >= args.rows) continue;
      float* out_row = args.out + m * args.out_features;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int n = n_first + nt * kMmaN;
        const float v0 = acc[mt][nt][2 * half] + bias_pair[nt][0];
        const float v1 = acc[mt][nt][2 * half + 1] + bias_pair[nt][1];
        if (args.paired_stores) {
          if (n < args.out_features) *reinterpret_cast<float2*>(out_row + n) = make_float2(v0, v1);
        } else {
          if (n < args.out_features) out_row[n] = v0;
          if (n + 1 < args.out_features) out_row[n + 1] = v1;
        }
      }
    }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shared-memory opt-in (> 48 KB), once per device.
inline void reserve_shared_memory() {
  constexpr int kMaxDevices = 64;
  static std::once_flag reserved[kMaxDevices];
  int device = 0;
  cudaGetDevice(&device);
  auto reserve = [] {
    cudaFuncSetAttribute(tf32x3_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  };
  if (device >= 0 && device < kMaxDevices) {
    std::call_once(reserved[device], reserve);
  } else {
    reserve();
  }
}

}  // namespace tf32x3_detail

inline const char* tf32x3_gemm_refusal(const ForwardProblem& p) {
  namespace d = tf32x3_detail;
  constexpr int64_t kMaxIndex = INT32_MAX;
  if (p.dtype != DType::kFloat32) return "dtype is not fp32";
  if (p.cc_major < 8) return "needs tf32 tensor cores (sm_80+)";
  if (p.rows() <= 0 || p.out_features <= 0 || p.reduction() <= 0) return "empty problem";
  if (p.shard_width % d::kVecFloats != 0) return "H % 4 != 0 (16-byte copies)";
  if (p.weight_stride_in != 1) return "weight's input dim is not contiguous";
  if (p.weight_stride_out % d::kVecFloats != 0) return "weight row stride is not a multiple of 16 bytes";
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.weight) % 16 != 0)
    return "x or weight is not 16-byte aligned";
  // Strides of size-1 dims are never used.
  if ((p.num_shards > 1 && p.x_stride_shard % d::kVecFloats != 0) ||
      (p.batch_outer > 1 && p.x_stride_outer % d::kVecFloats != 0) ||
      (p.batch_inner > 1 && p.x_stride_inner % d::kVecFloats != 0))
    return "an x stride is not a multiple of 16 bytes";
  if (p.reduction() > kMaxIndex - 2 * d::kBlockK || p.out_features > kMaxIndex - d::kBlockN) return "a dimension is >= 2^31";
  if (d::ceil_div(p.rows(), d::kBlockM) * d::ceil_div(p.out_features, d::kBlockN) > kMaxIndex) return "more than 2^31 output tiles";
  return nullptr;
}

inline void tf32x3_gemm_forward(const ForwardProblem& p, cudaStream_t stream) {
  namespace d = tf32x3_detail;
  d::GemmArgs args{};
  args.x = static_cast<const float*>(p.x);
  args.weight = static_cast<const float*>(p.weight);
  args.bias = static_cast<const float*>(p.bias);
  args.out = static_cast<float*>(p.out);
  args.rows = p.rows();
  args.batch_inner = p.batch_inner;
  args.x_stride_outer = p.x_stride_outer;
  args.x_stride_inner = p.x_stride_inner;
  args.x_stride_shard = p.x_stride_shard;
  args.weight_stride_out = p.weight_stride_out;
  args.bias_stride = p.bias_stride;
  args.shard_width = static_cast<int>(p.shard_width);
  args.reduction = static_cast<int>(p.reduction());
  args.out_features = static_cast<int>(p.out_features);
  args.num_kblocks = static_cast<int>(d::ceil_div(p.reduction(), d::kBlockK));
  args.m_tiles = static_cast<int>(d::ceil_div(p.rows(), d::kBlockM));
  args.n_tiles = static_cast<int>(d::ceil_div(p.out_features, d::kBlockN));
  args.paired_stores = p.out_features % 2 == 0 && reinterpret_cast<uintptr_t>(p.out) % 8 == 0;

  d::reserve_shared_memory();
  const unsigned tiles = static_cast<unsigned>(int64_t(args.m_tiles) * args.n_tiles);
  d::tf32x3_gemm_kernel<<<tiles, d::kThreads, d::kSharedBytes, stream>>>(args);
}

}  // namespace vga
