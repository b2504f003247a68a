#include "algorithms/plan_runner.hpp"

#include <immintrin.h>
#include <sched.h>

#include <cstring>

#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

namespace {
bool isComm(StepKind k) { return k == StepKind::kSend || k == StepKind::kRecv; }
}  // namespace

PlanRunner::PlanRunner(std::shared_ptr<const CompiledPlan> plan, const CollectiveCall& call, const RunContext& ctx)
    : plan_(std::move(plan)),
      steps_(plan_->plan.steps.data()),
      ctx_(ctx),
      elemSize_(dataTypeSize(call.type)),
      divisor_(static_cast<double>(ctx.transport->size())),
      buf_(ctx.workspace->takeBuffers()) {
  bases_[static_cast<int>(Buf::kInput)] = static_cast<char*>(const_cast<void*>(call.input));
  bases_[static_cast<int>(Buf::kOutput)] = static_cast<char*>(call.output);
  if (plan_->plan.scratchCount) bases_[static_cast<int>(Buf::kScratch)] = ctx_.scratch(plan_->plan.scratchCount * elemSize_);
  buf_->remaining.assign(plan_->initialRemaining.begin(), plan_->initialRemaining.end());
  buf_->readyComm.clear();
  buf_->readyCompute.clear();
  buf_->active.clear();
  const size_t n = plan_->plan.steps.size();
  if (ctx_.signedMessages) {
    // A slot per transfer: the signature, then the data (a receive holds
    // the most any peer's signed message can carry).
    constexpr size_t kSig = sizeof(transport::CallSignature);
    auto& slotOf = buf_->slotOf;
    slotOf.assign(n, 0);
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const Step& s = steps_[i];
      if (!isComm(s.kind)) continue;
      slotOf[i] = total;
      const size_t data = s.kind == StepKind::kSend ? s.a.count * elemSize_ : transport::kSignedPayloadLimit;
      total += (kSig + data + 63) / 64 * 64;
    }
    if (buf_->staging.size() < total) buf_->staging.resize(total);
  }
  for (size_t i = 0; i < n; ++i) {
    if (buf_->remaining[i] == 0) {
      (isComm(steps_[i].kind) ? buf_->readyComm : buf_->readyCompute).push_back(static_cast<uint32_t>(i));
    }
  }
}

PlanRunner::~PlanRunner() { ctx_.workspace->giveBack(std::move(buf_)); }

char* PlanRunner::address(const Span& s) const {
  char* base = bases_[static_cast<int>(s.buf)];
  return base ? base + s.offset * elemSize_ : nullptr;
}

size_t writeSigned(char* slot, const transport::CallSignature& mine, const void* data, size_t bytes) {
  std::memcpy(slot, &mine, sizeof mine);
  if (bytes) std::memcpy(slot + sizeof mine, data, bytes);
  return sizeof mine + bytes;
}

const char* readSigned(const char* slot, size_t got, size_t bytes, const transport::CallSignature& mine, int me,
                       int peer) {
  transport::CallSignature theirs;
  if (got < sizeof theirs) {
    throw MismatchError("rank " + std::to_string(me) + ": a message of " + std::to_string(got) + " bytes from rank " +
                        std::to_string(peer) +
                        " carries no call signature: the ranks run different versions of the library");
  }
  std::memcpy(&theirs, slot, sizeof theirs);
  if (!theirs.sameCall(mine) || theirs.seq != mine.seq) throw SignedCallMismatch(me, peer, mine, theirs);
  if (got != sizeof theirs + bytes) {
    // Equal calls make equal plans: a size that differs is a bug, not a user's mismatch.
    throw InternalError("rank " + std::to_string(me) + " received " + std::to_string(got - sizeof theirs) +
                        " bytes of data from rank " + std::to_string(peer) + " where its plan expects " +
                        std::to_string(bytes));
  }
  return slot + sizeof theirs;
}

void PlanRunner::startSigned(uint32_t id) {
  const Step& s = steps_[id];
  const transport::CallSignature& mine = *ctx_.signature;
  transport::Tag tag;
  tag.seq = mine.seq;
  tag.message = transport::Tag::kCallCheck;
  char* slot = buf_->staging.data() + buf_->slotOf[id];
  constexpr size_t kSig = sizeof mine;
  if (s.kind == StepKind::kSend) {
    const size_t bytes = s.a.count * elemSize_;
    if (bytes > transport::kSignedPayloadLimit) {
      throw InternalError("signed message of " + std::to_string(bytes) + " bytes, above the limit");
    }
    buf_->active.push_back({id, ctx_.transport->isend(s.peer, slot, writeSigned(slot, mine, address(s.a), bytes), tag)});
  } else {
    buf_->active.push_back({id, ctx_.transport->irecv(s.peer, slot, kSig + transport::kSignedPayloadLimit, tag)});
  }
}

void PlanRunner::acceptSigned(uint32_t id, const transport::Request& r) {
  const Step& s = steps_[id];
  if (s.kind != StepKind::kRecv) return;
  const size_t bytes = s.dst.count * elemSize_;
  const char* data = readSigned(buf_->staging.data() + buf_->slotOf[id], r.received(), bytes, *ctx_.signature,
                                ctx_.transport->rank(), s.peer);
  if (bytes) std::memcpy(address(s.dst), data, bytes);
}

void PlanRunner::start(uint32_t id) {
  if (ctx_.signedMessages) {
    startSigned(id);
    return;
  }
  const Step& s = steps_[id];
  transport::Tag tag = ctx_.tag;
  tag.message = s.message;
  if (s.kind == StepKind::kSend) {
    buf_->active.push_back({id, ctx_.transport->isend(s.peer, address(s.a), s.a.count * elemSize_, tag)});
  } else {
    buf_->active.push_back({id, ctx_.transport->irecv(s.peer, address(s.dst), s.dst.count * elemSize_, tag)});
  }
}

