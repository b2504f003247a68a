// gradcomm-comm-create: what forming communicators costs, per rank, the
// slowest rank's time reported (mpirun -np N gradcomm-comm-create):
//   first     the first communicator over MPI_COMM_WORLD (transport, context)
//   full      a second communicator formed the same way (a whole new stack)
//   split     Communicator::split into two halves (light: the same context)
//   dup       Communicator::dup
//   subgroup  Communicator::subgroup of the lower half, by its members alone
// and, for --groups G live dups: the process's threads, descriptors and
// resident memory before and after, per group.
//
//   mpirun -np 8 gradcomm-comm-create [--reps 20] [--groups 200]
// GRADCOMM_TRANSPORT picks the transport as usual (mpi or ucx).
#include <dirent.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gradcomm/mpi.hpp"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

long statusField(const char* name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(name);
  while (std::getline(f, line)) {
    if (line.compare(0, n, name) == 0 && line.size() > n && line[n] == ':') return std::atol(line.c_str() + n + 1);
  }
  return -1;
}

long openDescriptors() {
  long n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n - 2;  // . and ..
}

/// The slowest rank's value.
double slowest(double mine) {
  double out = 0;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

template <typename F> double millis(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  f();
  return slowest(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int reps = 20, groups = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--groups")) groups = std::max(0, std::atoi(argv[i + 1]));
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    Communicator world;
    const double first = millis([&] { world = communicatorFromMpi(MPI_COMM_WORLD); });
    std::vector<double> full, split, dup, sub;
    for (int i = 0; i < reps; ++i) {
      full.push_back(millis([&] { Communicator c = communicatorFromMpi(MPI_COMM_WORLD); c.barrier().wait(); }));
      split.push_back(millis([&] { world.split(rank % 2, rank).barrier().wait(); }));
      dup.push_back(millis([&] { world.dup().barrier().wait(); }));
      std::vector<int> lower;
      for (int r = 0; r < (size + 1) / 2; ++r) lower.push_back(r);
      sub.push_back(millis([&] {
        if (rank < (size + 1) / 2) world.subgroup(lower).barrier().wait();
      }));
    }
    const long threads0 = statusField("Threads"), fds0 = openDescriptors(), rss0 = statusField("VmRSS");
    std::vector<Communicator> live;
    const double many = millis([&] {
      for (int i = 0; i < groups; ++i) live.push_back(world.dup());
    });
    for (auto& g : live) g.barrier().wait();
    const long threads1 = statusField("Threads"), fds1 = openDescriptors(), rss1 = statusField("VmRSS");
    if (rank == 0) {
      std::printf("ranks %d, transport %s, reps %d (each: median of the slowest rank's times, ms; a formed "
                  "communicator's first barrier included)\n",
                  size, world.transportName().c_str(), reps);
      std::printf("first communicator      %9.3f ms\n", first);
      std::printf("another full one        %9.3f ms\n", median(full));
      std::printf("split into two          %9.3f ms\n", median(split));
      std::printf("dup                     %9.3f ms\n", median(dup));
      std::printf("subgroup (lower half)   %9.3f ms\n", median(sub));
      if (groups > 0) {
        std::printf("%d live dups: %.3f ms each; rank 0's threads %ld -> %ld, descriptors %ld -> %ld, resident "
                    "memory %+.1f KiB per group\n",
                    groups, many / groups, threads0, threads1, fds0, fds1,
                    static_cast<double>(rss1 - rss0) / groups);
      }
    }
    live.clear();
    world.destroy();
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
