// Compressed allreduce of device buffers: the device runtime's compressors
// run on the device. With the NCCL engine (a device per rank), summable
// payloads (fp16, bf16) are summed by ncclAllReduce and top-k slots
// gathered by ncclAllGather, everything on the caller's stream
// (submitDirectCompressed below; a top-k call's payloads are checked when
// its event has completed). Otherwise only payloads pass through pinned
// host memory:
//
//   to-host stream:   [wait caller, earlier copies back] compress (input +
//                     residual -> payload, device) -> copy payload to pinned
//   progress engine:  the host algorithm moves the payloads (an allreduce of
//                     summable payloads, an allgather of top-k slots)
//   to-device stream: copy payload(s) back -> decompressAll into the output
//                     -> avg or pre-scale correction -> the event
//                     Work::wait / synchronize wait for
//
// Every step mirrors algorithms/allreduce_compressed.cpp (same payload
// shape, seed, scale, inner algorithm and rank order of decompression), so
// with deterministic compressors the result equals the host path's bit for
// bit. The residual lives in device memory of the call's device.
#include <algorithm>
#include <memory>
#include <string>

#include "compression/compressor.hpp"
#include "core/communicator_impl.hpp"
#include "core/device_staging.hpp"
#include "device/collective_library.hpp"
#include "kernels/reduce.hpp"

