#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradcomm/types.hpp"
#include "topology/topology_view.hpp"

namespace gradcomm::topology {

/// Latency and inverse bandwidth of one link class (alpha-beta model).
struct LinkCost {
  double alphaSeconds = 0;        ///< time of an empty message
  double betaSecondsPerByte = 0;  ///< added time per byte
  /// The least a round costs (before the model's per-round overhead) when
  /// every rank sends at once: where ranks share cores, a round waits for
  /// its peers to get one, and that wait overlaps the transfer, so a round
  /// costs max(floor, alpha + bytes x beta). 0: no floor (the ping-pong's
  /// alpha is the whole fixed cost).
  double roundFloorSeconds = 0;
  /// What each further message of a round that leaves or enters a host by
  /// the same link adds, whatever its size (beyond the bytes, which share
  /// the link's bandwidth): the small-message gap of a host's link (a NIC
  /// that serves several messages at once has next to none). Calibration
  /// measures it across hosts only (where every host has several ranks);
  /// 0: none.
  double gapSeconds = 0;
  /// What a message alone costs at least: alpha, or the floor when higher.
  double fixedSeconds() const { return alphaSeconds > roundFloorSeconds ? alphaSeconds : roundFloorSeconds; }
};

/// The machine as the cost model sees it. Every rank of a communicator
/// holds identical values (rank 0's calibration, sent to all), so every
/// rank predicts, and chooses, alike.
struct MachineCosts {
  LinkCost sameHost;
  LinkCost interHost;
  double copySecondsPerByte = 0;    ///< memcpy on one core (shared-memory staging)
  double reduceSecondsPerByte = 0;  ///< the float32 sum kernel, per input byte
  double shmSyncSeconds = 0;        ///< one flag hand-off between ranks of a host
  /// What a byte of a shared-memory call of several rounds costs, as a
  /// multiple of what copySecondsPerByte and
  /// reduceSecondsPerByte price it at: calibration measures it with every
  /// rank of rank 0's host moving data at once through the segment (data
  /// that another core just wrote, ranks sharing cores). 1: not measured.
  double shmByteFactor = 1;
  /// Where the numbers came from: "defaults", "calibrated", "file PATH".
  std::string source = "defaults";

