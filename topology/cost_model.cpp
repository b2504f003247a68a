#include "topology/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "transport/call_signature.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::topology {
namespace {

/// Which rank (an index into the group) core index c is after folding the
/// first `extra` pairs: the odd rank of each of them (the even one hands
/// its data to it; patterns::unfold), then the unfolded ranks.
int coreIndex(int c, int extra) { return c < extra ? 2 * c + 1 : c + extra; }

int floorPow2(int p) {
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  return p2;
}

std::string linkText(const char* name, const LinkCost& l) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.2fus %.2fGB/s", name, l.alphaSeconds * 1e6,
                l.betaSecondsPerByte > 0 ? 1e-9 / l.betaSecondsPerByte : 0.0);
  std::string text = buf;
  if (l.roundFloorSeconds > 0) {
    std::snprintf(buf, sizeof buf, " (loaded round >= %.2fus)", l.roundFloorSeconds * 1e6);
    text += buf;
  }
  if (l.gapSeconds > 0) {
    std::snprintf(buf, sizeof buf, " (+%.2fus per further message on a host's link)", l.gapSeconds * 1e6);
    text += buf;
  }
  return text;
}

}  // namespace

bool hierExchangesByRd(size_t sliceBytes, size_t hosts, size_t rdSliceBytes) {
  return sliceBytes <= rdSliceBytes || (hosts == 2 && rdSliceBytes > 0);
}

bool hierSlicesPairOnce(const TopologyView& view) {
  // Slice j belongs to local rank j % L_h on host h, for j < S (the
  // largest host's L). Slices j and j' meet the same two owners on hosts h
  // and g exactly when they are congruent modulo both L_h and L_g, i.e.
  // modulo lcm(L_h, L_g): no two slices of the S do unless lcm >= S. Only
  // hosts that recursive doubling pairs exchange (patterns::fold: the even
  // host of each of the first H - H2 pairs hands its data to the odd one,
  // which then takes part as core host i; the other core hosts follow).
  const int hosts = view.numHosts();
  const size_t s = static_cast<size_t>(view.maxRanksPerHost());
  auto clash = [&](int h, int g) {
    return std::lcm(view.ranksOnHost(h).size(), view.ranksOnHost(g).size()) < s;
  };
  const int p2 = floorPow2(std::max(hosts, 1)), extra = hosts - p2;
  auto core = [&](int c) { return c < extra ? 2 * c + 1 : c + extra; };
  for (int i = 0; i < extra; ++i) {
    if (clash(2 * i, 2 * i + 1)) return false;
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    for (int c = 0; c < p2; ++c) {
      if (clash(core(c), core(c ^ mask))) return false;
    }
  }
  return true;
}

size_t hierWaveElems(size_t slices, size_t segmentBytes, size_t elemSize) {
  return std::max<size_t>(1, kHierWaveSegments * std::max<size_t>(slices, 1) *
                                 std::max<size_t>(1, segmentBytes / std::max<size_t>(elemSize, 1)));
}

size_t hierSlicesUsed(size_t slices, size_t count, size_t elemSize, size_t sliceMinBytes) {
  slices = std::max<size_t>(slices, 1);
  if (sliceMinBytes == 0) return slices;
  const size_t minElems = std::max<size_t>(1, sliceMinBytes / std::max<size_t>(elemSize, 1));
  return std::clamp<size_t>(count / minElems, 1, slices);
}

uint32_t hdSameHostDistances(const TopologyView& view) {
  const int p = view.size();
  const int p2 = floorPow2(std::max(p, 1)), extra = p - p2;
  uint32_t set = 0;
  for (int k = 0; k < 31 && (1 << k) < p2; ++k) {
    bool same = true;
    for (int c = 0; c < p2 && same; ++c) {
      same = view.hostOf(coreIndex(c, extra)) == view.hostOf(coreIndex(c ^ (1 << k), extra));
    }
    if (same) set |= uint32_t{1} << k;
  }
  return set;
}

