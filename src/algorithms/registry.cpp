#include "algorithms/catalog.hpp"

namespace gradcomm::algorithms {

const std::vector<const Algorithm*>& allAlgorithms() {
  static const std::vector<const Algorithm*> all = [] {
    std::vector<const Algorithm*> v = {
        &ringAllreduce(),   &recursiveDoublingAllreduce(), &halvingDoublingAllreduce(), &treeAllreduce(), &shmAllreduce(), &hierAllreduce(),
        &treeBroadcast(),   &hierBroadcast(), &treeReduce(), &ringAllgather(), &hierAllgather(),            &ringReduceScatter(),
        &disseminationBarrier(),
    };
    for (int c = 0; c < kNumCollectives; ++c) v.push_back(&nativeAlgorithm(static_cast<Collective>(c)));
    return v;
  }();
  return all;
}

const Algorithm* findAlgorithm(Collective collective, const std::string& name) {
  for (const Algorithm* a : allAlgorithms()) {
    if (a->collective() == collective && name == a->name()) return a;
  }
  return nullptr;
}

}  // namespace gradcomm::algorithms
