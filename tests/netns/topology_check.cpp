// Checks that scripts/netns-cluster really makes H separate hosts of P ranks
// (or of P0, P1, ... ranks: --ppn P0,P1,...):
//  - MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) groups exactly the ranks of
//    each host (host 0's first, then host 1's, ...) and nothing across hosts;
//  - every host has its own processor name, ending in "-h<index>";
//  - bytes between hosts cross the host's eth0 (so they pass the tbf shaper),
//    bytes within a host do not (shared memory).
//  - GRADCOMM_NET_RATE carries the shaped rate (bits/s) to gradcomm's model.
// Expects GRADCOMM_NETNS_HOSTS and GRADCOMM_NETNS_PPN (set by netns-cluster).
// Each rank writes PASS/FAIL to $GRADCOMM_TEST_MARKER_DIR/rank<N>.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr size_t kProbeBytes = size_t{4} << 20;

int rank_ = 0;
bool ok_ = true;

void fail(const std::string& what) {
  std::fprintf(stderr, "[rank %d] topology_check: FAIL: %s\n", rank_, what.c_str());
  ok_ = false;
}

// Bytes sent and received on eth0 of this process's network namespace.
bool eth0Bytes(unsigned long long& rx, unsigned long long& tx) {
  std::ifstream in("/proc/self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string ifname = line.substr(0, colon);
    ifname.erase(0, ifname.find_first_not_of(' '));
    if (ifname != "eth0") continue;
    std::istringstream fields(line.substr(colon + 1));
    unsigned long long v[9] = {0};
    for (auto& x : v) fields >> x;
    rx = v[0];
    tx = v[8];
    return true;
  }
  return false;
}

