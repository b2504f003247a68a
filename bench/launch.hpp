#pragma once
// What the benchmark tools share: how they start (under mpirun, with MPI
// initialised and communicators made from MPI_COMM_WORLD, or without MPI,
// a communicator formed from GRADCOMM_*, torchrun's or mpirun's variables)
// (their arguments: args.hpp).
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <optional>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "args.hpp"
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

/// Initialises MPI (MPI_THREAD_MULTIPLE) unless the tool was launched
/// without it (launchedWithoutMpi); returns whether MPI is up, with this
/// process's rank in MPI_COMM_WORLD in *rank.
inline bool startMpiUnlessLaunchedWithout(int& argc, char**& argv, int* rank) {
  if (launchedWithoutMpi(argc, argv)) return false;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  return true;
}

/// MPI_Finalize if MPI is up (error paths of either launch).
inline void finalizeMpiIfUp() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

/// Every rank's host (a hash of its host name), in rank order (collective).
inline std::vector<int64_t> hostOfEachRank(Communicator& comm, int64_t* mine = nullptr) {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  int64_t me = static_cast<int64_t>(std::hash<std::string>{}(name) >> 1);
  if (mine) *mine = me;
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(&me, all.data(), 1, DataType::kInt64).wait();
  return all;
}

/// Distinct hosts among the ranks of `comm` (collective).
inline int countHosts(Communicator& comm) {
  std::vector<int64_t> all = hostOfEachRank(comm);
  std::sort(all.begin(), all.end());
  return static_cast<int>(std::unique(all.begin(), all.end()) - all.begin());
}

/// Ranks of `comm` on this rank's host, itself included (collective).
inline int ranksOnThisHost(Communicator& comm) {
  int64_t mine = 0;
  const std::vector<int64_t> all = hostOfEachRank(comm, &mine);
  return static_cast<int>(std::count(all.begin(), all.end(), mine));
}

/// The communicator a tool measures with: over MPI_COMM_WORLD with
/// GRADCOMM_TRANSPORT=`transport` when MPI is up, else from the environment.
inline Communicator makeCommunicator(bool useMpi, const std::string& transport) {
  Options o;
  if (!transport.empty()) o.set("TRANSPORT", transport);
  return useMpi ? communicatorFromMpi(MPI_COMM_WORLD, o) : communicatorFromEnvironment(o);
}

}  // namespace gradcomm::bench
