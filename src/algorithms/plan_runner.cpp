#include "algorithms/plan_runner.hpp"

#include <cstring>

#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

PlanRunner::PlanRunner(Plan plan, const CollectiveCall& call, RunContext ctx)
    : plan_(std::move(plan)),
      ctx_(std::move(ctx)),
      elemSize_(dataTypeSize(call.type)),
      divisor_(static_cast<double>(ctx_.transport->size())) {
  bases_[static_cast<int>(Buf::kInput)] = static_cast<char*>(const_cast<void*>(call.input));
  bases_[static_cast<int>(Buf::kOutput)] = static_cast<char*>(call.output);
  if (plan_.scratchCount) bases_[static_cast<int>(Buf::kScratch)] = ctx_.scratch(plan_.scratchCount * elemSize_);

  const size_t n = plan_.steps.size();
  remaining_.assign(n, 0);
  succBegin_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan_.steps[i];
    remaining_[i] = s.depEnd - s.depBegin;
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) ++succBegin_[plan_.deps[k] + 1];
  }
  for (size_t i = 0; i < n; ++i) succBegin_[i + 1] += succBegin_[i];
  succ_.assign(plan_.deps.size(), 0);
  std::vector<uint32_t> fill(succBegin_.begin(), succBegin_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan_.steps[i];
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) succ_[fill[plan_.deps[k]]++] = static_cast<uint32_t>(i);
  }
  for (size_t i = 0; i < n; ++i) {
    if (remaining_[i] == 0) {
      auto kind = plan_.steps[i].kind;
      (kind == StepKind::kSend || kind == StepKind::kRecv ? readyComm_ : readyCompute_).push_back(static_cast<uint32_t>(i));
    }
  }
}

char* PlanRunner::address(const Span& s) const {
  char* base = bases_[static_cast<int>(s.buf)];
  return base ? base + s.offset * elemSize_ : nullptr;
}

void PlanRunner::start(uint32_t id) {
  const Step& s = plan_.steps[id];
  transport::Tag tag = ctx_.tag;
  tag.message = s.message;
  if (s.kind == StepKind::kSend) {
    active_.push_back({id, ctx_.transport->isend(s.peer, address(s.a), s.a.count * elemSize_, tag)});
  } else {
    active_.push_back({id, ctx_.transport->irecv(s.peer, address(s.dst), s.dst.count * elemSize_, tag)});
  }
}

void PlanRunner::runCompute(uint32_t id) {
  const Step& s = plan_.steps[id];
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
  for (uint32_t k = succBegin_[id]; k < succBegin_[id + 1]; ++k) {
    uint32_t next = succ_[k];
    if (--remaining_[next] == 0) {
      auto kind = plan_.steps[next].kind;
      (kind == StepKind::kSend || kind == StepKind::kRecv ? readyComm_ : readyCompute_).push_back(next);
    }
  }
}

bool PlanRunner::advance() {
  bool moved = false;
  for (int round = 0; round < 256 && !done(); ++round) {
    bool any = false;
    while (!readyComm_.empty()) {
      uint32_t id = readyComm_.front();
      readyComm_.pop_front();
      start(id);
      any = true;
    }
    for (size_t i = 0; i < active_.size();) {
      if (active_[i].request->test()) {
        uint32_t id = active_[i].step;
        active_[i] = std::move(active_.back());
        active_.pop_back();
        complete(id);
        any = true;
      } else {
        ++i;
      }
    }
    // Post newly enabled transfers before spending time on a reduction.
    if (!readyComm_.empty()) {
      moved = true;
      continue;
    }
    if (!readyCompute_.empty()) {
      uint32_t id = readyCompute_.front();
      readyCompute_.pop_front();
      runCompute(id);
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
  for (const auto& a : active_) {
    if (shown == 4) {
      out += ", ... (" + std::to_string(active_.size() - shown) + " more)";
      break;
    }
    const Step& s = plan_.steps[a.step];
    if (!out.empty()) out += ", ";
    out += std::string(s.kind == StepKind::kSend ? "send to rank " : "receive from rank ") + std::to_string(s.peer) +
           " (message " + std::to_string(s.message) + ")";
    ++shown;
  }
  if (out.empty()) out = "nothing (" + std::to_string(plan_.steps.size() - completed_) + " steps left)";
  return out;
}

std::vector<int> PlanRunner::awaitedPeers() const {
  std::vector<int> peers;
  for (const auto& a : active_) {
    const Step& s = plan_.steps[a.step];
    if (s.kind != StepKind::kRecv) continue;
    bool seen = false;
    for (int p : peers) seen = seen || p == s.peer;
    if (!seen) peers.push_back(s.peer);
  }
  return peers;
}

SchedulePtr PlannedAlgorithm::schedule(const CollectiveCall& call, RunContext ctx) const {
  const int rank = ctx.transport->rank();
  const int size = ctx.transport->size();
  const bool empty = call.count == 0 && call.collective != Collective::kBarrier;
  Plan p = empty ? emptyPlan(rank, size) : plan(call, rank, size, ctx.tuning);
  return std::make_unique<PlanRunner>(std::move(p), call, std::move(ctx));
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
