// The CPU compressors: fp16/bf16 casts (summable payloads) and top-k in the
// sparse wire format (gathered payloads).
#include <algorithm>
#include <cstring>
#include <string>

#include "compression/cast_compressor.hpp"
#include "compression/compressor.hpp"
#include "compression/cpu/cast.hpp"
#include "compression/cpu/topk.hpp"
#include "compression/sparse_format.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {
namespace {

/// The CPU kernels of the cast compressor, at one ISA level.
struct CpuCastKernels {
  static constexpr MemoryKind kMemory = MemoryKind::kHost;
  Isa isa;
  void cast(const float* in, uint16_t* out, size_t n, DataType half, float scale) const {
    castToHalf(in, out, n, half, scale, isa);
  }
  void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType half, float scale) const {
    compression::castWithResidual(in, residual, out, n, half, scale, isa);
  }
  void decode(const uint16_t* in, float* out, size_t n, DataType half) const { decodeHalf(in, out, n, half, isa); }
  void decodeAdd(const uint16_t* in, float* out, size_t n, DataType half) const {
    // Decoding is exact, so decode-then-add in blocks equals one add of the
    // decoded tensor; the block keeps the scratch on the stack.
    constexpr size_t kBlock = 1024;
    float block[kBlock];
    for (size_t begin = 0; begin < n; begin += kBlock) {
      const size_t len = std::min(kBlock, n - begin);
      decodeHalf(in + begin, block, len, half, isa);
      for (size_t i = 0; i < len; ++i) out[begin + i] += block[i];
    }
  }
};

/// Payload: an 8-byte length, then the sparse wire format
/// (sparse_format.hpp), in a slot padded to 8 bytes that holds the most
/// entries a selection may send (approximate mode: up to k + k/10 + 1).
class CpuTopKCompressor final : public Compressor {
 public:
  CpuTopKCompressor(const Spec& spec, Isa isa) : spec_(spec), isa_(isa) {}

  Kind kind() const override { return Kind::kTopK; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  bool summable() const override { return false; }
  DataType payloadType() const override { return DataType::kUInt8; }
  size_t payloadBytes(size_t n) const override { return (kHeader + encodedBytes(n, maxEntries(n)) + 7) / 8 * 8; }

  void compress(const float* in, float* residual, size_t n, void* payload, const CompressArgs& args) override {
    if (args.scale != 1.0f) {
      throw InvalidArgument("top-k compression takes no pre-scaling (scale " + std::to_string(args.scale) +
                            "): its payloads are not summed in reduced precision");
    }
    const size_t kmax = maxEntries(n);
    SparseTensor sparse;
    if (n) {
      TopKOptions o;
      o.k = spec_.topkCount(n);
      o.approximate = spec_.approximate;
      o.seed = args.seed;
      o.isa = isa_;
      topk(in, residual, n, o, sparse);
    } else {
      sparse.denseCount = 0;
    }
    if (sparse.nnz() > kmax) {
      throw InternalError("top-k selected " + std::to_string(sparse.nnz()) + " elements, more than the " +
                          std::to_string(kmax) + " its payload slot holds");
    }
    char* slot = static_cast<char*>(payload);
    const uint64_t len = encode(sparse, slot + kHeader, payloadBytes(n) - kHeader);
    std::memcpy(slot, &len, kHeader);
  }

  void decompress(const void* payload, float* out, size_t n) override {
    if (n) std::memset(out, 0, n * sizeof(float));
    decompressAdd(payload, out, n);
  }

  void decompressAdd(const void* payload, float* out, size_t n) override {
    const char* slot = static_cast<const char*>(payload);
    uint64_t len = 0;
    std::memcpy(&len, slot, kHeader);
    const size_t room = payloadBytes(n) - kHeader;
    if (len > room) {
      throw TransportError("top-k payload claims " + std::to_string(len) + " bytes, more than its slot of " +
                           std::to_string(room));
    }
    decodeAdd(slot + kHeader, static_cast<size_t>(len), out, n);
  }

 private:
  static constexpr size_t kHeader = 8;

  size_t maxEntries(size_t n) const {
    const size_t k = n == 0 ? 0 : spec_.topkCount(n);
    return spec_.approximate ? std::min(n, k + k / 10 + 1) : k;
  }

  Spec spec_;
  Isa isa_;
};

}  // namespace

CompressorPtr makeCpuCompressor(const Spec& spec, Isa isa) {
  const Isa level = kernels::minLevel(isa, detectIsa());
  switch (spec.kind) {
    case Kind::kFp16:
    case Kind::kBf16: return std::make_unique<CastCompressor<CpuCastKernels>>(spec.kind, CpuCastKernels{level});
    case Kind::kTopK: return std::make_unique<CpuTopKCompressor>(spec, level);
    case Kind::kNone: break;
  }
  throw InvalidArgument("compression '" + spec.toString() + "' has no compressor: ask for fp16, bf16 or topk");
}

}  // namespace gradcomm::compression
