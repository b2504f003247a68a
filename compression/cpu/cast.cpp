#include "compression/cpu/cast.hpp"

#include <cmath>
#include <string>

#include "compression/cast_args.hpp"
#include "compression/cpu/kernel_table.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {
namespace {

detail::HalfFormat formatOf(DataType type, const char* what) {
  return detail::castTargetIsFp16(type, what) ? detail::kFp16 : detail::kBf16;
}

void checkPointers(bool ok, size_t n, const char* what) {
  if (n > 0 && !ok) throw InvalidArgument(std::string(what) + ": null buffer for " + std::to_string(n) + " elements");
}

}  // namespace

void castToHalf(const float* in, uint16_t* out, size_t n, DataType type, float scale, Isa isa) {
  const auto format = formatOf(type, "castToHalf");
  detail::checkCastScale(scale, "castToHalf");
  checkPointers(in && out, n, "castToHalf");
  if (n > 0) detail::kernelTable(isa).cast[format](in, out, n, scale);
}

void decodeHalf(const uint16_t* in, float* out, size_t n, DataType type, Isa isa) {
  const auto format = formatOf(type, "decodeHalf");
  checkPointers(in && out, n, "decodeHalf");
  if (n > 0) detail::kernelTable(isa).decode[format](in, out, n);
}

void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType type, float scale,
                      Isa isa) {
  const auto format = formatOf(type, "castWithResidual");
  detail::checkCastScale(scale, "castWithResidual");
  checkPointers(in && residual && out, n, "castWithResidual");
  if (n > 0) detail::kernelTable(isa).residualCast[format](in, residual, out, n, scale);
}

}  // namespace gradcomm::compression