std::vector<int> hdHalvingOrder(int p2, uint32_t sameHostDistances) {
  std::vector<int> order;
  for (const bool same : {true, false}) {
    for (int k = 30; k >= 0; --k) {
      if ((1 << k) >= p2) continue;
      const bool isSame = (sameHostDistances >> k & 1u) != 0;
      if (isSame == same) order.push_back(1 << k);
    }
  }
  return order;
}

bool hierSignsMessages(const TopologyView& view, size_t count, size_t elemSize, size_t rdSliceBytes,
                       size_t segmentBytes, size_t sliceMinBytes) {
  // At most one message per ordered pair of ranks in a call: slices that
  // pair their owners once (always on equal hosts; the loop over host
  // pairs is paid on uneven ones only), and one wave: a call of several
  // sends a pair a message per wave under the call's one tag, and a later
  // wave's may leave first (a fold's hand-back waits on its own wave's
  // receive). Where no host has fewer ranks than the call has slices, each
  // owner has one slice, and two slices never share an owner.
  const size_t slices = static_cast<size_t>(std::max(view.maxRanksPerHost(), 1));
  const size_t used = hierSlicesUsed(slices, count, elemSize, sliceMinBytes);
  const size_t sliceBytes = (count + used - 1) / used * elemSize;
  auto eachOwnsOne = [&] {
    for (int h = 0; h < view.numHosts(); ++h) {
      if (view.ranksOnHost(h).size() < used) return false;
    }
    return true;
  };
  return view.numHosts() > 1 && slices > 1 && count > 0 &&
         sliceBytes <= std::min(rdSliceBytes, transport::kSignedPayloadLimit) &&
         count <= hierWaveElems(slices, segmentBytes, elemSize) &&
         (view.uniformHosts() || eachOwnsOne() || hierSlicesPairOnce(view));
}

MachineCosts MachineCosts::defaults() {
  MachineCosts c;
  c.sameHost = {2e-6, 1.0 / 5e9};
  c.interHost = {20e-6, 1.0 / 1.25e9};
  c.copySecondsPerByte = 1.0 / 10e9;
  c.reduceSecondsPerByte = 1.0 / 4e9;
  c.shmSyncSeconds = 0.5e-6;
  c.source = "defaults";
  return c;
}

MachineCosts shareCores(MachineCosts c, int ranksOnHost, int cpus) {
  if (cpus > 0 && ranksOnHost > cpus) {
    const double share = static_cast<double>(ranksOnHost) / cpus;
    c.copySecondsPerByte *= share;
    c.reduceSecondsPerByte *= share;
    c.sameHost.betaSecondsPerByte *= share;
  }
  return c;
}

MachineCosts MachineCosts::forHardware(int ranksOnHost, int cpus, double nicBitsPerSecond) {
  MachineCosts c = defaults();
  // Across hosts: TCP (or UCX over it) through the kernel's stack costs
  // about 20 us a small message one way, and carries about 0.95 of the
  // link's bit rate as payload (headers, acks). Where no NIC reports a speed
  // (virtual interfaces), 10 Gbit/s is assumed.
  const double bits = nicBitsPerSecond > 0 ? nicBitsPerSecond : 10e9;
  c.interHost.betaSecondsPerByte = 8.0 / (0.95 * bits);
  if (cpus > 0 && ranksOnHost > cpus) {
    // Ranks outnumber the CPUs they may run on: a byte copied, reduced or
    // sent on this host costs ranks / cpus times its idle price (each rank
    // gets cpus / ranks of a core; see shareCores), and every round waits
    // for its peers to get a core, a wait that overlaps the transfer (the
    // round floor). Waiting ranks yield (decideWait), and a yielded core
    // comes back after the peers' own polls: about a scheduler hand-off
    // (~5 us) per rank queued on each core beyond the first. The shared
    // memory hand-off pays the same wait.
    c = shareCores(c, ranksOnHost, cpus);
    const double share = static_cast<double>(ranksOnHost) / cpus;
    const double wait = 5e-6 * (share - 1);
    c.sameHost.roundFloorSeconds = c.sameHost.alphaSeconds + wait;
    c.shmSyncSeconds += wait;
  }
  c.source = "static";
  return c;
}

