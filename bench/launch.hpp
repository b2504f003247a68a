#pragma once
// How the benchmark tools start: under mpirun (MPI initialised, gradcomm
// communicators made from MPI_COMM_WORLD) or without MPI (a communicator
// formed from GRADCOMM_*, torchrun's or mpirun's variables).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradcomm/gradcomm.hpp"
#include "gradcomm/mpi.hpp"

namespace gradcomm::bench {

/// True when the tool must not initialise MPI: `--no-mpi` is among the
/// arguments, GRADCOMM_RANK is set, or torchrun's RANK outside mpirun.
inline bool launchedWithoutMpi(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-mpi") == 0) return true;
  }
  if (std::getenv("GRADCOMM_RANK")) return true;
  return std::getenv("RANK") && std::getenv("WORLD_SIZE") && !std::getenv("OMPI_COMM_WORLD_RANK");
}

/// MPI_Finalize if MPI is up (error paths of either launch).
inline void finalizeMpiIfUp() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

/// Distinct hosts among the ranks of `comm` (by host name; collective).
inline int countHosts(Communicator& comm) {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(name) >> 1);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(&mine, all.data(), 1, DataType::kInt64).wait();
  std::sort(all.begin(), all.end());
  return static_cast<int>(std::unique(all.begin(), all.end()) - all.begin());
}

/// The communicator a tool measures with: over MPI_COMM_WORLD with
/// GRADCOMM_TRANSPORT=`transport` when MPI is up, else from the environment.
inline Communicator makeCommunicator(bool useMpi, const std::string& transport) {
  Options o;
  if (!transport.empty()) o.set("TRANSPORT", transport);
  return useMpi ? communicatorFromMpi(MPI_COMM_WORLD, o) : communicatorFromEnvironment(o);
}

}  // namespace gradcomm::bench
