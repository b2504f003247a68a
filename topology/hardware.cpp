// This host's sockets, NUMA nodes and cores (from hwloc; optional: without
// it, or when it fails, the view says so and everything else works
// unchanged) and its network interfaces.
#include "topology/topology_view.hpp"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#if GRADCOMM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace gradcomm::topology {

namespace {

// Network interfaces as the kernel lists them (loopback left out). hwloc
// would list them only with its PCI discovery, whose plugin (libpciaccess)
// leaks about 1 KB per load that LeakSanitizer reports in every program
// linking gradcomm, and which costs a scan of the PCI bus.
std::vector<std::string> networkInterfaces() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/sys/class/net")) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != ".." && name != "lo") out.push_back(name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The fastest readable /sys/class/net/NIC/speed (Mbit/s) of `nics`, in bits
// per second; 0 where none reads as a positive number.
double nicSpeed(const std::vector<std::string>& nics) {
  double best = 0;
  for (const std::string& nic : nics) {
    std::ifstream in("/sys/class/net/" + nic + "/speed");
    long mbits = 0;
    if (in >> mbits && mbits > 0) best = std::max(best, static_cast<double>(mbits) * 1e6);
  }
  return best;
}

HostHardware load() {
  HostHardware hw;
#if GRADCOMM_HAVE_HWLOC
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return hw;
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return hw;
  }
  hw.detected = true;
  hw.numaNodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  hw.sockets = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  hw.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  hwloc_topology_destroy(topo);
#endif
  hw.nics = networkInterfaces();
  hw.nicBitsPerSecond = nicSpeed(hw.nics);
  return hw;
}

}  // namespace

int cpusAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int hostCpus(const HostHardware& hw) { return std::max(cpusAvailable(), hw.cores); }

WaitPolicy decideWait(const std::string& mode, int ranksOnHost, int cpus) {
  const std::string counts = std::to_string(ranksOnHost) + " rank(s) on this host, " + std::to_string(cpus) +
                             " CPU(s) available to each";
  if (mode == "spin") return {false, "spin (GRADCOMM_WAIT=spin; " + counts + ")"};
  if (mode == "yield") return {true, "yield (GRADCOMM_WAIT=yield; " + counts + ")"};
  if (ranksOnHost > cpus) return {true, "yield (ranks outnumber CPUs: " + counts + ")"};
  return {false, "spin (" + counts + ")"};
}

HostHardware detectHardware() {
  // Loading takes milliseconds (it scans PCI devices): once per process.
  static const HostHardware hw = load();
  return hw;
}

}  // namespace gradcomm::topology
