#pragma once
// The wire format of a sparse (top-k) payload. Everything is little-endian:
//
//   offset  size  field
//        0     4  magic "GCSP" (bytes 47 43 53 50)
//        4     2  version (1)
//        6     1  value type: 1 = float32 (the only one)
//        7     1  index width in bytes: 4 when element count < 2^32, else 8
//        8     8  element count (length of the dense tensor)
//       16     8  nnz (number of index/value pairs), <= element count
//       24     8  reserved, 0
//       32        nnz indices, strictly increasing, each < element count
//                 nnz values
//
// The payload is exactly 32 + nnz * (index width + value size) bytes. A
// reader validates every field, the exact size and every index before it
// touches the destination, so a corrupt or hostile payload is an
// InvalidArgument, never a crash or a partial update.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "compression/sparse_tensor.hpp"

namespace gradcomm::compression {

inline constexpr uint32_t kSparseMagic = 0x50534347;  // "GCSP" read as a little-endian u32
inline constexpr uint16_t kSparseVersion = 1;
inline constexpr size_t kSparseHeaderBytes = 32;
/// The value type byte: float32 values, 4 bytes each.
inline constexpr uint8_t kSparseFloat32 = 1;

/// The decoded header of a payload.
struct SparseHeader {
  uint16_t version = 0;
  uint8_t indexWidth = 0;
  uint64_t denseCount = 0;
  uint64_t nnz = 0;
};

/// Bytes of a payload with nnz pairs for a dense tensor of denseCount
/// elements; throws InvalidArgument when that does not fit in size_t.
size_t encodedBytes(size_t denseCount, size_t nnz);

/// Writes `sparse` into out[capacity]; returns the bytes written. Throws
/// InvalidArgument when the tensor is inconsistent (indices not strictly
/// increasing or out of range, counts disagreeing) or out is small.
size_t encode(const SparseTensor& sparse, void* out, size_t capacity);
/// encode() into a new buffer of exactly encodedBytes() bytes.
std::vector<uint8_t> encode(const SparseTensor& sparse);

/// Validates the header and the payload size (not the indices).
SparseHeader decodeHeader(const void* payload, size_t bytes);
/// Validates everything (header, size, denseCount, every index), then adds
/// the payload into dense[denseCount]. Throws InvalidArgument with the
/// reason, leaving dense untouched, when anything is wrong.
void decodeAdd(const void* payload, size_t bytes, float* dense, size_t denseCount);
/// Validates everything and returns the payload as a SparseTensor with
/// float values.
SparseTensor decode(const void* payload, size_t bytes);

}  // namespace gradcomm::compression
