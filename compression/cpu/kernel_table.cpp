#include "compression/cpu/kernel_table.hpp"

namespace gradcomm::compression::detail {

// A level above the CPU's best is never touched: even building its table
// could execute instructions the CPU lacks.
const KernelTable& kernelTable(Isa isa) {
  const Isa best = detectIsa();
  if (static_cast<int>(isa) > static_cast<int>(best)) isa = best;
  switch (isa) {
    case Isa::kAvx512Bf16: return *avx512Bf16Kernels();
    case Isa::kAvx512: return *avx512Kernels();
    case Isa::kAvx2: return *avx2Kernels();
    case Isa::kScalar: break;
  }
  return *scalarKernels();
}

}  // namespace gradcomm::compression::detail
