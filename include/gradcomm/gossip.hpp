#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradcomm/communicator.hpp"
#include "gradcomm/export.hpp"

namespace gradcomm {

namespace detail {
class GossipAveragerImpl;
}

/// One float32 parameter buffer the GossipAverager averages in place.
struct GossipBuffer {
  float* data = nullptr;
  size_t count = 0;
};

/// GossipAverager settings. Zeros take the matching GRADCOMM_GOSSIP_* parameter.
struct GossipOptions {
  size_t peersPerStep = 0;                 ///< GRADCOMM_GOSSIP_PEERS (1)
  int maxStaleness = 0;                    ///< GRADCOMM_GOSSIP_MAX_STALENESS (4 steps)
  std::chrono::milliseconds peerTimeout{0};  ///< GRADCOMM_GOSSIP_PEER_TIMEOUT (10 s)
  /// Measure the consensus distance every step (two blocking allreduces:
  /// for diagnostics, not for speed).
  bool consensusDistance = false;
  /// Chrome trace of this rank's gossip steps ("" = off; the rank is
  /// inserted before ".json").
  std::string timelinePath;
};

/// Counters since construction (and the last step's consensus distance).
struct GossipStats {
  uint64_t steps = 0;          ///< step() calls
  size_t sent = 0;             ///< pushes posted
  size_t received = 0;         ///< pushes mixed
  size_t late = 0;             ///< of those, mixed after their own step (within the staleness bound)
  size_t dropped = 0;          ///< pushes not mixed: later than the staleness bound, or arrived after synchronize()
  size_t failed = 0;           ///< transfers that failed (a dead peer)
  size_t isolatedSteps = 0;    ///< steps that began with nothing received for maxStaleness steps
  double weight = 1;           ///< this rank's push-sum weight
  /// RMS over ranks of |z_rank - mean z| after the last step (-1: not measured).
  double consensusDistance = -1;
  std::vector<int> removedPeers;  ///< ranks removed from the gossip graph, ascending
};

/// Asynchronous decentralised averaging (Stochastic Gradient Push, Assran
/// et al. 2019): push-sum gossip over a time-varying directed exponential
/// graph instead of an allreduce. Each step() pushes a share of the
/// parameters (and of the push-sum weight) to one peer (or
/// GRADCOMM_GOSSIP_PEERS), mixes whatever arrived, and leaves the
/// de-biased parameters in the caller's buffers; it never waits for a peer.
/// Pushes leave from a copy and progress on the communicator's progress
/// thread, so they overlap the caller's next computation, beside (never
/// inside) its collective queue. A push is mixed at most
/// GRADCOMM_GOSSIP_MAX_STALENESS steps after its own step, else dropped; a
/// peer whose transfer fails, or that is further behind and silent for
/// GRADCOMM_GOSSIP_PEER_TIMEOUT, is removed from the graph (the survivors'
/// graph stays strongly connected), and the others keep going.
///
/// Construction is collective and checks that every rank passed the same
/// sizes. Every rank must call step() the same number of times between
/// synchronize() calls.
class GRADCOMM_API GossipAverager {
 public:
  GossipAverager(Communicator comm, std::vector<GossipBuffer> parameters, GossipOptions options = {});
  ~GossipAverager();
  GossipAverager(const GossipAverager&) = delete;
  GossipAverager& operator=(const GossipAverager&) = delete;

  /// Pushes this step's share, mixes what arrived, de-biases into the
  /// buffers. Never blocks on a peer (with consensusDistance: two allreduces).
  void step();
  /// Exact average over all ranks (an allreduce, kAvg) of the de-biased
  /// parameters; collective. Pushes still in flight are dropped, weights
  /// reset to 1. Throws TransportError naming the removed ranks, and aborts
  /// the communicator so the others fail too, when a peer was removed.
  void synchronize();
  /// This rank's push-sum weight (1 at the start and after synchronize()).
  double weight() const;
  /// Counters since construction.
  GossipStats stats() const;

 private:
  std::unique_ptr<detail::GossipAveragerImpl> impl_;
};

}  // namespace gradcomm