std::string MachineCosts::describe() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, ", copy %.2fGB/s, reduce %.2fGB/s, shm hand-off %.2fus, shm bytes x%.2f (",
                copySecondsPerByte > 0 ? 1e-9 / copySecondsPerByte : 0.0,
                reduceSecondsPerByte > 0 ? 1e-9 / reduceSecondsPerByte : 0.0, shmSyncSeconds * 1e6, shmByteFactor);
  return linkText("same-host", sameHost) + ", " + linkText("inter-host", interHost) + buf + source + ")";
}

CostModel::CostModel(TopologyView view, MachineCosts costs, ModelSettings settings)
    : view_(std::move(view)), costs_(std::move(costs)), settings_(settings) {}

std::vector<std::string> CostModel::modelled(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return {"ring", "rd", "hd", "tree", "shm", "hier", "native"};
    case Collective::kBroadcast: return {"tree", "hier", "native"};
    case Collective::kReduce: return {"tree", "native"};
    case Collective::kAllgather: return {"ring", "hier", "native"};
    case Collective::kReduceScatter: return {"ring", "native"};
    case Collective::kBarrier: return {"dissemination", "native"};
  }
  return {};
}

std::vector<int> CostModel::everyRank() const {
  std::vector<int> all(static_cast<size_t>(view_.size()));
  for (int r = 0; r < view_.size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

double CostModel::roundSeconds(const Pairs& messages, double bytes) const {
  // Messages of one round that leave (or enter) a host share its network
  // link; same-host messages are taken as independent.
  std::vector<int> out(static_cast<size_t>(view_.numHosts()), 0), in(out.size(), 0);
  for (const auto& [s, d] : messages) {
    if (view_.linkClass(s, d) != LinkClass::kInterHost) continue;
    ++out[static_cast<size_t>(view_.hostOf(s))];
    ++in[static_cast<size_t>(view_.hostOf(d))];
  }
  double worst = 0;
  // A rank with several messages in one round (on uneven hosts, the owner
  // of several of hier's slices) handles them one after another: every
  // message after its costliest adds its fixed cost (an upper bound: on
  // emulated hosts each such message measured about half of it).
  const size_t ranks = static_cast<size_t>(view_.size());
  std::vector<double> sendFixed(ranks, 0), sendMost(ranks, 0), recvFixed(ranks, 0), recvMost(ranks, 0);
  for (const auto& [s, d] : messages) {
    const LinkClass c = view_.linkClass(s, d);
    if (c == LinkClass::kSelf) continue;
    double share = 1;
    if (c == LinkClass::kInterHost) {
      share = std::max(out[static_cast<size_t>(view_.hostOf(s))], in[static_cast<size_t>(view_.hostOf(d))]);
    }
    const LinkCost& l = costs_.link(c);
    // The messages that share a host's link share its bandwidth, and each
    // after the first adds the link's gap (LinkCost::gapSeconds).
    worst = std::max(worst, std::max(l.roundFloorSeconds, l.alphaSeconds + bytes * l.betaSecondsPerByte * share) +
                                l.gapSeconds * (share - 1));
    const double fixed = l.fixedSeconds();
    sendFixed[static_cast<size_t>(s)] += fixed;
    sendMost[static_cast<size_t>(s)] = std::max(sendMost[static_cast<size_t>(s)], fixed);
    recvFixed[static_cast<size_t>(d)] += fixed;
    recvMost[static_cast<size_t>(d)] = std::max(recvMost[static_cast<size_t>(d)], fixed);
  }
  double serial = 0;
  for (size_t r = 0; r < ranks; ++r) {
    serial = std::max({serial, sendFixed[r] - sendMost[r], recvFixed[r] - recvMost[r]});
  }
  return messages.empty() ? worst : worst + serial + settings_.roundOverheadSeconds;
}

double CostModel::ringPass(const std::vector<int>& g, double bytes, bool reduce) const {
  // p - 1 steps, each moving one chunk of bytes / p to the next rank.
  const size_t p = g.size();
  if (p < 2) return 0;
  Pairs next;
  for (size_t i = 0; i < p; ++i) next.emplace_back(g[i], g[(i + 1) % p]);
  const double chunk = bytes / static_cast<double>(p);
  const double steps = static_cast<double>(p - 1);
  return steps * roundSeconds(next, chunk) + (reduce ? steps * chunk * costs_.reduceSecondsPerByte : 0);
}

double CostModel::ringAllreduce(const std::vector<int>& g, double bytes) const {
  return ringPass(g, bytes, true) + ringPass(g, bytes, false);
}

double CostModel::foldSeconds(const std::vector<std::vector<int>>& groups, double bytes, bool reduce) const {
  const int p = groups.empty() ? 0 : static_cast<int>(groups.front().size());
  const int extra = p - floorPow2(std::max(p, 1));
  if (extra <= 0) return 0;
  Pairs in, back;
  for (const auto& g : groups) {
    for (int i = 0; i < extra; ++i) {
      in.emplace_back(g[static_cast<size_t>(2 * i + 1)], g[static_cast<size_t>(2 * i)]);
      back.emplace_back(g[static_cast<size_t>(2 * i)], g[static_cast<size_t>(2 * i + 1)]);
    }
  }
  return roundSeconds(in, bytes) + roundSeconds(back, bytes) + (reduce ? bytes * costs_.reduceSecondsPerByte : 0);
}

namespace {
/// The rank of core index c of group g after folding (coreIndex).
int coreRank(const std::vector<int>& g, int c, int extra) { return g[static_cast<size_t>(coreIndex(c, extra))]; }
}  // namespace

double CostModel::recursiveDoubling(const std::vector<std::vector<int>>& groups, double bytes) const {
  const int p = groups.empty() ? 0 : static_cast<int>(groups.front().size());
  if (p < 2) return 0;
  const int p2 = floorPow2(p), extra = p - p2;
  double t = foldSeconds(groups, bytes, true);
  for (int mask = 1; mask < p2; mask <<= 1) {
    Pairs round;
    for (const auto& g : groups) {
      for (int c = 0; c < p2; ++c) round.emplace_back(coreRank(g, c, extra), coreRank(g, c ^ mask, extra));
    }
    t += roundSeconds(round, bytes) + bytes * costs_.reduceSecondsPerByte;
  }
  return t;
}

double CostModel::halvingDoubling(const std::vector<int>& g, double bytes) const {
  const int p = static_cast<int>(g.size());
  if (p < 2) return 0;
  const int p2 = floorPow2(p), extra = p - p2;
  double t = foldSeconds({g}, bytes, true);
  double part = bytes;
  // The first round exchanges half the vector, with the partner at the
  // first distance of hdHalvingOrder (same-host distances first); the
  // allgather retraces the rounds backwards.
  const uint32_t sameHost = static_cast<int>(g.size()) == view_.size() ? hdSameHostDistances(view_) : 0;
  for (const int dist : hdHalvingOrder(p2, sameHost)) {
    part /= 2;
    Pairs round;
    for (int c = 0; c < p2; ++c) round.emplace_back(coreRank(g, c, extra), coreRank(g, c ^ dist, extra));
    t += 2 * roundSeconds(round, part) + part * costs_.reduceSecondsPerByte;
  }
  return t;
}

double CostModel::binomialTree(const std::vector<int>& g, double bytes, bool reduce) const {
  return binomialTrees({g}, bytes, reduce);
}

double CostModel::binomialTrees(const std::vector<std::vector<int>>& groups, double bytes, bool reduce) const {
  const TreeStream s = treeStream(groups, bytes, reduce);
  return s.fill + (s.segments - 1) * s.perSegment;
}

double CostModel::treeAllreduce(const std::vector<int>& g, double bytes) const {
  // allreduce_tree.cpp pipelines both halves: a segment goes down as soon
  // as it is reduced at the root, so the reduction's stream (towards the
  // root) and the broadcast's (away from it) overlap on full-duplex links.
  const TreeStream up = treeStream({g}, bytes, true), down = treeStream({g}, bytes, false);
  return up.fill + down.fill + (up.segments - 1) * std::max(up.perSegment, down.perSegment);
}

CostModel::TreeStream CostModel::treeStream(const std::vector<std::vector<int>>& groups, double bytes,
                                            bool reduce) const {
  // Segmented binomial tree: the first segment crosses every level (one
  // round per level); the others stream behind it, each level busy with a
  // different segment. The stream's rate is set by the busiest resource
  // per segment over all levels: a host's network link (every level's
  // messages that leave or enter that host share it), or a rank that
  // sends or receives at several levels through shared memory (or, when
  // reducing, its reduction kernel). Trees of several groups run side by
  // side: each round holds the messages of every group's level.
  int p = 0;
  for (const auto& g : groups) p = std::max(p, static_cast<int>(g.size()));
  if (p < 2) return {};
  const double seg = std::min(bytes, static_cast<double>(std::max<size_t>(settings_.segmentBytes, 1)));
  const double segments = seg > 0 ? std::ceil(bytes / seg) : 1;
  std::vector<int> hostOut(static_cast<size_t>(view_.numHosts()), 0), hostIn(hostOut.size(), 0);
  std::vector<int> rankSameHost(static_cast<size_t>(view_.size()), 0), rankMessages(rankSameHost.size(), 0);
  double fill = 0;
  for (int dist = 1; dist < p; dist *= 2) {
    Pairs round;
    for (const auto& g : groups) {
      const int n = static_cast<int>(g.size());
      for (int i = 0; i + dist < n; i += 2 * dist) {
        const int child = g[static_cast<size_t>(i + dist)], parent = g[static_cast<size_t>(i)];
        round.emplace_back(child, parent);
        ++rankMessages[static_cast<size_t>(child)];
        ++rankMessages[static_cast<size_t>(parent)];
        if (view_.linkClass(child, parent) == LinkClass::kInterHost) {
          ++hostOut[static_cast<size_t>(view_.hostOf(child))];
          ++hostIn[static_cast<size_t>(view_.hostOf(parent))];
        } else {
          ++rankSameHost[static_cast<size_t>(child)];
          ++rankSameHost[static_cast<size_t>(parent)];
        }
      }
    }
    fill += roundSeconds(round, seg) + (reduce ? seg * costs_.reduceSecondsPerByte : 0);
  }
  const int linkLoad = std::max(*std::max_element(hostOut.begin(), hostOut.end()),
                                *std::max_element(hostIn.begin(), hostIn.end()));
  const int sameHostLoad = *std::max_element(rankSameHost.begin(), rankSameHost.end());
  const int messagesPerRank = *std::max_element(rankMessages.begin(), rankMessages.end());
  double perSegment = std::max(linkLoad * seg * costs_.interHost.betaSecondsPerByte,
                               sameHostLoad * seg * costs_.sameHost.betaSecondsPerByte);
  // Each message a rank takes part in costs its fixed overhead once per
  // segment, and the root of a reduction sums what each child sent.
  const double alpha = linkLoad > 0 ? costs_.interHost.fixedSeconds() : costs_.sameHost.fixedSeconds();
  perSegment += messagesPerRank * (alpha + settings_.roundOverheadSeconds);
  if (reduce) perSegment += messagesPerRank * seg * costs_.reduceSecondsPerByte;
  return {fill, perSegment, segments};
}

double CostModel::dissemination(const std::vector<int>& g) const {
  const int p = static_cast<int>(g.size());
  double t = 0;
  for (int dist = 1; dist < p; dist *= 2) {
    Pairs round;
    for (int i = 0; i < p; ++i) round.emplace_back(g[static_cast<size_t>(i)], g[static_cast<size_t>((i + dist) % p)]);
    t += roundSeconds(round, 0);
  }
  return t;
}

double CostModel::shmByteScale(double bytes, double local) const {
  return bytes > local * static_cast<double>(std::max<size_t>(settings_.shmChunkBytes, 1)) ? costs_.shmByteFactor
                                                                                           : 1.0;
}

double CostModel::sharedMemoryAllreduce(int local, double bytes) const {
  // Per round of local x chunk bytes: stage, reduce own slice, gather
  // (three flag hand-offs). Per byte: a rank stages and gathers the
  // (L-1)/L it does not own, reduces (L-1) peers' slices of size 1/L and
  // copies its reduced slice (1/L) from its buffer into its output.
  if (local < 2) return 0;
  const double l = local;
  const double roundBytes = l * static_cast<double>(std::max<size_t>(settings_.shmChunkBytes, 1));
  const double rounds = std::max(1.0, std::ceil(bytes / roundBytes));
  // Up to 16 KiB in one round (allreduce_shm.cpp's direct path): one
  // hand-off; every rank stages its input and reduces all L of them.
  if (rounds == 1 && bytes <= static_cast<double>(transport::kShmDirectMaxBytes)) {
    return costs_.shmSyncSeconds + bytes * (costs_.copySecondsPerByte + (l - 1) * costs_.reduceSecondsPerByte);
  }
  return rounds * 3 * costs_.shmSyncSeconds + bytes * shmByteScale(bytes, l) *
                                                   ((2 * l - 1) / l * costs_.copySecondsPerByte +
                                                    (l - 1) / l * costs_.reduceSecondsPerByte);
}

std::vector<std::vector<int>> CostModel::sameLocalIndex() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(view_.maxRanksPerHost()));
  for (int h = 0; h < view_.numHosts(); ++h) {
    const auto& ranks = view_.ranksOnHost(h);
    for (size_t i = 0; i < ranks.size(); ++i) groups[i].push_back(ranks[i]);
  }
  return groups;
}

