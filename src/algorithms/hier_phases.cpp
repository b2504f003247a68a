#include "algorithms/hier_phases.hpp"

#include <algorithm>
#include <cstring>

#include "algorithms/plan_runner.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms::hier {

using transport::ShmGroup;
using transport::ShmRankBlock;

Layout Layout::of(const topology::TopologyView& view, int rank) {
  Layout l;
  for (int h = 0; h < view.numHosts(); ++h) l.hosts.push_back(view.ranksOnHost(h));
  for (size_t h = 0; h < l.hosts.size(); ++h) {
    const auto& ranks = l.hosts[h];
    l.slices = std::max(l.slices, ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == rank) {
        l.host = static_cast<int>(h);
        l.local = static_cast<int>(i);
      }
    }
  }
  return l;
}

int Layout::hostOf(int rank) const {
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (std::find(hosts[h].begin(), hosts[h].end(), rank) != hosts[h].end()) return static_cast<int>(h);
  }
  return -1;
}

std::string layoutProblem(const transport::Transport& t, const Layout& l) {
  if (l.hosts.empty()) return "the communicator's topology view holds no hosts";
  if (l.host < 0) return "this rank is missing from the communicator's topology view";
  if (l.hosts.size() < 2) return "all ranks share one host (use shm or a flat algorithm)";
  if (l.slices < 2) return "every host has one rank (use a flat algorithm)";
  if (l.slices > 64) return "it supports at most 64 ranks per host";
  if (l.localSize() >= 2) {
    const ShmGroup* g = const_cast<transport::Transport&>(t).sharedMemory();
    if (!g) return "there is no shared memory between the ranks of this host (GRADCOMM_SHM=0, or it failed)";
  }
  // Every slice (and allgather's rank blocks) needs a slot of at least one
  // element of the widest type in a round, on every host with several
  // ranks. The chunk is the same on every rank: a rank alone on its host,
  // which has no group to ask, decides as the others do (otherwise it ran
  // hier while they fell back, a mismatch of the default's choice).
  if (t.sharedMemoryChunkBytes() < 8 * static_cast<size_t>(t.size())) {
    return t.sharedMemoryChunkBytes() == 0
               ? "there is no shared memory between the ranks of the hosts (GRADCOMM_SHM=0)"
               : "its shared-memory chunk is too small (GRADCOMM_SHM_CHUNK below 8 bytes per rank)";
  }
  return {};
}

namespace {
size_t powerOfTwoAtLeast(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
}  // namespace

uint32_t appendSlicePlan(Plan& all, const Plan& p, const Layout& l, size_t j, size_t offset, uint32_t lane) {
  const uint32_t stride = static_cast<uint32_t>(powerOfTwoAtLeast(l.slices));
  const uint32_t stepBase = static_cast<uint32_t>(all.steps.size());
  const uint32_t depBase = static_cast<uint32_t>(all.deps.size());
  const size_t scratchBase = all.scratchCount;
  auto move = [&](Span& s) { s.offset += s.buf == Buf::kScratch ? scratchBase : offset; };
  for (Step s : p.steps) {
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      s.peer = l.owner(static_cast<size_t>(s.peer), j);
      s.message = (s.message * kLanes + lane) * stride + static_cast<uint32_t>(j);
    }
    move(s.dst);
    move(s.a);
    move(s.b);
    s.depBegin += depBase;
    s.depEnd += depBase;
    all.steps.push_back(s);
  }
  for (uint32_t d : p.deps) all.deps.push_back(d + stepBase);
  all.scratchCount += p.scratchCount;
  return stepBase;
}

void throwShmMismatch(const RunContext& ctx, const ShmGroup& g, int q, const char* what) {
  transport::CallSignature mine, theirs;
  const bool known = ctx.announcements && ctx.announcements->announced(g.localRank(), ctx.tag.seq, &mine);
  const bool knownTheirs = known && ctx.announcements->announced(q, ctx.tag.seq, &theirs);
  if (!known) mine.seq = ctx.tag.seq;
  throw MismatchError(transport::mismatchMessage(ctx.transport->rank(), std::string(what) + " #" + std::to_string(ctx.tag.seq),
                                                 mine, g.ranks()[static_cast<size_t>(q)],
                                                 knownTheirs ? &theirs : nullptr));
}

std::string ShmStall::describe(const ShmGroup* g) const {
  if (rank < 0 || !g) return "running";
  return "waiting for rank " + std::to_string(g->ranks()[static_cast<size_t>(rank)]) + " to " + why;
}

void checkPeersAlive(const ShmGroup& g, const char* what) {
  for (int q = 0; q < g.localSize(); ++q) {
    if (q != g.localRank() && !g.alive(q)) {
      throw TransportError("rank " + std::to_string(g.ranks()[static_cast<size_t>(q)]) + " (pid " +
                           std::to_string(g.block(q).pid) + ") on this host exited during a " + what);
    }
  }
}

