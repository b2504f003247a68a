// Recursive doubling allreduce for small messages: log2(p) rounds, each an
// exchange of the whole vector with the rank whose (core) number differs in
// one bit. Non-power-of-two sizes fold the first 2(p - p2) ranks in pairs
// before and unfold after. Both partners compute every element, so operands
// are always ordered lower rank first: every rank gets identical bits.
#include <cstring>

#include "algorithms/catalog.hpp"
#include "algorithms/patterns/binomial_tree.hpp"
#include "algorithms/plan_runner.hpp"
#include "algorithms/plan_helpers.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {
namespace {


// The small signed call without a plan (what runInline runs, and what the
// engine carries on with when peers are late): the same exchanges, fold
// and operand order as the plan below, one exchange at a time, every
// message in a staging slot of its own (the signature, then the data), so
// a send never waits for a later step and in place needs no ordering. It
// skips the plan's executor (dependency counts, ready lists), a cost paid
// on every look at the peers, which on ranks that share cores sets the
// pace of the whole call.
class SignedRdSchedule final : public Schedule {
 public:
  SignedRdSchedule(const CollectiveCall& call, const RunContext& ctx)
      : ctx_(ctx),
        signature_(*ctx.signature),
        in_(static_cast<const char*>(call.input)),
        out_(static_cast<char*>(call.output)),
        count_(call.count),
        bytes_(call.count * dataTypeSize(call.type)),
        avg_(call.op == ReduceOp::kAvg),
        me_(ctx.transport->rank()),
        buf_(ctx.workspace->takeBuffers()) {
    ctx_.signature = nullptr;  // the caller's may not outlive this call
    ctx_.phases = nullptr;
    const int p = ctx.transport->size();
    const auto f = patterns::fold(me_, p);
    if (me_ < 2 * f.extra && me_ % 2 == 0) {
      stages_[numStages_++] = {me_ + 1, kFoldAway};
    } else {
      if (me_ < 2 * f.extra) stages_[numStages_++] = {me_ - 1, kFoldIn};
      for (int mask = 1; mask < f.p2; mask <<= 1) {
        stages_[numStages_++] = {patterns::unfold(f.newRank ^ mask, f), kExchange};
      }
      if (me_ < 2 * f.extra) stages_[numStages_++] = {me_ - 1, kHandBack};
    }
    // One send slot and one receive slot per stage.
    slot_ = (kSig + std::max(bytes_, transport::kSignedPayloadLimit) + 63) / 64 * 64;
    if (buf_->staging.size() < 2 * numStages_ * slot_) buf_->staging.resize(2 * numStages_ * slot_);
  }
  SignedRdSchedule(SignedRdSchedule&&) = default;
  ~SignedRdSchedule() override {
    if (buf_) ctx_.workspace->giveBack(std::move(buf_));
  }

  bool advance() override {
    bool moved = false;
    for (;;) {
      if (next_ < numStages_ && !recv_) {
        post(stages_[next_]);
        moved = true;
      }
      // Sends of earlier stages finish in the background; the call is done
      // when every one has.
      for (int i = 0; i < sendsOpen_;) {
        if (sends_[i]->test()) {
          sends_[i] = std::move(sends_[--sendsOpen_]);
          sends_[sendsOpen_].reset();
          moved = true;
        } else {
          ++i;
        }
      }
      if (!recv_ || !recv_->test()) return moved;
      finish(stages_[next_]);
      recv_.reset();
      ++next_;
      moved = true;
    }
  }
  bool done() const override { return next_ == numStages_ && sendsOpen_ == 0; }
  std::string waitingFor() const override {
    if (recv_) {
      return "signed message from rank " + std::to_string(stages_[next_].peer) + " (step " + std::to_string(next_ + 1) +
             " of " + std::to_string(numStages_) + ")";
    }
    return std::to_string(sendsOpen_) + " send(s) to complete";
  }
  std::vector<int> awaitedPeers() const override {
    if (recv_) return {stages_[next_].peer};
    return {};
  }

 private:
  enum Kind : uint8_t {
    kFoldAway,  // even rank of a folded pair: data to the odd one, the result back
    kFoldIn,    // odd rank of a folded pair: the even one's data
    kExchange,  // a round of the power-of-two core
    kHandBack,  // odd rank of a folded pair: the result to the even one
  };
  struct Stage {
    int peer;
    Kind kind;
  };
  static constexpr size_t kSig = sizeof(transport::CallSignature);
  static constexpr int kMaxStages = 34;  // 2 folds + 32 rounds

  char* sendSlot(int k) { return buf_->staging.data() + (2 * static_cast<size_t>(k)) * slot_; }
  char* recvSlot(int k) { return buf_->staging.data() + (2 * static_cast<size_t>(k) + 1) * slot_; }
  // What this rank holds now: its input until the first reduction or
  // hand-back lands in the output.
  const char* current() const { return wroteOut_ ? out_ : in_; }

  void post(const Stage& st) {
    transport::Tag tag;
    tag.seq = signature_.seq;
    tag.message = transport::Tag::kCallCheck;
    const int k = next_;
    if (st.kind != kFoldIn) {
      // The last stage sends the result (divided already for avg).
      if (st.kind == kHandBack) finalise();
      char* s = sendSlot(k);
      sends_[sendsOpen_++] = ctx_.transport->isend(st.peer, s, writeSigned(s, signature_, current(), bytes_), tag);
    }
    if (st.kind == kHandBack) {
      // Nothing comes back: the stage is over once its send is posted.
      ++next_;
      return;
    }
    recv_ = ctx_.transport->irecv(st.peer, recvSlot(k), kSig + std::max(bytes_, transport::kSignedPayloadLimit), tag);
  }

