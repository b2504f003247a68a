// The avx512 compression kernel table: kernels_impl.hpp compiled with this
// level's flags (see CMakeLists.txt).
#include "compression/cpu/kernels_impl.hpp"

namespace gradcomm::compression::detail {

const KernelTable* avx512Kernels() {
  static const KernelTable table = buildTable();
  return &table;
}

}  // namespace gradcomm::compression::detail