double CostModel::hierarchicalBroadcast(double bytes) const {
  // broadcast_hier.cpp: the root's host fans the vector out through shared
  // memory (each local rank copies all of it), L binomial trees over the
  // hosts carry one slice of bytes / L each (side by side, sharing each
  // host's link), then every other host's owners fan their slices out (each
  // rank copies the (L - 1) / L it does not own). The model knows no root:
  // the trees are rooted at the first host.
  const double l = view_.maxRanksPerHost();
  const double copy = costs_.copySecondsPerByte * shmByteScale(bytes, l);
  double t = costs_.shmSyncSeconds + bytes * copy;
  if (view_.numHosts() > 1) {
    t += binomialTrees(sameLocalIndex(), bytes / l, false);
    t += costs_.shmSyncSeconds + (l - 1) / l * bytes * copy;
  }
  return t;
}

double CostModel::hierarchicalAllgather(double bytes) const {
  // allgather_hier.cpp: every rank sends its block (bytes / p) straight to
  // one rank of each other host, all in one round (each host link carries
  // L (H - 1) blocks each way), then each rank copies through shared memory
  // the blocks its host's other ranks hold: (L - 1) / L of the result.
  const int p = view_.size(), hosts = view_.numHosts();
  const double l = view_.maxRanksPerHost();
  const double block = bytes / p;
  Pairs round;
  for (int r = 0; r < p; ++r) {
    for (int h = 0; h < hosts; ++h) {
      if (h == view_.hostOf(r)) continue;
      const auto& ranks = view_.ranksOnHost(h);
      round.emplace_back(r, ranks[static_cast<size_t>(view_.localIndex(r)) % ranks.size()]);
    }
  }
  return roundSeconds(round, block) + costs_.shmSyncSeconds +
         (l - 1) / l * bytes * costs_.copySecondsPerByte * shmByteScale(bytes, l);
}

