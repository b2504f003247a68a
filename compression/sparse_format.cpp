#include "compression/sparse_format.hpp"

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "gradcomm/error.hpp"

// Index and value arrays are copied as host bytes; the header is spelled out.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the sparse wire format assumes a little-endian host");

namespace gradcomm::compression {
namespace {

constexpr const char* kWhat = "sparse payload";

template <typename T>
T readLe(const unsigned char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(p[i]) << (8 * i)));
  return v;
}

template <typename T>
void writeLe(unsigned char* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

uint8_t indexWidthFor(uint64_t denseCount) { return denseCount >= kWideIndexThreshold ? 8 : 4; }

uint64_t indexAt(const unsigned char* indices, size_t i, uint8_t width) {
  if (width == 4) {
    uint32_t v;
    std::memcpy(&v, indices + i * 4, 4);
    return v;
  }
  uint64_t v;
  std::memcpy(&v, indices + i * 8, 8);
  return v;
}

// Checks the indices at p (strictly increasing, each < denseCount) without
// trusting anything: p holds nnz indices of `width` bytes.
void checkIndices(const unsigned char* p, size_t nnz, uint8_t width, uint64_t denseCount, const char* what) {
  uint64_t previous = 0;
  for (size_t i = 0; i < nnz; ++i) {
    const uint64_t index = indexAt(p, i, width);
    if (index >= denseCount) {
      throw InvalidArgument(std::string(what) + ": index " + std::to_string(index) + " at position " +
                            std::to_string(i) + " is out of range for " + std::to_string(denseCount) + " elements");
    }
    if (i > 0 && index <= previous) {
      throw InvalidArgument(std::string(what) + ": index " + std::to_string(index) + " at position " +
                            std::to_string(i) + " does not follow " + std::to_string(previous) +
                            "; indices must be strictly increasing");
    }
    previous = index;
  }
}

float valueAt(const unsigned char* values, size_t i) {
  float f;
  std::memcpy(&f, values + i * 4, 4);
  return f;
}

}  // namespace

size_t encodedBytes(size_t denseCount, size_t nnz) {
  const size_t perPair = indexWidthFor(denseCount) + sizeof(float);
  if (nnz > (std::numeric_limits<size_t>::max() - kSparseHeaderBytes) / perPair) {
    throw InvalidArgument("sparse payload of " + std::to_string(nnz) + " pairs does not fit in memory");
  }
  return kSparseHeaderBytes + nnz * perPair;
}

size_t encode(const SparseTensor& sparse, void* out, size_t capacity) {
  const size_t nnz = sparse.nnz();
  const uint8_t width = indexWidthFor(sparse.denseCount);
  const bool wide = width == 8;
  const size_t held = wide ? sparse.indices64.size() : sparse.indices32.size();
  if (held != nnz) {
    throw InvalidArgument("encode: the sparse tensor has " + std::to_string(nnz) + " values but " +
                          std::to_string(held) + (wide ? " 64-bit" : " 32-bit") + " indices");
  }
  if (nnz > sparse.denseCount) {
    throw InvalidArgument("encode: " + std::to_string(nnz) + " pairs for a tensor of " +
                          std::to_string(sparse.denseCount) + " elements");
  }
  const size_t bytes = encodedBytes(sparse.denseCount, nnz);
  if (!out || capacity < bytes) {
    throw InvalidArgument("encode: the output holds " + std::to_string(out ? capacity : 0) + " bytes but " +
                          std::to_string(bytes) + " are needed (encodedBytes)");
  }
  const unsigned char* indexBytes = wide ? reinterpret_cast<const unsigned char*>(sparse.indices64.data())
                                         : reinterpret_cast<const unsigned char*>(sparse.indices32.data());
  checkIndices(indexBytes, nnz, width, sparse.denseCount, "encode");

  auto* p = static_cast<unsigned char*>(out);
  writeLe<uint32_t>(p, kSparseMagic);
  writeLe<uint16_t>(p + 4, kSparseVersion);
  p[6] = kSparseFloat32;
  p[7] = width;
  writeLe<uint64_t>(p + 8, sparse.denseCount);
  writeLe<uint64_t>(p + 16, nnz);
  writeLe<uint64_t>(p + 24, 0);
  unsigned char* indices = p + kSparseHeaderBytes;
  if (nnz > 0) std::memcpy(indices, indexBytes, nnz * width);
  if (nnz > 0) std::memcpy(indices + nnz * width, sparse.values.data(), nnz * sizeof(float));
  return bytes;
}

std::vector<uint8_t> encode(const SparseTensor& sparse) {
  std::vector<uint8_t> out(encodedBytes(sparse.denseCount, sparse.nnz()));
  encode(sparse, out.data(), out.size());
  return out;
}

