#include "topology/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gradcomm::topology {
namespace {

int floorPow2(int p) {
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  return p2;
}

int ceilLog2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

std::string linkText(const char* name, const LinkCost& l) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s %.2fus %.2fGB/s", name, l.alphaSeconds * 1e6,
                l.betaSecondsPerByte > 0 ? 1e-9 / l.betaSecondsPerByte : 0.0);
  return buf;
}

}  // namespace

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

std::string MachineCosts::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, ", copy %.2fGB/s, reduce %.2fGB/s, shm hand-off %.2fus (%s)",
                copySecondsPerByte > 0 ? 1e-9 / copySecondsPerByte : 0.0,
                reduceSecondsPerByte > 0 ? 1e-9 / reduceSecondsPerByte : 0.0, shmSyncSeconds * 1e6, source.c_str());
  return linkText("same-host", sameHost) + ", " + linkText("inter-host", interHost) + buf;
}

CostModel::CostModel(TopologyView view, MachineCosts costs, ModelSettings settings)
    : view_(std::move(view)), costs_(std::move(costs)), settings_(settings) {}

std::vector<std::string> CostModel::modelled(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return {"ring", "rd", "hd", "tree", "shm", "hier", "native"};
    case Collective::kBroadcast: return {"tree", "native"};
    case Collective::kReduce: return {"tree", "native"};
    case Collective::kAllgather: return {"ring", "native"};
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
  for (const auto& [s, d] : messages) {
    const LinkClass c = view_.linkClass(s, d);
    if (c == LinkClass::kSelf) continue;
    double share = 1;
    if (c == LinkClass::kInterHost) {
      share = std::max(out[static_cast<size_t>(view_.hostOf(s))], in[static_cast<size_t>(view_.hostOf(d))]);
    }
    const LinkCost& l = costs_.link(c);
    worst = std::max(worst, l.alphaSeconds + bytes * l.betaSecondsPerByte * share);
  }
  return messages.empty() ? worst : worst + settings_.roundOverheadSeconds;
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

double CostModel::foldSeconds(const std::vector<int>& g, double bytes, bool reduce) const {
  const int p = static_cast<int>(g.size());
  const int extra = p - floorPow2(p);
  if (extra == 0) return 0;
  Pairs in, back;
  for (int i = 0; i < extra; ++i) {
    in.emplace_back(g[static_cast<size_t>(2 * i + 1)], g[static_cast<size_t>(2 * i)]);
    back.emplace_back(g[static_cast<size_t>(2 * i)], g[static_cast<size_t>(2 * i + 1)]);
  }
  return roundSeconds(in, bytes) + roundSeconds(back, bytes) + (reduce ? bytes * costs_.reduceSecondsPerByte : 0);
}

namespace {
/// The rank of core index c after folding (the even rank of the first pairs).
int coreRank(const std::vector<int>& g, int c, int extra) {
  return g[static_cast<size_t>(c < extra ? 2 * c : c + extra)];
}
}  // namespace

double CostModel::recursiveDoubling(const std::vector<int>& g, double bytes) const {
  const int p = static_cast<int>(g.size());
  if (p < 2) return 0;
  const int p2 = floorPow2(p), extra = p - p2;
  double t = foldSeconds(g, bytes, true);
  for (int mask = 1; mask < p2; mask <<= 1) {
    Pairs round;
    for (int c = 0; c < p2; ++c) round.emplace_back(coreRank(g, c, extra), coreRank(g, c ^ mask, extra));
    t += roundSeconds(round, bytes) + bytes * costs_.reduceSecondsPerByte;
  }
  return t;
}

double CostModel::halvingDoubling(const std::vector<int>& g, double bytes) const {
  const int p = static_cast<int>(g.size());
  if (p < 2) return 0;
  const int p2 = floorPow2(p), extra = p - p2;
  double t = foldSeconds(g, bytes, true);
  double part = bytes;
  // Distance halving: the first round exchanges half the vector with the
  // partner p2/2 away; the allgather retraces the rounds backwards.
  for (int dist = p2 / 2; dist >= 1; dist /= 2) {
    part /= 2;
    Pairs round;
    for (int c = 0; c < p2; ++c) round.emplace_back(coreRank(g, c, extra), coreRank(g, c ^ dist, extra));
    t += 2 * roundSeconds(round, part) + part * costs_.reduceSecondsPerByte;
  }
  return t;
}

double CostModel::binomialTree(const std::vector<int>& g, double bytes, bool reduce) const {
  // Segmented binomial tree: the first segment crosses every level (one
  // round per level), the others follow one level behind each other; the
  // root handles one child per level per segment, which bounds the rate.
  const int p = static_cast<int>(g.size());
  if (p < 2) return 0;
  const double seg = std::min(bytes, static_cast<double>(std::max<size_t>(settings_.segmentBytes, 1)));
  const double segments = seg > 0 ? std::ceil(bytes / seg) : 1;
  const int levels = ceilLog2(p);
  double fill = 0, slowestLevel = 0;
  for (int dist = 1; dist < p; dist *= 2) {
    Pairs round;
    for (int i = 0; i + dist < p; i += 2 * dist) round.emplace_back(g[static_cast<size_t>(i + dist)], g[static_cast<size_t>(i)]);
    const double r = roundSeconds(round, seg) + (reduce ? seg * costs_.reduceSecondsPerByte : 0);
    fill += r;
    slowestLevel = std::max(slowestLevel, r);
  }
  return fill + (segments - 1) * levels * slowestLevel;
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

double CostModel::sharedMemoryAllreduce(int local, double bytes) const {
  // Per round of local x chunk bytes: stage, reduce own slice, gather
  // (three flag hand-offs). Per byte: a rank stages and gathers the
  // (L-1)/L it does not own and reduces (L-1) peers' slices of size 1/L.
  if (local < 2) return 0;
  const double l = local;
  const double roundBytes = l * static_cast<double>(std::max<size_t>(settings_.shmChunkBytes, 1));
  const double rounds = std::max(1.0, std::ceil(bytes / roundBytes));
  // Up to 16 KiB in one round (allreduce_shm.cpp's direct path): one
  // hand-off; every rank stages its input and reduces all L of them.
  if (rounds == 1 && bytes <= 16 * 1024) {
    return costs_.shmSyncSeconds + bytes * (costs_.copySecondsPerByte + (l - 1) * costs_.reduceSecondsPerByte);
  }
  return rounds * 3 * costs_.shmSyncSeconds +
         (l - 1) / l * bytes * (2 * costs_.copySecondsPerByte + costs_.reduceSecondsPerByte);
}

double CostModel::hierarchical(double bytes) const {
  // Reduce-scatter through shared memory in each host, one inter-host ring
  // per local index on bytes / L (the L rings share each host's link),
  // then an allgather through shared memory.
  const int hosts = view_.numHosts();
  const double l = view_.maxRanksPerHost();
  double t = 0;
  if (l > 1) {
    t += 2 * costs_.shmSyncSeconds + (l - 1) / l * bytes * (costs_.copySecondsPerByte + costs_.reduceSecondsPerByte);
    t += costs_.shmSyncSeconds + (l - 1) / l * bytes * costs_.copySecondsPerByte;
  }
  if (hosts > 1) {
    // All L rings run at once: one round carries L messages per host link.
    const double slice = bytes / l;
    std::vector<std::vector<int>> rings(static_cast<size_t>(l));
    for (int h = 0; h < hosts; ++h) {
      const auto& ranks = view_.ranksOnHost(h);
      for (size_t i = 0; i < ranks.size(); ++i) rings[i].push_back(ranks[i]);
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

std::optional<double> CostModel::predict(Collective collective, const std::string& algorithm, size_t bytesIn) const {
  const double bytes = static_cast<double>(bytesIn);
  const std::vector<int> all = everyRank();
  const int p = view_.size();
  // native: MPI picks among the same kinds of algorithm (taken as the best
  // of ours) after gradcomm's agreement allgather of call signatures.
  auto native = [&](double best) { return best + dissemination(all); };
  switch (collective) {
    case Collective::kAllreduce:
      if (algorithm == "ring") return ringAllreduce(all, bytes);
      if (algorithm == "rd") return recursiveDoubling(all, bytes);
      if (algorithm == "hd") return halvingDoubling(all, bytes);
      if (algorithm == "tree") return binomialTree(all, bytes, true) + binomialTree(all, bytes, false);
      if (algorithm == "shm") {
        if (view_.numHosts() != 1) return std::nullopt;
        return sharedMemoryAllreduce(p, bytes);
      }
      if (algorithm == "hier") {
        if (!view_.uniformHosts()) return std::nullopt;
        return hierarchical(bytes);
      }
      if (algorithm == "native") return native(std::min(ringAllreduce(all, bytes), recursiveDoubling(all, bytes)));
      return std::nullopt;
    case Collective::kBroadcast:
      if (algorithm == "tree") return binomialTree(all, bytes, false);
      if (algorithm == "native") return native(binomialTree(all, bytes, false));
      return std::nullopt;
    case Collective::kReduce:
      if (algorithm == "tree") return binomialTree(all, bytes, true);
      if (algorithm == "native") return native(binomialTree(all, bytes, true));
      return std::nullopt;
    case Collective::kAllgather:
      if (algorithm == "ring") return ringPass(all, bytes, false);
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