std::vector<std::vector<int>> CostModel::sliceOwners(size_t used) const {
  // allreduce_hier.cpp: `used` slices (hierSlicesUsed); slice j belongs to
  // local rank j % L_h on host h.
  std::vector<std::vector<int>> owners(used);
  for (size_t j = 0; j < used; ++j) {
    for (int h = 0; h < view_.numHosts(); ++h) {
      const auto& ranks = view_.ranksOnHost(h);
      owners[j].push_back(ranks[j % ranks.size()]);
    }
  }
  return owners;
}

double CostModel::hierarchical(double bytes) const {
  // Reduce-scatter through shared memory in each host, one exchange between
  // hosts per slice on bytes / S (S: the slices the call uses, at most the
  // largest host's rank count; the S exchanges share each host's link):
  // recursive doubling for slices up to hierRdSliceBytes or on two hosts,
  // else a ring (hierExchangesByRd); then
  // an allgather through shared memory. Each shared-memory phase copies the
  // whole vector once per rank: the reduce-scatter stages the part others
  // own and moves the rank's reduced slices into its output; the allgather
  // publishes them and fetches the rest. On a host of L_h ranks a rank owns
  // up to ceil(S / L_h) slices and reduces L_h - 1 peers' parts of each; a
  // rank alone on its host only copies its input to its output. The
  // slowest host sets the shared-memory phases' time.
  const int hosts = view_.numHosts();
  // Bytes as elements of one byte, as callCheckSeconds counts them.
  const size_t used = hierSlicesUsed(static_cast<size_t>(std::max(view_.maxRanksPerHost(), 1)),
                                     static_cast<size_t>(bytes), 1, settings_.hierSliceMinBytes);
  const double s = static_cast<double>(used);
  double t = 0;
  for (int h = 0; h < hosts; ++h) {
    const double l = static_cast<double>(view_.ranksOnHost(h).size());
    double host = bytes * costs_.copySecondsPerByte;
    if (l > 1) {
      const double owned = std::ceil(s / l) / s;
      const double scale = shmByteScale(bytes, l);
      host = 2 * costs_.shmSyncSeconds +
             bytes * scale * (costs_.copySecondsPerByte + (l - 1) * owned * costs_.reduceSecondsPerByte);
      host += costs_.shmSyncSeconds + bytes * scale * costs_.copySecondsPerByte;
    }
    t = std::max(t, host);
  }
  if (hosts > 1) {
    // All S exchanges run at once: one round carries S messages per host link.
    const double slice = bytes / s;
    const std::vector<std::vector<int>> rings = sliceOwners(used);
    if (hierExchangesByRd(static_cast<size_t>(slice), static_cast<size_t>(hosts), settings_.hierRdSliceBytes)) {
      return t + recursiveDoubling(rings, slice);
    }
    Pairs round;
    for (const auto& ring : rings) {
      for (size_t i = 0; i < ring.size(); ++i) round.emplace_back(ring[i], ring[(i + 1) % ring.size()]);
    }
    const double chunk = slice / hosts;
    const double steps = hosts - 1;
    t += 2 * steps * roundSeconds(round, chunk) + steps * chunk * costs_.reduceSecondsPerByte;
  }
  return t;
}