void ShmFanOut::start(ShmGroup& g, std::vector<FanOutItem> items, char* out, size_t elem, const RunContext& ctx,
                      const char* what) {
  g_ = &g;
  ctx_ = &ctx;
  what_ = what;
  items_ = std::move(items);
  out_ = out;
  elem_ = elem;
  me_ = g.localRank();
  p_ = g.localSize();
  std::vector<size_t> perOwner(static_cast<size_t>(p_), 0);
  ordinal_.resize(items_.size());
  size_t longest = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    ordinal_[i] = perOwner[static_cast<size_t>(items_[i].owner)]++;
    longest = std::max(longest, items_[i].count);
  }
  const size_t slots = std::max<size_t>(1, *std::max_element(perOwner.begin(), perOwner.end()));
  chunk_ = g.bufferBytes() / slots / elem;
  if (chunk_ == 0) {
    throw UnsupportedError(std::string(what) + ": " + std::to_string(slots) +
                           " ranges per rank do not fit the shared-memory buffer; raise GRADCOMM_SHM_CHUNK");
  }
  rounds_ = longest == 0 ? 1 : (longest + chunk_ - 1) / chunk_;
  firstRound_ = g.takeRound();
  for (size_t k = 1; k < rounds_; ++k) g.takeRound();
}

char* ShmFanOut::slot(int q, int b, size_t ordinal) const { return g_->buffer(q, b) + ordinal * chunk_ * elem_; }

bool ShmFanOut::advance() {
  bool moved = false;
  for (bool any = true; any && !done();) {
    any = tryGather() || tryPublish();
    moved = moved || any;
  }
  return moved;
}

bool ShmFanOut::tryPublish() {
  const size_t k = publishNext_;
  if (k >= rounds_ || k > gatherNext_ + 1) return false;
  const uint64_t rid = firstRound_ + k;
  if (int q = g_->peerStillReading(rid); q >= 0) return stall_.set(q, "finish reading an earlier round");
  const int b = static_cast<int>(rid & 1);
  for (size_t i = 0; i < items_.size(); ++i) {
    const FanOutItem& it = items_[i];
    if (it.owner != me_ || k * chunk_ >= it.count) continue;
    const size_t begin = k * chunk_, n = std::min(chunk_, it.count - begin);
    const char* src = it.src + begin * elem_;
    std::memcpy(slot(me_, b, ordinal_[i]), src, n * elem_);
    char* dst = out_ + (it.dst + begin) * elem_;
    if (dst != src) std::memcpy(dst, src, n * elem_);
  }
  ShmRankBlock& mine = g_->block(me_);
  mine.mailbox[b].fingerprint = ctx_->tag.fingerprint;
  mine.reduced[b].store(rid, std::memory_order_release);
  ++publishNext_;
  return true;
}

bool ShmFanOut::tryGather() {
  const size_t k = gatherNext_;
  if (k >= publishNext_) return false;
  return gather_.look(*g_, firstRound_ + k, stall_, "publish its data", &gatherNext_, [&](int q, int b) {
    if (g_->block(q).mailbox[b].fingerprint != ctx_->tag.fingerprint) throwShmMismatch(*ctx_, *g_, q, what_);
    for (size_t i = 0; i < items_.size(); ++i) {
      const FanOutItem& it = items_[i];
      if (it.owner != q || k * chunk_ >= it.count) continue;
      const size_t begin = k * chunk_, n = std::min(chunk_, it.count - begin);
      std::memcpy(out_ + (it.dst + begin) * elem_, slot(q, b, ordinal_[i]), n * elem_);
    }
  });
}

std::string ShmFanOut::waitingFor() const {
  std::string s = "round " + std::to_string(gatherNext_ + 1) + " of " + std::to_string(rounds_) + " in this host: ";
  return s + stall_.describe(g_);
}

PhasedSchedule::PhasedSchedule(const RunContext& ctx, ShmGroup* g, size_t elem, PhasedParts parts)
    : ctx_(ctx), g_(g), parts_(std::move(parts)) {
  char* out = static_cast<char*>(parts_.planCall.output);
  // Both fan-outs take their rounds now, in this order on every local rank.
  if (!parts_.before.empty()) before_.start(*g_, std::move(parts_.before), out, elem, ctx_, parts_.what);
  if (!parts_.after.empty()) after_.start(*g_, std::move(parts_.after), out, elem, ctx_, parts_.what);
}

bool PhasedSchedule::advance() {
  bool moved = false;
  if (phase_ == 0) {
    if (parts_.copyBytes && !before_.started() && parts_.copyDst != parts_.copySrc) {
      std::memcpy(parts_.copyDst, parts_.copySrc, parts_.copyBytes);
      parts_.copyBytes = 0;
      moved = true;
    }
    if (before_.started()) {
      moved = before_.advance() || moved;
      if (!before_.done()) return moved;
    }
    phase_ = 1;
    runner_ = makeSchedule<PlanRunner>(nullptr, parts_.plan, parts_.planCall, ctx_);
    moved = true;
  }
  if (phase_ == 1) {
    moved = runner_->advance() || moved;
    if (!runner_->done()) return moved;
    runner_.reset();
    phase_ = 2;
    moved = true;
  }
  if (phase_ == 2) {
    if (after_.started()) {
      moved = after_.advance() || moved;
      if (!after_.done()) return moved;
    }
    phase_ = 3;
    moved = true;
  }
  return moved;
}

std::string PhasedSchedule::waitingFor() const {
  const std::string what = std::string(parts_.what) + ", ";
  if (phase_ == 0) return what + "fan-out, " + before_.waitingFor();
  if (phase_ == 1 && runner_) return what + "between hosts: " + runner_->waitingFor();
  return what + "fan-out, " + after_.waitingFor();
}

std::vector<int> PhasedSchedule::awaitedPeers() const {
  if (phase_ == 1 && runner_) return runner_->awaitedPeers();
  return {};
}

void PhasedSchedule::healthCheck() {
  if (g_) checkPeersAlive(*g_, parts_.what);
}

}  // namespace gradcomm::algorithms::hier
