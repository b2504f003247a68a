#include "topology/calibration.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <cstdint>
#include <functional>
#include <sstream>
#include <vector>

#include "base/units.hpp"
#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::topology {
namespace {

using Clock = std::chrono::steady_clock;

double medianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double secondsBetween(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

/// Rank 0's decisions and numbers as they travel (plain bytes; every rank
/// runs the same build, so the layout is the same everywhere).
struct Wire {
  static constexpr uint32_t kMagic = 0x67636331;  // "gcc1"
  static constexpr uint32_t kPingPong = 1, kTuning = 2, kTuningError = 4, kShmLoad = 8;
  uint32_t magic = kMagic;
  uint32_t flags = 0;
  uint64_t textBytes = 0;
  double values[11] = {};
  uint32_t source = 0;  // 0 defaults, 1 calibrated, 2 file, 3 static
  uint32_t pad = 0;
  int32_t probes[2] = {-1, -1};  // the peer rank 0 probes per link class, or -1
};

void pack(const MachineCosts& c, Wire* w) {
  const double v[11] = {c.sameHost.alphaSeconds,     c.sameHost.betaSecondsPerByte, c.interHost.alphaSeconds,
                        c.interHost.betaSecondsPerByte, c.copySecondsPerByte,      c.reduceSecondsPerByte,
                        c.shmSyncSeconds,               c.sameHost.roundFloorSeconds, c.interHost.roundFloorSeconds,
                        c.shmByteFactor,                c.interHost.gapSeconds};
  std::memcpy(w->values, v, sizeof v);
  w->source = c.source == "defaults" ? 0 : c.source == "calibrated" ? 1 : c.source == "static" ? 3 : 2;
}

MachineCosts unpack(const Wire& w) {
  MachineCosts c;
  c.sameHost = {w.values[0], w.values[1], w.values[7]};
  c.interHost = {w.values[2], w.values[3], w.values[8], w.values[10]};
  c.copySecondsPerByte = w.values[4];
  c.reduceSecondsPerByte = w.values[5];
  c.shmSyncSeconds = w.values[6];
  c.shmByteFactor = w.values[9];
  c.source = w.source == 0 ? "defaults" : w.source == 1 ? "calibrated" : w.source == 3 ? "static" : "file";
  return c;
}

constexpr size_t kSmallBytes = 8;
constexpr int kSmallReps = 10;
constexpr size_t kMediumBytes = 64 * 1024;
constexpr int kMediumReps = 3;
constexpr size_t kLargeBytes = 1024 * 1024;
// Message indices: 0 header, 1 tuning text, 2 final costs; each probed
// link class its own block after that.
constexpr uint32_t kHeaderMessage = 0, kTextMessage = 1, kFinalMessage = 2, kLeadersMessage = 3;
// Each rank tells the first rank of its host (in its own view) the size of
// the shared-memory group it sees (0: none), before the header.
constexpr uint32_t kShmStatusMessage = 4;
// The first rank of a host other than rank 0's tells the others whether
// their host runs the shared-memory phase (rank 0's host learns it from
// the header).
constexpr uint32_t kShmDecisionMessage = 5;
constexpr uint32_t kClassBase[2] = {16, 64};
// The loaded round: every rank sends 8 bytes to the next rank and receives
// from the previous, kRingRounds times, each round after the last one's
// receive; rank 0 times each round after the first and takes the median,
// not the mean, so that a round whose rank lost its core for a while
// (common where emulated hosts share cores) does not set the alpha: it
// prices a round at its typical time, as the benchmarks' medians do.
constexpr uint32_t kRingBase = kLoadedRingMessageBase;
constexpr int kRingRounds = kLoadedRingRounds;
// After them, rank 0 sends every rank the size of the loaded bulk rounds
// (kBulkSizeMessage), then kLoadedBulkRounds rounds of that many bytes
// (message indices kBulkBase + i): rank 0 takes the median round after the
// first, and raises the slowest class's beta to what the round took beyond
// alpha and the model's round overhead (fitLoadedBeta).
constexpr uint32_t kBulkSizeMessage = kRingBase + kRingRounds;
constexpr uint32_t kBulkBase = kBulkSizeMessage + 1;
constexpr int kLoadedBulkRounds = 5;
// The across and leaders rounds (the inter-host link gap): after the
// 8-byte ring rounds, where there are several hosts of several ranks
// (across()); message indices kAcrossMessageBase + k.
static_assert(kAcrossMessageBase >= kLoadedRingMessageBase + kLoadedRingRounds + 1 + kLoadedBulkRounds,
              "the across rounds' messages follow the ring's and the bulk rounds'");
constexpr size_t kLoadedBulkBytes = 256 * 1024;
// The loaded shared-memory phase (the ranks of each host, all at once,
// where every one of them sees the same shared-memory group): kShmSyncRounds
// hand-offs with no data; rank 0 takes the median of all but the first on
// its host (a fixed price far underpriced ranks that share cores). Every
// host runs it at the same time, as a hierarchical call does.
constexpr int kShmSyncRounds = kShmHandOffRounds;
// Then kShmDataRounds rounds with data, each the shared-memory allreduce's
// round in small: every rank stages a round of its input into its buffer
// (all but its own slice), reduces its slice from every rank's buffer,
// gathers the other slices into its output, a hand-off after each step.
// Each round reads a fresh part of the input and writes a fresh part of
// the output, as a large call streams through them. Rank 0 takes the
// median round after the first (fitShmByteFactor). A round is at most
// kShmDataMaxBytes (the group's buffer is one round of the allreduce).
constexpr size_t kShmDataMaxBytes = 1024 * 1024;

/// A list of sends, receives and callbacks run strictly in order; callbacks
/// may insert further steps right after themselves.
class SetupExchangeImpl : public SetupExchange {
 public:
  SetupExchangeImpl(transport::Transport& t, const transport::Tag& tag, const TopologyView& view, const SetupInput& in,
                std::shared_ptr<SetupResult> result)
      : t_(t), tag_(tag), view_(view), in_(in), result_(std::move(result)) {
    // Rank 0 decides whom it probes (and tells them in the header).
    probes_[0] = view.hostLocalRanks(0).size() > 1 ? view.hostLocalRanks(0)[1] : -1;
    probes_[1] = view.numHosts() > 1 ? view.ranksOnHost(1).front() : -1;
    leaders_.resize(static_cast<size_t>(t_.size()));
    for (int r = 0; r < t_.size(); ++r) {
      leaders_[static_cast<size_t>(r)] = view.ranksOnHost(view.hostOf(r)).front();
    }
    transport::ShmGroup* g = t_.sharedMemory();
    shmSize_ = g ? g->localSize() : 0;
    if (t_.rank() == 0) startRoot(); else startOther();
  }

  bool advance() override {
    bool moved = false;
    for (size_t i = 0; i < detached_.size();) {
      if (detached_[i]->test()) {
        detached_[i] = std::move(detached_.back());
        detached_.pop_back();
        moved = true;
      } else {
        ++i;
      }
    }
    while (next_ < steps_.size()) {
      if (steps_[next_].kind == Step::kPoll && !steps_[next_].poll()) return moved;
      if (!current_ && steps_[next_].kind != Step::kCall && steps_[next_].kind != Step::kPoll) {
        Step& s = steps_[next_];
        transport::Tag tag = tag_;
        tag.message = s.message;
        current_ = s.kind == Step::kSend ? t_.isend(s.peer, s.data, s.bytes, tag) : t_.irecv(s.peer, s.data, s.bytes, tag);
        moved = true;
        // A detached send is not waited for here (the next step, its
        // round's receive, runs beside it); done() waits for it.
        if (s.detach) detached_.push_back(std::move(current_));
      }
      if (current_) {
        // Ping-pong replies are awaited by spinning (bounded) so the
        // measured round trip holds no back-off sleep of the progress loop.
        const auto spinUntil = Clock::now() + std::chrono::milliseconds(steps_[next_].spin ? 5 : 0);
        while (!current_->test()) {
          if (Clock::now() >= spinUntil) return moved;
        }
        current_.reset();
      }
      std::function<void()> then = std::move(steps_[next_].then);
      insertAt_ = ++next_;
      moved = true;
      if (then) then();
    }
    return moved;
  }
  bool done() const override { return next_ >= steps_.size() && detached_.empty(); }
  std::string waitingFor() const override {
    if (done()) return "nothing";
    if (next_ >= steps_.size()) return "calibration sends of the loaded round to complete";
    const Step& s = steps_[next_];
    if (s.kind == Step::kPoll) return "the host's other ranks in the calibration's shared-memory phase";
    return std::string("calibration ") + (s.kind == Step::kSend ? "send to" : "recv from") + " rank " +
           std::to_string(s.peer) + " (message " + std::to_string(s.message) + ")";
  }

 private:
  struct Step {
    enum Kind { kSend, kRecv, kCall, kPoll } kind = kCall;
    int peer = -1;
    void* data = nullptr;
    size_t bytes = 0;
    uint32_t message = 0;
    bool spin = false;
    std::function<void()> then;
    bool detach = false;  ///< a send the exchange does not wait for before the next step
    std::function<bool()> poll = {};  ///< kPoll: true once the step is done (then `then` runs)
  };
  void add(Step s) { steps_.insert(steps_.begin() + static_cast<std::ptrdiff_t>(insertAt_++), std::move(s)); }
  void send(int peer, void* data, size_t bytes, uint32_t message, std::function<void()> then = {}) {
    add(Step{Step::kSend, peer, data, bytes, message, false, std::move(then)});
  }
  void recv(int peer, void* data, size_t bytes, uint32_t message, std::function<void()> then = {}, bool spin = false) {
    add(Step{Step::kRecv, peer, data, bytes, message, spin, std::move(then)});
  }
  /// A send that no step waits for (it completes in the background; the
  /// exchange ends only once it has).
  void sendDetached(int peer, void* data, size_t bytes, uint32_t message) {
    Step s{Step::kSend, peer, data, bytes, message, false, {}};
    s.detach = true;
    add(std::move(s));
  }
  void call(std::function<void()> f) { add(Step{Step::kCall, -1, nullptr, 0, 0, false, std::move(f)}); }
  void poll(std::function<bool()> f, std::function<void()> then = {}) {
    Step s;
    s.kind = Step::kPoll;
    s.poll = std::move(f);
    s.then = std::move(then);
    add(std::move(s));
  }

  void startRoot() {
    header_.flags = (in_.runPingPong ? Wire::kPingPong : 0) | (in_.tuning.tuningPresent ? Wire::kTuning : 0) |
                    (in_.tuning.error.empty() ? 0 : Wire::kTuningError);
    // The shared-memory phase needs every rank of this host in it: run it
    // only when each sees the same group as rank 0 (a rank left out would
    // leave the others waiting for its hand-offs).
    receiveShmStatus(view_.hostLocalRanks(0));
    call([this] {
      if (in_.runPingPong && hostAgrees(view_.hostLocalRanks(0))) header_.flags |= Wire::kShmLoad;
    });
    text_ = in_.tuning.error.empty() ? in_.tuning.tuningText : in_.tuning.error;
    header_.textBytes = text_.size();
    pack(in_.costs, &header_);
    header_.probes[0] = probes_[0];
    header_.probes[1] = probes_[1];
    for (int r = 1; r < t_.size(); ++r) send(r, &header_, sizeof header_, kHeaderMessage);
    for (int r = 1; r < t_.size(); ++r) send(r, leaders_.data(), leaders_.size() * sizeof(int32_t), kLeadersMessage);
    if (!text_.empty()) {
      for (int r = 1; r < t_.size(); ++r) send(r, text_.data(), text_.size(), kTextMessage);
    }
    costs_ = in_.costs;
    if (in_.runPingPong) {
      start_ = Clock::now();
      for (int c = 0; c < 2; ++c) {
        if (probes_[c] >= 0) call([this, c] { initiate(c); });
      }
      call([this] { ring(); });
      call([this] {
        if (header_.flags & Wire::kShmLoad) shmLoad();
      });
      call([this] {
        // Measured on idle cores; where this host's ranks share fewer
        // CPUs, every byte moved or reduced on it takes longer.
        const int local = static_cast<int>(view_.hostLocalRanks(0).size());
        costs_ = shareCores(costs_, local, cpusAvailable());
        if (!shmDataRounds_.empty()) {
          const double roundBytes = static_cast<double>(shmSliceFloats_ * sizeof(float)) * local;
          costs_.shmByteFactor = fitShmByteFactor(medianOf(shmDataRounds_), roundBytes, local, costs_);
        }
        costs_.source = "calibrated";
        pack(costs_, &final_);
        for (int r = 1; r < t_.size(); ++r) send(r, &final_, sizeof final_, kFinalMessage);
      });
    }
    call([this] { finish(header_.flags); });
  }

  void startOther() {
    // The first rank of this host (in this rank's view) decides whether the
    // host runs the shared-memory phase; rank 0 decides for its own host.
    const auto& local = view_.hostLocalRanks(t_.rank());
    const int first = local.front();
    if (first != t_.rank()) {
      send(first, &shmSize_, sizeof shmSize_, kShmStatusMessage);
    } else if (first != 0) {
      receiveShmStatus(local);
    }
    recv(0, &header_, sizeof header_, kHeaderMessage, [this] {
      if (header_.magic != Wire::kMagic) {
        throw InternalError("calibration: rank 0 sent a malformed header (another gradcomm build?)");
      }
      costs_ = unpack(header_);
      probes_[0] = header_.probes[0];
      probes_[1] = header_.probes[1];
      recv(0, leaders_.data(), leaders_.size() * sizeof(int32_t), kLeadersMessage);
      if (header_.textBytes) {
        text_.resize(header_.textBytes);
        recv(0, text_.data(), text_.size(), kTextMessage);
      }
      if (header_.flags & Wire::kPingPong) {
        for (int c = 0; c < 2; ++c) {
          if (probes_[c] == t_.rank()) call([this, c] { respond(c); });
        }
        call([this] { ring(); });
        // Every host at once; rank 0's numbers are the ones used, the other
        // hosts load the cores and links as a hierarchical call would.
        call([this] {
          const auto& local = view_.hostLocalRanks(t_.rank());
          if (leaders_[static_cast<size_t>(t_.rank())] == 0) {
            hostShm_ = (header_.flags & Wire::kShmLoad) != 0;
          } else if (local.front() == t_.rank()) {
            hostShm_ = hostAgrees(local) ? 1 : 0;
            for (size_t i = 1; i < local.size(); ++i) send(local[i], &hostShm_, sizeof hostShm_, kShmDecisionMessage);
          } else {
            recv(local.front(), &hostShm_, sizeof hostShm_, kShmDecisionMessage);
          }
          call([this] {
            if (hostShm_) shmLoad();
          });
        });
        recv(0, &final_, sizeof final_, kFinalMessage, [this] { costs_ = unpack(final_); });
      }
      call([this] { finish(header_.flags); });
    });
  }

  /// The first rank of a host: receives the size of the shared-memory group
  /// each other rank of the host (`local`) sees.
  void receiveShmStatus(const std::vector<int>& local) {
    peerShmSizes_.assign(local.size(), -1);
    for (size_t i = 1; i < local.size(); ++i) recv(local[i], &peerShmSizes_[i], sizeof(int32_t), kShmStatusMessage);
  }

  /// The first rank of a host, once it heard from the others: whether
  /// every rank of the host (`local`) sees the same shared-memory group, of
  /// all of them (a rank left out would leave the others waiting for its
  /// hand-offs).
  bool hostAgrees(const std::vector<int>& local) const {
    const auto n = static_cast<int32_t>(local.size());
    bool agreed = n >= 2 && shmSize_ == n && peerShmSizes_.size() == local.size();
    for (size_t i = 1; agreed && i < peerShmSizes_.size(); ++i) agreed = peerShmSizes_[i] == n;
    return agreed;
  }

  void finish(uint32_t flags) {
    result_->costs = costs_;
    result_->hostLeaders.assign(leaders_.begin(), leaders_.end());
    result_->tuningPresent = (flags & Wire::kTuning) != 0;
    if (flags & Wire::kTuningError) result_->error = text_;
    else result_->tuningText = text_;
  }

  /// Rank 0's half of the ping-pong with the probe of link class c.
  void initiate(int c) {
    const int peer = probes_[c];
    const uint32_t base = kClassBase[c];
    small_.assign(kSmallBytes, 0);
    medium_.assign(kMediumBytes, 0);
    rtt_[c] = {1e30, 1e30, 1e30};
    uint32_t m = base;
    for (int i = 0; i < kSmallReps; ++i, m += 2) {
      call([this] { t0_ = Clock::now(); });
      send(peer, small_.data(), kSmallBytes, m);
      recv(peer, small_.data(), kSmallBytes, m + 1, [this, c] { rtt_[c][0] = std::min(rtt_[c][0], secondsSince(t0_)); },
           true);
    }
    for (int i = 0; i < kMediumReps; ++i, m += 2) {
      const bool last = i == kMediumReps - 1;
      call([this, c, last] {
        // Before the last medium ping: is there time for a large one? The
        // first class keeps half the budget for the second.
        if (last) {
          const double budget = std::chrono::duration<double>(in_.budget).count();
          const double share = (c == 0 && probes_[1] >= 0) ? budget / 2 : budget;
          const double estimate = rtt_[c][1] * (kLargeBytes / kMediumBytes) * 1.5;
          large_[c] = secondsSince(start_) + estimate <= share;
          medium_[0] = large_[c] ? 1 : 0;
        }
        t0_ = Clock::now();
      });
      send(peer, medium_.data(), kMediumBytes, m);
      recv(peer, medium_.data(), kMediumBytes, m + 1, [this, c] { rtt_[c][1] = std::min(rtt_[c][1], secondsSince(t0_)); },
           true);
    }
    call([this, c, peer, m] {
      if (large_[c]) {
        big_.assign(kLargeBytes, 0);
        call([this] { t0_ = Clock::now(); });
        send(peer, big_.data(), kLargeBytes, m);
        recv(peer, big_.data(), kLargeBytes, m + 1, [this, c] { rtt_[c][2] = secondsSince(t0_); }, true);
      }
      call([this, c] { conclude(c); });
    });
  }

  /// Every rank: rounds of one 8-byte message to the next rank and one from
  /// the previous, all ranks at once, as in a collective's rounds. A lone
  /// ping-pong between two otherwise idle ranks misses what such rounds
  /// cost where ranks share cores or links; rank 0 raises the slowest link
  /// class's round floor to what a round took (fitRoundFloor). Receives are not
  /// spun on: the creator's loop yields between polls, as waiting ranks do.
  void ring() {
    const int p = t_.size(), r = t_.rank();
    ringOut_.assign(8, 0);
    ringIn_.assign(8, 0);
    loadedRounds((r + 1) % p, (r + p - 1) % p, ringOut_, ringIn_, kRingBase, kRingRounds, roundSeconds_,
                 [](double round, LinkCost& l) {
                   l.roundFloorSeconds = fitRoundFloor(round, ModelSettings{}.roundOverheadSeconds);
                 });
    across();
    // Then rounds of bulk data: rank 0 says how many bytes (what fits in
    // the budget left), every rank runs them.
    if (r == 0) {
      call([this, p] {
        bulkBytes_ = chooseBulkBytes();
        for (int q = 1; q < p; ++q) send(q, &bulkBytes_, sizeof bulkBytes_, kBulkSizeMessage);
        call([this] { bulk(); });
      });
    } else {
      recv(0, &bulkBytes_, sizeof bulkBytes_, kBulkSizeMessage, [this] { bulk(); });
    }
  }

  /// Rank 0: the loaded bulk rounds' size, kLoadedBulkBytes or kMediumBytes,
  /// whichever fits in the budget left at twice the time the ping-pong's
  /// medium round trip predicts (ranks moving data at once take longer),
  /// or 0 (none) when neither fits or the class was not probed.
  uint64_t chooseBulkBytes() const {
    const int c = view_.numHosts() > 1 ? 1 : 0;
    if (probes_[c] < 0 || !(rtt_[c][1] < 1e29)) return 0;
    const double left = std::chrono::duration<double>(in_.budget).count() - secondsSince(start_);
    for (const size_t bytes : {kLoadedBulkBytes, kMediumBytes}) {
      const double round = rtt_[c][1] / 2 * static_cast<double>(bytes) / kMediumBytes;
      if (kLoadedBulkRounds * round * 2 <= left) return bytes;
    }
    return 0;
  }

  /// Every rank: the loaded bulk rounds, as the 8-byte ones with
  /// bulkBytes_ each: every rank's bytes in flight at once, as in a ring's
  /// step, where the lone ping-pong had the link and the cores to itself.
  /// Rank 0 takes the median round after the first and raises the slowest
  /// class's beta to it (fitLoadedBeta).
  void bulk() {
    if (bulkBytes_ == 0 || bulkBytes_ > kLoadedBulkBytes) return;
    bulkOut_.assign(bulkBytes_, 0);
    bulkIn_.assign(bulkBytes_, 0);
    const int p = t_.size(), r = t_.rank();
    loadedRounds((r + 1) % p, (r + p - 1) % p, bulkOut_, bulkIn_, kBulkBase, kLoadedBulkRounds, bulkSeconds_,
                 [this](double round, LinkCost& l) {
                   l.betaSecondsPerByte = fitLoadedBeta(round, static_cast<double>(bulkBytes_), l,
                                                        ModelSettings{}.roundOverheadSeconds);
                 });
  }

  /// Every rank, where rank 0's view has at least two hosts and each has
  /// at least two ranks: rounds of 8-byte messages, alternately "across"
  /// (local rank i of each host sends to local rank i of the next host and
  /// receives from the previous, for every i below the smallest host's rank
  /// count, all at once, as in recursive doubling's rounds between hosts)
  /// and "leaders" (local rank 0 of each host alone, as in a small
  /// hierarchical call's exchange). Rank 0 takes the typical round of each
  /// kind (typicalRound) and sets the inter-host link gap to what an
  /// across round took more per further message (fitLinkGap). Interleaved,
  /// so that both kinds see the same load.
  void across() {
    const TopologyView hosts(std::vector<int>(leaders_.begin(), leaders_.end()));
    const int n = hosts.numHosts();
    if (n < 2) return;
    size_t smallest = SIZE_MAX;
    for (int g = 0; g < n; ++g) smallest = std::min(smallest, hosts.ranksOnHost(g).size());
    if (smallest < 2) return;
    const int r = t_.rank(), h = hosts.hostOf(r);
    const auto& mine = hosts.ranksOnHost(h);
    const size_t i = static_cast<size_t>(std::find(mine.begin(), mine.end(), r) - mine.begin());
    if (i >= smallest) return;
    const int to = hosts.ranksOnHost((h + 1) % n)[i], from = hosts.ranksOnHost((h + n - 1) % n)[i];
    acrossOut_.assign(8, 0);
    acrossIn_.assign(8, 0);
    const int share = static_cast<int>(smallest);
    if (r == 0) ringStart_ = Clock::now();
    // Round k: across when k is even, leaders when odd (k = 0 is not timed).
    for (int k = 0; k < kAcrossRounds; ++k) {
      const bool leadersOnly = k % 2 == 1;
      if (leadersOnly && i != 0) continue;
      const uint32_t message = kAcrossMessageBase + static_cast<uint32_t>(k);
      sendDetached(to, acrossOut_.data(), acrossOut_.size(), message);
      recv(from, acrossIn_.data(), acrossIn_.size(), message, [this, k, r, share, leadersOnly] {
        if (r != 0) return;
        const auto now = Clock::now();
        if (k > 0) (leadersOnly ? leadersSeconds_ : acrossSeconds_).push_back(secondsBetween(ringStart_, now));
        ringStart_ = now;
        if (k == kAcrossRounds - 1) {
          costs_.interHost.gapSeconds = fitLinkGap(typicalRound(acrossSeconds_), share, typicalRound(leadersSeconds_));
        }
      });
    }
  }

  /// Every rank that calls it: `rounds` rounds of sending `out` to rank
  /// `to` and receiving `in` from rank `from` (message indices base + i),
  /// all at once, each round after the last one's receive. Detached: every
  /// rank's send and receive of a round are in flight together (a
  /// transport may complete a send only once it is matched). Rank 0 times
  /// rounds 2..rounds one by one into `seconds`, then hands their median
  /// and the slowest link class (inter-host on several hosts, else
  /// same-host) to `fit`.
  void loadedRounds(int to, int from, std::vector<char>& out, std::vector<char>& in, uint32_t base, int rounds,
                    std::vector<double>& seconds, std::function<void(double, LinkCost&)> fit) {
    const int r = t_.rank();
    if (r == 0) ringStart_ = Clock::now();
    for (int i = 0; i < rounds; ++i) {
      const uint32_t message = base + static_cast<uint32_t>(i);
      sendDetached(to, out.data(), out.size(), message);
      recv(from, in.data(), in.size(), message, [this, i, r, rounds, &seconds, fit] {
        if (r != 0) return;
        const auto now = Clock::now();
        if (i > 0) seconds.push_back(std::chrono::duration<double>(now - ringStart_).count());
        ringStart_ = now;
        if (i == rounds - 1) fit(medianOf(seconds), view_.numHosts() > 1 ? costs_.interHost : costs_.sameHost);
      });
    }
  }

  /// Every rank of rank 0's host, when each sees the same shared-memory
  /// group, all at once: hand-offs through the mailboxes with no data. Rank 0 sets
  /// the shared-memory hand-off to the median one (what a flag costs when
  /// every rank of the host waits for the others, as in a collective).
  void shmLoad() {
    transport::ShmGroup* g = t_.sharedMemory();
    if (!g || g->localSize() < 2) return;
    const bool measures = t_.rank() == 0;
    for (int i = 0; i < kShmSyncRounds; ++i) {
      shmHandOff(*g, [this, i, measures] {
        if (!measures) return;
        const auto now = Clock::now();
        if (i > 0) shmRounds_.push_back(std::chrono::duration<double>(now - shmStart_).count());
        shmStart_ = now;
        if (i == kShmSyncRounds - 1) costs_.shmSyncSeconds = medianOf(shmRounds_);
      });
    }
    shmData(*g);
  }

  /// The data rounds (kShmDataRounds): every rank of the host at once.
  void shmData(transport::ShmGroup& g) {
    const size_t l = static_cast<size_t>(g.localSize());
    const size_t sliceFloats = std::min(g.bufferBytes(), kShmDataMaxBytes) / (l * sizeof(float));
    if (sliceFloats == 0) return;
    shmSliceFloats_ = sliceFloats;
    const size_t roundFloats = sliceFloats * l;
    call([this, roundFloats] {
      shmIn_.assign(roundFloats * kShmDataRounds, 1.0f);
      shmOut_.assign(roundFloats * kShmDataRounds, 0.0f);
      shmReduce_ = kernels::reduceFunction(DataType::kFloat32, ReduceOp::kSum, kernels::resolveSimd("auto"));
    });
    const bool measures = t_.rank() == 0;
    for (int i = 0; i < kShmDataRounds; ++i) {
      const size_t base = static_cast<size_t>(i) * roundFloats;
      const int me = g.localRank();
      const size_t mine = static_cast<size_t>(me) * sliceFloats;
      call([this, &g, base, mine, roundFloats, sliceFloats] {
        float* buf = reinterpret_cast<float*>(g.buffer(g.localRank(), 0));
        if (mine) std::memcpy(buf, shmIn_.data() + base, mine * sizeof(float));
        const size_t after = mine + sliceFloats;
        std::memcpy(buf + after, shmIn_.data() + base + after, (roundFloats - after) * sizeof(float));
      });
      shmHandOff(g, {});
      call([this, &g, base, mine, sliceFloats, me] {
        float* acc = reinterpret_cast<float*>(g.buffer(me, 0)) + mine;
        const float* prev = nullptr;
        for (int q = 0; q < g.localSize(); ++q) {
          const float* src = q == me ? shmIn_.data() + base + mine : reinterpret_cast<const float*>(g.buffer(q, 0)) + mine;
          if (prev) shmReduce_(acc, prev, src, sliceFloats);
          prev = prev ? acc : src;
        }
        std::memcpy(shmOut_.data() + base + mine, acc, sliceFloats * sizeof(float));
      });
      shmHandOff(g, {});
      call([this, &g, base, sliceFloats, me] {
        for (int q = 0; q < g.localSize(); ++q) {
          if (q == me) continue;
          const size_t at = static_cast<size_t>(q) * sliceFloats;
          std::memcpy(shmOut_.data() + base + at, reinterpret_cast<const float*>(g.buffer(q, 0)) + at,
                      sliceFloats * sizeof(float));
        }
      });
      shmHandOff(g, [this, i, measures] {
        if (!measures) return;
        const auto now = Clock::now();
        if (i > 0) shmDataRounds_.push_back(std::chrono::duration<double>(now - shmStart_).count());
        shmStart_ = now;
      });
    }
    call([this] {
      shmIn_ = {};
      shmOut_ = {};
    });
  }

  /// One hand-off among the host's ranks: publish a new round, wait until
  /// every peer published it too, mark it read (the shm allreduce's flags,
  /// with no data and no fingerprint).
  void shmHandOff(transport::ShmGroup& g, std::function<void()> then) {
    poll(
        [this, &g] {
          const int me = g.localRank();
          // Every rank of the host takes as many rounds, in the same order.
          if (shmRound_ == 0) shmRound_ = g.takeRound();
          if (!shmPublished_) {
            if (g.peerStillReading(shmRound_) >= 0) return false;
            g.publish(static_cast<int>(shmRound_ & 1), shmRound_, 0);
            shmPublished_ = true;
          }
          for (int q = 0; q < g.localSize(); ++q) {
            if (q != me && g.block(q).mailbox[shmRound_ & 1].ready.load(std::memory_order_acquire) < shmRound_) {
              return false;
            }
          }
          g.block(me).consumed.store(shmRound_, std::memory_order_release);
          shmRound_ = 0;
          shmPublished_ = false;
          return true;
        },
        std::move(then));
  }

  /// The probe's half: echo every message; the last medium ping says
  /// whether a large one follows.
  void respond(int c) {
    const int peer = 0;
    small_.assign(kSmallBytes, 0);
    medium_.assign(kMediumBytes, 0);
    uint32_t m = kClassBase[c];
    for (int i = 0; i < kSmallReps; ++i, m += 2) {
      recv(peer, small_.data(), kSmallBytes, m, {}, true);
      send(peer, small_.data(), kSmallBytes, m + 1);
    }
    for (int i = 0; i < kMediumReps; ++i, m += 2) {
      recv(peer, medium_.data(), kMediumBytes, m, {}, true);
      send(peer, medium_.data(), kMediumBytes, m + 1);
    }
    call([this, peer, m] {
      if (medium_[0] != 1) return;
      big_.assign(kLargeBytes, 0);
      recv(peer, big_.data(), kLargeBytes, m, {}, true);
      send(peer, big_.data(), kLargeBytes, m + 1);
    });
  }

  void conclude(int c) {
    const bool large = large_[c];
    LinkCost& l = c == 0 ? costs_.sameHost : costs_.interHost;
    l = fitLink(rtt_[c][0], large ? rtt_[c][2] : rtt_[c][1], large ? kLargeBytes : kMediumBytes,
                costs_.copySecondsPerByte);
  }

  transport::Transport& t_;
  transport::Tag tag_;
  TopologyView view_;
  SetupInput in_;
  std::shared_ptr<SetupResult> result_;
  int probes_[2] = {-1, -1};  ///< the peer rank 0 probes per class (same host, other host), or -1
  std::vector<Step> steps_;
  size_t next_ = 0;
  size_t insertAt_ = 0;
  transport::RequestPtr current_;
  std::vector<transport::RequestPtr> detached_;  ///< sends in flight that no step waits for
  Wire header_, final_;
  std::string text_;
  MachineCosts costs_;
  std::vector<char> small_, medium_, big_, ringOut_, ringIn_;
  std::vector<int32_t> leaders_;  ///< rank 0's view of the hosts (sent, or received)
  Clock::time_point start_, t0_, ringStart_;  // ringStart_: the last round's end (rank 0)
  std::vector<double> roundSeconds_;
  std::vector<char> acrossOut_, acrossIn_;  ///< the across rounds' buffers
  std::vector<double> acrossSeconds_, leadersSeconds_;  ///< rank 0's across and leaders round times
  uint64_t bulkBytes_ = 0;              ///< the loaded bulk rounds' size (rank 0's choice)
  std::vector<char> bulkOut_, bulkIn_;  ///< the loaded bulk rounds' buffers
  std::vector<double> bulkSeconds_;     ///< rank 0's loaded bulk round times
  // The shared-memory phase: the round in progress and whether it is
  // published; rank 0's hand-off times.
  int32_t shmSize_ = 0;                ///< the shared-memory group this rank sees (0: none)
  std::vector<int32_t> peerShmSizes_;  ///< a host's first rank: what each rank of its host sees
  int32_t hostShm_ = 0;                ///< whether this rank's host runs the shared-memory phase
  uint64_t shmRound_ = 0;  ///< 0: none taken yet
  bool shmPublished_ = false;
  Clock::time_point shmStart_;
  std::vector<double> shmRounds_;
  // The data rounds: a slice's floats, each rank's input and output (all
  // rounds), the kernel; rank 0's round times.
  size_t shmSliceFloats_ = 0;
  std::vector<float> shmIn_, shmOut_;
  kernels::ReduceFn shmReduce_ = nullptr;
  std::vector<double> shmDataRounds_;
  std::array<double, 3> rtt_[2] = {};
  bool large_[2] = {false, false};
};

}  // namespace

LinkCost fitLink(double smallRoundTrip, double bulkRoundTrip, size_t bulkBytes, double copySecondsPerByte) {
  const double oneWay = bulkRoundTrip / 2;
  // On a loaded machine a ping can lose its core for milliseconds: a small
  // message then "takes" longer than a large one, and the plain fit gave
  // a negative beta (shown as 10000 GB/s) that made message algorithms
  // look free. Neither bound loses anything on an idle machine.
  const double alpha = std::min(smallRoundTrip / 2, oneWay);
  const double floorBeta = std::max(copySecondsPerByte, 1e-13);
  return {alpha, std::max((oneWay - alpha) / static_cast<double>(bulkBytes), floorBeta)};
}

double fitShmByteFactor(double roundSeconds, double roundBytes, int localRanks, const MachineCosts& c) {
  const double l = localRanks;
  const double formula = (2 * l - 1) / l * c.copySecondsPerByte + (l - 1) / l * c.reduceSecondsPerByte;
  if (localRanks < 2 || !(roundBytes > 0) || !(formula > 0) || !(roundSeconds > 0)) return 1;
  const double perByte = std::max(0.0, roundSeconds - 3 * c.shmSyncSeconds) / roundBytes;
  return std::clamp(perByte / formula, kShmByteFactorMin, kShmByteFactorMax);
}

double fitLoadedBeta(double roundSeconds, double bytes, const LinkCost& lone, double roundOverheadSeconds) {
  if (!(bytes > 0) || !(roundSeconds > 0)) return lone.betaSecondsPerByte;
  return std::max(lone.betaSecondsPerByte, (roundSeconds - roundOverheadSeconds - lone.alphaSeconds) / bytes);
}

double fitLinkGap(double acrossSeconds, int share, double leadersSeconds) {
  if (share < 2 || !(acrossSeconds > leadersSeconds) || !(leadersSeconds > 0)) return 0;
  return std::min((acrossSeconds - leadersSeconds) / (share - 1), leadersSeconds);
}

double typicalRound(const std::vector<double>& rounds) {
  // Rounds come in bursts where ranks share cores (one long, then several
  // that found their data waiting): the median of single rounds is then
  // that of the short ones. Windows of kTypicalRoundWindow rounds average
  // the bursts; their median drops a window with a stall.
  std::vector<double> means;
  for (size_t at = 0; at + kTypicalRoundWindow <= rounds.size(); at += kTypicalRoundWindow) {
    double sum = 0;
    for (size_t j = 0; j < kTypicalRoundWindow; ++j) sum += rounds[at + j];
    means.push_back(sum / kTypicalRoundWindow);
  }
  return means.empty() ? medianOf(rounds) : medianOf(means);
}

double fitRoundFloor(double roundSeconds, double roundOverheadSeconds) {
  return std::max(0.0, roundSeconds - roundOverheadSeconds);
}

MachineCosts measureLocalCosts() {
  // Once per process: the core does not change, and communicators are
  // created often (tests create hundreds).
  static const MachineCosts measured = [] {
    MachineCosts c = MachineCosts::defaults();
    // 8 MiB, beyond the caches, as the large calls whose choice depends on it.
    constexpr size_t kFloats = 2 * 1024 * 1024;
    std::vector<float> a(kFloats, 1.0f), b(kFloats, 2.0f), d(kFloats, 0.0f);
    const auto reduce = kernels::reduceFunction(DataType::kFloat32, ReduceOp::kSum, kernels::resolveSimd("auto"));
    double bestCopy = 1e30, bestReduce = 1e30;
    for (int i = 0; i < 3; ++i) {
      auto t0 = Clock::now();
      std::memcpy(d.data(), a.data(), kFloats * sizeof(float));
      bestCopy = std::min(bestCopy, secondsSince(t0));
      t0 = Clock::now();
      reduce(d.data(), a.data(), b.data(), kFloats);
      bestReduce = std::min(bestReduce, secondsSince(t0));
    }
    const double bytes = kFloats * sizeof(float);
    // A clock too coarse to see the pass keeps the default.
    if (bestCopy > 0) c.copySecondsPerByte = bestCopy / bytes;
    if (bestReduce > 0) c.reduceSecondsPerByte = bestReduce / bytes;
    return c;
  }();
  return measured;
}

std::string formatCalibration(const MachineCosts& c, const std::string& layout) {
  std::ostringstream out;
  out.precision(17);
  out << "# gradcomm calibration (GRADCOMM_CALIBRATE=path): seconds and seconds per byte; from the "
      << (c.source.empty() ? "defaults" : c.source) << " costs\n";
  out << "layout " << layout << "\n";
  out << "same_host " << c.sameHost.alphaSeconds << " " << c.sameHost.betaSecondsPerByte << " "
      << c.sameHost.roundFloorSeconds << "\n";
  out << "inter_host " << c.interHost.alphaSeconds << " " << c.interHost.betaSecondsPerByte << " "
      << c.interHost.roundFloorSeconds << " " << c.interHost.gapSeconds << "\n";
  out << "copy " << c.copySecondsPerByte << "\n";
  out << "reduce " << c.reduceSecondsPerByte << "\n";
  out << "shm_sync " << c.shmSyncSeconds << "\n";
  out << "shm_bytes " << c.shmByteFactor << "\n";
  return out.str();
}

MachineCosts parseCalibration(const std::string& text, const std::string& origin, std::string* layout) {
  MachineCosts c = MachineCosts::defaults();
  c.source = "file";
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  bool seen[5] = {};
  while (std::getline(in, raw)) {
    ++lineNo;
    const std::string where = origin + " line " + std::to_string(lineNo) + ": ";
    std::istringstream words(raw.substr(0, raw.find('#')));
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty()) continue;
    auto number = [&](size_t i) {
      char* end = nullptr;
      const double v = std::strtod(w[i].c_str(), &end);
      if (!end || *end || !(v >= 0) || v > 1) {
        throw ConfigError(where + "'" + w[i] + "' is not a time in seconds between 0 and 1");
      }
      return v;
    };
    auto expect = [&](size_t n) {
      if (w.size() != n) {
        throw ConfigError(where + "'" + w[0] + "' takes " + std::to_string(n - 1) + " value(s), got " +
                          std::to_string(w.size() - 1));
      }
    };
    if (w[0] == "layout") {
      // One word (layoutName()). Files of earlier versions named uneven
      // layouts in words ("4 rank(s) on 2 host(s) (1+3)"): kept whole, such
      // a layout matches no job, which measures again and rewrites the file.
      if (w.size() < 2) expect(2);
      if (layout) {
        *layout = w[1];
        for (size_t i = 2; i < w.size(); ++i) *layout += " " + w[i];
      }
    } else if (w[0] == "same_host" || w[0] == "inter_host") {
      // alpha, beta, the loaded round's floor and, across hosts, the
      // link gap (files of earlier versions have no floor or gap: none).
      const bool inter = w[0] == "inter_host";
      if (w.size() < 3 || w.size() > (inter ? 5u : 4u)) {
        throw ConfigError(where + "'" + w[0] + "' takes " + (inter ? "2 to 4" : "2 or 3") +
                          " values (alpha, beta, loaded round floor" + (inter ? ", link gap" : "") + "), got " +
                          std::to_string(w.size() - 1));
      }
      LinkCost& l = inter ? c.interHost : c.sameHost;
      l = {number(1), number(2), w.size() >= 4 ? number(3) : 0.0, w.size() == 5 ? number(4) : 0.0};
      seen[w[0] == "same_host" ? 0 : 1] = true;
    } else if (w[0] == "copy") {
      expect(2);
      c.copySecondsPerByte = number(1);
      seen[2] = true;
    } else if (w[0] == "reduce") {
      expect(2);
      c.reduceSecondsPerByte = number(1);
      seen[3] = true;
    } else if (w[0] == "shm_sync") {
      expect(2);
      c.shmSyncSeconds = number(1);
      seen[4] = true;
    } else if (w[0] == "shm_bytes") {
      // A factor, not a time (files of earlier versions have none: 1).
      expect(2);
      char* end = nullptr;
      const double v = std::strtod(w[1].c_str(), &end);
      if (!end || *end || !(v >= kShmByteFactorMin) || !(v <= kShmByteFactorMax)) {
        throw ConfigError(where + "'" + w[1] + "' is not a shared-memory byte factor between 0.25 and 16");
      }
      c.shmByteFactor = v;
    } else {
      throw ConfigError(where + "unknown key '" + w[0] +
                        "' (expected layout, same_host, inter_host, copy, reduce, shm_sync or shm_bytes)");
    }
  }
  const char* names[5] = {"same_host", "inter_host", "copy", "reduce", "shm_sync"};
  for (int i = 0; i < 5; ++i) {
    if (!seen[i]) throw ConfigError(origin + ": no '" + names[i] + "' line (a calibration file has all five)");
  }
  return c;
}

std::unique_ptr<SetupExchange> setupExchange(transport::Transport& t, const transport::Tag& tag, const TopologyView& view,
                                             const SetupInput& input, std::shared_ptr<SetupResult> result) {
  return std::make_unique<SetupExchangeImpl>(t, tag, view, input, std::move(result));
}

TopologyView detect(const transport::HostLayout& layout) {
  // Every rank's lowest host-mate, from the transport's host layout (equal
  // on every rank). A transport that does not know the other hosts gets a
  // host per rank: the same answer on every rank, which is what matters.
  std::vector<int> leaders(static_cast<size_t>(layout.size));
  for (int r = 0; r < layout.size; ++r) leaders[static_cast<size_t>(r)] = r;
  for (const auto& host : layout.hosts) {
    for (int r : host) {
      if (r < 0 || r >= layout.size) {
        throw InternalError("host layout names rank " + std::to_string(r) + " of " + std::to_string(layout.size));
      }
      leaders[static_cast<size_t>(r)] = host.front();
    }
  }
  TopologyView view(leaders);
  view.setHardware(detectHardware());
  view.setHostLabel(layout.hostName);
  return view;
}

}  // namespace gradcomm::topology
