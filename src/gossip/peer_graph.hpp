#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomm::gossip {

/// SGP's time-varying directed exponential graph over a set of member ranks
/// (all ranks, or the survivors after peers were removed). Members are
/// numbered 0..m-1 in ascending rank order; at step k a member sends to the
/// members at distances 2^i, i = (k * peersPerStep + j) mod L for j <
/// peersPerStep, where L = ceil(log2 m) is the number of powers of two below
/// m. Distance 1 alone is a ring, so the union over one period (L steps,
/// rounded up to whole steps) is strongly connected for every m, not only
/// powers of two. Pure: no transport, unit-tested on its own.
class ExponentialGraph {
 public:
  /// `members`: distinct ranks (sorted here); `peersPerStep` is capped at L.
  ExponentialGraph(std::vector<int> members, size_t peersPerStep);

  /// Ranks `rank` pushes to at `step` (empty for a lone member or a non-member).
  std::vector<int> outPeers(int rank, uint64_t step) const;
  /// Ranks that push to `rank` at `step`.
  std::vector<int> inPeers(int rank, uint64_t step) const;
  /// Steps after which the distances repeat (at least 1).
  size_t period() const;
  const std::vector<int>& members() const { return members_; }

 private:
  int indexOf(int rank) const;
  /// The distances used at `step`.
  std::vector<size_t> distances(uint64_t step) const;

  std::vector<int> members_;
  size_t levels_ = 0;  // L: distances 1, 2, ..., 2^(L-1), all below m
  size_t peersPerStep_ = 0;
};

}  // namespace gradcomm::gossip
