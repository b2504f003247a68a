#pragma once
// Per-ISA entry points of the CPU compression kernels. Each table is filled
// by kernels_impl.hpp compiled in its own translation unit with that level's
// -m flags (kernels_{scalar,avx2,avx512,avx512bf16}.cpp); cast.cpp and
// topk.cpp pick a table at run time.
#include <cstddef>
#include <cstdint>

#include "compression/cpu/isa.hpp"

namespace gradcomm::compression::detail {

/// Format index into the tables: fp16 (saturating) or bf16.
enum HalfFormat : int { kFp16 = 0, kBf16 = 1 };

/// Where a top-k scan reads its values: t[i] = a[i] (+ b[i] when b is set),
/// and t[i] is written to store[i] when store is set (error feedback folds
/// the residual into the gradient in the same pass).
struct ScanSource {
  const float* a = nullptr;
  const float* b = nullptr;
  float* store = nullptr;
};

/// Buckets of the magnitude histogram: the top 11 bits of |t|'s bit pattern.
inline constexpr size_t kHistogramBuckets = 2048;
inline constexpr int kHistogramShift = 20;

using CastFn = void (*)(const float* in, uint16_t* out, size_t n, float scale);
using DecodeFn = void (*)(const uint16_t* in, float* out, size_t n);
using ResidualCastFn = void (*)(const float* in, float* residual, uint16_t* out, size_t n, float scale);
/// Appends (i, t[i]) for i in [begin, end) whose magnitude key
/// (bits & 0x7FFFFFFF) is >= lo, in index order, to idx/val at *count.
/// Stops before running past `cap` entries; returns where it stopped.
template <typename IndexT>
using FilterFn = size_t (*)(const ScanSource& src, size_t begin, size_t end, uint32_t lo, IndexT* idx, float* val,
                            size_t* count, size_t cap);
/// Adds the magnitude histogram of t[0, n) to hist[kHistogramBuckets].
using HistogramFn = void (*)(const ScanSource& src, size_t n, size_t* hist);

struct KernelTable {
  CastFn cast[2];
  DecodeFn decode[2];
  ResidualCastFn residualCast[2];
  FilterFn<uint32_t> filter32;
  FilterFn<uint64_t> filter64;
  HistogramFn histogram;
};

/// Tables of each level; null when the compiler could not build that level.
const KernelTable* scalarKernels();
const KernelTable* avx2Kernels();
const KernelTable* avx512Kernels();
const KernelTable* avx512Bf16Kernels();

/// The table of `isa`, clamped to what this CPU supports.
const KernelTable& kernelTable(Isa isa);

}  // namespace gradcomm::compression::detail