// Rank `from` sends kProbeBytes to rank `to`; returns how much eth0 counters
// of the sender moved (tx) and of the receiver (rx), on those two ranks.
unsigned long long probe(int from, int to) {
  std::vector<char> buf(kProbeBytes, 'p');
  unsigned long long rx0 = 0, tx0 = 0, rx1 = 0, tx1 = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  eth0Bytes(rx0, tx0);
  if (rank_ == from) MPI_Send(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, to, 7, MPI_COMM_WORLD);
  if (rank_ == to) MPI_Recv(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, from, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
  eth0Bytes(rx1, tx1);
  return rank_ == from ? tx1 - tx0 : rank_ == to ? rx1 - rx0 : 0;
}

void writeMarker(bool ok) {
  if (const char* dir = std::getenv("GRADCOMM_TEST_MARKER_DIR")) {
    std::string path = std::string(dir) + "/rank" + std::to_string(rank_);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(ok ? "PASS" : "FAIL", f);
      std::fclose(f);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* hostsEnv = std::getenv("GRADCOMM_NETNS_HOSTS");
  const char* ppnEnv = std::getenv("GRADCOMM_NETNS_PPN");
  const int hosts = hostsEnv ? std::atoi(hostsEnv) : 0;
  // Ranks per host: "P" (every host) or "P0,P1,...".
  std::vector<int> perHost;
  if (ppnEnv) {
    std::stringstream list(ppnEnv);
    for (std::string item; std::getline(list, item, ',');) perHost.push_back(std::atoi(item.c_str()));
    if (perHost.size() == 1 && hosts > 1) perHost.assign(static_cast<size_t>(hosts), perHost[0]);
  }
  std::vector<int> hostOf;  // rank -> host
  for (size_t h = 0; h < perHost.size(); ++h) hostOf.insert(hostOf.end(), static_cast<size_t>(std::max(perHost[h], 0)), static_cast<int>(h));
  // The emulated rate reaches gradcomm's cost model as a NIC's speed would.
  const char* rateBps = std::getenv("GRADCOMM_NETNS_RATE_BPS");
  const char* netRate = std::getenv("GRADCOMM_NET_RATE");
  if (rateBps && std::string(rateBps) != "0" && (!netRate || std::string(netRate) != rateBps)) {
    fail(std::string("GRADCOMM_NET_RATE is '") + (netRate ? netRate : "(unset)") + "', not the link's " + rateBps +
         " bits/s");
  }
  if (hosts <= 0 || perHost.empty()) {
    fail("GRADCOMM_NETNS_HOSTS/PPN not set; run under scripts/netns-cluster");
  } else if (static_cast<int>(perHost.size()) != hosts || size != static_cast<int>(hostOf.size())) {
    fail("world size " + std::to_string(size) + " does not match " + std::to_string(hosts) + " hosts of " + ppnEnv +
         " ranks");
  }
  const bool known = size == static_cast<int>(hostOf.size());
  auto hostOfRank = [&](int r) { return known ? hostOf[static_cast<size_t>(r)] : 0; };
  const int myHost = hostOfRank(rank_);
  const int ppn = known ? perHost[static_cast<size_t>(myHost)] : 0;  // ranks on my host

  // Shared-memory groups: exactly my host's ranks.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  int localSize = 0;
  MPI_Comm_size(local, &localSize);
  std::vector<int> members(static_cast<size_t>(localSize));
  MPI_Allgather(&rank_, 1, MPI_INT, members.data(), 1, MPI_INT, local);
  std::string memberText;
  for (int m : members) {
    memberText += (memberText.empty() ? "" : ",") + std::to_string(m);
    if (known && hostOfRank(m) != myHost) fail("rank " + std::to_string(m) + " of another host shares memory with me");
  }
  if (localSize != ppn) fail("shared-memory group has " + std::to_string(localSize) + " ranks, expected " + std::to_string(ppn));
  MPI_Comm_free(&local);

  // Processor names: one per host, named after the host's namespace.
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  const std::string suffix = "-h" + std::to_string(myHost);
  const std::string me(name);
  if (me.size() < suffix.size() || me.compare(me.size() - suffix.size(), suffix.size(), suffix) != 0) {
    fail("processor name '" + me + "' does not end in " + suffix);
  }
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < size && known; ++r) {
    const std::string other(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    if ((hostOfRank(r) == myHost) != (other == me)) {
      fail("rank " + std::to_string(r) + " is named '" + other + "', I am '" + me + "'");
    }
  }

  // Traffic: between hosts over eth0, within a host not.
  unsigned long long rx = 0, tx = 0;
  if (!eth0Bytes(rx, tx)) fail("no eth0 in /proc/self/net/dev: not inside a netns-cluster host");
  // Collective probes: every rank passes the same ranks (host 1 starts
  // after host 0's ranks).
  const int host0 = known ? perHost[0] : 0;
  if (hosts >= 2 && host0 > 0) {
    const unsigned long long moved = probe(0, host0);
    if ((rank_ == 0 || rank_ == host0) && moved < kProbeBytes) {
      fail("a " + std::to_string(kProbeBytes) + "-byte message to another host moved only " + std::to_string(moved) +
           " bytes over eth0");
    }
  }
  if (host0 >= 2) {
    const unsigned long long moved = probe(0, 1);
    if ((rank_ == 0 || rank_ == 1) && moved > kProbeBytes / 4) {
      fail("a message within a host moved " + std::to_string(moved) + " bytes over eth0 (no shared memory?)");
    }
  }

  int okInt = ok_ ? 1 : 0, allOk = 0;
  MPI_Allreduce(&okInt, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  // Rank by rank, so the lines stay in order.
  for (int r = 0; r < size; ++r) {
    if (r == rank_) {
      std::printf("topology_check rank=%d host=%s shared_group=%s\n", rank_, name, memberText.c_str());
      std::fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank_ == 0) std::printf("topology_check: %s\n", allOk == 1 ? "PASS" : "FAIL");
  writeMarker(allOk == 1);
  MPI_Finalize();
  return allOk == 1 ? 0 : 1;
}
