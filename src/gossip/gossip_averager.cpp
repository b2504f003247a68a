#include "gradcomm/gossip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/communicator_impl.hpp"
#include "base/log.hpp"
#include "base/timeline.hpp"
#include "gossip/gossip_transfers.hpp"
#include "gossip/peer_graph.hpp"
#include "gossip/push_sum.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm {
namespace detail {

namespace {

using Clock = std::chrono::steady_clock;
using gossip::ExponentialGraph;
using gossip::PushSum;
using gossip::Transfer;

// Every push starts with this header, then the sender's bitmap of removed
// ranks (so removals spread along the gossip graph itself), then the floats.
struct PushHeader {
  uint64_t step;
  double weight;
  uint32_t sender;
  uint32_t removedWords;
};
static_assert(sizeof(PushHeader) == 24, "the push header is part of the wire format");

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

// Buffers a transport may still write into after their transfer was
// abandoned (MPI cannot take back a matched receive): kept for the process.
void keepForever(std::vector<std::shared_ptr<std::vector<char>>>&& buffers) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<std::vector<char>>> graveyard;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& b : buffers) graveyard.push_back(std::move(b));
}

}  // namespace

class GossipAveragerImpl {
 public:
  GossipAveragerImpl(Communicator comm, std::vector<GossipBuffer> params, GossipOptions options);
  ~GossipAveragerImpl();
  void step();
  void synchronize();
  double weight() const { return weight_; }
  GossipStats stats() const;

 private:
  size_t headerBytes() const { return sizeof(PushHeader) + removedWords_ * sizeof(uint64_t); }
  size_t messageBytes() const { return headerBytes() + count_ * sizeof(float); }
  void gather();   // z_ = the caller's buffers
  void scatter();  // the caller's buffers = z_
  /// Keeps windowFrom_[p] receives posted for each in-neighbour p's next pushes.
  void postReceives(transport::Transport& t);
  /// Mixes one arrived push unless it is stale; returns the step it carries
  /// (-1: malformed).
  int64_t mix(const Transfer& pull);
  /// The ranks that push here at some step of the current graph, and the
  /// receives to keep posted for each.
  void computeInNeighbours();
  void removePeer(int peer, const std::string& why);
  void rebuildGraph(transport::Transport& t);
  void measureConsensus();
  /// Records the buffers held (under the engine's drive lock).
  void noteBuffers();

  Communicator comm_;
  CommunicatorImpl& impl_;
  std::vector<GossipBuffer> params_;
  size_t count_ = 0;
  int rank_;
  int size_;
  size_t peersPerStep_;
  uint64_t maxStaleness_;
  Clock::duration peerTimeout_;
  bool measureConsensus_;
  std::unique_ptr<core::Timeline> timeline_;

  std::vector<float> z_;  // the de-biased estimate, all buffers back to back
  double weight_ = 1;
  // The gossip clock: the step this rank's next push carries. It advances by
  // one per step() and jumps to within half the staleness bound of the
  // newest step a peer's push carried (a Lamport clock with slack), so a
  // slow rank stays on the group's clock: its pushes are late only by their
  // time in transit and that margin, not by the steps it could not compute,
  // and are mixed rather than dropped as stale.
  uint64_t step_ = 0;
  uint64_t calls_ = 0;         // step() calls
  uint64_t discardBelow_ = 0;  // pushes of earlier steps were overtaken by synchronize()
  std::unique_ptr<ExponentialGraph> graph_;
  std::vector<int> inNeighbours_;
  std::vector<size_t> windowFrom_;    // per sender: receives kept posted for its pushes
  std::vector<uint64_t> pushesTo_;    // per receiver: the number of this rank's next push to it (the tag)
  std::vector<uint64_t> postedFrom_;  // per sender: the number of its next push not yet covered by a receive
  std::vector<uint64_t> newestFrom_;  // per sender: 1 + the newest step heard from it (or when it became an in-neighbour)
  size_t removedWords_;
  std::vector<bool> removed_;
  std::vector<std::string> removedWhy_;
  std::vector<Clock::time_point> lastHeard_;  // per sender: its last push, or when it became an in-neighbour
  uint64_t lastReceiveCall_ = 0;
  bool isolatedReported_ = false;  // this episode was logged
  bool isolatedWarned_ = false;    // an episode was logged at warn level
  GossipStats stats_;
  std::shared_ptr<gossip::GossipTransfers> transfers_;
  bool graphChanged_ = false;
};

