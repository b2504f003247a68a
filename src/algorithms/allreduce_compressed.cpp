// Compressed allreduce of float32 gradients, driven only through the
// Compressor interface (compression/compressor.hpp).
//
// Compress (with error feedback, and pre-scaling when asked and the payload
// is summed in reduced precision), move the payloads with an ordinary
// algorithm, decompress into the output. Which algorithm moves them follows
// from Compressor::summable():
// - summable (fp16, bf16): allreduce the payloads (the reduction kernels
//   accumulate in float32 and round once per step), decode the sum;
// - not summable (top-k): allgather fixed-size payload slots (the selected
//   count varies within 10% in approximate mode), then decompress-accumulate
//   every rank's payload, in rank order, into the output. Every payload is
//   validated by the compressor before it touches memory.
#include "algorithms/compressed.hpp"

#include <algorithm>
#include <string>

#include "compression/compressor.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {
namespace {

using Clock = std::chrono::steady_clock;

void recordPhase(const RunContext& ctx, const char* name, Clock::time_point start) {
  if (ctx.phases) ctx.phases->push_back({name, {start, Clock::now()}});
}

/// The call that moves `compressor`'s payloads of `count` elements (its
/// buffers left to fill): an allreduce of summable payloads, else an
/// allgather of payload slots.
CollectiveCall innerCallOf(const compression::Compressor& compressor, size_t count) {
  CollectiveCall c;
  c.type = compressor.payloadType();
  c.count = compressor.payloadBytes(count) / dataTypeSize(c.type);
  c.inPlace = true;
  if (compressor.summable()) {
    c.collective = Collective::kAllreduce;
    c.op = ReduceOp::kSum;
  } else {
    c.collective = Collective::kAllgather;
  }
  return c;
}

/// Compress, run an ordinary algorithm on the payloads, decompress.
class CompressedSchedule final : public Schedule {
 public:
  CompressedSchedule(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                     compression::Residual* residual, const Algorithm& inner)
      : call_(call),
        ctx_(ctx),
        residual_(residual),
        inner_(inner),
        compressor_(compression::makeCompressor(spec, compression::MemoryKind::kHost, ctx.simd)),
        // Pre-scaling keeps a reduced-precision sum from overflowing; payloads
        // that are not summed have nothing to protect.
        prescale_(spec.prescale && compressor_->summable()) {}

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
    const char* what = compressor_->summable() ? "compressed allreduce" : "compressed allgather";
    return std::string(what) + ": " + (innerSchedule_ ? innerSchedule_->waitingFor() : "compressing");
  }
  void healthCheck() override {
    if (innerSchedule_) innerSchedule_->healthCheck();
  }

 private:
  SchedulePtr prepare() {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    const int r = ctx_.transport->rank();
    slotBytes_ = compressor_->payloadBytes(n);
    const auto args = compression::CompressArgs::forCall(prescale_, p, ctx_.tag.seq, r);
    const auto* in = static_cast<const float*>(call_.input);
    float* residual = residual_ ? residual_->data(n) : nullptr;
    CollectiveCall innerCall = innerCallOf(*compressor_, n);
    RunContext innerCtx = ctx_;
    if (compressor_->summable()) {
      payloads_ = ctx_.workspace->buffer(0, std::max<size_t>(slotBytes_, dataTypeSize(innerCall.type)));
      compressor_->compress(in, residual, n, payloads_, args);
      innerCall.input = payloads_;
      innerCall.output = payloads_;
      innerCtx.reduce = kernels::reduceFunction(innerCall.type, ReduceOp::kSum, ctx_.simd);
    } else {
      payloads_ = ctx_.workspace->buffer(1, slotBytes_ * static_cast<size_t>(p));
      char* mine = payloads_ + static_cast<size_t>(r) * slotBytes_;
      compressor_->compress(in, residual, n, mine, args);
      innerCall.input = mine;
      innerCall.output = payloads_;
    }
    return inner_.schedule(innerCall, innerCtx);
  }

  void finish() {
    const size_t n = call_.count;
    const int p = ctx_.transport->size();
    auto* out = static_cast<float*>(call_.output);
    compressor_->decompressAll(payloads_, slotBytes_, p, out, n);
    // Pre-scaled values already summed to the average (a sum is scaled
    // back); otherwise avg divides, exactly like the uncompressed paths.
    const bool avg = call_.op == ReduceOp::kAvg;
    if (prescale_ && !avg) {
      for (size_t i = 0; i < n; ++i) out[i] *= static_cast<float>(p);
    } else if (!prescale_ && avg && n) {
      ctx_.divide(out, n, static_cast<double>(p));
    }
  }

  CollectiveCall call_;
  RunContext ctx_;
  compression::Residual* residual_;
  const Algorithm& inner_;
  compression::CompressorPtr compressor_;
  bool prescale_;
  size_t slotBytes_ = 0;
  char* payloads_ = nullptr;
  SchedulePtr innerSchedule_;
  bool innerDone_ = false;
  bool done_ = false;
};

}  // namespace

SchedulePtr compressedAllreduce(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                                compression::Residual* residual, const Algorithm& inner) {
  return makeSchedule<CompressedSchedule>(ctx.workspace, call, ctx, spec, residual, inner);
}

CollectiveCall compressedInnerCall(const CollectiveCall& call, const compression::Spec& spec) {
  // Only the payload's shape matters here, which no kernel level changes.
  return innerCallOf(*compression::makeCompressor(spec, compression::MemoryKind::kHost), call.count);
}

}  // namespace gradcomm::algorithms
