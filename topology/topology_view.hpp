#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace gradcomm::topology {

/// How two ranks are connected, from fastest to slowest. The cost model
/// keeps one latency/bandwidth pair per class.
enum class LinkClass { kSelf, kSameHost, kInterHost };

/// What hwloc reports about this rank's host (zeros when hwloc is absent or
/// failed: the model does not depend on it, it is for display and later use).
struct HostHardware {
  bool detected = false;  ///< hwloc loaded the topology
  int numaNodes = 0;
  int sockets = 0;
  int cores = 0;
  std::vector<std::string> nics;  ///< network interfaces of /sys/class/net but lo ("eth0", "ib0")
  /// The fastest link speed /sys/class/net/NIC/speed reports among `nics`,
  /// in bits per second; 0 where none is readable (virtual interfaces and
  /// links that are down report -1 or nothing).
  double nicBitsPerSecond = 0;
  /// "2 sockets, 2 NUMA nodes, 32 cores, NICs eth0,ib0", or why unknown.
  std::string describe() const;
};

/// Which ranks share a host, and how any two ranks are linked. Identical on
/// every rank of a communicator (built from facts every rank exchanged), so
/// decisions made from it agree without further communication.
class TopologyView {
 public:
  /// One host per rank (the view of a transport that knows no better).
  TopologyView() = default;
  /// `hostLeaders[r]`: the lowest rank on rank r's host. Throws
  /// InternalError when the list is inconsistent (a leader that is not on
  /// its own host, or above the rank).
  explicit TopologyView(const std::vector<int>& hostLeaders);
  /// `hosts` hosts of `ranksPerHost` consecutive ranks each (tests, tools).
  static TopologyView uniform(int hosts, int ranksPerHost);

  int size() const { return static_cast<int>(hostOf_.size()); }
  int numHosts() const { return static_cast<int>(hosts_.size()); }
  /// Index (0..numHosts-1, in order of each host's lowest rank) of rank r's host.
  int hostOf(int rank) const { return hostOf_[static_cast<size_t>(rank)]; }
  /// Ranks on host `host`, ascending.
  const std::vector<int>& ranksOnHost(int host) const { return hosts_[static_cast<size_t>(host)]; }
  /// Ranks sharing rank r's host (r included), ascending.
  const std::vector<int>& hostLocalRanks(int rank) const { return ranksOnHost(hostOf(rank)); }
  /// Position of r among its host's ranks.
  int localIndex(int rank) const { return localIndex_[static_cast<size_t>(rank)]; }
  LinkClass linkClass(int a, int b) const;
  /// True when every host holds the same number of ranks.
  bool uniformHosts() const;
  /// Most ranks on any host.
  int maxRanksPerHost() const;
  /// "4 ranks on 2 hosts (2x2)" or "5 ranks on 2 hosts (3+2)".
  std::string describe() const;

  /// The transport's label for this rank's host ("node1/node-of-rank0").
  const std::string& hostLabel() const { return hostLabel_; }
  void setHostLabel(std::string label) { hostLabel_ = std::move(label); }
  /// This rank's host hardware (hwloc), for display.
  const HostHardware& hardware() const { return hardware_; }
  void setHardware(HostHardware h) { hardware_ = std::move(h); }

 private:
  std::vector<int> hostOf_;
  std::vector<int> localIndex_;
  std::vector<std::vector<int>> hosts_;
  HostHardware hardware_;
  std::string hostLabel_ = "localhost";
};

/// hwloc's view of this host; `detected` false (and no error) without hwloc.
HostHardware detectHardware();

/// CPUs this process may run on (its affinity mask; the online CPUs when
/// the mask cannot be read).
int cpusAvailable();

/// The CPUs a host's ranks share, as the static model counts them: the
/// host's cores (`hw`, from hwloc) or this process's affinity mask,
/// whichever is larger. A launcher that binds each rank to a core of its
/// own leaves a mask of one CPU while the ranks share nothing.
int hostCpus(const HostHardware& hw);

/// How waiting ranks behave (GRADCOMM_WAIT): `yield` is true when they
/// hand the core over between polls; `why` says what decided it.
struct WaitPolicy {
  bool yield = false;
  std::string why;
};
/// `mode` is auto, spin or yield. auto yields when the host's ranks
/// outnumber the CPUs one of them may run on: a spinning rank would then
/// hold the core its peer needs to make the progress it waits for.
WaitPolicy decideWait(const std::string& mode, int ranksOnHost, int cpus);

}  // namespace gradcomm::topology