GossipAveragerImpl::GossipAveragerImpl(Communicator comm, std::vector<GossipBuffer> params, GossipOptions options)
    : comm_(std::move(comm)),
      impl_(*comm_.impl()),
      params_(std::move(params)),
      rank_(comm_.rank()),
      size_(comm_.size()) {
  const core::Config& cfg = impl_.config();
  peersPerStep_ = options.peersPerStep ? options.peersPerStep : static_cast<size_t>(cfg.gossipPeers);
  maxStaleness_ = static_cast<uint64_t>(options.maxStaleness > 0 ? options.maxStaleness : cfg.gossipMaxStaleness);
  peerTimeout_ = options.peerTimeout.count() > 0 ? Clock::duration(options.peerTimeout)
                                                  : Clock::duration(cfg.gossipPeerTimeout);
  measureConsensus_ = options.consensusDistance;
  const std::string what = "rejected its GossipAverager";
  if (options.maxStaleness < 0) {
    impl_.abortAndThrow(InvalidUsage("GossipOptions::maxStaleness must be >= 0 (0: GRADCOMM_GOSSIP_MAX_STALENESS), got " +
                                     std::to_string(options.maxStaleness)),
                        what);
  }
  if (params_.empty()) impl_.abortAndThrow(InvalidUsage("GossipAverager needs at least one parameter buffer"), what);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].data && params_[i].count > 0) {
      impl_.abortAndThrow(InvalidUsage("GossipAverager: parameter buffer " + std::to_string(i) + " is null with count " +
                                       std::to_string(params_[i].count)),
                          what);
    }
    count_ += params_[i].count;
  }
  // Every rank must average the same number of floats (a push is one message
  // of a fixed size): compare min and max before anything moves.
  int64_t mine[2] = {static_cast<int64_t>(count_), -static_cast<int64_t>(count_)};
  int64_t agreed[2] = {0, 0};
  comm_.allreduce(mine, agreed, 2, DataType::kInt64, ReduceOp::kMin).wait();
  if (agreed[0] != -agreed[1]) {
    throw MismatchError("GossipAverager: ranks passed different parameter sizes (between " + std::to_string(agreed[0]) +
                        " and " + std::to_string(-agreed[1]) + " floats; this rank " + std::to_string(count_) +
                        "): every rank must register the same parameters");
  }
  removedWords_ = (static_cast<size_t>(size_) + 63) / 64;
  removed_.assign(static_cast<size_t>(size_), false);
  removedWhy_.assign(static_cast<size_t>(size_), std::string());
  lastHeard_.assign(static_cast<size_t>(size_), Clock::now());
  pushesTo_.assign(static_cast<size_t>(size_), 0);
  postedFrom_.assign(static_cast<size_t>(size_), 0);
  newestFrom_.assign(static_cast<size_t>(size_), 0);
  windowFrom_.assign(static_cast<size_t>(size_), 0);
  std::vector<int> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) all[static_cast<size_t>(r)] = r;
  graph_ = std::make_unique<ExponentialGraph>(all, peersPerStep_);
  computeInNeighbours();
  z_.resize(count_);
  if (!options.timelinePath.empty()) {
    timeline_ = std::make_unique<core::Timeline>(core::Timeline::perRankPath(options.timelinePath, rank_), rank_);
  }
  transfers_ = std::make_shared<gossip::GossipTransfers>();
  impl_.engine().addBackground(transfers_);
  impl_.engine().withTransport([&](transport::Transport&) {
    transport::Transport& t = impl_.transport();  // this communicator's (a group's, for a split one)
    postReceives(t);
    noteBuffers();
  });
}

void GossipAveragerImpl::noteBuffers() {
  stats_.receiveBuffers = 0;
  for (const auto& tr : transfers_->receives()) stats_.receiveBuffers += tr.done ? 0 : 1;
  stats_.bufferBytes = transfers_->bufferBytes();
}

