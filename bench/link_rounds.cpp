// gradcomm-link-rounds: what one round of 8-byte messages costs on this
// layout, by pattern, in a bare MPI program (no gradcomm): the numbers the
// calibration's loaded rounds stand for, measured without its engine.
//
//   scripts/netns-cluster --hosts 2 --ppn 2 --rate 1gbit -- build/bin/gradcomm-link-rounds
//   mpirun -np 4 gradcomm-link-rounds [--rounds N] [--repeats R] [--bytes B]
//
// Hosts are MPI's shared-memory split. Patterns, each rank's round one
// send and one receive (but "all"), each round after the last one's receive:
//   ring      rank r sends to r + 1 and receives from r - 1 (as the
//             calibration's loaded ring);
//   across    local rank i of every host sends to local rank i of the next
//             host, for every i below the smallest host's rank count (as
//             recursive doubling's rounds between hosts; the calibration's
//             "across" rounds);
//   leaders   local rank 0 of every host alone (as a small hierarchical
//             call's exchange; the calibration's "leaders" rounds);
//   same-host local ranks 2j and 2j + 1 of each host exchange;
//   pairs     recursive doubling's exchanges: in round k rank r exchanges
//             with r xor 2^(k mod log2 p), the partners of an 8-byte `rd`
//             call's rounds (power-of-two rank counts only);
//   all       every rank sends to and receives from every other rank in
//             one round (p - 1 messages each way): the single round a
//             small call could make instead of recursive doubling's
//             log2 p (4x1 at 1 Gbit/s: one such round took longer than
//             two rounds of pairs; docs/PERFORMANCE.md, stop 34).
// Rank 0 prints, per pattern, the median over the repeats of the mean round
// (a repeat's rounds / their count), and the spread.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Peers {
  int to = -1, from = -1;  // -1: this rank sits the pattern out
};