  /// Fixed constants of a host with idle cores and an unknown NIC: same
  /// host 2 us and 5 GB/s, across hosts 20 us and 1.25 GB/s (10 Gbit/s),
  /// copy 10 GB/s, reduce 4 GB/s, shared-memory hand-off 0.5 us. The base
  /// that forHardware() adjusts, and what a calibration file's missing
  /// lines keep.
  static MachineCosts defaults();
  /// The static model (GRADCOMM_CALIBRATE=0, the default): defaults()
  /// adjusted by facts that do not move between runs, so the same job
  /// chooses the same algorithms every time. `ranksOnHost` ranks share
  /// `cpus` CPUs (where they outnumber them every byte moved on the host
  /// costs ranks / cpus times more, and a round waits for peers to get a
  /// core); `nicBitsPerSecond` is the host's fastest NIC (0: unknown, 10
  /// Gbit/s assumed). Rank 0 computes it from its own host, and every rank
  /// takes rank 0's numbers at creation.
  static MachineCosts forHardware(int ranksOnHost, int cpus, double nicBitsPerSecond);
  const LinkCost& link(LinkClass c) const { return c == LinkClass::kInterHost ? interHost : sameHost; }
  /// "same-host 2.0us 5.00GB/s, inter-host ..." for logs and gradcomm-info.
  std::string describe() const;
};

/// `c` for a host whose `ranksOnHost` ranks share `cpus` CPUs: where the
/// ranks outnumber the CPUs, each gets cpus / ranks of one, so a byte
/// copied, reduced or sent to a rank of the same host (a copy too) costs
/// ranks / cpus times what it costs on an idle core (the condition under
/// which waiting ranks yield; see decideWait).
MachineCosts shareCores(MachineCosts c, int ranksOnHost, int cpus);

/// Algorithm parameters that change predicted times.
struct ModelSettings {
  size_t segmentBytes = 256 * 1024;  ///< GRADCOMM_SEGMENT_SIZE (tree pipelines)
  size_t shmChunkBytes = 128 * 1024; ///< GRADCOMM_SHM_CHUNK (shm rounds)
  /// gradcomm's own cost of one round of messages (posting and completing
  /// its transfers through the plan runner and the engine), on top of the
  /// transport's alpha that calibration measures with bare ping-pongs
  /// (several times that alpha on one host).
  double roundOverheadSeconds = 2e-6;
  /// The hierarchy's exchange between hosts: slices (bytes / ranks per
  /// host) of at most this many bytes go by recursive doubling, larger ones
  /// by a ring, except on two hosts (GRADCOMM_HIER_RD_SIZE;
  /// hierExchangesByRd, the rule algorithms::Tuning's users share).
  size_t hierRdSliceBytes = 16 * 1024;
  /// The hierarchy's smallest slice (GRADCOMM_HIER_SLICE_MIN;
  /// algorithms::Tuning, the same rule: hierSlicesUsed).
  size_t hierSliceMinBytes = 32 * 1024;
};

/// Whether the hierarchical allreduce sums a slice of `sliceBytes` between
/// `hosts` hosts by recursive doubling (else a ring): up to `rdSliceBytes`
/// (GRADCOMM_HIER_RD_SIZE), where it takes fewer rounds, and on two hosts
/// at any size, where it sends the same bytes as the ring (the whole slice
/// once, against half of it twice) in one round instead of two, unless
/// `rdSliceBytes` is 0 (GRADCOMM_HIER_RD_SIZE=0: always rings). From 4
/// hosts recursive doubling sends log2(hosts) slices against the ring's
/// 2 (hosts - 1) / hosts.
bool hierExchangesByRd(size_t sliceBytes, size_t hosts, size_t rdSliceBytes);

/// Whether recursive doubling between hosts, run for each slice of a
/// hierarchical call, sends at most one message between any two ranks
/// (allreduce_hier.cpp: slice j belongs to local rank j % L_h on host h):
/// true on hosts of equal size, and on uneven hosts where every two hosts
/// that recursive doubling pairs have rank counts whose least common
/// multiple is at least the largest host's (hosts of 1 and 3, 2 and 3,
/// 4 and 3; not 2, 2 and 4, whose two small hosts pair their slices 0
/// and 2 twice). Plans test it against every layout of up to 4 hosts.
bool hierSlicesPairOnce(const TopologyView& view);

/// Pipeline segments per slice in one wave of a hierarchical allreduce
/// (allreduce_hier.cpp: each wave is a whole hierarchical allreduce of its
/// range, and consecutive waves overlap).
constexpr size_t kHierWaveSegments = 16;

/// Elements in each wave (the last may hold fewer) of a hierarchical
/// allreduce with `slices` slices per wave: kHierWaveSegments segments of
/// `segmentBytes` (GRADCOMM_SEGMENT_SIZE) per slice.
size_t hierWaveElems(size_t slices, size_t segmentBytes, size_t elemSize);

/// Whether a hierarchical allreduce of `count` elements signs its messages
/// between hosts instead of running the engine's call check: several
/// hosts, one with several ranks, whose slices pair their owners once
/// (hierSlicesPairOnce), slices that go by recursive doubling (`rdSliceBytes`,
/// GRADCOMM_HIER_RD_SIZE) within kSignedPayloadLimit, and a call of one
/// wave (hierWaveElems). The algorithm (allreduce_hier.cpp) and the model
/// ask the same question here.
bool hierSignsMessages(const TopologyView& view, size_t count, size_t elemSize, size_t rdSliceBytes,
                       size_t segmentBytes, size_t sliceMinBytes);

/// Slices a hierarchical allreduce (or one wave of it) of `count` elements
/// is cut into: one per rank of the largest host (`slices`), fewer where
/// they would hold less than `sliceMinBytes` each (GRADCOMM_HIER_SLICE_MIN;
/// at least one; 0: always `slices`). Slice j belongs to local rank j % L_h,
/// so a small call exchanges between hosts from each host's first ranks
/// only: fewer messages on each host's link and fewer ranks that poll it.
size_t hierSlicesUsed(size_t slices, size_t count, size_t elemSize, size_t sliceMinBytes);

/// Halving-doubling (allreduce_hd) over the ranks 0..size-1 of `view`,
/// whose first 2(size - p2) ranks fold in pairs (the odd rank of each pair
/// stays in the core, p2 the largest power of two <= size): the exchange
/// distances, in core ranks, at which every pair of partners shares a host,
/// as a bit set (distance 2^k is bit k). On 2x2 (ranks 0,1 | 2,3): bit 0
/// (distance 1).
uint32_t hdSameHostDistances(const TopologyView& view);

/// The order of halving-doubling's reduce-scatter rounds over `p2` core
/// ranks (its allgather retraces them backwards): the distances in
/// `sameHostDistances` first, then the others, each from the largest down.
/// The first round moves half the vector, the next a quarter, so the
/// largest exchanges stay inside hosts where they can (plain distance
/// halving sends half the vector across hosts in its first round, and is
/// about twice as slow). Without such distances: p2/2, p2/4, ..., 1.
std::vector<int> hdHalvingOrder(int p2, uint32_t sameHostDistances);

/// Predicts the time of each algorithm for a call from the topology and the
/// machine's costs: per algorithm a sum over its communication rounds of
/// the slowest message in the round (alpha + bytes x beta of its link
/// class, or the class's loaded-round floor when higher; beta multiplied
/// by the number of messages sharing a host's network link in that
/// round; a rank that sends or receives several messages in the round
/// adds the fixed cost of each after its costliest), plus the reduction's
/// bytes x cost.
class CostModel {
 public:
  CostModel(TopologyView view, MachineCosts costs, ModelSettings settings = {});

