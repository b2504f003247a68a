// The NCCL engine under the Communicator: which engine a communicator's
// device calls take (chosen with the other ranks at the first device call
// that needs it), the NCCL group formed through gradcomm's own exchanges,
// and calls queued on the caller's stream beside a host operation that
// checks the ranks' calls.
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "algorithms/catalog.hpp"
#include "base/hash.hpp"
#include "base/log.hpp"
#include "core/communicator_impl.hpp"
#include "core/device_staging.hpp"
#include "device/collective_library.hpp"

namespace gradcomm::detail {

using algorithms::CollectiveCall;

namespace {

/// What each rank tells the others before the choice.
struct EngineRecord {
  uint8_t usable = 0;     ///< the library can serve this rank
  uint8_t pad[7] = {};
  uint64_t identity = 0;  ///< hash of the device's identity
};
static_assert(sizeof(EngineRecord) == 16, "EngineRecord travels as bytes");

/// A group id as it travels: its length, then the bytes.
constexpr size_t kMaxIdBytes = 128;
struct IdRecord {
  uint32_t bytes = 0;
  char id[kMaxIdBytes] = {};
};

/// The host part of an NCCL engine call: no data, only the call check.
class CheckOnly final : public algorithms::Schedule {
 public:
  bool advance() override { return false; }
  bool done() const override { return true; }
  std::string waitingFor() const override { return {}; }
};

/// The device part of an NCCL engine call: the event recorded after it on
/// the caller's stream (from the staging's pool, given back at the end),
/// and the device blocks its kernels use.
class DirectCall final : public DeviceCompletion {
 public:
  DirectCall(std::shared_ptr<DeviceStaging> staging, device::Event event, DirectBlocks blocks,
             std::shared_ptr<device::DeviceComm> comm, std::weak_ptr<core::ProgressEngine> engine,
             std::chrono::nanoseconds timeout, std::string what, std::function<void()> check)
      : staging_(std::move(staging)),
        rt_(&staging_->runtime()),
        event_(event),
        blocks_(std::move(blocks)),
        comm_(std::move(comm)),
        engine_(std::move(engine)),
        timeout_(timeout),
        what_(std::move(what)),
        check_(std::move(check)) {}
  // The kernels may still run (a Work dropped before they finished): the
  // blocks go back once the event says they did.
  ~DirectCall() override {
    staging_->retire(event_, std::move(blocks_.device), blocks_.pinned, blocks_.pinnedCapacity);
  }
  // The event first: kernels that end because a peer aborted the group
  // complete it too, and the failure, known by then, must win. Then the
  // check of what the kernels read (top-k payloads), once, its verdict kept.
  bool done() override {
    const bool finished = rt_->done(event_);
    throwIfFailed();
    if (finished) runCheck();
    return finished;
  }
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0; !done(); ++polls) {
      if (timeout_.count() > 0 && std::chrono::steady_clock::now() - start > timeout_) {
        comm_->abort();  // ends the kernels that wait for a peer
        throw TimeoutError(what_ + ": the device did not finish it within GRADCOMM_TIMEOUT; the NCCL group was "
                                   "aborted");
      }
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  // A call whose kernels' result is checked on the host (top-k payloads)
  // waits for its event first, so no stream goes on with unchecked data.
  void streamWait(device::Stream stream) override {
    throwIfFailed();
    if (checkPending()) wait();
    rt_->streamWait(stream, event_);
  }

 private:
  bool checkPending() {
    std::lock_guard<std::mutex> lock(checkMu_);
    return check_ || checkError_;
  }
  void runCheck() {
    std::lock_guard<std::mutex> lock(checkMu_);
    if (check_) {
      auto check = std::move(check_);
      check_ = nullptr;
      try {
        check();
      } catch (const Error& e) {
        checkError_ = std::make_exception_ptr(TransportError(what_ + ": " + e.what()));
      }
    }
    if (checkError_) std::rethrow_exception(checkError_);
  }
  /// Throws when the communicator failed (another rank's error, or a
  /// mismatch: its kernels will not end by themselves, so the group is
  /// aborted) or the library reports an error.
  void throwIfFailed() {
    onEngine([](core::ProgressEngine& e) { e.throwIfFailed(); });
    const std::string error = comm_->asyncError();
    if (error.empty()) return;
    // A group fails when a rank whose call failed aborted it; that rank's
    // reason comes through the communicator, a moment later.
    onEngine([this](core::ProgressEngine& e) { e.throwIfPeerAborted(std::chrono::seconds(1), what_); });
    throw DeviceError(what_ + ": " + error);
  }
  /// Runs `check` on the communicator's engine; when it throws (the
  /// communicator failed), the group is aborted first.
  template <typename F>
  void onEngine(F&& check) {
    auto engine = engine_.lock();
    if (!engine) return;
    try {
      check(*engine);
    } catch (const Error&) {
      comm_->abort();
      throw;
    }
  }
  std::shared_ptr<DeviceStaging> staging_;
  device::Runtime* rt_;
  device::Event event_;
  DirectBlocks blocks_;
  std::shared_ptr<device::DeviceComm> comm_;
  std::weak_ptr<core::ProgressEngine> engine_;
  std::chrono::nanoseconds timeout_;
  std::string what_;
  std::mutex checkMu_;
  std::function<void()> check_;
  std::exception_ptr checkError_;
};

}  // namespace

std::vector<char> CommunicatorImpl::exchangeForDeviceCall(const CollectiveCall& call, const void* mine, size_t bytes,
                                                          const char* what) {
  std::vector<char> all(bytes * static_cast<size_t>(size_));
  std::memcpy(all.data() + bytes * static_cast<size_t>(rank_), mine, bytes);
  if (size_ == 1) return all;
  // Checked as the caller's call: a rank whose call differs (a host call,
  // another count) fails here with the difference named.
  transport::CallSignature signature = callSignature(call, what, {});
  signature.memory = 1;
  const transport::Tag tag = numberCall(signature);
  internalAllgather(all.data() + bytes * static_cast<size_t>(rank_), all.data(), bytes, signature, tag, nullptr);
  return all;
}

std::shared_ptr<device::DeviceComm> CommunicatorImpl::directEngine(const CollectiveCall& call, int device) {
  std::lock_guard<std::mutex> lock(deviceEngineMu_);
  if (deviceEngineChosen_) return deviceComm_;
  // Chosen once, also when the choice fails: the failure fails the
  // communicator on every rank.
  deviceEngineChosen_ = true;
  const std::string& want = config_.deviceEngine;
  if (want == "staged") {
    deviceEngineWhy_ = "GRADCOMM_DEVICE_ENGINE=staged";
    return nullptr;
  }
  std::shared_ptr<device::CollectiveLibrary> lib = device::collectiveLibrary();
  const std::string mine = !lib ? "this gradcomm was built without NCCL" : lib->unavailable();
  EngineRecord record;
  record.usable = mine.empty() ? 1 : 0;
  const std::string identity = device::runtime().identity(device);
  record.identity = core::fnv1a64(core::kFnv64Basis, identity.data(), identity.size());
  const std::vector<char> all = exchangeForDeviceCall(call, &record, sizeof record);
  std::vector<EngineRecord> ranks(static_cast<size_t>(size_));
  std::memcpy(ranks.data(), all.data(), all.size());
  // Every rank reaches the same verdict from the same records.
  std::string why;
  for (int r = 0; r < size_ && why.empty(); ++r) {
    if (!ranks[r].usable) why = r == rank_ ? mine : "rank " + std::to_string(r) + " cannot open NCCL";
  }
  for (int a = 0; a < size_ && why.empty(); ++a) {
    for (int b = a + 1; b < size_ && why.empty(); ++b) {
      if (ranks[a].identity == ranks[b].identity) {
        why = "ranks " + std::to_string(a) + " and " + std::to_string(b) +
              " share one device (NCCL takes one rank per device)";
      }
    }
  }
  if (!why.empty()) {
    if (want == "nccl") {
      throw UnsupportedError("GRADCOMM_DEVICE_ENGINE=nccl, but " + why +
                             "; use GRADCOMM_DEVICE_ENGINE=auto or staged");
    }
    core::logOnce(core::LogLevel::kInfo, rank_, "device calls are staged through host memory: " + why);
    deviceEngineWhy_ = why;
    return nullptr;
  }
  IdRecord id;
  if (rank_ == 0) {
    const std::vector<char> bytes = lib->newId();
    if (bytes.size() > kMaxIdBytes) throw InternalError("NCCL engine: the group id is longer than its record");
    id.bytes = static_cast<uint32_t>(bytes.size());
    std::memcpy(id.id, bytes.data(), bytes.size());
  }
  const std::vector<char> ids = exchangeForDeviceCall(call, &id, sizeof id, "engine-id");
  std::memcpy(&id, ids.data(), sizeof id);  // rank 0's
  std::weak_ptr<core::ProgressEngine> engine = engine_;
  deviceComm_ = lib->join(std::vector<char>(id.id, id.id + id.bytes), size_, rank_, device, [engine] {
    auto e = engine.lock();
    if (!e) return true;
    try {
      e->throwIfFailed();
      return false;
    } catch (const Error&) {
      return true;
    }
  });
  core::logOnce(core::LogLevel::kInfo, rank_, "device calls run on " + lib->name());
  deviceEngineWhy_ = "every rank has a device of its own and opened " + lib->name();
  return deviceComm_;
}

Communicator::DeviceEngine CommunicatorImpl::deviceEngine(int device) {
  closePointToPoint();
  // In the order of calls as a zero-length device allreduce: every rank
  // asks, and its exchanges are checked like a call's.
  CollectiveCall call;
  call.collective = Collective::kAllreduce;
  call.type = DataType::kFloat32;
  call.op = ReduceOp::kSum;
  device::Runtime& rt = device::runtime();
  try {
    if (device < -1) {
      throw InvalidArgument("deviceEngine: device " + std::to_string(device) + " is not a device (-1: the current one)");
    }
    const bool built = rt.canMoveDeviceMemory();
    const uint8_t able = built && rt.devicesPresent() ? 1 : 0;
    const std::vector<char> all = exchangeForDeviceCall(call, &able, sizeof able, "device-query");
    for (int r = 0; r < size_; ++r) {
      if (all[static_cast<size_t>(r)]) continue;
      if (r != rank_) {
        return {"none", "rank " + std::to_string(r) + " cannot make device calls (no CUDA device, or no CUDA in its build)"};
      }
      return {"none", built ? "no CUDA device is visible in this process" : "this gradcomm was built without CUDA"};
    }
    const std::shared_ptr<device::DeviceComm> comm = directEngine(call, device < 0 ? rt.streamDevice(nullptr) : device);
    std::lock_guard<std::mutex> lock(deviceEngineMu_);
    return {comm ? "nccl" : "staged", deviceEngineWhy_};
  } catch (const Error& e) {
    abortAndThrow(e, "could not decide its device engine");
  }
}

Work CommunicatorImpl::submitDirect(const std::shared_ptr<device::DeviceComm>& comm, const CollectiveCall& call,
                                    const CollectiveOptions& options, int device) {
  const device::Stream stream = options.stream;
  return submitDirectOperation(comm, call, "", options, device, [&](uint64_t) -> std::function<void()> {
    switch (call.collective) {
      case Collective::kAllreduce:
        comm->allreduce(call.input, call.output, call.count, call.type, call.op, stream);
        break;
      case Collective::kBroadcast:
        comm->broadcast(call.input, call.output, call.count, call.type, call.root, stream);
        break;
      case Collective::kReduce:
        comm->reduce(call.input, call.output, call.count, call.type, call.op, call.root, stream);
        break;
      case Collective::kAllgather:
        comm->allgather(call.input, call.output, call.count, call.type, stream);
        break;
      case Collective::kReduceScatter:
        comm->reduceScatter(call.input, call.output, call.count, call.type, call.op, stream);
        break;
      default:
        throw InternalError(std::string("NCCL engine: ") + toString(call.collective) + " has no device form");
    }
    return {};
  });
}

Work CommunicatorImpl::submitDirectOperation(const std::shared_ptr<device::DeviceComm>& comm, const CollectiveCall& call,
                                             const std::string& label, const CollectiveOptions& options, int device,
                                             const std::function<std::function<void()>(uint64_t seq)>& queue,
                                             DirectBlocks blocks) {
  const device::Stream stream = options.stream;
  auto staging = deviceStaging(device);
  // Device receives issued before this call: their data must be in place
  // before the caller's stream runs it (this rank's failure, if any, fails
  // the call below).
  std::vector<std::weak_ptr<OperationState>> receives;
  {
    std::lock_guard<std::mutex> lock(context_->deviceMu);
    receives.swap(context_->deviceReceives);
  }
  for (const auto& r : receives) {
    if (auto received = r.lock()) {
      try {
        Work(received).wait();
      } catch (const Error&) {
      }
    }
  }
  const std::string algorithm = label.empty() ? "nccl" : label + "+nccl";
  auto op = OperationState::create();
  op->algorithm = algorithm;
  op->signature = callSignature(call, "nccl", label);
  op->signature.memory = 1;
  const transport::Tag tag = numberCall(op->signature);
  op->seq = tag.seq;
  op->fingerprint = tag.fingerprint;
  op->bytes = algorithms::Selector::callBytes(call, size_);
  const std::string what = std::string(toString(call.collective)) + (label.empty() ? "" : "[" + label + "]") + " on NCCL";
  device::Event event = nullptr;
  std::function<void()> check;
  try {
    check = queue(op->seq);
    event = staging->takeEvent();
    staging->runtime().record(event, stream);
  } catch (const Error&) {
    // What was queued may wait for peers that never match it: the group is
    // aborted (the communicator fails too: the caller rejects the call).
    // The blocks may be in use by what was queued: they are not reused.
    comm->abort();
    // A group that refused the call may have been aborted by another
    // rank's failure: that reason, when it comes, is the error here.
    engine_->throwIfPeerAborted(std::chrono::seconds(1), what);
    throw;
  }
  logChoice(call, op->seq, algorithm, "device buffers, GRADCOMM_DEVICE_ENGINE=" + config_.deviceEngine);
  CollectiveCall none;
  none.collective = Collective::kBarrier;
  op->ctx = runContext(none, tag);
  op->call = call;
  op->custom = [](const algorithms::RunContext& ctx) {
    return algorithms::makeSchedule<CheckOnly>(ctx.workspace);
  };
  op->customWhat = what;
  op->deviceDone =
      std::make_shared<DirectCall>(staging, event, std::move(blocks), comm, engine_, config_.timeout, what,
                                   std::move(check));
  // Ranks whose calls differ have queued kernels that will never match:
  // the failed check ends them.
  std::weak_ptr<device::DeviceComm> weak = comm;
  op->addCallback([weak](std::exception_ptr e) {
    if (!e) return;
    if (auto c = weak.lock()) c->abort();
  });
  return enqueue(op);
}

}  // namespace gradcomm::detail