int usage(int rank, const char* why) {
  if (rank == 0) {
    std::fprintf(stderr, "gradcomm-link-rounds: %s\nusage: gradcomm-link-rounds [--rounds N] [--repeats R] [--bytes B]\n",
                 why);
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long rounds = 2000, repeats = 5, bytes = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    long* target = a == "--rounds" ? &rounds : a == "--repeats" ? &repeats : a == "--bytes" ? &bytes : nullptr;
    if (!target || i + 1 >= argc) {
      const int rc = usage(rank, ("unknown or incomplete argument '" + a + "'").c_str());
      MPI_Finalize();
      return rc;
    }
    char* end = nullptr;
    *target = std::strtol(argv[++i], &end, 10);
    if (!end || *end || *target < 1 || *target > (1L << 24)) {
      const int rc = usage(rank, (a + " takes a count from 1 to 16777216, got '" + argv[i] + "'").c_str());
      MPI_Finalize();
      return rc;
    }
  }
  if (size < 2) {
    const int rc = usage(rank, "needs at least 2 ranks");
    MPI_Finalize();
    return rc;
  }

  // Hosts: every rank's host index and local index, from the shared-memory split.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int localRank = 0, localSize = 1;
  MPI_Comm_rank(local, &localRank);
  MPI_Comm_size(local, &localSize);
  int leader = rank;
  MPI_Bcast(&leader, 1, MPI_INT, 0, local);
  std::vector<int> leaders(static_cast<size_t>(size));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> hostLeaders = leaders;
  std::sort(hostLeaders.begin(), hostLeaders.end());
  hostLeaders.erase(std::unique(hostLeaders.begin(), hostLeaders.end()), hostLeaders.end());
  const int hosts = static_cast<int>(hostLeaders.size());
  std::vector<std::vector<int>> members(static_cast<size_t>(hosts));
  for (int q = 0; q < size; ++q) {
    const auto h = std::lower_bound(hostLeaders.begin(), hostLeaders.end(), leaders[static_cast<size_t>(q)]) - hostLeaders.begin();
    members[static_cast<size_t>(h)].push_back(q);
  }
  const int myHost = static_cast<int>(std::lower_bound(hostLeaders.begin(), hostLeaders.end(), leader) - hostLeaders.begin());
  size_t smallest = members[0].size();
  for (const auto& m : members) smallest = std::min(smallest, m.size());

  struct Pattern {
    const char* name;
    std::vector<Peers> cycle;  // round k's peers: cycle[k % cycle.size()]
    bool runs;                 // whether the layout has this pattern
    bool everyPeer = false;    // "all": each round exchanges with every other rank
  };
  std::vector<Pattern> patterns;
  patterns.push_back({"ring", {{(rank + 1) % size, (rank + size - 1) % size}}, true});
  const size_t h = static_cast<size_t>(myHost), n = static_cast<size_t>(hosts), i = static_cast<size_t>(localRank);
  Peers across, leadersOnly, sameHost;
  if (hosts >= 2 && i < smallest) across = {members[(h + 1) % n][i], members[(h + n - 1) % n][i]};
  if (hosts >= 2 && i == 0) leadersOnly = {members[(h + 1) % n][0], members[(h + n - 1) % n][0]};
  if ((i ^ 1) < members[h].size()) sameHost = {members[h][i ^ 1], members[h][i ^ 1]};
  patterns.push_back({"across", {across}, hosts >= 2 && smallest >= 2});
  patterns.push_back({"leaders", {leadersOnly}, hosts >= 2});
  patterns.push_back({"same-host", {sameHost}, localSize >= 2});
  const bool powerOfTwo = (size & (size - 1)) == 0;
  std::vector<Peers> pairs;
  for (int mask = 1; powerOfTwo && mask < size; mask <<= 1) pairs.push_back({rank ^ mask, rank ^ mask});
  patterns.push_back({"pairs", pairs, powerOfTwo});
  patterns.push_back({"all", {{0, 0}}, true, true});

  if (rank == 0) {
    std::printf("gradcomm-link-rounds: %d ranks on %d host(s) (smallest %zu), %ld-byte messages, %ld rounds x %ld repeats\n",
                size, hosts, smallest, bytes, rounds, repeats);
    std::printf("%-10s %12s %12s %12s\n", "pattern", "round (us)", "min (us)", "max (us)");
  }
  std::vector<char> out(static_cast<size_t>(bytes), 1), in(static_cast<size_t>(bytes) * static_cast<size_t>(size));
  std::vector<MPI_Request> everyone(2 * static_cast<size_t>(size));
  for (const Pattern& p : patterns) {
    if (!p.runs) {
      if (rank == 0) std::printf("%-10s %12s\n", p.name, "-");
      continue;
    }
    std::vector<double> means;
    for (long rep = 0; rep < repeats; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (long k = 0; k < rounds && p.everyPeer; ++k) {
        int n = 0;
        for (int q = 0; q < size; ++q) {
          if (q == rank) continue;
          MPI_Irecv(in.data() + static_cast<size_t>(q) * static_cast<size_t>(bytes), static_cast<int>(bytes), MPI_BYTE, q,
                    7, MPI_COMM_WORLD, &everyone[static_cast<size_t>(n++)]);
        }
        for (int q = 0; q < size; ++q) {
          if (q == rank) continue;
          MPI_Isend(out.data(), static_cast<int>(bytes), MPI_BYTE, q, 7, MPI_COMM_WORLD, &everyone[static_cast<size_t>(n++)]);
        }
        MPI_Waitall(n, everyone.data(), MPI_STATUSES_IGNORE);
      }
      for (long k = 0; k < rounds && !p.everyPeer; ++k) {
        const Peers& peers = p.cycle[static_cast<size_t>(k) % p.cycle.size()];
        if (peers.to < 0) break;
        MPI_Request r[2];
        MPI_Irecv(in.data(), static_cast<int>(bytes), MPI_BYTE, peers.from, 7, MPI_COMM_WORLD, &r[0]);
        MPI_Isend(out.data(), static_cast<int>(bytes), MPI_BYTE, peers.to, 7, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
      }
      means.push_back((MPI_Wtime() - t0) / static_cast<double>(rounds));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::sort(means.begin(), means.end());
      std::printf("%-10s %12.2f %12.2f %12.2f\n", p.name, means[means.size() / 2] * 1e6, means.front() * 1e6,
                  means.back() * 1e6);
    }
  }
  MPI_Comm_free(&local);
  MPI_Finalize();
  return 0;
}
