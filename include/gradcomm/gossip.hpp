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
  int maxStaleness = 0;                    ///< GRADCOMM_GOSSIP_MAX_STALENESS (16 steps)
  std::chrono::milliseconds peerTimeout{0};  ///< GRADCOMM_GOSSIP_PEER_TIMEOUT (10 s)
  /// Measure the consensus distance every step (two blocking allreduces:
  /// for diagnostics, not for speed; every rank must then call step() equally often).
  bool consensusDistance = false;
  /// Chrome trace of this rank's gossip steps ("" = off; the rank is
  /// inserted before ".json").
  std::string timelinePath;
};

/// Counters since construction (and the last step's consensus distance).
struct GossipStats {
  uint64_t steps = 0;          ///< step() calls
  /// The gossip clock: the step this rank's next push carries. It runs ahead
  /// of `steps` when the rank adopted a faster peer's clock (a slow rank
  /// skips steps rather than falling behind).
  uint64_t clock = 0;
  size_t sent = 0;             ///< pushes posted
  size_t received = 0;         ///< pushes mixed
  size_t late = 0;             ///< of those, mixed after the step they carry (within the staleness bound)
  size_t dropped = 0;          ///< pushes not mixed: more than the staleness bound behind this rank's clock, or from before synchronize()
  size_t failed = 0;           ///< transfers that failed (a dead peer)
  size_t isolatedSteps = 0;    ///< steps that began with nothing received for maxStaleness steps
  double weight = 1;           ///< this rank's push-sum weight
  /// RMS over ranks of |z_rank - mean z| after the last step (-1: not measured).
  double consensusDistance = -1;
  std::vector<int> removedPeers;  ///< ranks removed from the gossip graph, ascending
  /// Receives posted for in-neighbours' pushes after the last step, each
  /// with a buffer of one push (the parameters and a small header).
  size_t receiveBuffers = 0;
  /// Bytes of the gossip buffers held after the last step: posted receives
  /// and pushes still in flight.
  size_t bufferBytes = 0;
};

/// Asynchronous decentralised averaging (Stochastic Gradient Push, Assran
/// et al. 2019): push-sum gossip over a time-varying directed exponential
/// graph instead of an allreduce. Each step() pushes a share of the
/// parameters (and of the push-sum weight) to one peer (or
/// GRADCOMM_GOSSIP_PEERS), mixes whatever arrived, and leaves the
/// de-biased parameters in the caller's buffers; it never waits for a peer.
/// Pushes leave from a copy and progress on the communicator's progress
/// thread, so they overlap the caller's next computation, beside (never
/// inside) its collective queue.
///
/// Steps are counted on a gossip clock (stats().clock): each push carries
/// its sender's clock, and a rank more than half the staleness bound behind
/// the newest step it hears moves its clock up to that margin, so a slow
/// rank skips steps instead of falling ever further behind, and its pushes
/// stay current. A push more than GRADCOMM_GOSSIP_MAX_STALENESS steps
/// behind the receiver's clock is dropped (counted); a peer whose transfer
/// fails, or that is that far behind and silent for
/// GRADCOMM_GOSSIP_PEER_TIMEOUT, is removed from the graph (the survivors'
/// graph stays strongly connected), and the others keep going. Ranks that
/// train for a fixed number of steps should therefore stop by the clock
/// (`while (avg.stats().clock < steps)`): a rank that stops stepping while
/// the others go on looks dead to them after the timeout.
///
/// Construction is collective and checks that every rank passed the same
/// sizes; synchronize() is collective. Ranks may call step() different
/// numbers of times in between.
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
