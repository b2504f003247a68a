#pragma once
// The fp16/bf16 cast compressor, once for both memories: the class shape is
// the same on the host and on the device, only the kernels differ. Each
// backend (compression/cpu/compressors.cpp, compression/cuda/compressors.cu)
// passes a Kernels object with
//   static constexpr MemoryKind kMemory;
//   void cast(const float* in, uint16_t* out, size_t n, DataType half, float scale);
//   void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType half, float scale);
//   void decode(const uint16_t* in, float* out, size_t n, DataType half);
//   void decodeAdd(const uint16_t* in, float* out, size_t n, DataType half);
// bound to its ISA level or its stream.
#include <cstdint>
#include <utility>

#include "compression/compressor.hpp"

namespace gradcomm::compression {

template <typename Kernels>
class CastCompressor final : public Compressor {
 public:
  CastCompressor(Kind kind, Kernels kernels)
      : kind_(kind), half_(kind == Kind::kFp16 ? DataType::kFloat16 : DataType::kBFloat16), k_(std::move(kernels)) {}

  Kind kind() const override { return kind_; }
  MemoryKind memory() const override { return Kernels::kMemory; }
  bool summable() const override { return true; }
  DataType payloadType() const override { return half_; }
  size_t payloadBytes(size_t n) const override { return n * sizeof(uint16_t); }

  void compress(const float* in, float* residual, size_t n, void* payload, const CompressArgs& args) override {
    auto* out = static_cast<uint16_t*>(payload);
    if (residual) {
      k_.castWithResidual(in, residual, out, n, half_, args.scale);
    } else {
      k_.cast(in, out, n, half_, args.scale);
    }
  }
  void decompress(const void* payload, float* out, size_t n) override {
    k_.decode(static_cast<const uint16_t*>(payload), out, n, half_);
  }
  void decompressAdd(const void* payload, float* out, size_t n) override {
    k_.decodeAdd(static_cast<const uint16_t*>(payload), out, n, half_);
  }

 private:
  Kind kind_;
  DataType half_;
  Kernels k_;
};

}  // namespace gradcomm::compression