void PlanRunner::runCompute(uint32_t id) {
  const Step& s = steps_[id];
  switch (s.kind) {
    case StepKind::kReduce:
      if (s.dst.count) ctx_.reduce(address(s.dst), address(s.a), address(s.b), s.dst.count);
      break;
    case StepKind::kCopy:
      if (s.dst.count && address(s.dst) != address(s.a)) {
        std::memcpy(address(s.dst), address(s.a), s.dst.count * elemSize_);
      }
      break;
    case StepKind::kDivide:
      if (s.dst.count) ctx_.divide(address(s.dst), s.dst.count, divisor_);
      break;
    case StepKind::kNop:
      break;
    default:
      throw InternalError("plan executor: communication step scheduled as compute");
  }
  complete(id);
}

void PlanRunner::complete(uint32_t id) {
  ++completed_;
  const auto& succBegin = plan_->succBegin;
  const auto& succ = plan_->succ;
  for (uint32_t k = succBegin[id]; k < succBegin[id + 1]; ++k) {
    const uint32_t next = succ[k];
    if (--buf_->remaining[next] == 0) {
      (isComm(steps_[next].kind) ? buf_->readyComm : buf_->readyCompute).push_back(next);
    }
  }
}

bool PlanRunner::advance() {
  bool moved = false;
  auto& readyComm = buf_->readyComm;
  auto& readyCompute = buf_->readyCompute;
  auto& active = buf_->active;
  for (int round = 0; round < 256 && !done(); ++round) {
    bool any = false;
    while (commHead_ < readyComm.size()) {
      start(readyComm[commHead_++]);
      any = true;
    }
    for (size_t i = 0; i < active.size();) {
      if (active[i].request->test()) {
        const uint32_t id = active[i].step;
        if (ctx_.signedMessages) acceptSigned(id, *active[i].request);
        active[i] = std::move(active.back());
        active.pop_back();
        complete(id);
        any = true;
      } else {
        ++i;
      }
    }
    // Post newly enabled transfers before spending time on a reduction.
    if (commHead_ < readyComm.size()) {
      moved = true;
      continue;
    }
    if (computeHead_ < readyCompute.size()) {
      runCompute(readyCompute[computeHead_++]);
      any = true;
    }
    if (!any) break;
    moved = true;
  }
  return moved;
}

std::string PlanRunner::waitingFor() const {
  std::string out;
  size_t shown = 0;
  for (const auto& a : buf_->active) {
    if (shown == 4) {
      out += ", ... (" + std::to_string(buf_->active.size() - shown) + " more)";
      break;
    }
    const Step& s = steps_[a.step];
    if (!out.empty()) out += ", ";
    out += std::string(s.kind == StepKind::kSend ? "send to rank " : "receive from rank ") + std::to_string(s.peer) +
           " (message " + std::to_string(s.message) + ")";
    ++shown;
  }
  if (out.empty()) out = "nothing (" + std::to_string(plan_->plan.steps.size() - completed_) + " steps left)";
  return out;
}

std::vector<int> PlanRunner::awaitedPeers() const {
  std::vector<int> peers;
  for (const auto& a : buf_->active) {
    const Step& s = steps_[a.step];
    if (s.kind != StepKind::kRecv) continue;
    bool seen = false;
    for (int p : peers) seen = seen || p == s.peer;
    if (!seen) peers.push_back(s.peer);
  }
  return peers;
}

bool pollInline(Schedule& s, Algorithm::InlinePatience patience) {
  for (int i = 0; i < patience.polls; ++i) {
    const bool moved = s.advance();
    if (s.done()) return true;
    if (moved) continue;
    if (patience.yield) {
      sched_yield();
    } else {
      _mm_pause();
    }
  }
  return false;
}

PlanKey planKey(const Algorithm* algorithm, const CollectiveCall& call, const RunContext& ctx) {
  PlanKey key;
  key.algorithm = algorithm;
  key.collective = static_cast<uint8_t>(call.collective);
  key.type = static_cast<uint8_t>(call.type);
  key.op = static_cast<uint8_t>(call.op);
  key.inPlace = call.inPlace ? 1 : 0;
  key.root = call.root;
  key.rank = ctx.transport->rank();
  key.size = ctx.transport->size();
  key.depth = ctx.tuning.pipelineDepth;
  key.count = call.count;
  key.segmentBytes = ctx.tuning.segmentBytes;
  key.exchangeSegmentBytes = ctx.tuning.exchangeSegmentBytes;
  return key;
}

SchedulePtr PlannedAlgorithm::schedule(const CollectiveCall& call, RunContext ctx) const {
  auto compiled = cachedPlan(this, call, ctx, [&] {
    const int rank = ctx.transport->rank();
    const int size = ctx.transport->size();
    const bool empty = call.count == 0 && call.collective != Collective::kBarrier;
    return empty ? emptyPlan(rank, size) : plan(call, rank, size, ctx.tuning);
  });
  return makeSchedule<PlanRunner>(ctx.workspace, std::move(compiled), call, ctx);
}

Plan emptyPlan(int rank, int size) {
  PlanBuilder b;
  if (size > 1) {
    b.send((rank + 1) % size, in(0, 0), 0);
    b.recv((rank + size - 1) % size, out(0, 0), 0);
  }
  return b.finish();
}

}  // namespace gradcomm::algorithms