GossipAveragerImpl::~GossipAveragerImpl() {
  auto& engine = impl_.engine();
  engine.removeBackground(transfers_.get());
  bool keep = false;
  engine.withTransport([&](transport::Transport&) {
    transport::Transport& t = impl_.transport();  // this communicator's (a group's, for a split one)
    transfers_->abandonAll();
    keep = t.abandonedTransfersPending();
  });
  if (keep) keepForever(std::move(transfers_->abandoned()));
  if (timeline_) timeline_->flush();
}

void GossipAveragerImpl::computeInNeighbours() {
  // How often each sender pushes here: at `perPeriod` of every `period` steps.
  std::map<int, size_t> perPeriod;
  const size_t period = graph_->period();
  for (uint64_t s = 0; s < period; ++s) {
    for (int p : graph_->inPeers(rank_, s)) ++perPeriod[p];
  }
  inNeighbours_.clear();
  // Only the pushes of the last S + 1 steps can be mixed (older ones are
  // stale): a sender on this rank's clock makes ceil((S + 1) * perPeriod /
  // period) of them, and one more receive lets its next push land before
  // this rank's next step reposts. So the receives in all are about S + 1
  // plus one per in-neighbour, not S + 1 per in-neighbour. A receiver that
  // falls further behind leaves later pushes waiting at their senders (sends
  // never block), and drains them by this many per step.
  const size_t horizon = static_cast<size_t>(maxStaleness_) + 1;
  for (const auto& [p, n] : perPeriod) {
    inNeighbours_.push_back(p);
    windowFrom_[static_cast<size_t>(p)] = std::min(horizon, (horizon * n + period - 1) / period + 1);
  }
}

void GossipAveragerImpl::postReceives(transport::Transport& t) {
  // Receives are posted per sender by push number, not by step: the n-th
  // receive for a sender matches its n-th push to this rank whatever either
  // clock says (the step travels in the header), so every push finds a
  // receive and nothing piles up unmatched in the transport.
  std::vector<size_t> outstanding(static_cast<size_t>(size_), 0);
  for (const auto& tr : transfers_->receives()) ++outstanding[static_cast<size_t>(tr.peer)];
  for (int p : inNeighbours_) {
    const size_t i = static_cast<size_t>(p);
    for (; outstanding[i] < windowFrom_[i]; ++outstanding[i]) {
      transfers_->post(t, false, postedFrom_[i]++, p, std::make_shared<std::vector<char>>(messageBytes()));
    }
  }
}

void GossipAveragerImpl::gather() {
  // What the caller changed since the last step (its optimizer's update) is
  // applied to the push-sum numerator x = w z, as SGP does: z += (p - z) / w.
  // A plain copy would apply it to z, i.e. scale every update by w, and
  // while pushes are in flight the ranks hold less than all the weight
  // (the average model then learns more slowly). A rank
  // whose pushes keep leaving while none arrive has a small w: its update is
  // taken at most kMaxUpdateScale times, so its own model cannot run away.
  constexpr double kMaxUpdateScale = 4;
  const float scale = static_cast<float>(std::min(1 / weight_, kMaxUpdateScale));
  size_t off = 0;
  for (const auto& p : params_) {
    float* z = z_.data() + off;
    if (scale == 1.0f) {
      std::memcpy(z, p.data, p.count * sizeof(float));
    } else {
      for (size_t i = 0; i < p.count; ++i) z[i] += (p.data[i] - z[i]) * scale;
    }
    off += p.count;
  }
}

void GossipAveragerImpl::scatter() {
  size_t off = 0;
  for (const auto& p : params_) {
    std::memcpy(p.data, z_.data() + off, p.count * sizeof(float));
    off += p.count;
  }
}

void GossipAveragerImpl::removePeer(int peer, const std::string& why) {
  if (peer == rank_ || removed_[static_cast<size_t>(peer)]) return;
  removed_[static_cast<size_t>(peer)] = true;
  removedWhy_[static_cast<size_t>(peer)] = why;
  graphChanged_ = true;
  core::log(core::LogLevel::kWarn, rank_,
            "gossip: removed rank " + std::to_string(peer) + " from the gossip graph at step " + std::to_string(step_) +
                " (" + why + "); the others keep going, and synchronize() will fail");
  if (timeline_) {
    timeline_->instant("removed rank " + std::to_string(peer), "gossip", Clock::now(), core::Timeline::kComm);
  }
}

