#pragma once
// The wire format of a sparse (top-k) payload. Everything is little-endian:
//
//   offset  size  field
//        0     4  magic "GCSP" (bytes 47 43 53 50)
//        4     2  version (1)
//        6     1  value type: 1 = float32, 2 = float16, 3 = bfloat16
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

/// Element type of the values on the wire.
enum class SparseValueType : uint8_t { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

/// The decoded header of a payload.
struct SparseHeader {
  uint16_t version = 0;
  SparseValueType valueType = SparseValueType::kFloat32;
  uint8_t indexWidth = 0;
  uint64_t denseCount = 0;
  uint64_t nnz = 0;
};

/// Bytes of one value of `type` on the wire.
size_t sparseValueBytes(SparseValueType type);
/// Bytes of a payload with nnz pairs for a dense tensor of denseCount
/// elements; throws InvalidArgument when that does not fit in size_t.
size_t encodedBytes(size_t denseCount, size_t nnz, SparseValueType valueType = SparseValueType::kFloat32);

/// Writes `sparse` into out[capacity]; returns the bytes written. float16
/// values saturate like castToHalf, bfloat16 values round to nearest even.
/// Throws InvalidArgument when the tensor is inconsistent (indices not
/// strictly increasing or out of range, counts disagreeing) or out is small.
size_t encode(const SparseTensor& sparse, void* out, size_t capacity,
              SparseValueType valueType = SparseValueType::kFloat32);
/// encode() into a new buffer of exactly encodedBytes() bytes.
std::vector<uint8_t> encode(const SparseTensor& sparse, SparseValueType valueType = SparseValueType::kFloat32);

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
