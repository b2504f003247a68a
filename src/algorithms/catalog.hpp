#pragma once
// Every algorithm object of the library, one per file. The registry
// (registry.cpp) lists them; tests reach planners through findAlgorithm().
#include "algorithms/algorithm.hpp"

namespace gradcomm::algorithms {

const Algorithm& ringAllreduce();
const Algorithm& recursiveDoublingAllreduce();
const Algorithm& halvingDoublingAllreduce();
const Algorithm& treeAllreduce();
const Algorithm& shmAllreduce();
/// Hierarchical: shared memory inside hosts, one ring per local rank between them.
const Algorithm& hierAllreduce();
const Algorithm& treeBroadcast();
const Algorithm& hierBroadcast();
const Algorithm& treeReduce();
const Algorithm& ringAllgather();
const Algorithm& hierAllgather();
const Algorithm& ringReduceScatter();
const Algorithm& disseminationBarrier();
/// MPI passthrough for each collective.
const Algorithm& nativeAlgorithm(Collective collective);

}  // namespace gradcomm::algorithms
