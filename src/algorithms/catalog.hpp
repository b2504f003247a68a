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
const Algorithm& treeBroadcast();
const Algorithm& treeReduce();
const Algorithm& ringAllgather();
const Algorithm& ringReduceScatter();
const Algorithm& disseminationBarrier();
/// MPI passthrough for each collective.
const Algorithm& nativeAlgorithm(Collective collective);

}  // namespace gradcomm::algorithms
