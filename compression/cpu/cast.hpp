#pragma once
// float32 <-> fp16/bf16 compression casts on the CPU, dispatched at run time
// to the best instruction set (or the one asked for).
//
// Rounding is to nearest, ties to even, and subnormals are kept (never
// flushed to zero), bit-identical at every ISA level. fp16 SATURATES: a
// finite value beyond the fp16 range becomes +-65504 rather than inf, so a
// gradient spike stays finite (error feedback carries the excess); inf stays
// inf and NaN stays NaN (quiet, payload truncated). bf16 keeps IEEE
// behaviour (only values within half an ulp of FLT_MAX round to inf).
#include <cstddef>
#include <cstdint>

#include "compression/cpu/isa.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::compression {

/// out[i] = half(in[i] * scale) for type kFloat16 or kBFloat16; scale is the
/// pre-scaling factor (1/ranks for an average), finite and > 0.
void castToHalf(const float* in, uint16_t* out, size_t n, DataType type, float scale = 1.0f,
                Isa isa = detectIsa());

/// out[i] = float(in[i]) (exact) for type kFloat16 or kBFloat16; an fp16
/// NaN comes back quiet (as F16C makes it), a bf16 NaN keeps its bits.
void decodeHalf(const uint16_t* in, float* out, size_t n, DataType type, Isa isa = detectIsa());

/// Cast with error feedback, one pass: t = in[i] + residual[i];
/// out[i] = half(t * scale); residual[i] = (t*scale - float(out[i])) / scale.
/// The residual stays in gradient units (it is added before scaling next
/// time), its numerator comes from one fused multiply-add, and it is 0 where
/// that is not finite (an inf/NaN step must not poison every later step).
void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType type,
                      float scale = 1.0f, Isa isa = detectIsa());

}  // namespace gradcomm::compression
