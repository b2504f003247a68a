#pragma once
// The Compressor interface: one object per (scheme, memory kind) that the
// compressed allreduce and the NCCL frontend drive without knowing the
// scheme. A payload either sums directly (fp16/bf16: allreduce the payloads)
// or does not (top-k: allgather them, then decompress-accumulate each
// rank's). Error feedback is the caller's Residual buffer, passed to
// compress(): what the payload does not carry stays in it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "compression/compression.hpp"
#include "compression/cpu/isa.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::compression {

/// Where a compressor's inputs, outputs, residuals and payloads live.
enum class MemoryKind { kHost, kDevice };

/// Per-call parameters of Compressor::compress.
struct CompressArgs {
  float scale = 1.0f;  ///< pre-scaling factor (1/ranks for an average); summable compressors only, else must be 1
  uint64_t seed = 0;   ///< sampling seed of approximate top-k; vary it per step (exact results do not depend on it)
  /// Rank `rank`'s arguments for collective number `seq` of `ranks` ranks:
  /// every path of a compressed allreduce (host, staged, NCCL) uses these,
  /// so that their results agree bit for bit.
  static CompressArgs forCall(bool prescale, int ranks, uint64_t seq, int rank) {
    CompressArgs a;
    a.scale = prescale ? 1.0f / static_cast<float>(ranks) : 1.0f;
    a.seed = seq * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank);
    return a;
  }
};

/// Compresses float32 tensors into payloads and back.
class Compressor {
 public:
  virtual ~Compressor() = default;
  Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  /// The scheme (kFp16, kBf16 or kTopK).
  virtual Kind kind() const = 0;
  /// Where the buffers passed to this compressor live.
  virtual MemoryKind memory() const = 0;
  /// True when payloads of several ranks may be added elementwise as
  /// payloadType() values (an allreduce of payloads); false when each rank's
  /// payload has to be moved whole (an allgather) and decompressAdd()ed.
  virtual bool summable() const = 0;
  /// Element type of a payload: kFloat16 or kBFloat16 for summable
  /// payloads, kUInt8 (opaque bytes) otherwise.
  virtual DataType payloadType() const = 0;
  /// Bytes of the payload of n elements; the same on every rank for the same
  /// n (top-k: a slot sized for the most entries a selection may send), and
  /// a multiple of the size of payloadType().
  virtual size_t payloadBytes(size_t n) const = 0;

  /// Compresses in[0, n) (plus residual[0, n) when residual is not null)
  /// into payload (payloadBytes(n) bytes). With a residual (error feedback),
  /// residual afterwards holds what the payload does not carry, in gradient
  /// units: (in + old residual) - decompress(payload) / scale.
  virtual void compress(const float* in, float* residual, size_t n, void* payload, const CompressArgs& args) = 0;
  /// out[0, n) = the values payload carries (after any reduction of summable
  /// payloads, still multiplied by the compress scale).
  virtual void decompress(const void* payload, float* out, size_t n) = 0;
  /// out[0, n) += the values payload carries. A payload that came over the
  /// wire is validated first: a malformed one throws TransportError or
  /// InvalidArgument before out is touched out of bounds.
  virtual void decompressAdd(const void* payload, float* out, size_t n) = 0;
  /// out[0, n) = what the payloads of `ranks` ranks carry together: the one
  /// (already reduced) payload of a summable compressor, else the slots of
  /// `slotBytes` each, decompressed in rank order (the order fixes the float
  /// sums, equal on every rank and memory). A malformed slot throws
  /// TransportError naming its rank. The default calls decompress() and
  /// decompressAdd(); a device compressor may validate all slots at once.
  virtual void decompressAll(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n);
  /// Host bytes decompressAllQueued() needs for `ranks` payloads (0: none).
  virtual size_t queuedCheckBytes(int ranks) const;
  /// decompressAll() without waiting for a device compressor's stream: the
  /// check of the payloads lands in `hostCheck` (queuedCheckBytes(ranks)
  /// bytes of pinned host memory that outlive the queued work), and the
  /// returned function, run once the stream has passed this point, throws
  /// what decompressAll() would. The default runs decompressAll() now and
  /// returns an empty function (nothing left to check).
  virtual std::function<void()> decompressAllQueued(const char* payloads, size_t slotBytes, int ranks, float* out,
                                                    size_t n, void* hostCheck);
};

/// Owning pointer to a Compressor.
using CompressorPtr = std::unique_ptr<Compressor>;

/// The compressor of `spec` for buffers in `memory`. `isa` is the CPU
/// kernels' level (capped to what this CPU runs; unused on the device);
/// `stream` is the cudaStream_t device compressors run on (null: the default
/// stream; unused on the host). Throws InvalidArgument for Kind::kNone and
/// UnsupportedError for device memory when the library was built without
/// CUDA or no GPU is usable.
CompressorPtr makeCompressor(const Spec& spec, MemoryKind memory, Isa isa = detectIsa(), void* stream = nullptr);

/// The CPU compressors (makeCompressor picks them for MemoryKind::kHost).
CompressorPtr makeCpuCompressor(const Spec& spec, Isa isa);

}  // namespace gradcomm::compression
