// gradcomm-nccl-bench: ncclAllReduce through libgradcomm_nccl.so against
// gradcomm's C++ allreduce of the same buffers, in one run (issue 13's
// goal: the shim costs at most 5% on host memory).
//
//   gradcomm-nccl-bench [--ranks 2] [--sizes 8,64M] [--rounds 11]
//
// Forks the ranks itself (loopback rendezvous). Each rank forms a C++
// communicator from the environment and an NCCL communicator from a unique
// id that rank 0 broadcasts over the first. Per size, rounds alternate
// between the two APIs (which goes first alternates too); each round times
// a block of back-to-back float32 sum allreduces after a barrier; the
// medians of the per-call times are compared.
#include <nccl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradcomm/gradcomm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// "8", "64K", "64M", "1G"; 0 (and a message) for anything else.
size_t parseSize(const std::string& s) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  const std::string suffix = s.substr(digits);
  if (digits == 0 || digits > 12 || (suffix != "" && suffix != "K" && suffix != "M" && suffix != "G")) return 0;
  const size_t v = std::stoull(s.substr(0, digits));
  return suffix == "K" ? v << 10 : suffix == "M" ? v << 20 : suffix == "G" ? v << 30 : v;
}

/// A whole number in [lo, hi], or -1.
long long parseCount(const std::string& s, long long lo, long long hi) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const long long v = std::stoll(s);
  return v < lo || v > hi ? -1 : v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int runRank(const std::vector<size_t>& sizes, int rounds) {
  gradcomm::Communicator comm = gradcomm::communicatorFromEnvironment();
  const int rank = comm.rank(), n = comm.size();
  ncclUniqueId id;
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    std::fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  comm.broadcast(&id, &id, sizeof id, gradcomm::DataType::kUInt8, 0).wait();
  ncclComm_t nccl = nullptr;
  if (ncclCommInitRank(&nccl, n, id, rank) != ncclSuccess) {
    std::fprintf(stderr, "ncclCommInitRank: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  if (rank == 0) {
    std::printf("# %d ranks, float32 sum allreduce on host memory, median of %d rounds\n", n, rounds);
    std::printf("%12s %8s %14s %14s %8s\n", "bytes", "iters", "c++ (us)", "ncclAllReduce", "ratio");
  }
  for (size_t bytes : sizes) {
    const size_t count = std::max<size_t>(bytes / 4, 1);
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + rank) % 17);
    const int iters = bytes <= (64 << 10) ? 2000 : bytes <= (4 << 20) ? 50 : 5;
    auto cxx = [&] { comm.allreduce(in.data(), out.data(), count, gradcomm::DataType::kFloat32, gradcomm::ReduceOp::kSum).wait(); };
    auto shim = [&] {
      if (ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, nccl, nullptr) != ncclSuccess) {
        std::fprintf(stderr, "ncclAllReduce: %s\n", ncclGetLastError(nullptr));
        std::exit(1);
      }
    };
    for (int i = 0; i < 3; ++i) { cxx(); shim(); }
    std::vector<double> tc, ts;
    auto block = [&](auto&& f, std::vector<double>& into) {
      comm.barrier().wait();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) f();
      into.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
    };
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) { block(cxx, tc); block(shim, ts); } else { block(shim, ts); block(cxx, tc); }
    }
    // Every rank's median, the slowest rank's counts (a collective ends on the last rank).
    double med[2] = {median(tc), median(ts)};
    comm.allreduce(med, med, 2, gradcomm::DataType::kFloat64, gradcomm::ReduceOp::kMax).wait();
    if (rank == 0) {
      std::printf("%12zu %8d %14.2f %14.2f %8.3f\n", count * 4, iters, med[0], med[1], med[1] / med[0]);
      std::fflush(stdout);
    }
  }
  ncclCommDestroy(nccl);
  return 0;
}

uint16_t freePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("socket");
    std::exit(2);
  }
  close(s);
  return ntohs(a.sin_port);
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, rounds = 11;
  std::vector<size_t> sizes = {8, 64u << 20};
  const char* usage = "usage: %s [--ranks N (1-64)] [--sizes 8,64M] [--rounds R (1-1000)]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(usage, argv[0]);
      return 0;
    }
    if (a != "--ranks" && a != "--rounds" && a != "--sizes") {
      std::fprintf(stderr, "gradcomm-nccl-bench: unknown option '%s'\n", a.c_str());
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gradcomm-nccl-bench: option %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--ranks" || a == "--rounds") {
      const long long n = a == "--ranks" ? parseCount(v, 1, 64) : parseCount(v, 1, 1000);
      if (n < 0) {
        std::fprintf(stderr, "gradcomm-nccl-bench: %s '%s' is not a whole number in %s\n", a.c_str(), v.c_str(),
                     a == "--ranks" ? "1..64" : "1..1000");
        return 2;
      }
      (a == "--ranks" ? ranks : rounds) = static_cast<int>(n);
    } else {
      sizes.clear();
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        const size_t bytes = parseSize(v.substr(p, q - p));
        if (bytes == 0 || bytes % sizeof(float) != 0) {
          std::fprintf(stderr, "gradcomm-nccl-bench: size '%s' in --sizes is not a positive multiple of 4 bytes "
                       "(8, 64K, 64M, 1G)\n", v.substr(p, q - p).c_str());
          return 2;
        }
        sizes.push_back(bytes);
        p = q + 1;
      }
    }
  }
  if (std::getenv("GRADCOMM_RANK")) return runRank(sizes, rounds);
  const std::string rendezvous = "127.0.0.1:" + std::to_string(freePort());
  setenv("GRADCOMM_RENDEZVOUS", rendezvous.c_str(), 1);
  setenv("GRADCOMM_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  if (!std::getenv("GRADCOMM_NCCL_ID_ADDR")) setenv("GRADCOMM_NCCL_ID_ADDR", "127.0.0.1", 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t p = fork();
    if (p == 0) {
      setenv("GRADCOMM_RANK", std::to_string(r).c_str(), 1);
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(p);
  }
  int bad = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad;
}
