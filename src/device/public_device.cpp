// The public device services (gradcomm/device.hpp) over the library's own
// kernels and NCCL loader.
#include "gradcomm/device.hpp"

#include <cstdint>

#include "device/nccl_library.hpp"
#include "gradcomm/error.hpp"
#if GRADCOMM_HAVE_CUDA
#include "compression/cuda/compression_cuda.hpp"
#endif

namespace gradcomm {
namespace {

void checkCast(const char* fn, const void* in, const void* out, size_t count, DataType half) {
  if (half != DataType::kFloat16 && half != DataType::kBFloat16) {
    throw InvalidArgument(std::string(fn) + ": the half type must be float16 or bfloat16, not " + toString(half));
  }
  if (count > 0 && (!in || !out)) throw InvalidArgument(std::string(fn) + ": a buffer is null with count > 0");
#if !GRADCOMM_HAVE_CUDA
  throw UnsupportedError(std::string(fn) + ": this build of gradcomm has no CUDA");
#endif
}

}  // namespace

void castToHalfOnDevice(const float* in, void* out, size_t count, DataType half, void* stream) {
  checkCast("castToHalfOnDevice", in, out, count, half);
#if GRADCOMM_HAVE_CUDA
  if (count > 0) compression::cuda::castToHalf(in, static_cast<uint16_t*>(out), count, half, 1.0f, stream);
#else
  (void)stream;
#endif
}

void castFromHalfOnDevice(const void* in, float* out, size_t count, DataType half, void* stream) {
  checkCast("castFromHalfOnDevice", in, out, count, half);
#if GRADCOMM_HAVE_CUDA
  if (count > 0) compression::cuda::decodeHalf(static_cast<const uint16_t*>(in), out, count, half, stream);
#else
  (void)stream;
#endif
}

namespace nccl {

bool available() { return device::NcclLibrary::instance().available(); }
std::string unavailableReason() { return device::NcclLibrary::instance().why(); }
std::string path() {
  device::NcclLibrary& lib = device::NcclLibrary::instance();
  lib.available();
  return lib.path();
}
void* symbol(const char* name) { return device::NcclLibrary::instance().symbol(name); }

}  // namespace nccl
}  // namespace gradcomm
