// The device compressors: the CUDA cast and top-k kernels behind the
// Compressor interface, stream-ordered on the stream they were made for.
// Host code only; it lives here so that it is compiled only with CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "compression/cast_compressor.hpp"
#include "compression/compressor.hpp"
#include "compression/cuda/compression_cuda.hpp"
#include "compression/cuda/cuda_check.cuh"
#include "compression/sparse_tensor.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda {
namespace {

size_t alignUp8(size_t bytes) { return (bytes + 7) / 8 * 8; }

/// Stream-ordered device scratch, freed on the stream when it goes out of
/// scope (so it lives exactly as long as the queued work needs it).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
    if (bytes) detail::check(cudaMallocAsync(&ptr_, bytes, stream), what);
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

/// The CUDA kernels of the cast compressor, ordered on one stream.
struct CudaCastKernels {
  static constexpr MemoryKind kMemory = MemoryKind::kDevice;
  void* stream;
  void cast(const float* in, uint16_t* out, size_t n, DataType half, float scale) const {
    castToHalf(in, out, n, half, scale, stream);
  }
  void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType half, float scale) const {
    cuda::castWithResidual(in, residual, out, n, half, scale, stream);
  }
  void decode(const uint16_t* in, float* out, size_t n, DataType half) const { decodeHalf(in, out, n, half, stream); }
  void decodeAdd(const uint16_t* in, float* out, size_t n, DataType half) const {
    decodeAddHalf(in, out, n, half, stream);
  }
};

/// Payload (device memory): uint64 count, then topkCapacity indices (uint32,
/// or uint64 from 2^32 elements), then as many float values, each part
/// 8-byte aligned.
class CudaTopKCompressor final : public Compressor {
 public:
  CudaTopKCompressor(const Spec& spec, void* stream) : spec_(spec), stream_(stream) {}

