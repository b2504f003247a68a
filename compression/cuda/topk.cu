// Top-k on device: radix select on the 31 magnitude bits of t, then an
// ordered compaction.
//
// Select: up to three histogram passes (digits of 11, 11 and 9 bits, top
// first), each over the elements whose higher digits match the prefix chosen
// so far; after each, a one-thread kernel finds the bucket holding the k-th
// element. The final rule is "key > threshold, plus the first `ties`
// elements with key == threshold in index order". Later passes return at
// once when an earlier one already settled it (a device flag), so the host
// never waits: everything is ordered on the stream.
//
// Compact: tiles of 4096 elements; count selected/tied per tile, scan the
// tile counts in one block, then each tile writes its selected elements at
// its offset, so the output is in index order and ties go to lower indices.
#include <cuda_runtime.h>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "compression/cuda/compression_cuda.hpp"
#include "compression/cuda/cpu_arithmetic.cuh"
#include "compression/cuda/cuda_check.cuh"
#include "compression/cuda/radix_select.hpp"
#include "compression/sparse_tensor.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda {
namespace {

using detail::Digit;
using detail::SelectState;

constexpr int kBuckets = detail::kRadixBuckets;
constexpr int kHistThreads = 256;
constexpr int kThreads = 256;
constexpr int kItems = 16;
constexpr int kTile = kThreads * kItems;
constexpr int kScanThreads = 1024;
constexpr size_t kAlign = 256;

struct Workspace {
  SelectState* state;
  unsigned long long* hist;  // 3 x kBuckets
  unsigned* tileAbove;
  unsigned* tileTies;
  unsigned long long* aboveBefore;
  unsigned long long* tiesBefore;
};

size_t alignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

size_t tilesFor(size_t n) { return (n + kTile - 1) / kTile; }

Workspace carve(void* base, size_t n) {
  const size_t tiles = tilesFor(n);
  auto* p = static_cast<unsigned char*>(base);
  Workspace w;
  w.state = reinterpret_cast<SelectState*>(p);
  p += alignUp(sizeof(SelectState));
  w.hist = reinterpret_cast<unsigned long long*>(p);
  p += alignUp(3 * kBuckets * sizeof(unsigned long long));
  w.tileAbove = reinterpret_cast<unsigned*>(p);
  p += alignUp(tiles * sizeof(unsigned));
  w.tileTies = reinterpret_cast<unsigned*>(p);
  p += alignUp(tiles * sizeof(unsigned));
  w.aboveBefore = reinterpret_cast<unsigned long long*>(p);
  p += alignUp(tiles * sizeof(unsigned long long));
  w.tiesBefore = reinterpret_cast<unsigned long long*>(p);
  return w;
}

__device__ inline uint32_t keyOf(float t) { return __float_as_uint(t) & 0x7FFFFFFFu; }

__global__ void initKernel(SelectState* s, unsigned long long k, int all) { detail::initSelect(*s, k, all != 0); }

// Histogram of one digit of the keys that match the prefix. With kFold the
// residual is folded in (t = in + residual, stored back): pass 0 only.
template <bool kFold>
__global__ void __launch_bounds__(kHistThreads)
    histogramKernel(const float* __restrict__ a, float* __restrict__ residual, size_t n,
                                const SelectState* __restrict__ s, int shift, uint32_t digitMask,
                                unsigned long long* __restrict__ hist) {
  if (s->done) return;
  __shared__ unsigned local[kBuckets];
  for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const SelectState state = *s;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float t = a[i];
    if constexpr (kFold) {
      t = addLikeCpu(t, residual[i]);
      residual[i] = t;
    }
    const uint32_t key = keyOf(t);
    if (detail::inPrefix(state, key)) atomicAdd(&local[(key >> shift) & digitMask], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) {
    if (local[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

__global__ void foldKernel(const float* __restrict__ in, float* __restrict__ residual, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    residual[i] = addLikeCpu(in[i], residual[i]);
  }
}

__global__ void selectKernel(SelectState* s, const unsigned long long* hist, int pass, unsigned long long low,
                             unsigned long long high, int approximate) {
  detail::selectStep(*s, hist, detail::radixDigit(pass), pass == 2, approximate != 0, low, high);
}

__global__ void __launch_bounds__(kThreads)
    tileCountKernel(const float* __restrict__ t, size_t n, const SelectState* __restrict__ s,
                                unsigned* __restrict__ tileAbove, unsigned* __restrict__ tileTies) {
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const size_t base = static_cast<size_t>(blockIdx.x) * kTile;
  const uint32_t threshold = s->threshold;
  unsigned above = 0, ties = 0;
  for (int j = threadIdx.x; j < kTile; j += kThreads) {
    const size_t i = base + j;
    if (i < n) {
      const uint32_t key = keyOf(t[i]);
      above += key > threshold ? 1u : 0u;
      ties += key == threshold ? 1u : 0u;
    }
  }
  const unsigned blockAbove = Reduce(temp).Sum(above);
  __syncthreads();
  const unsigned blockTies = Reduce(temp).Sum(ties);
  if (threadIdx.x == 0) {
    tileAbove[blockIdx.x] = blockAbove;
    tileTies[blockIdx.x] = blockTies;
  }
}

// __launch_bounds__: without it ptxas gives this kernel 88 registers a thread,
// and 1,024 threads of that exceed a block's 64K registers (the launch fails
// with "too many resources requested"; seen on an H200).
__global__ void __launch_bounds__(kScanThreads)
    tileScanKernel(const unsigned* __restrict__ tileAbove, const unsigned* __restrict__ tileTies,
                               size_t tiles, unsigned long long* __restrict__ aboveBefore,
                               unsigned long long* __restrict__ tiesBefore) {
  using Scan = cub::BlockScan<unsigned long long, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ unsigned long long carryAbove, carryTies;
  if (threadIdx.x == 0) carryAbove = carryTies = 0;
  __syncthreads();
  for (size_t base = 0; base < tiles; base += kScanThreads) {
    const size_t i = base + threadIdx.x;
    const unsigned long long a = i < tiles ? tileAbove[i] : 0, t = i < tiles ? tileTies[i] : 0;
    unsigned long long beforeA, beforeT, sumA, sumT;
    Scan(temp).ExclusiveSum(a, beforeA, sumA);
    __syncthreads();
    Scan(temp).ExclusiveSum(t, beforeT, sumT);
    __syncthreads();
    if (i < tiles) {
      aboveBefore[i] = carryAbove + beforeA;
      tiesBefore[i] = carryTies + beforeT;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      carryAbove += sumA;
      carryTies += sumT;
    }
    __syncthreads();
  }
}

template <typename IndexT>
__global__ void __launch_bounds__(kThreads)
    tileWriteKernel(const float* __restrict__ t, float* __restrict__ residual, size_t n,
                                const SelectState* __restrict__ s, const unsigned long long* __restrict__ aboveBefore,
                                const unsigned long long* __restrict__ tiesBefore, IndexT* __restrict__ outIdx,
                                float* __restrict__ outVal, size_t capacity) {
  using Load = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_TRANSPOSE>;
  using Scan = cub::BlockScan<unsigned, kThreads>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
  } temp;
  const size_t tileBase = static_cast<size_t>(blockIdx.x) * kTile;
  const int valid = static_cast<int>(n - tileBase < static_cast<size_t>(kTile) ? n - tileBase : kTile);
  float v[kItems];
  Load(temp.load).Load(t + tileBase, v, valid, 0.0f);
  __syncthreads();

  const uint32_t threshold = s->threshold;
  const unsigned long long tiesWanted = s->ties;
  const int first = threadIdx.x * kItems;  // blocked arrangement: consecutive elements per thread
  unsigned myTies = 0;
  for (int j = 0; j < kItems; ++j) myTies += (first + j < valid && keyOf(v[j]) == threshold) ? 1u : 0u;
  unsigned tieRank;
  Scan(temp.scan).ExclusiveSum(myTies, tieRank);
  __syncthreads();

  unsigned long long tie = tiesBefore[blockIdx.x] + tieRank;
  unsigned selectedMask = 0, mySelected = 0;
  for (int j = 0; j < kItems; ++j) {
    if (first + j >= valid) break;
    const uint32_t key = keyOf(v[j]);
    bool take = key > threshold;
    if (key == threshold) take = tie++ < tiesWanted;
    if (take) {
      selectedMask |= 1u << j;
      ++mySelected;
    }
  }
  unsigned rank;
  Scan(temp.scan).ExclusiveSum(mySelected, rank);
  const unsigned long long tiesTakenBefore = tiesBefore[blockIdx.x] < tiesWanted ? tiesBefore[blockIdx.x] : tiesWanted;
  unsigned long long pos = aboveBefore[blockIdx.x] + tiesTakenBefore + rank;
  for (int j = 0; j < kItems; ++j) {
    if (!(selectedMask & (1u << j))) continue;
    const size_t i = tileBase + first + j;
    if (pos < capacity) {  // guaranteed by construction; never write past the caller's buffers
      outIdx[pos] = static_cast<IndexT>(i);
      outVal[pos] = v[j];
    }
    if (residual) residual[i] = 0.0f;
    ++pos;
  }
}

__global__ void publishCountKernel(const SelectState* s, uint64_t* nnz, size_t capacity) {
  const unsigned long long total = s->total;
  *nnz = total < capacity ? total : capacity;
}

}  // namespace

size_t topkWorkspaceBytes(size_t n) {
  const size_t tiles = tilesFor(n);
  return alignUp(sizeof(SelectState)) + alignUp(3 * kBuckets * sizeof(unsigned long long)) +
         2 * alignUp(tiles * sizeof(unsigned)) + 2 * alignUp(tiles * sizeof(unsigned long long));
}

size_t topkCapacity(size_t n, size_t k, bool approximate) {
  const size_t want = approximate ? k + k / 10 : k;
  return want < n ? want : n;
}

void topk(const float* in, float* residual, size_t n, size_t k, bool approximate, void* indices, bool wideIndices,
          float* values, size_t capacity, uint64_t* nnzDevice, void* workspace, size_t workspaceBytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!nnzDevice) throw InvalidArgument("cuda::topk: null count pointer");
  if (n == 0) {
    detail::check(cudaMemsetAsync(nnzDevice, 0, sizeof(uint64_t), s), "cuda::topk: clearing the count");
    return;
  }
  if (k == 0) throw InvalidArgument("cuda::topk: k is 0; select at least one element (Spec::topkCount)");
  if (!in || !indices || !values || !workspace) {
    throw InvalidArgument("cuda::topk: null buffer for " + std::to_string(n) + " elements");
  }
  if (wideIndices != needsWideIndices(n)) {
    throw InvalidArgument(std::string("cuda::topk: ") + std::to_string(n) + " elements need " +
                          (needsWideIndices(n) ? "64" : "32") + "-bit indices");
  }
  if (residual && in < residual + n && residual < in + n) {
    throw InvalidArgument("cuda::topk: the input and the residual overlap; keep the residual in its own buffer");
  }
  if (k > n) k = n;
  if (capacity < topkCapacity(n, k, approximate)) {
    throw InvalidArgument("cuda::topk: output buffers hold " + std::to_string(capacity) + " entries but " +
                          std::to_string(topkCapacity(n, k, approximate)) + " are needed (topkCapacity)");
  }
  if (workspaceBytes < topkWorkspaceBytes(n)) {
    throw InvalidArgument("cuda::topk: workspace of " + std::to_string(workspaceBytes) + " bytes, " +
                          std::to_string(topkWorkspaceBytes(n)) + " needed (topkWorkspaceBytes)");
  }

  const Workspace w = carve(workspace, n);
  const size_t tiles = tilesFor(n);
  const float* t = residual ? residual : in;  // after pass 0, t lives in the residual
  const unsigned long long low = k - k / 10, high = k + k / 10;
  detail::check(cudaMemsetAsync(w.hist, 0, 3 * kBuckets * sizeof(unsigned long long), s), "cuda::topk: memset");
  initKernel<<<1, 1, 0, s>>>(w.state, k, k == n ? 1 : 0);
  const unsigned histGrid = detail::gridFor(n, kHistThreads * 8, 4096);
  for (int pass = 0; pass < 3; ++pass) {
    const Digit d = detail::radixDigit(pass);
    unsigned long long* hist = w.hist + pass * kBuckets;
    const uint32_t digitMask = (1u << d.bits) - 1u;
    if (pass == 0 && residual) {
      histogramKernel<true><<<histGrid, kHistThreads, 0, s>>>(in, residual, n, w.state, d.shift, digitMask, hist);
    } else {
      histogramKernel<false><<<histGrid, kHistThreads, 0, s>>>(t, nullptr, n, w.state, d.shift, digitMask, hist);
    }
    selectKernel<<<1, 1, 0, s>>>(w.state, hist, pass, low, high, approximate ? 1 : 0);
  }
  // With k == n every pass returned at once, so the residual was never folded.
  if (k == n && residual) foldKernel<<<detail::gridFor(n, kThreads), kThreads, 0, s>>>(in, residual, n);
  detail::check(cudaGetLastError(), "cuda::topk: select kernel launch");
  tileCountKernel<<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(t, n, w.state, w.tileAbove, w.tileTies);
  tileScanKernel<<<1, kScanThreads, 0, s>>>(w.tileAbove, w.tileTies, tiles, w.aboveBefore, w.tiesBefore);
  if (wideIndices) {
    tileWriteKernel<uint64_t><<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(
        t, residual, n, w.state, w.aboveBefore, w.tiesBefore, static_cast<uint64_t*>(indices), values, capacity);
  } else {
    tileWriteKernel<uint32_t><<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(
        t, residual, n, w.state, w.aboveBefore, w.tiesBefore, static_cast<uint32_t*>(indices), values, capacity);
  }
  publishCountKernel<<<1, 1, 0, s>>>(w.state, nnzDevice, capacity);
  detail::check(cudaGetLastError(), "cuda::topk: compaction kernel launch");
}

}  // namespace gradcomm::compression::cuda
