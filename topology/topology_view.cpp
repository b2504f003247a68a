#include "topology/topology_view.hpp"

#include <algorithm>

#include "gradcomm/error.hpp"

namespace gradcomm::topology {

std::string HostHardware::describe() const {
  if (!detected) return "hardware unknown (gradcomm built without hwloc, or hwloc failed)";
  std::string nicText;
  for (size_t i = 0; i < nics.size(); ++i) nicText += (i ? "," : "") + nics[i];
  return std::to_string(sockets) + " socket(s), " + std::to_string(numaNodes) + " NUMA node(s), " +
         std::to_string(cores) + " core(s), NICs " + (nicText.empty() ? std::string("none found") : nicText);
}

TopologyView::TopologyView(const std::vector<int>& hostLeaders) {
  const int n = static_cast<int>(hostLeaders.size());
  hostOf_.assign(hostLeaders.size(), -1);
  localIndex_.assign(hostLeaders.size(), 0);
  for (int r = 0; r < n; ++r) {
    const int leader = hostLeaders[static_cast<size_t>(r)];
    if (leader < 0 || leader > r || hostLeaders[static_cast<size_t>(leader)] != leader) {
      throw InternalError("topology: rank " + std::to_string(r) + " reports host leader " + std::to_string(leader) +
                          ", which is not the lowest rank of a host");
    }
    if (leader == r) {
      hostOf_[static_cast<size_t>(r)] = static_cast<int>(hosts_.size());
      hosts_.push_back({});
    } else {
      hostOf_[static_cast<size_t>(r)] = hostOf_[static_cast<size_t>(leader)];
    }
    auto& host = hosts_[static_cast<size_t>(hostOf_[static_cast<size_t>(r)])];
    localIndex_[static_cast<size_t>(r)] = static_cast<int>(host.size());
    host.push_back(r);
  }
}

TopologyView TopologyView::uniform(int hosts, int ranksPerHost) {
  std::vector<int> leaders;
  for (int h = 0; h < hosts; ++h) {
    for (int i = 0; i < ranksPerHost; ++i) leaders.push_back(h * ranksPerHost);
  }
  return TopologyView(leaders);
}

LinkClass TopologyView::linkClass(int a, int b) const {
  if (a == b) return LinkClass::kSelf;
  return hostOf(a) == hostOf(b) ? LinkClass::kSameHost : LinkClass::kInterHost;
}

bool TopologyView::uniformHosts() const {
  for (const auto& h : hosts_) {
    if (h.size() != hosts_.front().size()) return false;
  }
  return true;
}

int TopologyView::maxRanksPerHost() const {
  size_t most = 0;
  for (const auto& h : hosts_) most = std::max(most, h.size());
  return static_cast<int>(most);
}

std::string TopologyView::describe() const {
  std::string out = std::to_string(size()) + " rank(s) on " + std::to_string(numHosts()) + " host(s) (";
  if (uniformHosts() && !hosts_.empty()) {
    out += std::to_string(numHosts()) + "x" + std::to_string(hosts_.front().size());
  } else {
    for (size_t h = 0; h < hosts_.size() && h < 16; ++h) out += (h ? "+" : "") + std::to_string(hosts_[h].size());
    if (hosts_.size() > 16) out += "+...";
  }
  return out + ")";
}

}  // namespace gradcomm::topology
