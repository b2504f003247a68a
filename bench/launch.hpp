#pragma once
// What the benchmark tools share: how they start (under mpirun, with MPI
// initialised and communicators made from MPI_COMM_WORLD, or without MPI,
// a communicator formed from GRADCOMM_*, torchrun's or mpirun's variables)
// and how they check their arguments.
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

/// Walks a tool's options:
///   for (bench::ArgWalk w(argc, argv, die); w.next();) {
///     if (w.key() == "--steps") a.steps = parse(w.value()); ...
/// value() takes the option's value, and dies with "option K needs a value"
/// when there is none.
class ArgWalk {
 public:
  ArgWalk(int argc, char** argv, void (*die)(const std::string&)) : argc_(argc), argv_(argv), die_(die) {}
  /// Moves to the next option; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    key_ = argv_[i_];
    return true;
  }
  const std::string& key() const { return key_; }
  std::string value() {
    if (i_ + 1 >= argc_) die_("option " + key_ + " needs a value");
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  void (*die_)(const std::string&);
  int i_ = 0;
  std::string key_;
};

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

/// All of `text` as a whole number in [lo, hi] (atoi took "5x" as 5 and
/// "abc" as 0), or nothing.
inline std::optional<long long> wholeNumber(const std::string& text, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return std::nullopt;
  return v;
}

/// All of `text` as a whole number in [lo, hi]; else `die`s naming the
/// option (`what`), the range and the text.
inline long long wholeNumberOr(const std::string& text, const std::string& what, long long lo, long long hi,
                               void (*die)(const std::string&)) {
  const auto v = wholeNumber(text, lo, hi);
  if (!v) {
    die(what + " must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" +
        text + "'");
  }
  return *v;
}

/// All of `text` as a finite number, or nothing.
inline std::optional<double> realNumber(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// Empty, or why `path` cannot be written: checked before a run, so that
/// results are not measured only to be lost.
inline std::string unwritable(const std::string& path) {
  struct stat st;
  const bool existed = ::stat(path.c_str(), &st) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return "cannot write '" + path + "': " + std::strerror(errno);
  std::fclose(f);
  if (!existed) ::unlink(path.c_str());
  return {};
}

}  // namespace gradcomm::bench
