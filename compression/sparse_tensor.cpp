#include "compression/sparse_tensor.hpp"

#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::compression {

template <typename IndexT>
void scatterAdd(float* dense, size_t denseCount, const IndexT* indices, const float* values, size_t nnz) {
  if (nnz == 0) return;
  if (!dense || !indices || !values) {
    throw InvalidArgument("scatterAdd: null buffer for " + std::to_string(nnz) + " sparse elements");
  }
  // Validate everything first so that a bad index leaves dense untouched.
  for (size_t i = 0; i < nnz; ++i) {
    if (static_cast<uint64_t>(indices[i]) >= static_cast<uint64_t>(denseCount)) {
      throw InvalidArgument("scatterAdd: index " + std::to_string(indices[i]) + " at position " + std::to_string(i) +
                            " is outside the dense tensor of " + std::to_string(denseCount) + " elements");
    }
  }
  for (size_t i = 0; i < nnz; ++i) dense[indices[i]] += values[i];
}

template void scatterAdd<uint32_t>(float*, size_t, const uint32_t*, const float*, size_t);
template void scatterAdd<uint64_t>(float*, size_t, const uint64_t*, const float*, size_t);

void scatterAdd(float* dense, size_t denseCount, const SparseTensor& sparse) {
  if (sparse.denseCount != denseCount) {
    throw InvalidArgument("scatterAdd: the sparse tensor is for " + std::to_string(sparse.denseCount) +
                          " elements but the dense buffer has " + std::to_string(denseCount));
  }
  const size_t nnz = sparse.nnz();
  const size_t held = sparse.wideIndices() ? sparse.indices64.size() : sparse.indices32.size();
  if (held != nnz) {
    throw InvalidArgument("scatterAdd: the sparse tensor has " + std::to_string(nnz) + " values but " +
                          std::to_string(held) + (sparse.wideIndices() ? " 64-bit" : " 32-bit") + " indices");
  }
  if (sparse.wideIndices()) scatterAdd(dense, denseCount, sparse.indices64.data(), sparse.values.data(), nnz);
  else scatterAdd(dense, denseCount, sparse.indices32.data(), sparse.values.data(), nnz);
}

}  // namespace gradcomm::compression