  /// Predicted seconds of `algorithm` for `collective` moving `bytes` (the
  /// selector's callBytes: the whole buffer; allgather and reduce-scatter
  /// the whole size x count buffer); nullopt when the model has no formula
  /// for that name or the algorithm cannot apply to this topology (shm
  /// across hosts; hier on one host or one rank per host).
  std::optional<double> predict(Collective collective, const std::string& algorithm, size_t bytes) const;
  /// What the engine's call check adds to `algorithm`'s call: the software
  /// of one more message (roundOverheadSeconds), or 0 where the algorithm
  /// compares calls itself or signs its messages (the rules of
  /// Algorithm::checksCalls and signsMessages).
  double callCheckSeconds(Collective collective, const std::string& algorithm, size_t bytes) const;
  /// Names with a formula for `collective`.
  static std::vector<std::string> modelled(Collective collective);

  const MachineCosts& costs() const { return costs_; }

 private:
  std::optional<double> predictAlgorithm(Collective collective, const std::string& algorithm, size_t bytes) const;
  using Pairs = std::vector<std::pair<int, int>>;  ///< (sender, receiver) of one round
  /// Time of one round where each listed message carries `bytes`.
  double roundSeconds(const Pairs& messages, double bytes) const;
  /// Rounds on ranks `group` (indices into it): recursive doubling, ring, ...
  double ringAllreduce(const std::vector<int>& group, double bytes) const;
  double ringPass(const std::vector<int>& group, double bytes, bool reduce) const;
  /// Recursive doubling on each of `groups` (of equal size) at once: their
  /// rounds share links.
  double recursiveDoubling(const std::vector<std::vector<int>>& groups, double bytes) const;
  double halvingDoubling(const std::vector<int>& group, double bytes) const;
  double binomialTree(const std::vector<int>& group, double bytes, bool reduce) const;
  /// Binomial trees on each of `groups` at once (their rounds share links).
  double binomialTrees(const std::vector<std::vector<int>>& groups, double bytes, bool reduce) const;
  /// A segmented tree: the first segment's trip through every level, then
  /// the time per further segment, set by the busiest link or rank.
  struct TreeStream {
    double fill = 0;
    double perSegment = 0;
    double segments = 1;
  };
  TreeStream treeStream(const std::vector<std::vector<int>>& groups, double bytes, bool reduce) const;
  double treeAllreduce(const std::vector<int>& group, double bytes) const;
  double dissemination(const std::vector<int>& group) const;
  double sharedMemoryAllreduce(int localRanks, double bytes) const;
  /// The multiplier of a shared-memory phase's byte costs in a call of
  /// `bytes` on hosts of `local` ranks: MachineCosts::shmByteFactor for a
  /// call of more than one round of the shm allreduce (local x
  /// GRADCOMM_SHM_CHUNK bytes), whose data streams through memory as in
  /// calibration's data rounds; else 1 (one round's data mostly stays in
  /// the caches).
  double shmByteScale(double bytes, double local) const;
  double hierarchical(double bytes) const;
  double hierarchicalBroadcast(double bytes) const;
  double hierarchicalAllgather(double bytes) const;
  /// groups[i]: the rank of local index i on every host (uniform hosts).
  std::vector<std::vector<int>> sameLocalIndex() const;
  /// groups[j]: the owner of hier's slice j on every host (any hosts).
  std::vector<std::vector<int>> sliceOwners(size_t used) const;
  /// The folding of non-power-of-two groups (rd, hd): the odd rank of each
  /// of the first 2(p - p2) pairs sends to the even one, and back at the end.
  double foldSeconds(const std::vector<std::vector<int>>& groups, double bytes, bool reduce) const;
  std::vector<int> everyRank() const;

  TopologyView view_;
  MachineCosts costs_;
  ModelSettings settings_;
};

}  // namespace gradcomm::topology
