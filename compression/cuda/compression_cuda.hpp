#pragma once
// Compression kernels on device memory, stream-ordered, with the same
// semantics as the CPU kernels (bit for bit for the casts and the residual,
// the same selection for exact top-k). Declared without CUDA headers;
// compiled only when the library is built with CUDA. `stream` is a
// cudaStream_t (null: the default stream). Launch errors throw
// DeviceError; argument errors throw InvalidArgument before anything is
// launched.
#include <cstddef>
#include <cstdint>

#include "compression/compressor.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::compression::cuda {

/// out[i] = half(in[i] * scale), type kFloat16 (saturating) or kBFloat16;
/// see compression/cpu/cast.hpp for the rounding rules.
void castToHalf(const float* in, uint16_t* out, size_t n, DataType type, float scale, void* stream);
/// out[i] = float(in[i]), exact; an fp16 NaN comes back quiet.
void decodeHalf(const uint16_t* in, float* out, size_t n, DataType type, void* stream);
/// out[i] += float(in[i]), in one pass, with the CPU's bits (NaNs included).
void decodeAddHalf(const uint16_t* in, float* out, size_t n, DataType type, void* stream);
/// t = in[i] + residual[i]; out[i] = half(t * scale);
/// residual[i] = (t*scale - float(out[i])) / scale, 0 where not finite.
void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType type, float scale,
                      void* stream);

/// Bytes of device scratch topk() needs for n elements.
size_t topkWorkspaceBytes(size_t n);
/// Entries topk() may write: k (exact) or k + k/10 (approximate), at most n.
size_t topkCapacity(size_t n, size_t k, bool approximate);

/// Top-k by magnitude of t = in (+ residual), ordered like the CPU top-k
/// (NaN above inf, ties to the lower index), by radix select on the
/// magnitude bits (11 + 11 + 9 bits, one histogram pass each) and an ordered
/// compaction. Exact: exactly k, the same set as the CPU. Approximate: stops
/// refining as soon as a digit bucket boundary gives a count within 10% of k
/// (often after the first pass). Writes indices in increasing order
/// (uint32 when n < 2^32, else uint64: `wideIndices` must say which),
/// values, and the count to *nnzDevice (device memory). With a residual,
/// t is folded into it and the sent positions are zeroed.
void topk(const float* in, float* residual, size_t n, size_t k, bool approximate, void* indices, bool wideIndices,
          float* values, size_t capacity, uint64_t* nnzDevice, void* workspace, size_t workspaceBytes, void* stream);

/// Where the parts of a top-k payload lie: a uint64 count at offset 0, then
/// `capacity` indices (uint64 when `wideIndices`, else uint32) at
/// `indicesOffset`, then as many float values at `valuesOffset`.
struct SlotLayout {
  size_t capacity = 0;
  size_t indicesOffset = 0;
  size_t valuesOffset = 0;
  bool wideIndices = false;
};

/// For each of `slots` payloads (slot q at payloads + q * slotBytes, device
/// memory): dense[indices[i]] += values[i] for i below the slot's count, slot
/// after slot on `stream`. The counts are read on the device, so nothing
/// here waits. statusDevice holds 2 per slot and is cleared first; then
/// status[2q] is the count of slot q when it exceeds the capacity (nothing
/// of that slot is added) and status[2q + 1] how many of its indices were
/// >= denseCount (skipped). `dense` may be null when denseCount is 0.
void scatterAddSlots(float* dense, size_t denseCount, const char* payloads, size_t slotBytes, int slots,
                     const SlotLayout& layout, unsigned long long* statusDevice, void* stream);

/// The device Compressor of `spec` (fp16, bf16 or topk) running on
/// `stream`; does not probe for a GPU (compression::makeCompressor does).
/// Top-k validates what it decompresses on the host, so decompress(),
/// decompressAdd() and decompressAll() wait for the stream, once a call.
CompressorPtr makeCompressor(const Spec& spec, void* stream);

}  // namespace gradcomm::compression::cuda
