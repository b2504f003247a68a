#pragma once
// What the benchmark tools share: how they start (under mpirun, with MPI
// initialised and communicators made from MPI_COMM_WORLD, or without MPI,
// a communicator formed from GRADCOMM_*, torchrun's or mpirun's variables)
// (their arguments: args.hpp). A build without MPI (GRADCOMM_HAVE_MPI=0)
// always starts the second way.
#if GRADCOMM_HAVE_MPI
#include <mpi.h>
#endif
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
#if GRADCOMM_HAVE_MPI
#include "gradcomm/mpi.hpp"
#endif

namespace gradcomm::bench {

#if GRADCOMM_HAVE_MPI
using MpiComm = MPI_Comm;
#else
/// Stands in for MPI_Comm in a build without MPI, where no code reads it.
using MpiComm = int;
#endif

/// True when the tool must not initialise MPI: a build without MPI,
/// `--no-mpi` among the arguments, GRADCOMM_RANK set, or torchrun's RANK
/// outside mpirun.
inline bool launchedWithoutMpi(int argc, char** argv) {
  if (!GRADCOMM_HAVE_MPI) return true;
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
#if GRADCOMM_HAVE_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  return true;
#else
  (void)rank;
  return false;
#endif
}

/// MPI_Finalize if MPI is up (error paths of either launch).
inline void finalizeMpiIfUp() {
#if GRADCOMM_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
#endif
}

/// What a tool says when asked for something only MPI can do (`what`
/// needs MPI) while it runs without: launched so, or built so.
inline std::string needsMpi(const std::string& what) {
  return what + (GRADCOMM_HAVE_MPI ? " needs MPI: launch with mpirun (without --no-mpi)"
                                   : " needs MPI, and this build has none (rebuild gradcomm with MPI, "
                                     "e.g. apt-get install libopenmpi-dev)");
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
inline Communicator makeCommunicator(bool useMpi, const std::string& transport, bool calibrate = false) {
  Options o;
  if (!transport.empty()) o.set("TRANSPORT", transport);
  if (calibrate) o.set("CALIBRATE", "1");
#if GRADCOMM_HAVE_MPI
  if (useMpi) return communicatorFromMpi(MPI_COMM_WORLD, o);
#else
  (void)useMpi;
#endif
  return communicatorFromEnvironment(o);
}

}  // namespace gradcomm::bench
