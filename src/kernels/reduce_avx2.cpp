// The avx2 kernel table: reduce_impl.hpp compiled with this level's flags
// (see CMakeLists.txt).
#include "kernels/reduce_impl.hpp"

namespace gradcomm::kernels {

const ReduceTable* avx2Table() {
  static const ReduceTable table = buildTable();
  return &table;
}

}  // namespace gradcomm::kernels
