// libFuzzer target: arbitrary bytes as a sparse payload. decodeAdd must
// either reject them with InvalidArgument, leaving the destination as it
// was, or accept them; anything else (a crash, a sanitizer report, another
// exception) is a finding. An accepted payload must also decode and
// re-encode to a payload that decodes to the same tensor.
//
// Built and run by scripts/run-fuzz (clang++ -fsanitize=fuzzer,address,undefined).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compression/sparse_format.hpp"
#include "gradcomm/error.hpp"

using gradcomm::InvalidArgument;
namespace gc = gradcomm::compression;

namespace {

bool sameValue(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Size the destination from the element count the payload claims, when
  // that is small, so that the fuzzer reaches the index checks and the
  // additions; otherwise take a size that mismatches.
  uint64_t claimed = 0;
  if (size >= 16) {
    for (int i = 0; i < 8; ++i) claimed |= static_cast<uint64_t>(data[8 + i]) << (8 * i);
  }
  const size_t denseCount = claimed <= (uint64_t{1} << 16) ? static_cast<size_t>(claimed) : 1000;
  std::vector<float> dense(denseCount, 0.25f);

  // A copy, so that reads past the end are reads past a heap block of
  // exactly `size` bytes (AddressSanitizer sees them).
  std::vector<uint8_t> payload(data, data + size);
  const uint8_t* p = payload.empty() ? nullptr : payload.data();
  try {
    gc::decodeAdd(p, size, dense.data(), dense.size());
  } catch (const InvalidArgument&) {
    for (float v : dense) require(v == 0.25f);  // rejected: untouched
    return 0;
  }

  const gc::SparseHeader header = gc::decodeHeader(p, size);
  const gc::SparseTensor decoded = gc::decode(p, size);
  require(decoded.nnz() == header.nnz && decoded.denseCount == header.denseCount);
  const std::vector<uint8_t> again = gc::encode(decoded);
  require(again.size() == size);
  const gc::SparseTensor twice = gc::decode(again.data(), again.size());
  require(twice.indices32 == decoded.indices32 && twice.indices64 == decoded.indices64);
  for (size_t i = 0; i < decoded.nnz(); ++i) require(sameValue(twice.values[i], decoded.values[i]));
  return 0;
}