double CostModel::callCheckSeconds(Collective collective, const std::string& algorithm, size_t bytes) const {
  // The engine's call check sends each rank's signature to the next rank
  // beside the algorithm's first round: its latency overlaps the
  // algorithm, its software does not. Algorithms that compare calls
  // themselves (native, shm) or sign their messages (rd up to
  // kSignedPayloadLimit; hier where hierSignsMessages says) send none.
  if (view_.size() < 2 || algorithm == "native" || algorithm == "shm") return 0;
  if (collective == Collective::kAllreduce && bytes > 0) {
    if (algorithm == "rd" && bytes <= transport::kSignedPayloadLimit) return 0;
    // Bytes as elements of one byte: the same waves wherever the segment
    // is a whole number of elements.
    if (algorithm == "hier" &&
        hierSignsMessages(view_, bytes, 1, settings_.hierRdSliceBytes, settings_.segmentBytes,
                          settings_.hierSliceMinBytes)) {
      return 0;
    }
  }
  return settings_.roundOverheadSeconds;
}

std::optional<double> CostModel::predict(Collective collective, const std::string& algorithm, size_t bytesIn) const {
  const auto t = predictAlgorithm(collective, algorithm, bytesIn);
  if (!t) return t;
  return *t + callCheckSeconds(collective, algorithm, bytesIn);
}