void GossipAveragerImpl::rebuildGraph(transport::Transport& t) {
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (!removed_[static_cast<size_t>(r)]) members.push_back(r);
  }
  const auto before = inNeighbours_;
  graph_ = std::make_unique<ExponentialGraph>(members, peersPerStep_);
  computeInNeighbours();
  // Transfers with removed ranks go. Receives posted under the old graph
  // stay: a sender that has not heard of the removal yet still pushes by it,
  // and those that never match are given up once newer pushes overtake them.
  transfers_->abandonIf(false, [&](const Transfer& tr) { return removed_[static_cast<size_t>(tr.peer)]; });
  transfers_->abandonIf(true, [&](const Transfer& tr) { return removed_[static_cast<size_t>(tr.peer)]; });
  const auto now = Clock::now();
  for (int p : inNeighbours_) {
    if (std::find(before.begin(), before.end(), p) == before.end()) {
      // A new in-neighbour: its pushes to this rank start about now.
      newestFrom_[static_cast<size_t>(p)] = std::max(newestFrom_[static_cast<size_t>(p)], step_ + 1);
      lastHeard_[static_cast<size_t>(p)] = now;
    }
  }
  postReceives(t);
  graphChanged_ = false;
}

int64_t GossipAveragerImpl::mix(const Transfer& pull) {
  const char* p = pull.buffer->data();
  PushHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.sender != static_cast<uint32_t>(pull.peer) || h.removedWords != removedWords_ || !(h.weight >= 0) ||
      !std::isfinite(h.weight) || h.step > (uint64_t{1} << 62)) {
    // Cannot happen between ranks of one build; never mix garbage.
    core::log(core::LogLevel::kWarn, rank_,
              "gossip: dropped a malformed push from rank " + std::to_string(pull.peer) + " (its push " +
                  std::to_string(pull.seq) + " here)");
    ++stats_.dropped;
    return -1;
  }
  for (size_t w = 0; w < removedWords_; ++w) {
    uint64_t bits;
    std::memcpy(&bits, p + sizeof h + w * sizeof(uint64_t), sizeof bits);
    for (int b = 0; b < 64 && bits; ++b, bits >>= 1) {
      const int r = static_cast<int>(w * 64) + b;
      if ((bits & 1) && r < size_) removePeer(r, "reported removed by rank " + std::to_string(pull.peer));
    }
  }
  const int64_t step = static_cast<int64_t>(h.step);
  if (h.step < discardBelow_ || h.step + maxStaleness_ < step_) {
    ++stats_.dropped;  // pushed before synchronize(), or later than the bound
    return step;
  }
  std::vector<float> y(count_);
  std::memcpy(y.data(), p + headerBytes(), count_ * sizeof(float));
  PushSum::mix(z_.data(), weight_, y.data(), h.weight, count_);
  ++stats_.received;
  if (h.step < step_) ++stats_.late;
  return step;
}

