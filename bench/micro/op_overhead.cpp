// Fixed cost of one collective call on one rank (no communication): what
// submit, scheduling, planning and completion cost by themselves.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <vector>

#include "gradcomm/mpi.hpp"

using namespace gradcomm;

static Communicator& comm() {
  static Communicator c = [] {
    int provided;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    return communicatorFromMpi(MPI_COMM_SELF);
  }();
  return c;
}

static void BM_AllreduceOneRank(benchmark::State& state) {
  std::vector<float> buf(2, 1.0f);
  CollectiveOptions o;
  o.algorithm = state.range(0) == 0 ? "rd" : "ring";
  for (auto _ : state) comm().allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
}
BENCHMARK(BM_AllreduceOneRank)->Arg(0)->Arg(1);

static void BM_MpiAllreduceOneRank(benchmark::State& state) {
  comm();
  std::vector<float> buf(2, 1.0f);
  for (auto _ : state) MPI_Allreduce(MPI_IN_PLACE, buf.data(), 2, MPI_FLOAT, MPI_SUM, MPI_COMM_SELF);
}
BENCHMARK(BM_MpiAllreduceOneRank);
BENCHMARK_MAIN();
