#include "compression/compressor.hpp"

#include <string>

#include "gradcomm/error.hpp"

#if GRADCOMM_HAVE_CUDA
#include "compression/cuda/compression_cuda.hpp"
#include "kernels/reduce_cuda.hpp"
#endif

namespace gradcomm::compression {

void Compressor::decompressAll(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n) {
  if (summable()) {
    decompress(payloads, out, n);
    return;
  }
  for (int q = 0; q < ranks; ++q) {
    const char* slot = payloads + static_cast<size_t>(q) * slotBytes;
    try {
      if (q == 0) {
        decompress(slot, out, n);
      } else {
        decompressAdd(slot, out, n);
      }
    } catch (const TransportError& e) {
      throw TransportError("payload of rank " + std::to_string(q) + ": " + e.what());
    }
  }
}

size_t Compressor::queuedCheckBytes(int) const { return 0; }

std::function<void()> Compressor::decompressAllQueued(const char* payloads, size_t slotBytes, int ranks, float* out,
                                                      size_t n, void*) {
  decompressAll(payloads, slotBytes, ranks, out, n);
  return {};
}

CompressorPtr makeCompressor(const Spec& spec, MemoryKind memory, Isa isa, void* stream) {
  if (spec.kind == Kind::kNone) {
    throw InvalidArgument("compression '" + spec.toString() + "' has no compressor: ask for fp16, bf16 or topk");
  }
  switch (memory) {
    case MemoryKind::kHost: return makeCpuCompressor(spec, isa);
    case MemoryKind::kDevice: {
#if GRADCOMM_HAVE_CUDA
      std::string why;
      if (kernels::cuda::deviceCount(&why) == 0) {
        throw UnsupportedError("a " + spec.toString() + " compressor for device memory needs a usable GPU, and " +
                               "there is none (" + why + "); compress host buffers instead");
      }
      return cuda::makeCompressor(spec, stream);
#else
      (void)stream;
      throw UnsupportedError("a " + spec.toString() + " compressor for device memory needs CUDA, and this " +
                             "gradcomm was built without it (configure with -DGRADCOMM_WITH_CUDA=ON)");
#endif
    }
  }
  throw InvalidArgument("invalid MemoryKind value " + std::to_string(static_cast<int>(memory)));
}

}  // namespace gradcomm::compression
