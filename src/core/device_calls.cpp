// Collectives on device buffers: argument checks, the context's device, and
// the split of a call into staged chunks (core/device_staging.hpp).
#include <algorithm>
#include <optional>
#include <string>

#include "algorithms/catalog.hpp"
#include "base/log.hpp"
#include "compression/compression.hpp"
#include "core/communicator_impl.hpp"
#include "core/device_staging.hpp"
#include "device/runtime.hpp"

namespace gradcomm::detail {

using algorithms::CollectiveCall;

namespace {

std::string where(const device::Memory& m) {
  return m.device ? "device memory (device " + std::to_string(m.ordinal) + ")" : std::string("host memory");
}

/// One device per context (per process, as with NCCL): the first device call's.
void checkServes(const DeviceStaging& staging, int device) {
  if (staging.device() == device) return;
  throw InvalidArgument("the buffers are on device " + std::to_string(device) +
                        ", but this communicator serves device " + std::to_string(staging.device()) +
                        " (the device of its first call on device memory; one device per process, as with "
                        "NCCL): pass buffers of device " + std::to_string(staging.device()));
}

}  // namespace

bool touchesDeviceMemory(const CollectiveCall& call, int rank) {
  device::Runtime& rt = device::runtime();
  const BufferUses uses = buffersUsed(call, rank);
  return (uses.in && call.input && rt.classify(call.input).device) ||
         (uses.out && call.output && rt.classify(call.output).device);
}

int CommunicatorImpl::deviceOf(const CollectiveCall& call, const CollectiveOptions& options) const {
  device::Runtime& rt = device::runtime();
  const std::string name = toString(call.collective);
  const BufferUses uses = buffersUsed(call, rank_);
  const device::Memory in = uses.in && call.input ? rt.classify(call.input) : device::Memory{};
  const device::Memory out = uses.out && call.output ? rt.classify(call.output) : device::Memory{};
  if (uses.in && uses.out && call.count > 0 && (in.device != out.device || in.ordinal != out.ordinal)) {
    throw InvalidArgument(name + ": the input is " + where(in) + " but the output is " + where(out) +
                          "; pass both buffers on one device, or both in host memory");
  }
  const device::Memory& m = in.device ? in : out;
  if (!m.device) throw InternalError(name + ": a device call without device buffers");
  if (!rt.canMoveDeviceMemory()) {
    throw UnsupportedError(name + ": the buffers are " + where(m) +
                           ", but this gradcomm was built without CUDA (GRADCOMM_WITH_CUDA=OFF, or no CUDA "
                           "compiler when it was built); pass host memory, or use a build with CUDA");
  }
  {
    std::lock_guard<std::mutex> lock(context_->deviceMu);
    if (context_->device) checkServes(*context_->device, m.ordinal);
  }
  // A null stream is the legacy default stream of the buffers' device: the
  // call is made with that device current (submitDevice).
  const int streamDevice = options.stream ? rt.streamDevice(options.stream) : m.ordinal;
  if (streamDevice != m.ordinal) {
    throw InvalidArgument(name + ": CollectiveOptions::stream belongs to device " + std::to_string(streamDevice) +
                          " but the buffers are on device " + std::to_string(m.ordinal) +
                          "; pass a stream of the buffers' device");
  }
  return m.ordinal;
}

std::shared_ptr<DeviceStaging> CommunicatorImpl::deviceStaging(int device) {
  std::lock_guard<std::mutex> lock(context_->deviceMu);
  if (!context_->device) {
    context_->device = std::make_shared<DeviceStaging>(device::sharedRuntime(), device);
    engine_->serveDevice(device);
  } else {
    checkServes(*context_->device, device);
  }
  return context_->device;
}

Work CommunicatorImpl::submitDevice(const CollectiveCall& call, const CollectiveOptions& options) {
  closePointToPoint();  // transfers issued later run after this call
  const size_t elem = dataTypeSize(call.type);
  const size_t n = call.count;
  const BufferUses uses = buffersUsed(call, rank_);
  // The host calls (one per chunk) on the pinned block, each chunk's
  // copies, and the algorithm that runs each.
  std::vector<CollectiveCall> hostCalls;
  std::vector<const algorithms::Algorithm*> algos;
  std::shared_ptr<StagedCall> staged;
  compression::Spec spec;
  std::optional<device::CurrentDevice> current;  // to the end of the call
  try {
    validate(call);
    spec = compressionFor(call, options);
    const int device = deviceOf(call, options);
    current.emplace(device::runtime(), device);
    // Compressed calls compress on the device; their payloads are staged.
    if (spec.kind != compression::Kind::kNone) return submitDeviceCompressed(call, spec, options, device);
    if (auto comm = directEngine(call, device)) return submitDirect(comm, call, options, device);
    auto staging = deviceStaging(device);
    const bool perRank = call.collective == Collective::kAllgather || call.collective == Collective::kReduceScatter;
    const size_t hostBytes = n * elem * (perRank ? static_cast<size_t>(size_) : 1);
    staged = std::make_shared<StagedCall>(staging, hostBytes);
    char* host = staged->host();
    auto& chunks = staged->chunks();
    CollectiveCall h = call;
    h.inPlace = true;
    if (perRank) {
      // One chunk: this rank's block sits at its place in the whole.
      const size_t block = n * elem, mine = static_cast<size_t>(rank_) * block;
      StagedCall::Chunk c;
      c.deviceIn = call.input;
      c.deviceOut = call.output;
      if (call.collective == Collective::kAllgather) {
        c.hostIn = host + mine, c.inBytes = block, c.hostOut = host, c.outBytes = block * size_;
        h.input = host + mine, h.output = host;
      } else {
        c.hostIn = host, c.inBytes = block * size_, c.hostOut = host + mine, c.outBytes = block;
        h.input = host, h.output = host + mine;
      }
      chunks.push_back(c);
      hostCalls.push_back(h);
    } else {
      // Elementwise collectives: chunks of GRADCOMM_DEVICE_CHUNK_SIZE.
      const size_t per = std::max<size_t>(1, config_.deviceChunkBytes / elem);
      for (size_t first = 0; first < n || (n == 0 && chunks.empty()); first += per) {
        const size_t len = std::min(per, n - first), off = first * elem;
        StagedCall::Chunk c;
        c.hostIn = host + off;
        c.hostOut = host + off;
        if (uses.in) c.deviceIn = static_cast<const char*>(call.input) + off, c.inBytes = len * elem;
        if (uses.out && call.output) c.deviceOut = static_cast<char*>(call.output) + off, c.outBytes = len * elem;
        chunks.push_back(c);
        h.input = host + off, h.output = host + off, h.count = len;
        hostCalls.push_back(h);
        if (n == 0) break;
      }
    }
    for (const CollectiveCall& hc : hostCalls) {
      algos.push_back(selector_.select(hc, {*transport_, view_}, options.algorithm).algorithm);
    }
    staged->start(options.stream);
  } catch (const Error& err) {
    reject(err, call);
  }
  Work last;
  for (size_t i = 0; i < hostCalls.size(); ++i) {
    const CollectiveCall& hc = hostCalls[i];
    transport::CallSignature signature = callSignature(hc, algos[i]->name(), {});
    signature.memory = 1;
    const algorithms::RunContext ctx = runContext(hc, numberCall(signature));
    if (i == 0) {
      logChoice(call, signature.seq, algos[i]->name(),
                "device buffers, " + std::to_string(hostCalls.size()) + " staged chunk(s)");
    }
    auto op = OperationState::forCall(algos[i], hc, ctx, signature, algorithms::Selector::callBytes(hc, size_));
    op->staged = staged;
    op->deviceDone = staged;
    op->stagedChunk = i;
    last = enqueue(op);
  }
  return last;
}

}  // namespace gradcomm::detail