void GossipAveragerImpl::step() {
  // No throwIfFailed(): gossip runs beside the collective queue, and the
  // survivors of a failed (aborted) communicator keep averaging. A destroyed
  // one has no progress thread and may have lost its peers.
  if (impl_.destroyed()) throw InvalidUsage("GossipAverager::step: the communicator was destroyed");
  const auto started = Clock::now();
  const uint64_t clock = step_;
  gather();
  // This step's push: one buffer for every out-peer (each gets the same share).
  const auto out = graph_->outPeers(rank_, step_);
  std::shared_ptr<std::vector<char>> push;
  if (!out.empty()) {
    push = std::make_shared<std::vector<char>>(messageBytes());
    char* p = push->data();
    PushHeader h{step_, PushSum::splitWeight(weight_, out.size()), static_cast<uint32_t>(rank_),
                 static_cast<uint32_t>(removedWords_)};
    std::memcpy(p, &h, sizeof h);
    for (size_t w = 0; w < removedWords_; ++w) {
      uint64_t bits = 0;
      for (int b = 0; b < 64; ++b) {
        const size_t r = w * 64 + static_cast<size_t>(b);
        if (r < removed_.size() && removed_[r]) bits |= uint64_t{1} << b;
      }
      std::memcpy(p + sizeof h + w * sizeof(uint64_t), &bits, sizeof bits);
    }
    std::memcpy(p + headerBytes(), z_.data(), count_ * sizeof(float));
  }
  std::vector<Transfer> arrived;
  impl_.engine().withTransport([&](transport::Transport&) {
    transport::Transport& t = impl_.transport();  // this communicator's (a group's, for a split one)
    transfers_->advanceAll();
    for (int peer : out) transfers_->post(t, true, pushesTo_[static_cast<size_t>(peer)]++, peer, push);
    stats_.sent += out.size();
    for (auto& f : transfers_->takeFailedSends()) {
      ++stats_.failed;
      removePeer(f.peer, "a push to it failed: " + f.error);
    }
    arrived = transfers_->takeFinishedReceives();
  });
  const auto now = Clock::now();
  bool receivedAny = false;
  uint64_t newest = 0;  // the newest step a push carried
  // Oldest first, so that the newest push of a sender is mixed last.
  std::sort(arrived.begin(), arrived.end(), [](const Transfer& a, const Transfer& b) { return a.seq < b.seq; });
  for (const auto& tr : arrived) {
    const size_t p = static_cast<size_t>(tr.peer);
    if (!tr.error.empty()) {
      ++stats_.failed;
      removePeer(tr.peer, "a push from it failed: " + tr.error);
      continue;
    }
    lastHeard_[p] = now;
    const size_t before = stats_.received;
    const int64_t step = mix(tr);
    receivedAny = receivedAny || stats_.received > before;
    if (step < 0) continue;
    newestFrom_[p] = std::max(newestFrom_[p], static_cast<uint64_t>(step) + 1);
    newest = std::max(newest, static_cast<uint64_t>(step));
  }
  if (PushSum::renormalize(weight_)) {
    core::logOnce(core::LogLevel::kInfo, rank_,
                  "gossip: push-sum weight rescaled (pushes keep being dropped as stale: a persistent straggler)");
  }
  impl_.engine().withTransport([&](transport::Transport&) {
    transport::Transport& t = impl_.transport();  // this communicator's (a group's, for a split one)
    // A dead peer: an in-neighbour more than S steps behind this rank's
    // clock and silent for the timeout. A live straggler keeps pushing, and
    // on the group's clock (it adopts the newest step it hears).
    for (int peer : inNeighbours_) {
      const size_t p = static_cast<size_t>(peer);
      if (!removed_[p] && newestFrom_[p] + maxStaleness_ < step_ + 1 && now - lastHeard_[p] > peerTimeout_) {
        removePeer(peer, "no push from it for longer than GRADCOMM_GOSSIP_PEER_TIMEOUT (" +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(peerTimeout_).count()) +
                             " ms) while it owed one");
      }
    }
    if (graphChanged_) rebuildGraph(t);
    postReceives(t);
    noteBuffers();
  });
  if (receivedAny) {
    lastReceiveCall_ = calls_;
    isolatedReported_ = false;
  } else if (calls_ >= lastReceiveCall_ + maxStaleness_ && graph_->members().size() > 1) {
    ++stats_.isolatedSteps;
    if (!isolatedReported_) {
      // Once per averager at warn level (the counter has the rest): with
      // fast steps on a busy host this happens now and then by itself.
      isolatedReported_ = true;
      core::log(isolatedWarned_ ? core::LogLevel::kInfo : core::LogLevel::kWarn, rank_,
                "gossip: rank " + std::to_string(rank_) + " has mixed no push for " +
                    std::to_string(calls_ - lastReceiveCall_) + " steps (GRADCOMM_GOSSIP_MAX_STALENESS=" +
                    std::to_string(maxStaleness_) + "); its peers may be slow or dead");
      isolatedWarned_ = true;
    }
  }
  // The next step: one on, or half the staleness bound behind the newest
  // step a peer already pushed (a rank within that margin keeps every step;
  // one further behind skips ahead, and its pushes stay within the bound).
  const uint64_t margin = maxStaleness_ / 2;
  step_ = std::max(step_ + 1, newest > margin ? newest - margin : uint64_t{0});
  ++calls_;
  scatter();
  stats_.steps = calls_;
  stats_.clock = step_;
  stats_.weight = weight_;
  if (measureConsensus_) measureConsensus();
  if (timeline_) {
    timeline_->span("gossip step " + std::to_string(clock), "gossip", started, Clock::now(), core::Timeline::kCompute,
                    "\"call\": " + std::to_string(calls_ - 1) + ", \"mixed\": " + std::to_string(arrived.size()));
  }
}

