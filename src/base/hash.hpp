#pragma once
// FNV-1a: the library's hashes of what ranks compare (call signatures,
// member lists, device identities), equal on every rank for equal bytes.
#include <cstddef>
#include <cstdint>

namespace gradcomm::core {

inline constexpr uint32_t kFnv32Basis = 2166136261u;
inline constexpr uint64_t kFnv64Basis = 14695981039346656037ull;

/// Continues the 32-bit hash `h` over `n` bytes at `data`.
inline uint32_t fnv1a32(uint32_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

/// Continues the 64-bit hash `h` over `n` bytes at `data`.
inline uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace gradcomm::core
