// gradcomm-rendezvous-scale: how the store rendezvous grows with the world
// size. For each size p, p simulated ranks (threads of this process, each
// with its own TcpStore connection, as separate processes would have) run
// the StoreBootstrap allgather that forming a communicator through a store
// starts with, against one TcpStore served by a child process.
//
// Descriptors: every rank's connection takes one descriptor here and one in
// the server's process; both raise RLIMIT_NOFILE to the hard limit, and a
// size that needs more than that is refused with the limit named (nothing is
// multiplexed: one connection per simulated rank).
//
// Reported per size: the time to connect every rank (not part of the
// rendezvous), the time from releasing the connected ranks until the last
// has every value (the part that scales with p), and the server process's
// CPU time over that interval.
//
//   gradcomm-rendezvous-scale [--ranks 256,1024,4096,16384] [--value-bytes 8] [--rounds 1]
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "gradcomm/error.hpp"
#include "gradcomm/store.hpp"
#include "transport/bootstrap.hpp"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

rlim_t raiseDescriptorLimit() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  getrlimit(RLIMIT_NOFILE, &lim);
  return lim.rlim_cur;
}

/// CPU seconds (user + system) that process `pid` has used.
double cpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Rank {
  int rank = 0;
  int size = 0;
  uint16_t port = 0;
  std::string prefix;
  int rounds = 1;
  size_t valueBytes = 8;
  Clock::time_point connected{}, done{};
  std::string error;
  pthread_t thread{};
};

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int connected = 0;
  bool open = false;
  Clock::time_point opened{};
};

Gate* gGate = nullptr;

void* runRank(void* arg) {
  Rank& r = *static_cast<Rank*>(arg);
  try {
    TcpStore::Options o;
    o.connectTimeout = std::chrono::seconds(120);
    auto client = std::make_shared<TcpStore>("127.0.0.1", r.port, o);
    auto scoped = std::make_shared<PrefixStore>(r.prefix, client);
    transport::StoreBootstrap boot(scoped, r.rank, r.size, std::chrono::seconds(300));
    std::string mine = std::to_string(r.rank);
    mine.resize(r.valueBytes, 'v');
    r.connected = Clock::now();
    {
      std::unique_lock<std::mutex> lock(gGate->mu);
      ++gGate->connected;
      gGate->cv.notify_all();
      gGate->cv.wait(lock, [] { return gGate->open; });
    }
    for (int k = 0; k < r.rounds; ++k) {
      auto all = boot.allgather(mine);
      if (static_cast<int>(all.size()) != r.size) throw InternalError("wrong number of values");
    }
    r.done = Clock::now();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return nullptr;
}

std::vector<int> parseList(const char* text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

int usage(const char* why) {
  std::fprintf(stderr, "gradcomm-rendezvous-scale: %s\nusage: gradcomm-rendezvous-scale [--ranks N,N,...] "
               "[--value-bytes B] [--rounds K]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{256, 1024, 4096, 16384};
  size_t valueBytes = 8;
  int rounds = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    if (a == "--ranks") sizes = parseList(argv[++i]);
    else if (a == "--value-bytes") valueBytes = static_cast<size_t>(std::atol(argv[++i]));
    else if (a == "--rounds") rounds = std::atoi(argv[++i]);
    else return usage(("unknown argument " + a).c_str());
  }
  if (sizes.empty() || *std::min_element(sizes.begin(), sizes.end()) < 1 || rounds < 1 || valueBytes < 1 ||
      valueBytes > 4096) {
    return usage("ranks must be >= 1, rounds >= 1, value bytes in [1, 4096]");
  }
  const int largest = *std::max_element(sizes.begin(), sizes.end());
  const rlim_t limit = raiseDescriptorLimit();
  if (limit < static_cast<rlim_t>(largest) + 64) {
    std::fprintf(stderr, "gradcomm-rendezvous-scale: %d ranks need about %d descriptors per process, but "
                 "RLIMIT_NOFILE's hard limit is %llu\n", largest, largest + 64,
                 static_cast<unsigned long long>(limit));
    return 1;
  }

  // The server in a child process: its descriptors count against its own limit.
  int toParent[2], fromParent[2];
  if (pipe(toParent) != 0 || pipe(fromParent) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(toParent[0]);
    close(fromParent[1]);
    TcpStore::Options o;
    o.isServer = true;
    TcpStore server("127.0.0.1", 0, o);
    uint16_t port = server.port();
    if (write(toParent[1], &port, sizeof port) != sizeof port) _exit(1);
    char c;
    while (read(fromParent[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(toParent[1]);
  close(fromParent[0]);
  uint16_t port = 0;
  if (read(toParent[0], &port, sizeof port) != sizeof port) {
    std::fprintf(stderr, "gradcomm-rendezvous-scale: the store process did not start\n");
    return 1;
  }

  std::printf("# one TcpStore (server in process %d), ranks as threads with a connection each; value %zu bytes, "
              "%d allgather round(s); RLIMIT_NOFILE %llu\n",
              static_cast<int>(child), valueBytes, rounds, static_cast<unsigned long long>(limit));
  std::printf("%8s %12s %14s %16s %14s\n", "ranks", "connect_s", "rendezvous_s", "per_rank_us", "server_cpu_s");
  int status = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const int p = sizes[s];
    Gate gate;
    gGate = &gate;
    std::vector<Rank> ranks(static_cast<size_t>(p));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    const auto t0 = Clock::now();
    int started = 0;
    for (int r = 0; r < p; ++r) {
      Rank& rk = ranks[static_cast<size_t>(r)];
      rk.rank = r;
      rk.size = p;
      rk.port = port;
      rk.prefix = "bench/" + std::to_string(s);
      rk.rounds = rounds;
      rk.valueBytes = valueBytes;
      if (pthread_create(&rk.thread, &attr, runRank, &rk) != 0) {
        std::fprintf(stderr, "gradcomm-rendezvous-scale: could not start thread %d of %d\n", r, p);
        std::exit(1);
      }
      ++started;
    }
    pthread_attr_destroy(&attr);
    double serverBefore = 0;
    {
      std::unique_lock<std::mutex> lock(gate.mu);
      gate.cv.wait(lock, [&] { return gate.connected == started; });
      serverBefore = cpuSeconds(child);
      gate.open = true;
      gate.opened = Clock::now();
      gate.cv.notify_all();
    }
    for (auto& rk : ranks) pthread_join(rk.thread, nullptr);
    // Every rank is done once the last has its values.
    Clock::time_point last = gate.opened;
    int failed = 0;
    for (const auto& rk : ranks) {
      if (!rk.error.empty()) {
        if (failed++ == 0) std::fprintf(stderr, "rank %d of %d: %s\n", rk.rank, p, rk.error.c_str());
        continue;
      }
      last = std::max(last, rk.done);
    }
    const double serverCpu = cpuSeconds(child) - serverBefore;
    if (failed) {
      std::fprintf(stderr, "%d of %d ranks failed\n", failed, p);
      status = 1;
      break;
    }
    const double connect = std::chrono::duration<double>(gate.opened - t0).count();
    const double rendezvous = std::chrono::duration<double>(last - gate.opened).count();
    std::printf("%8d %12.3f %14.3f %16.2f %14.3f\n", p, connect, rendezvous, rendezvous * 1e6 / p, serverCpu);
    std::fflush(stdout);
  }
  close(fromParent[1]);
  int ws = 0;
  waitpid(child, &ws, 0);
  return status;
}