void GossipAveragerImpl::measureConsensus() {
  // Two blocking collectives over every rank: impossible once a rank is gone.
  for (bool r : removed_) {
    if (r) {
      stats_.consensusDistance = -1;
      return;
    }
  }
  std::vector<float> mean(count_);
  comm_.allreduce(z_.data(), mean.data(), count_, DataType::kFloat32, ReduceOp::kAvg).wait();
  double sq = 0;
  for (size_t i = 0; i < count_; ++i) {
    const double d = static_cast<double>(z_[i]) - static_cast<double>(mean[i]);
    sq += d * d;
  }
  double total = 0;
  comm_.allreduce(&sq, &total, 1, DataType::kFloat64, ReduceOp::kAvg).wait();
  stats_.consensusDistance = std::sqrt(total);
}

void GossipAveragerImpl::synchronize() {
  std::vector<int> gone;
  std::string why;
  for (int r = 0; r < size_; ++r) {
    if (!removed_[static_cast<size_t>(r)]) continue;
    gone.push_back(r);
    why += (why.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + removedWhy_[static_cast<size_t>(r)]);
  }
  if (!gone.empty()) {
    impl_.abortAndThrow(TransportError("GossipAverager::synchronize: rank" + std::string(gone.size() > 1 ? "s " : " ") +
                                       rankList(gone) + " left the gossip graph (" + why +
                                       "), so there is no exact average over all ranks"),
                        "could not synchronize its GossipAverager");
  }
  // Clocks differ by rank: agree on the newest, and start after it. Every
  // push still in flight carries an earlier step and would unbalance the
  // exact average: those are dropped when they arrive (their receives stay
  // posted, so nothing is left unmatched in the transport).
  int64_t mine = static_cast<int64_t>(step_), newest = 0;
  comm_.allreduce(&mine, &newest, 1, DataType::kInt64, ReduceOp::kMax).wait();
  step_ = static_cast<uint64_t>(newest) + 1;
  discardBelow_ = step_;
  stats_.clock = step_;
  std::vector<Transfer> arrived;
  impl_.engine().withTransport([&](transport::Transport&) {
    transport::Transport& t = impl_.transport();  // this communicator's (a group's, for a split one)
    transfers_->advanceAll();
    arrived = transfers_->takeFinishedReceives();
    postReceives(t);
    noteBuffers();
  });
  const auto now = Clock::now();
  for (const auto& tr : arrived) {
    if (!tr.error.empty()) continue;  // the next step() sees the failure again through its sends
    lastHeard_[static_cast<size_t>(tr.peer)] = now;
    ++stats_.dropped;
  }
  for (const auto& p : params_) {
    comm_.allreduce(p.data, p.data, p.count, DataType::kFloat32, ReduceOp::kAvg).wait();
  }
  weight_ = 1;
  stats_.weight = 1;
  lastReceiveCall_ = calls_;
  std::fill(lastHeard_.begin(), lastHeard_.end(), Clock::now());
}

GossipStats GossipAveragerImpl::stats() const {
  GossipStats s = stats_;
  s.removedPeers.clear();
  for (int r = 0; r < size_; ++r) {
    if (removed_[static_cast<size_t>(r)]) s.removedPeers.push_back(r);
  }
  return s;
}

}  // namespace detail

GossipAverager::GossipAverager(Communicator comm, std::vector<GossipBuffer> parameters, GossipOptions options)
    : impl_(std::make_unique<detail::GossipAveragerImpl>(std::move(comm), std::move(parameters), std::move(options))) {}
GossipAverager::~GossipAverager() = default;
void GossipAverager::step() { impl_->step(); }
void GossipAverager::synchronize() { impl_->synchronize(); }
double GossipAverager::weight() const { return impl_->weight(); }
GossipStats GossipAverager::stats() const { return impl_->stats(); }

}  // namespace gradcomm