SparseHeader decodeHeader(const void* payload, size_t bytes) {
  if (bytes < kSparseHeaderBytes) {
    throw InvalidArgument(std::string(kWhat) + " is truncated: " + std::to_string(bytes) + " bytes, but the header alone is " +
                          std::to_string(kSparseHeaderBytes));
  }
  if (!payload) throw InvalidArgument(std::string(kWhat) + ": null pointer for " + std::to_string(bytes) + " bytes");
  const auto* p = static_cast<const unsigned char*>(payload);
  const uint32_t magic = readLe<uint32_t>(p);
  if (magic != kSparseMagic) {
    throw InvalidArgument(std::string(kWhat) + " has magic " + hex(magic) + ", expected " + hex(kSparseMagic) +
                          " (\"GCSP\"): this is not a gradcomm sparse payload, or it is corrupt");
  }
  SparseHeader h;
  h.version = readLe<uint16_t>(p + 4);
  if (h.version != kSparseVersion) {
    throw InvalidArgument(std::string(kWhat) + " has version " + std::to_string(h.version) + "; this build reads version " +
                          std::to_string(kSparseVersion) + " (are all ranks running the same gradcomm?)");
  }
  if (p[6] != kSparseFloat32) {
    throw InvalidArgument(std::string(kWhat) + " has value type " + std::to_string(p[6]) +
                          "; this build reads 1 (float32)");
  }
  h.indexWidth = p[7];
  h.denseCount = readLe<uint64_t>(p + 8);
  h.nnz = readLe<uint64_t>(p + 16);
  const uint64_t reserved = readLe<uint64_t>(p + 24);
  if (reserved != 0) {
    throw InvalidArgument(std::string(kWhat) + " has reserved field " + hex(reserved) + "; it must be 0");
  }
  if (h.indexWidth != indexWidthFor(h.denseCount)) {
    throw InvalidArgument(std::string(kWhat) + " has index width " + std::to_string(h.indexWidth) + " for " +
                          std::to_string(h.denseCount) + " elements; expected " +
                          std::to_string(indexWidthFor(h.denseCount)) + " (4 below 2^32 elements, 8 from there)");
  }
  if (h.nnz > h.denseCount) {
    throw InvalidArgument(std::string(kWhat) + " claims " + std::to_string(h.nnz) + " pairs for " +
                          std::to_string(h.denseCount) + " elements; nnz cannot exceed the element count");
  }
  // nnz <= denseCount, but both come from the wire: guard the arithmetic.
  const uint64_t perPair = h.indexWidth + sizeof(float);
  const uint64_t maxPairs = (std::numeric_limits<uint64_t>::max() - kSparseHeaderBytes) / perPair;
  if (h.nnz > maxPairs || kSparseHeaderBytes + h.nnz * perPair > std::numeric_limits<size_t>::max()) {
    throw InvalidArgument(std::string(kWhat) + " claims " + std::to_string(h.nnz) +
                          " pairs, more than any buffer can hold");
  }
  const uint64_t expected = kSparseHeaderBytes + h.nnz * perPair;
  if (bytes != expected) {
    throw InvalidArgument(std::string(kWhat) + " is " + std::to_string(bytes) + " bytes but its header (" +
                          std::to_string(h.nnz) + " pairs of " + std::to_string(perPair) + " bytes) implies " +
                          std::to_string(expected) + (bytes < expected ? ": truncated" : ": trailing bytes"));
  }
  return h;
}

void decodeAdd(const void* payload, size_t bytes, float* dense, size_t denseCount) {
  const SparseHeader h = decodeHeader(payload, bytes);
  if (h.denseCount != denseCount) {
    throw InvalidArgument(std::string(kWhat) + " is for " + std::to_string(h.denseCount) +
                          " elements but the destination has " + std::to_string(denseCount) +
                          " (do all ranks compress the same bucket?)");
  }
  const size_t nnz = static_cast<size_t>(h.nnz);
  if (nnz == 0) return;
  if (!dense) throw InvalidArgument(std::string(kWhat) + ": null destination for " + std::to_string(denseCount) + " elements");
  const auto* indices = static_cast<const unsigned char*>(payload) + kSparseHeaderBytes;
  const auto* values = indices + nnz * h.indexWidth;
  checkIndices(indices, nnz, h.indexWidth, h.denseCount, kWhat);
  for (size_t i = 0; i < nnz; ++i) dense[indexAt(indices, i, h.indexWidth)] += valueAt(values, i);
}

SparseTensor decode(const void* payload, size_t bytes) {
  const SparseHeader h = decodeHeader(payload, bytes);
  const size_t nnz = static_cast<size_t>(h.nnz);
  const auto* indices = static_cast<const unsigned char*>(payload) + kSparseHeaderBytes;
  const auto* values = indices + nnz * h.indexWidth;
  checkIndices(indices, nnz, h.indexWidth, h.denseCount, kWhat);
  SparseTensor out;
  out.denseCount = static_cast<size_t>(h.denseCount);
  out.values.resize(nnz);
  if (h.indexWidth == 8) out.indices64.resize(nnz);
  else out.indices32.resize(nnz);
  for (size_t i = 0; i < nnz; ++i) {
    if (h.indexWidth == 8) out.indices64[i] = indexAt(indices, i, 8);
    else out.indices32[i] = static_cast<uint32_t>(indexAt(indices, i, 4));
    out.values[i] = valueAt(values, i);
  }
  return out;
}

}  // namespace gradcomm::compression
