// The link rate MPI gets between two emulated hosts of scripts/netns-cluster:
// a one-way stream, a bidirectional stream and a small-message ping-pong
// between rank 0 and the first rank on another host. This is the p2p
// baseline that collective bandwidth is compared against, measured on the
// same shaped links in the same kind of run.
//
//   netns-cluster --hosts 2 --ppn 1 --rate 1gbit -- gradcomm_netns_link_rate
//
// Options: --bytes N (per direction; default 2 s worth at the nominal rate),
// --msg N (message size, default 4M), --window W (messages in flight, 4),
// --repeat N (runs of each stream mode, default 1), --modes
// stream,bidir,pingpong, --min-ratio R / --max-ratio R (fail when the best
// one-way stream is outside R x nominal rate; for tests), --min-bidir-ratio R
// (fail when the best bidirectional run is below R x nominal each way).
// Rank 0 prints "link_rate mode=MODE key=value..." lines: one per run and a
// summary (median and best) per stream mode.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradcomm/error.hpp"
#include "base/units.hpp"

namespace {

struct Settings {
  size_t bytes = 0;  // 0: derive from the nominal rate
  size_t msgBytes = size_t{4} << 20;
  int window = 4;
  int repeat = 1;
  std::string modes = "stream,bidir,pingpong";
  double minRatio = 0;
  double maxRatio = 0;
  double minBidirRatio = 0;
};

const char* envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Moves sendBytes to and recvBytes from `peer` in messages of msgBytes with
// up to `window` sends and `window` receives in flight.
void transfer(int peer, size_t sendBytes, size_t recvBytes, const Settings& s, std::vector<char>& sendBuf,
              std::vector<char>& recvBuf) {
  const int w = s.window;
  std::vector<MPI_Request> reqs(static_cast<size_t>(2 * w), MPI_REQUEST_NULL);
  size_t sendPosted = 0, recvPosted = 0;
  auto postSend = [&](int slot) {
    const size_t part = std::min(s.msgBytes, sendBytes - sendPosted);
    MPI_Isend(sendBuf.data(), static_cast<int>(part), MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[static_cast<size_t>(slot)]);
    sendPosted += part;
  };
  auto postRecv = [&](int slot) {
    const size_t part = std::min(s.msgBytes, recvBytes - recvPosted);
    MPI_Irecv(recvBuf.data(), static_cast<int>(part), MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[static_cast<size_t>(slot)]);
    recvPosted += part;
  };
  for (int i = 0; i < w && sendPosted < sendBytes; ++i) postSend(i);
  for (int i = 0; i < w && recvPosted < recvBytes; ++i) postRecv(w + i);
  for (;;) {
    int idx = MPI_UNDEFINED;
    MPI_Waitany(2 * w, reqs.data(), &idx, MPI_STATUS_IGNORE);
    if (idx == MPI_UNDEFINED) break;
    if (idx < w && sendPosted < sendBytes) postSend(idx);
    if (idx >= w && recvPosted < recvBytes) postRecv(idx);
  }
}

void ack(int peer, bool send) {
  char b = 0;
  if (send) {
    MPI_Send(&b, 1, MPI_CHAR, peer, 2, MPI_COMM_WORLD);
  } else {
    MPI_Recv(&b, 1, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

// First rank that does not share memory with rank 0, i.e. the first rank on
// another host; -1 when every rank is on one host.
int firstRemoteRank() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  // Am I on rank 0's host? Only if world rank 0 is in my shared communicator.
  MPI_Group localGroup, worldGroup;
  MPI_Comm_group(local, &localGroup);
  MPI_Comm_group(MPI_COMM_WORLD, &worldGroup);
  int zero = 0, translated = MPI_UNDEFINED;
  MPI_Group_translate_ranks(worldGroup, 1, &zero, localGroup, &translated);
  MPI_Group_free(&localGroup);
  MPI_Group_free(&worldGroup);
  MPI_Comm_free(&local);
  int withZero = translated != MPI_UNDEFINED ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(size));
  MPI_Allgather(&withZero, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r) {
    if (!all[static_cast<size_t>(r)]) return r;
  }
  return -1;
}

double ratioOf(double bitsPerSecond, double nominal) { return nominal > 0 ? bitsPerSecond / nominal : 0.0; }

void writeMarker(int rank, bool ok) {
  if (const char* dir = std::getenv("GRADCOMM_TEST_MARKER_DIR")) {
    std::string path = std::string(dir) + "/rank" + std::to_string(rank);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(ok ? "PASS" : "FAIL", f);
      std::fclose(f);
    }
  }
}

Settings parseArgs(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw gradcomm::ConfigError("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--bytes") {
      s.bytes = gradcomm::core::parseBytes(value(), "--bytes");
    } else if (a == "--msg") {
      s.msgBytes = gradcomm::core::parseBytes(value(), "--msg");
    } else if (a == "--window") {
      s.window = static_cast<int>(gradcomm::core::parseInteger(value(), "--window", 1, 1024));
    } else if (a == "--repeat") {
      s.repeat = static_cast<int>(gradcomm::core::parseInteger(value(), "--repeat", 1, 1000));
    } else if (a == "--modes") {
      s.modes = value();
    } else if (a == "--min-ratio") {
      s.minRatio = std::atof(value().c_str());
    } else if (a == "--max-ratio") {
      s.maxRatio = std::atof(value().c_str());
    } else if (a == "--min-bidir-ratio") {
      s.minBidirRatio = std::atof(value().c_str());
    } else {
      throw gradcomm::ConfigError("unknown option '" + a +
                                  "'; options: --bytes N --msg N --window W --repeat N --modes LIST --min-ratio R "
                                  "--max-ratio R --min-bidir-ratio R");
    }
  }
  if (s.msgBytes == 0 || s.msgBytes > (size_t{1} << 30)) throw gradcomm::ConfigError("--msg must be 1 byte to 1G");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Settings s;
  try {
    s = parseArgs(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "link_rate: %s\n", e.what());
    writeMarker(rank, false);
    MPI_Finalize();
    return 2;
  }
  const double nominal = std::atof(envOr("GRADCOMM_NETNS_RATE_BPS", "0"));
  if (s.bytes == 0) {
    // About two seconds at the nominal rate: long enough that the tbf burst
    // (about 1 ms of traffic) and connection start-up do not show.
    s.bytes = nominal > 0 ? std::max<size_t>(size_t{16} << 20, static_cast<size_t>(nominal / 8 * 2)) : size_t{1} << 30;
  }
  const int peer = firstRemoteRank();
  bool ok = true;
  if (peer < 0) {
    if (rank == 0) std::fprintf(stderr, "link_rate: every rank shares memory with rank 0; run on at least 2 hosts\n");
    ok = false;
  }
  const bool active = peer >= 0 && (rank == 0 || rank == peer);
  const int other = rank == 0 ? peer : 0;
  char name[MPI_MAX_PROCESSOR_NAME] = {0}, peerName[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> sendBuf, recvBuf;
  if (active) {
    sendBuf.assign(std::min(s.msgBytes, s.bytes) + 1, 'x');
    recvBuf.assign(std::min(s.msgBytes, s.bytes) + 1, 0);
    MPI_Sendrecv(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, other, 3, peerName, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, other,
                 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    // Warm-up: opens the TCP connections (btl_tcp_links of them) both ways.
    transfer(other, s.msgBytes, s.msgBytes, s, sendBuf, recvBuf);
  }
  if (rank == 0 && peer >= 0) {
    std::printf("link_rate ranks=0,%d hosts=%s,%s nominal=%s nominal_bps=%.0f bytes=%zu msg=%zu window=%d\n", peer, name,
                peerName, envOr("GRADCOMM_NETNS_RATE", "?"), nominal, s.bytes, s.msgBytes, s.window);
  }
  auto wants = [&](const char* mode) { return ("," + s.modes + ",").find(std::string(",") + mode + ",") != std::string::npos; };

  // Each stream mode runs --repeat times; the summary gives the median and
  // the best run. Interference from other processes on the machine only ever
  // lowers a run (the shaper caps it), so the best run is the link rate.
  double streamRatio = -1, bidirRatio = -1;
  for (const char* mode : {"stream", "bidir"}) {
    if (!wants(mode)) continue;
    const bool bidir = std::strcmp(mode, "bidir") == 0;
    std::vector<double> gbits;
    for (int run = 1; run <= s.repeat; ++run) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (active && bidir) {
        transfer(other, s.bytes, s.bytes, s, sendBuf, recvBuf);
        char b = 0, c = 0;
        MPI_Sendrecv(&b, 1, MPI_CHAR, other, 2, &c, 1, MPI_CHAR, other, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (active) {
        transfer(other, rank == 0 ? s.bytes : 0, rank == 0 ? 0 : s.bytes, s, sendBuf, recvBuf);
        ack(other, rank != 0);
      }
      const double dt = MPI_Wtime() - t0;
      if (rank == 0 && active) {
        const double bps = static_cast<double>(s.bytes) * 8 / dt;
        gbits.push_back(bps / 1e9);
        std::printf("link_rate mode=%s run=%d seconds=%.3f gbit_per_s%s=%.4f ratio=%.4f\n", mode, run, dt,
                    bidir ? "_each_way" : "", bps / 1e9, ratioOf(bps, nominal));
        std::fflush(stdout);
      }
    }
    if (rank == 0 && active) {
      std::sort(gbits.begin(), gbits.end());
      const double median = gbits[gbits.size() / 2];
      const double best = gbits.back();
      std::printf("link_rate mode=%s summary runs=%d median_gbit_per_s=%.4f best_gbit_per_s=%.4f median_ratio=%.4f "
                  "best_ratio=%.4f\n",
                  mode, s.repeat, median, best, ratioOf(median * 1e9, nominal), ratioOf(best * 1e9, nominal));
      (bidir ? bidirRatio : streamRatio) = ratioOf(best * 1e9, nominal);
    }
  }
  if (wants("pingpong")) {
    MPI_Barrier(MPI_COMM_WORLD);
    const int iters = 1000;
    char b[8] = {0};
    double t0 = 0;
    if (active) {
      for (int i = -10; i < iters; ++i) {
        if (i == 0) t0 = MPI_Wtime();
        if (rank == 0) {
          MPI_Send(b, 8, MPI_CHAR, other, 4, MPI_COMM_WORLD);
          MPI_Recv(b, 8, MPI_CHAR, other, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(b, 8, MPI_CHAR, other, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(b, 8, MPI_CHAR, other, 4, MPI_COMM_WORLD);
        }
      }
    }
    const double dt = MPI_Wtime() - t0;
    if (rank == 0 && active) {
      std::printf("link_rate mode=pingpong bytes=8 usec_one_way=%.1f\n", dt / iters / 2 * 1e6);
    }
  }
  if (rank == 0 && streamRatio >= 0) {
    if (s.minRatio > 0 && streamRatio < s.minRatio) {
      std::fprintf(stderr, "link_rate: FAIL: best stream reached %.3f of the nominal rate, below --min-ratio %.3f\n",
                   streamRatio, s.minRatio);
      ok = false;
    }
    if (s.maxRatio > 0 && streamRatio > s.maxRatio) {
      std::fprintf(stderr,
                   "link_rate: FAIL: best stream reached %.3f of the nominal rate, above --max-ratio %.3f (is the link "
                   "shaped?)\n",
                   streamRatio, s.maxRatio);
      ok = false;
    }
  }
  if (rank == 0 && bidirRatio >= 0 && s.minBidirRatio > 0 && bidirRatio < s.minBidirRatio) {
    std::fprintf(stderr,
                 "link_rate: FAIL: best bidirectional stream reached %.3f of the nominal rate each way, below "
                 "--min-bidir-ratio %.3f\n",
                 bidirRatio, s.minBidirRatio);
    ok = false;
  }
  if ((s.minRatio > 0 || s.maxRatio > 0 || s.minBidirRatio > 0) &&
      (nominal <= 0 || !wants("stream") || (s.minBidirRatio > 0 && !wants("bidir")))) {
    if (rank == 0) {
      std::fprintf(stderr, "link_rate: FAIL: the ratio checks need GRADCOMM_NETNS_RATE_BPS and their modes\n");
    }
    ok = false;
  }
  std::fflush(stdout);
  int okInt = ok ? 1 : 0, allOk = 0;
  MPI_Allreduce(&okInt, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  writeMarker(rank, allOk == 1);
  MPI_Finalize();
  return allOk == 1 ? 0 : 1;
}