  Kind kind() const override { return Kind::kTopK; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  bool summable() const override { return false; }
  DataType payloadType() const override { return DataType::kUInt8; }
  size_t payloadBytes(size_t n) const override { return valuesOffset(n) + alignUp8(capacity(n) * sizeof(float)); }

  void compress(const float* in, float* residual, size_t n, void* payload, const CompressArgs& args) override {
    if (args.scale != 1.0f) {
      throw InvalidArgument("top-k compression takes no pre-scaling (scale " + std::to_string(args.scale) +
                            "): its payloads are not summed in reduced precision");
    }
    auto* base = static_cast<char*>(payload);
    auto* count = reinterpret_cast<uint64_t*>(base);
    const size_t k = n ? spec_.topkCount(n) : 0;
    const size_t bytes = topkWorkspaceBytes(n);
    StreamScratch work(n ? bytes : 0, static_cast<cudaStream_t>(stream_), "cuda top-k compress: workspace");
    topk(in, residual, n, k, spec_.approximate, base + kHeader, needsWideIndices(n),
         reinterpret_cast<float*>(base + valuesOffset(n)), capacity(n), count, work.get(), bytes, stream_);
  }

  void decompress(const void* payload, float* out, size_t n) override {
    clear(out, n);
    scatterChecked(static_cast<const char*>(payload), 0, 1, out, n, false);
  }
  void decompressAdd(const void* payload, float* out, size_t n) override {
    scatterChecked(static_cast<const char*>(payload), 0, 1, out, n, false);
  }
  void decompressAll(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n) override {
    clear(out, n);
    scatterChecked(payloads, slotBytes, ranks, out, n, true);
  }
  size_t queuedCheckBytes(int ranks) const override { return statusBytes(ranks); }
  std::function<void()> decompressAllQueued(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n,
                                            void* hostCheck) override {
    if (ranks <= 0) return {};
    if (!hostCheck) throw InvalidArgument("cuda top-k decompress: no host memory for the check of the payloads");
    clear(out, n);
    auto* host = static_cast<unsigned long long*>(hostCheck);
    const size_t cap = queueScatter(payloads, slotBytes, ranks, out, n, host);
    return [host, ranks, cap, n] { throwIfMalformed(host, ranks, cap, n, true); };
  }

 private:
  static constexpr size_t kHeader = 8;

  void clear(float* out, size_t n) {
    if (n) {
      detail::check(cudaMemsetAsync(out, 0, n * sizeof(float), static_cast<cudaStream_t>(stream_)),
                    "cuda top-k decompress: clearing the output");
    }
  }

  static size_t statusBytes(int slots) {
    return 2 * static_cast<size_t>(std::max(slots, 0)) * sizeof(unsigned long long);
  }

  /// Queues the scatter-add of the slots in rank order and the copy of
  /// their check (2 per slot: an excess count, indices past the tensor)
  /// into `host`; returns the slots' capacity. The counts live on the
  /// device, so they are checked there; a slot whose count exceeds its
  /// capacity adds nothing.
  size_t queueScatter(const char* payloads, size_t slotBytes, int slots, float* out, size_t n,
                      unsigned long long* host) {
    const auto s = static_cast<cudaStream_t>(stream_);
    StreamScratch status(statusBytes(slots), s, "cuda top-k decompress: status");
    SlotLayout layout;
    layout.capacity = capacity(n);
    layout.indicesOffset = kHeader;
    layout.valuesOffset = valuesOffset(n);
    layout.wideIndices = needsWideIndices(n);
    auto* statusDevice = static_cast<unsigned long long*>(status.get());
    scatterAddSlots(out, n, payloads, slotBytes, slots, layout, statusDevice, stream_);
    detail::check(cudaMemcpyAsync(host, statusDevice, statusBytes(slots), cudaMemcpyDeviceToHost, s),
                  "cuda top-k decompress: reading the status");
    return layout.capacity;
  }

  /// TransportError for the first malformed slot of a check (naming its
  /// rank where `nameRanks`).
  static void throwIfMalformed(const unsigned long long* host, int slots, size_t capacity, size_t n, bool nameRanks) {
    for (int q = 0; q < slots; ++q) {
      const std::string who = nameRanks ? "payload of rank " + std::to_string(q) + ": " : "";
      if (const auto claimed = host[2 * static_cast<size_t>(q)]) {
        throw TransportError(who + "top-k payload claims " + std::to_string(claimed) +
                             " entries, more than its slot of " + std::to_string(capacity));
      }
      if (const auto bad = host[2 * static_cast<size_t>(q) + 1]) {
        throw TransportError(who + "top-k payload holds " + std::to_string(bad) + " indices past the tensor's " +
                             std::to_string(n) + " elements (they were skipped)");
      }
    }
  }

  /// The slots added and checked, waiting for the stream once.
  void scatterChecked(const char* payloads, size_t slotBytes, int slots, float* out, size_t n, bool nameRanks) {
    if (slots <= 0) return;
    std::vector<unsigned long long> host(2 * static_cast<size_t>(slots));
    const size_t cap = queueScatter(payloads, slotBytes, slots, out, n, host.data());
    detail::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                  "cuda top-k decompress: waiting for the scatter");
    throwIfMalformed(host.data(), slots, cap, n, nameRanks);
  }

  size_t capacity(size_t n) const { return n ? topkCapacity(n, spec_.topkCount(n), spec_.approximate) : 0; }
  size_t valuesOffset(size_t n) const {
    return kHeader + alignUp8(capacity(n) * (needsWideIndices(n) ? sizeof(uint64_t) : sizeof(uint32_t)));
  }

  Spec spec_;
  void* stream_;
};

}  // namespace

CompressorPtr makeCompressor(const Spec& spec, void* stream) {
  switch (spec.kind) {
    case Kind::kFp16:
    case Kind::kBf16: return std::make_unique<CastCompressor<CudaCastKernels>>(spec.kind, CudaCastKernels{stream});
    case Kind::kTopK: return std::make_unique<CudaTopKCompressor>(spec, stream);
    case Kind::kNone: break;
  }
  throw InvalidArgument("compression '" + spec.toString() + "' has no compressor: ask for fp16, bf16 or topk");
}

}  // namespace gradcomm::compression::cuda