std::optional<double> CostModel::predictAlgorithm(Collective collective, const std::string& algorithm,
                                                  size_t bytesIn) const {
  const double bytes = static_cast<double>(bytesIn);
  const std::vector<int> all = everyRank();
  const int p = view_.size();
  // native: MPI picks among the same kinds of algorithm (taken as the best
  // of ours) after gradcomm's agreement allgather of call signatures.
  auto native = [&](double best) { return best + dissemination(all); };
  switch (collective) {
    case Collective::kAllreduce:
      if (algorithm == "ring") return ringAllreduce(all, bytes);
      if (algorithm == "rd") return recursiveDoubling({all}, bytes);
      if (algorithm == "hd") return halvingDoubling(all, bytes);
      if (algorithm == "tree") return treeAllreduce(all, bytes);
      if (algorithm == "shm") {
        if (view_.numHosts() != 1) return std::nullopt;
        return sharedMemoryAllreduce(p, bytes);
      }
      if (algorithm == "hier") {
        // allreduce_hier.cpp's layoutProblem: several hosts, one with several ranks.
        if (view_.numHosts() < 2 || view_.maxRanksPerHost() < 2) return std::nullopt;
        return hierarchical(bytes);
      }
      if (algorithm == "native") return native(std::min(ringAllreduce(all, bytes), recursiveDoubling({all}, bytes)));
      return std::nullopt;
    case Collective::kBroadcast:
      if (algorithm == "tree") return binomialTree(all, bytes, false);
      if (algorithm == "hier") {
        if (!view_.uniformHosts() || view_.maxRanksPerHost() < 2 || view_.numHosts() < 2) return std::nullopt;
        return hierarchicalBroadcast(bytes);
      }
      if (algorithm == "native") return native(binomialTree(all, bytes, false));
      return std::nullopt;
    case Collective::kReduce:
      if (algorithm == "tree") return binomialTree(all, bytes, true);
      if (algorithm == "native") return native(binomialTree(all, bytes, true));
      return std::nullopt;
    case Collective::kAllgather:
      if (algorithm == "ring") return ringPass(all, bytes, false);
      if (algorithm == "hier") {
        if (!view_.uniformHosts() || view_.maxRanksPerHost() < 2 || view_.numHosts() < 2) return std::nullopt;
        return hierarchicalAllgather(bytes);
      }
      if (algorithm == "native") return native(ringPass(all, bytes, false));
      return std::nullopt;
    case Collective::kReduceScatter:
      if (algorithm == "ring") return ringPass(all, bytes, true);
      if (algorithm == "native") return native(ringPass(all, bytes, true));
      return std::nullopt;
    case Collective::kBarrier:
      if (algorithm == "dissemination") return dissemination(all);
      if (algorithm == "native") return native(dissemination(all));
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace gradcomm::topology