  void finish(const Stage& st) {
    const char* theirs = readSigned(recvSlot(next_), recv_->received(), bytes_, signature_, me_, st.peer);
    if (st.kind == kFoldAway) {
      std::memcpy(out_, theirs, bytes_);  // the whole result, divided for avg
      wroteOut_ = true;
      return;
    }
    // Lower rank's operand first: every rank computes identical bits.
    if (st.peer < me_) {
      ctx_.reduce(out_, theirs, current(), count_);
    } else {
      ctx_.reduce(out_, current(), theirs, count_);
    }
    wroteOut_ = true;
    if (next_ + 1 == numStages_) finalise();
  }

  // After the last reduction: the output holds the result (a copy where no
  // reduction wrote it), divided for avg.
  void finalise() {
    if (finalised_) return;
    finalised_ = true;
    if (!wroteOut_) {
      if (out_ != in_) std::memcpy(out_, in_, bytes_);
      wroteOut_ = true;
    }
    if (avg_) ctx_.divide(out_, count_, static_cast<double>(ctx_.transport->size()));
  }

  RunContext ctx_;
  transport::CallSignature signature_;
  const char* in_;
  char* out_;
  size_t count_, bytes_;
  bool avg_;
  int me_;
  std::unique_ptr<RunnerBuffers> buf_;
  size_t slot_ = 0;
  Stage stages_[kMaxStages] = {};
  int numStages_ = 0;
  int next_ = 0;
  bool wroteOut_ = false, finalised_ = false;
  transport::RequestPtr recv_;
  transport::RequestPtr sends_[kMaxStages];
  int sendsOpen_ = 0;
};

// Which calls sign their messages (and so run SignedRdSchedule).
bool signedCall(size_t count, DataType type, const RunContext& ctx) {
  return ctx.transport->size() >= 2 && count > 0 && count * dataTypeSize(type) <= transport::kSignedPayloadLimit;
}

class RecursiveDoublingAllreduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "rd"; }
  Collective collective() const override { return Collective::kAllreduce; }
  /// Small calls carry the call signature in their messages: rd's exchanges
  /// (and the fold's pairs) depend on the ranks alone, at most one message
  /// per ordered pair, and link every rank. Saves the call check's message
  /// per operation, about a message latency over TCP.
  bool signsMessages(const transport::CallSignature& call, const RunContext& ctx) const override {
    return signedCall(call.count, static_cast<DataType>(call.type), ctx);
  }
  /// Signed calls run without the plan's executor, and on an idle engine in
  /// the caller's thread (SignedRdSchedule).
  bool runsInline(const CollectiveCall& call, const RunContext& ctx) const override {
    return signedCall(call.count, call.type, ctx);
  }
  bool runInline(const CollectiveCall& call, const RunContext& ctx, InlinePatience patience,
                 SchedulePtr* rest) const override {
    if (!ctx.signature || !runsInline(call, ctx)) return false;
    SignedRdSchedule s(call, ctx);
    if (pollInline(s, patience)) return true;
    *rest = makeSchedule<SignedRdSchedule>(ctx.workspace, std::move(s));
    return false;
  }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    if (ctx.signedMessages && ctx.signature) return makeSchedule<SignedRdSchedule>(ctx.workspace, call, ctx);
    return PlannedAlgorithm::schedule(call, ctx);
  }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning&) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const auto f = patterns::fold(r, p);
    const Span tmp = scratch(b.allocScratch(n), n);
    const Span mine = out(0, n);

    // "Current data" starts as the input (no copy) and lives in out after
    // the first reduction.
    Span cur = in(0, n);
    Id curReady = kNone;   // last write of cur
    Id lastSend = kNone;   // last send that reads out
    Id tmpFree = kNone;    // last reader of tmp

    if (r < 2 * f.extra) {
      if (r % 2 == 0) {
        // Folded away: give our data to r+1, receive the result back.
        Id s = b.send(r + 1, in(0, n), 0);
        b.recv(r + 1, mine, 1, {call.inPlace ? s : kNone});  // already divided for avg
        return b.finish();
      }
      Id rv = b.recv(r - 1, tmp, 0);
      curReady = b.reduce(mine, tmp, cur, {rv});  // lower rank's data first
      tmpFree = curReady;
      cur = mine;
    }
    if (f.newRank >= 0) {
      for (int mask = 1; mask < f.p2; mask <<= 1) {
        const int partnerNew = f.newRank ^ mask;
        const int partner = patterns::unfold(partnerNew, f);
        const uint32_t msg = static_cast<uint32_t>(2 + mask);
        Id s = b.send(partner, cur, msg, {curReady});
        Id rv = b.recv(partner, tmp, msg, {tmpFree});
        const bool partnerLower = partner < r;
        // Writing `mine` must wait for the send that still reads it.
        Id red = partnerLower ? b.reduce(mine, tmp, cur, {rv, s, lastSend})
                              : b.reduce(mine, cur, tmp, {rv, s, lastSend});
        lastSend = s;
        tmpFree = red;
        curReady = red;
        cur = mine;
      }
    }
    if (cur.buf == Buf::kInput && !call.inPlace) curReady = b.copy(mine, cur, {curReady});
    Id finalStep = curReady;
    if (call.op == ReduceOp::kAvg) finalStep = b.divide(mine, {curReady, lastSend});
    if (r < 2 * f.extra && r % 2 == 1) b.send(r - 1, mine, 1, {finalStep});
    return b.finish();
  }
};

}  // namespace

const Algorithm& recursiveDoublingAllreduce() {
  static const RecursiveDoublingAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
