#pragma once
// Reduction kernels on device memory, stream-ordered. Declared without CUDA
// headers; compiled only when the library is built with CUDA.
#include <cstddef>
#include <string>

#include "gradcomm/types.hpp"

namespace gradcomm::kernels::cuda {

/// Number of usable devices; 0 (never an error) when there is no GPU or
/// driver. `why` receives the runtime's reason when it is 0.
int deviceCount(std::string* why = nullptr);
/// dst[i] = a[i] OP b[i] on `stream` (a cudaStream_t; null is the default
/// stream). Same semantics as the CPU kernels (NaN-propagating min/max,
/// float32 arithmetic for float16/bfloat16, wrapping integers).
void reduce(void* dst, const void* a, const void* b, size_t n, DataType type, ReduceOp op, void* stream);
/// data[i] /= divisor (float32) on `stream`.
void divide(float* data, size_t n, float divisor, void* stream);
/// data[i] *= factor (float32) on `stream`.
void multiply(float* data, size_t n, float factor, void* stream);

}  // namespace gradcomm::kernels::cuda
