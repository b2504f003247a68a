// Compressed allreduce of float32 gradients.
//
// fp16 / bf16: cast (with error feedback and pre-scaling if asked) into a
// half-size buffer, allreduce that buffer with an ordinary algorithm (which
// accumulates in float32 and rounds once per step), decode into the output.
//
// top-k: select the k largest magnitudes (of gradient + residual), encode
// them in the sparse wire format, allgather the payloads (fixed-size slots:
// the selected count varies within 10% in approximate mode), and add every
// rank's payload, in rank order, into the zeroed output. Every payload is
// validated by the decoder before it touches memory.
#include "algorithms/compressed.hpp"

#include <cstring>

#include "compression/cpu/cast.hpp"
#include "compression/cpu/topk.hpp"
#include "compression/sparse_format.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {
namespace {

using compression::Kind;
using Clock = std::chrono::steady_clock;

void recordPhase(const RunContext& ctx, const char* name, Clock::time_point start) {
  if (ctx.phases) ctx.phases->push_back({name, {start, Clock::now()}});
}

/// Compress, run an ordinary algorithm on the payload, finish: the frame
/// both compressed schedules share. prepare() compresses and returns the
/// inner schedule; finish() decompresses into the output.
class CompressedSchedule : public Schedule {
 public:
  CompressedSchedule(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                     compression::Residual* residual, const Algorithm& inner, const char* what)
      : call_(call), ctx_(ctx), spec_(spec), residual_(residual), inner_(inner), what_(what) {}

  bool advance() override {
    bool moved = false;
    if (!innerSchedule_) {
      const auto t0 = Clock::now();
      innerSchedule_ = prepare();
      recordPhase(ctx_, "compress", t0);
      moved = true;
    }
    if (!innerDone_) {
      moved = innerSchedule_->advance() || moved;
      if (!innerSchedule_->done()) return moved;
      innerDone_ = true;
    }
    const auto t0 = Clock::now();
    finish();
    recordPhase(ctx_, "decompress", t0);
    done_ = true;
    return true;
  }
  bool done() const override { return done_; }
  std::string waitingFor() const override {
    return std::string(what_) + ": " + (innerSchedule_ ? innerSchedule_->waitingFor() : "compressing");
  }
  void healthCheck() override {
    if (innerSchedule_) innerSchedule_->healthCheck();
  }

 protected:
  virtual SchedulePtr prepare() = 0;
  virtual void finish() = 0;

  CollectiveCall call_;
  RunContext ctx_;
  compression::Spec spec_;
  compression::Residual* residual_;
  const Algorithm& inner_;

 private:
  const char* what_;
  SchedulePtr innerSchedule_;
  bool innerDone_ = false;
  bool done_ = false;
};

class CastCompressedAllreduce final : public CompressedSchedule {
 public:
  CastCompressedAllreduce(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                          compression::Residual* residual, const Algorithm& inner)
      : CompressedSchedule(call, ctx, spec, residual, inner, "compressed allreduce"),
        half_(spec.kind == Kind::kFp16 ? DataType::kFloat16 : DataType::kBFloat16) {}

 private:
  SchedulePtr prepare() override {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    halfBuffer_ = reinterpret_cast<uint16_t*>(ctx_.workspace->buffer(0, std::max<size_t>(n, 1) * 2));
    const float scale = spec_.prescale ? 1.0f / static_cast<float>(p) : 1.0f;
    const auto* in = static_cast<const float*>(call_.input);
    if (residual_) {
      compression::castWithResidual(in, residual_->data(n), halfBuffer_, n, half_, scale);
    } else {
      compression::castToHalf(in, halfBuffer_, n, half_, scale);
    }
    CollectiveCall innerCall;
    innerCall.collective = Collective::kAllreduce;
    innerCall.type = half_;
    innerCall.op = ReduceOp::kSum;
    innerCall.count = n;
    innerCall.input = halfBuffer_;
    innerCall.output = halfBuffer_;
    innerCall.inPlace = true;
    RunContext innerCtx = ctx_;
    innerCtx.reduce = kernels::reduceFunction(half_, ReduceOp::kSum, ctx_.simd);
    return inner_.schedule(innerCall, innerCtx);
  }

  void finish() override {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    auto* out = static_cast<float*>(call_.output);
    compression::decodeHalf(halfBuffer_, out, n, half_);
    // Pre-scaled values already summed to the average (a sum is scaled
    // back); otherwise avg divides, exactly like the uncompressed paths.
    const bool avg = call_.op == ReduceOp::kAvg;
    if (spec_.prescale && !avg) {
      for (size_t i = 0; i < n; ++i) out[i] *= static_cast<float>(p);
    } else if (!spec_.prescale && avg && n) {
      ctx_.divide(out, n, static_cast<double>(p));
    }
  }

