#include "gossip/peer_graph.hpp"

#include <algorithm>

namespace gradcomm::gossip {

ExponentialGraph::ExponentialGraph(std::vector<int> members, size_t peersPerStep) : members_(std::move(members)) {
  std::sort(members_.begin(), members_.end());
  members_.erase(std::unique(members_.begin(), members_.end()), members_.end());
  const size_t m = members_.size();
  while ((size_t{1} << levels_) < m) ++levels_;
  peersPerStep_ = std::min(std::max<size_t>(peersPerStep, 1), levels_);
}

int ExponentialGraph::indexOf(int rank) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), rank);
  return it != members_.end() && *it == rank ? static_cast<int>(it - members_.begin()) : -1;
}

std::vector<size_t> ExponentialGraph::distances(uint64_t step) const {
  std::vector<size_t> d;
  for (size_t j = 0; j < peersPerStep_; ++j) {
    d.push_back(size_t{1} << ((step * peersPerStep_ + j) % levels_));
  }
  return d;
}

size_t ExponentialGraph::period() const {
  if (levels_ == 0) return 1;
  return (levels_ + peersPerStep_ - 1) / peersPerStep_;
}

std::vector<int> ExponentialGraph::outPeers(int rank, uint64_t step) const {
  const int v = indexOf(rank);
  if (v < 0 || levels_ == 0) return {};
  const size_t m = members_.size();
  std::vector<int> out;
  for (size_t d : distances(step)) out.push_back(members_[(static_cast<size_t>(v) + d) % m]);
  return out;
}

std::vector<int> ExponentialGraph::inPeers(int rank, uint64_t step) const {
  const int v = indexOf(rank);
  if (v < 0 || levels_ == 0) return {};
  const size_t m = members_.size();
  std::vector<int> in;
  for (size_t d : distances(step)) in.push_back(members_[(static_cast<size_t>(v) + m - d) % m]);
  return in;
}

}  // namespace gradcomm::gossip