namespace gradcomm::detail {

using algorithms::CollectiveCall;

namespace {

/// The tensor's residual in memory of `device`, or null without one:
/// allocated by the tensor's first device call and zeroed on `compressOn`
/// (the stream its compress runs on) ahead of it.
float* deviceResidual(compression::Residual* residual, size_t n, int device, device::Runtime& rt,
                      device::Stream compressOn) {
  if (!residual) return nullptr;
  return residual->deviceData(n, device, [&rt, device, compressOn](size_t bytes) {
    std::shared_ptr<void> owned = device::allocateOwned(device::sharedRuntime(), device, bytes);
    rt.zero(owned.get(), bytes, compressOn);
    return owned;
  });
}

/// As the host path: pre-scaled values summed to the average (a sum is
/// scaled back); otherwise avg divides. Queued on `s`.
void scaleAfterSum(device::Runtime& rt, float* out, size_t n, int ranks, bool prescale, bool avg, device::Stream s) {
  if (prescale && !avg) {
    rt.multiply(out, n, static_cast<float>(ranks), s);
  } else if (!prescale && avg && n) {
    rt.divide(out, n, static_cast<float>(ranks), s);
  }
}

}  // namespace

Work CommunicatorImpl::submitDeviceCompressed(const CollectiveCall& call, const compression::Spec& spec,
                                              const CollectiveOptions& options, int device) {
  if (auto comm = directEngine(call, device)) return submitDirectCompressed(comm, call, spec, options, device);
  auto staging = deviceStaging(device);
  device::Runtime* rt = &staging->runtime();
  // One compressor per stream: compress runs on the to-host stream (after
  // the caller's work), decompress on the to-device stream (before the event
  // the caller waits for).
  std::shared_ptr<compression::Compressor> compressor = rt->makeCompressor(spec, device, staging->toHost());
  std::shared_ptr<compression::Compressor> decompressor = rt->makeCompressor(spec, device, staging->toDevice());
  const size_t n = call.count;
  const int p = size_, r = rank_;
  const bool summable = compressor->summable();
  const DataType type = compressor->payloadType();
  const size_t slot = compressor->payloadBytes(n);
  // As the host path: a summed payload is at least one element; top-k
  // payloads are one fixed slot per rank.
  const size_t bytes = summable ? std::max(slot, dataTypeSize(type)) : slot * static_cast<size_t>(p);
  const size_t mine = summable ? 0 : static_cast<size_t>(r) * slot;

  // The signature says "device" and, as every staged call, in place.
  CollectiveCall sig = call;
  sig.inPlace = true;
  CompressedChoice choice;
  auto op = compressedOperation(sig, spec, options, true, &choice);
  // Compress runs on the to-host stream.
  float* residual = deviceResidual(choice.residual, n, device, *rt, staging->toHost());

  auto staged = std::make_shared<StagedCall>(staging, bytes);
  char* payloads = static_cast<char*>(staged->deviceBlock(bytes));
  StagedCall::Chunk c;
  c.deviceIn = payloads + mine;
  c.hostIn = staged->host() + mine;
  c.inBytes = slot;
  c.hostOut = staged->host();
  c.deviceOut = payloads;
  c.outBytes = summable ? slot : bytes;
  staged->chunks().push_back(c);

  const bool prescale = spec.prescale && summable;
  const auto args = compression::CompressArgs::forCall(prescale, p, op->seq, r);
  const auto* in = static_cast<const float*>(call.input);
  auto* out = static_cast<float*>(call.output);
  const bool avg = call.op == ReduceOp::kAvg;
  staged->setDeviceWork(
      [compressor, in, residual, n, payloads, mine, args](device::Stream) {
        compressor->compress(in, residual, n, payloads + mine, args);
      },
      [decompressor, rt, out, n, payloads, slot, prescale, avg, p](device::Stream s) {
        decompressor->decompressAll(payloads, slot, p, out, n);
        scaleAfterSum(*rt, out, n, p, prescale, avg, s);
      });
  staged->start(options.stream);

  // The host part: move the payloads in the pinned block.
  CollectiveCall inner;
  inner.type = type;
  inner.count = slot / dataTypeSize(type);
  inner.inPlace = true;
  if (summable) {
    inner.collective = Collective::kAllreduce;
    inner.op = ReduceOp::kSum;
    inner.input = staged->host();
    inner.output = staged->host();
  } else {
    inner.collective = Collective::kAllgather;
    inner.input = staged->host() + mine;
    inner.output = staged->host();
  }
  const algorithms::Algorithm* algo = choice.inner;
  op->custom = [inner, algo, summable](const algorithms::RunContext& ctx) {
    algorithms::RunContext c = ctx;
    if (summable) c.reduce = kernels::reduceFunction(inner.type, ReduceOp::kSum, ctx.simd);
    return algo->schedule(inner, c);
  };
  op->customWhat = "allreduce[" + spec.toString() + ", on device]";
  op->staged = staged;
  op->deviceDone = staged;
  op->stagedChunk = 0;
  return enqueue(op);
}

Work CommunicatorImpl::submitDirectCompressed(const std::shared_ptr<device::DeviceComm>& comm,
                                              const CollectiveCall& call, const compression::Spec& spec,
                                              const CollectiveOptions& options, int device) {
  auto staging = deviceStaging(device);
  device::Runtime* rt = &staging->runtime();
  const device::Stream stream = options.stream;
  // One compressor on the caller's stream: compress, the sum and
  // decompress follow each other there.
  std::shared_ptr<compression::Compressor> compressor = rt->makeCompressor(spec, device, stream);
  const size_t n = call.count;
  const int p = size_, r = rank_;
  const bool summable = compressor->summable();
  const DataType type = compressor->payloadType();
  const size_t slot = compressor->payloadBytes(n);
  float* residual = deviceResidual(residualFor(spec, options, true), n, device, *rt, stream);
  // Taken last: a throw above leaves nothing behind. Summed payloads are
  // one slot (at least an element); top-k slots one per rank, gathered in
  // place, and the check of the gathered slots lands in pinned memory.
  DirectBlocks blocks;
  size_t capacity = 0;
  const size_t bytes = summable ? std::max(slot, dataTypeSize(type)) : slot * static_cast<size_t>(p);
  char* payloads = static_cast<char*>(staging->acquireDevice(bytes, &capacity));
  blocks.device.emplace_back(payloads, capacity);
  if (const size_t checkBytes = summable ? 0 : compressor->queuedCheckBytes(p)) {
    blocks.pinned = staging->acquire(checkBytes, &blocks.pinnedCapacity);
  }
  void* hostCheck = blocks.pinned;
  char* mine = payloads + (summable ? 0 : static_cast<size_t>(r) * slot);
  const bool prescale = spec.prescale && summable;
  const bool avg = call.op == ReduceOp::kAvg;
  const auto* in = static_cast<const float*>(call.input);
  auto* out = static_cast<float*>(call.output);
  return submitDirectOperation(comm, call, spec.toString(), options, device, [&](uint64_t seq) {
    // As the staged and host paths: the same scale and seed, the payloads
    // summed (or gathered and added in rank order), then the avg division
    // or the pre-scale correction in float32.
    compressor->compress(in, residual, n, mine, compression::CompressArgs::forCall(prescale, p, seq, r));
    std::function<void()> check;
    if (summable) {
      comm->allreduce(payloads, payloads, slot / dataTypeSize(type), type, ReduceOp::kSum, stream);
      compressor->decompress(payloads, out, n);
    } else {
      comm->allgather(mine, payloads, slot, DataType::kUInt8, stream);
      check = compressor->decompressAllQueued(payloads, slot, p, out, n, hostCheck);
    }
    scaleAfterSum(*rt, out, n, p, prescale, avg, stream);
    return check;
  }, std::move(blocks));
}

}  // namespace gradcomm::detail