  DataType half_;
  uint16_t* halfBuffer_ = nullptr;
};

class TopKAllreduce final : public CompressedSchedule {
 public:
  TopKAllreduce(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                compression::Residual* residual, const Algorithm& inner)
      : CompressedSchedule(call, ctx, spec, residual, inner, "top-k allgather") {}

 private:
  SchedulePtr prepare() override {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    const int r = ctx_.transport->rank();
    const size_t k = n == 0 ? 0 : spec_.topkCount(n);
    const size_t kmax = spec_.approximate ? std::min(n, k + k / 10 + 1) : k;
    slotBytes_ = (8 + compression::encodedBytes(n, kmax) + 7) / 8 * 8;
    gather_ = ctx_.workspace->buffer(1, slotBytes_ * static_cast<size_t>(p));
    char* mine = gather_ + static_cast<size_t>(r) * slotBytes_;
    compression::SparseTensor sparse;
    if (n) {
      compression::TopKOptions o;
      o.k = k;
      o.approximate = spec_.approximate;
      o.seed = ctx_.tag.seq * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(r);
      compression::topk(static_cast<const float*>(call_.input), residual_ ? residual_->data(n) : nullptr, n, o, sparse);
    } else {
      sparse.denseCount = 0;
    }
    if (sparse.nnz() > kmax) {
      throw InternalError("top-k selected " + std::to_string(sparse.nnz()) + " elements, more than the " +
                          std::to_string(kmax) + " its payload slot holds");
    }
    const uint64_t len = compression::encode(sparse, mine + 8, slotBytes_ - 8);
    std::memcpy(mine, &len, 8);
    CollectiveCall innerCall;
    innerCall.collective = Collective::kAllgather;
    innerCall.type = DataType::kUInt8;
    innerCall.count = slotBytes_;
    innerCall.input = mine;
    innerCall.output = gather_;
    innerCall.inPlace = true;
    return inner_.schedule(innerCall, ctx_);
  }

  void finish() override {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    auto* out = static_cast<float*>(call_.output);
    if (n) std::memset(out, 0, n * sizeof(float));
    for (int q = 0; q < p; ++q) {
      const char* slot = gather_ + static_cast<size_t>(q) * slotBytes_;
      uint64_t len = 0;
      std::memcpy(&len, slot, 8);
      if (len > slotBytes_ - 8) {
        throw TransportError("top-k payload of rank " + std::to_string(q) + " claims " + std::to_string(len) +
                             " bytes, more than its slot of " + std::to_string(slotBytes_ - 8));
      }
      compression::decodeAdd(slot + 8, static_cast<size_t>(len), out, n);
    }
    if (call_.op == ReduceOp::kAvg && n) ctx_.divide(out, n, static_cast<double>(p));
  }

  size_t slotBytes_ = 0;
  char* gather_ = nullptr;
};

}  // namespace

SchedulePtr compressedAllreduce(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                                compression::Residual* residual, const Algorithm& inner) {
  switch (spec.kind) {
    case Kind::kFp16:
    case Kind::kBf16:
      return makeSchedule<CastCompressedAllreduce>(ctx.workspace, call, ctx, spec, residual, inner);
    case Kind::kTopK:
      return makeSchedule<TopKAllreduce>(ctx.workspace, call, ctx, spec, residual, inner);
    case Kind::kNone:
      break;
  }
  throw InternalError("compressedAllreduce called without compression");
}

CollectiveCall compressedInnerCall(const CollectiveCall& call, const compression::Spec& spec, int size) {
  CollectiveCall c;
  c.count = call.count;
  c.inPlace = true;
  if (spec.kind == Kind::kTopK) {
    const size_t n = call.count;
    const size_t k = n == 0 ? 0 : spec.topkCount(n);
    const size_t kmax = spec.approximate ? std::min(n, k + k / 10 + 1) : k;
    c.collective = Collective::kAllgather;
    c.type = DataType::kUInt8;
    c.count = (8 + compression::encodedBytes(n, kmax) + 7) / 8 * 8;
  } else {
    c.collective = Collective::kAllreduce;
    c.type = spec.kind == Kind::kFp16 ? DataType::kFloat16 : DataType::kBFloat16;
    c.op = ReduceOp::kSum;
  }
  (void)size;
  return c;
}

}  // namespace gradcomm::algorithms
