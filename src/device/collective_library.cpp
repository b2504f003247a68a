#include "device/collective_library.hpp"

#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "gradcomm/error.hpp"

#if GRADCOMM_HAVE_NCCL
#include <nccl.h>

#include <cstring>

#include "device/cuda_scope.hpp"
#include "device/nccl_library.hpp"
#endif

namespace gradcomm::device {
namespace {

#if GRADCOMM_HAVE_NCCL

// NCCL's functions the engine calls: (member, NCCL name).
#define GRADCOMM_NCCL_FUNCTIONS(X)                                                                          \
  X(getVersion, ncclGetVersion) X(getUniqueId, ncclGetUniqueId) X(initRankConfig, ncclCommInitRankConfig) \
  X(getAsyncError, ncclCommGetAsyncError) X(destroy, ncclCommDestroy) X(abort, ncclCommAbort)              \
  X(errorString, ncclGetErrorString) X(lastError, ncclGetLastError) X(allReduce, ncclAllReduce)          \
  X(broadcast, ncclBroadcast) X(reduce, ncclReduce) X(allGather, ncclAllGather)                          \
  X(reduceScatter, ncclReduceScatter)

/// NCCL's functions, looked up once in the library NcclLibrary opened.
struct NcclApi {
#define GRADCOMM_NCCL_MEMBER(member, name) decltype(&name) member = nullptr;
  GRADCOMM_NCCL_FUNCTIONS(GRADCOMM_NCCL_MEMBER)
#undef GRADCOMM_NCCL_MEMBER
  std::string missing;  ///< the first function the library lacks, or ""

  void load(NcclLibrary& lib) {
#define GRADCOMM_NCCL_LOOKUP(member, name)                    \
  member = lib.get<decltype(&name)>(#name);                   \
  if (!member && missing.empty()) missing = #name;
    GRADCOMM_NCCL_FUNCTIONS(GRADCOMM_NCCL_LOOKUP)
#undef GRADCOMM_NCCL_LOOKUP
  }
};
#undef GRADCOMM_NCCL_FUNCTIONS

ncclDataType_t ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  throw InvalidArgument("NCCL engine: unknown data type");
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw InvalidArgument("NCCL engine: unknown reduction");
}

/// "`what` failed: " and NCCL's string for `rc`, with `comm`'s last error.
std::string describeFailure(const NcclApi& api, ncclComm_t comm, ncclResult_t rc, const char* what) {
  std::string out = std::string(what) + " failed: " + api.errorString(rc);
  const char* last = api.lastError ? api.lastError(comm) : nullptr;
  if (last && *last) out += " (" + std::string(last) + ")";
  return out;
}

/// One NCCL communicator. Calls come from the caller's threads; abort()
/// may come from the progress thread when the gradcomm communicator fails,
/// so the handle is used under a lock, never after it was aborted.
class NcclComm final : public DeviceComm {
 public:
  /// `api` is copied (the library object may go first); `cancelled` as for join().
  NcclComm(const NcclApi& api, ncclComm_t comm, int device, std::function<bool()> cancelled)
      : api_(api), comm_(comm), device_(device), cancelled_(std::move(cancelled)) {}
  ~NcclComm() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    // A failed group is aborted: destroying it would wait for kernels that
    // may never end, and NCCL's destroy of a group in an error state
    // returns that error having freed nothing.
    ncclResult_t state = ncclSuccess;
    if (!failed_ && api_.getAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess &&
        api_.destroy(comm_) == ncclSuccess) {
      return;
    }
    api_.abort(comm_);
  }

  void allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, Stream s) override {
    run("ncclAllReduce", [&] { return api_.allReduce(in, out, count, ncclType(type), ncclOp(op), comm_, cuda(s)); });
  }
  void broadcast(const void* in, void* out, size_t count, DataType type, int root, Stream s) override {
    run("ncclBroadcast", [&] { return api_.broadcast(in, out, count, ncclType(type), root, comm_, cuda(s)); });
  }
  void reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root, Stream s) override {
    run("ncclReduce",
        [&] { return api_.reduce(in, out, count, ncclType(type), ncclOp(op), root, comm_, cuda(s)); });
  }
  void allgather(const void* in, void* out, size_t count, DataType type, Stream s) override {
    run("ncclAllGather", [&] { return api_.allGather(in, out, count, ncclType(type), comm_, cuda(s)); });
  }
  void reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op, Stream s) override {
    run("ncclReduceScatter",
        [&] { return api_.reduceScatter(in, out, count, ncclType(type), ncclOp(op), comm_, cuda(s)); });
  }
  std::string asyncError() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return "the NCCL group was aborted (the communicator failed)";
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = api_.getAsyncError(comm_, &state);
    if (rc != ncclSuccess) return describeFailure(api_, comm_, rc, "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) {
      failed_ = true;
      return describeFailure(api_, comm_, state, "an earlier NCCL call");
    }
    return "";
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    api_.abort(comm_);
  }

 private:
  static cudaStream_t cuda(Stream s) { return static_cast<cudaStream_t>(s); }
  /// Runs one NCCL call. The group is non-blocking (so that forming it can
  /// be cancelled): a call may return while NCCL still queues it, and the
  /// next may only start once that settled.
  template <typename F>
  void run(const char* what, F&& call) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) throw DeviceError(std::string(what) + ": the NCCL group was aborted (the communicator failed)");
    DeviceScope scope(device_);
    ncclResult_t rc = call();
    for (int looks = 0; rc == ncclInProgress; ++looks) {
      // NCCL still queues it (a first call may connect to the peers):
      // yield, then back off; give up when the communicator failed.
      lock.unlock();
      if (looks < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      const bool cancel = cancelled_ && cancelled_();
      lock.lock();
      if (cancel && !aborted_) {
        aborted_ = true;
        api_.abort(comm_);
      }
      if (aborted_) throw DeviceError(std::string(what) + ": the NCCL group was aborted (the communicator failed)");
      ncclResult_t state = ncclSuccess;
      rc = api_.getAsyncError(comm_, &state);
      if (rc == ncclSuccess) rc = state;
    }
    if (rc != ncclSuccess) {
      failed_ = true;
      throw DeviceError(describeFailure(api_, comm_, rc, what));
    }
  }
  const NcclApi api_;
  ncclComm_t comm_;
  int device_;
  std::function<bool()> cancelled_;
  std::mutex mu_;
  bool failed_ = false;   // guarded by mu_
  bool aborted_ = false;  // guarded by mu_
};

class Nccl final : public CollectiveLibrary {
 public:
  Nccl() {
    NcclLibrary& lib = NcclLibrary::instance();
    if (!lib.available()) {
      why_ = lib.why();
      return;
    }
    api_.load(lib);
    if (!api_.missing.empty()) {
      why_ = lib.path() + " lacks " + api_.missing + " (NCCL 2.14 or newer is needed)";
      return;
    }
    int v = 0;
    api_.getVersion(&v);
    name_ = "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    if (v < 21400) why_ = lib.path() + " is " + name_ + "; the NCCL engine needs 2.14 or newer";
  }
  std::string name() override { return name_; }
  std::string unavailable() override { return why_; }
  std::vector<char> newId() override {
    ncclUniqueId id;
    ncclResult_t rc = api_.getUniqueId(&id);
    if (rc != ncclSuccess) throw DeviceError(std::string("ncclGetUniqueId failed: ") + api_.errorString(rc));
    return std::vector<char>(id.internal, id.internal + sizeof id.internal);
  }
  std::unique_ptr<DeviceComm> join(const std::vector<char>& idBytes, int size, int rank, int device,
                                   const std::function<bool()>& cancelled) override {
    ncclUniqueId id;
    if (idBytes.size() != sizeof id.internal) throw InternalError("NCCL engine: a group id of the wrong size");
    std::memcpy(id.internal, idBytes.data(), sizeof id.internal);
    DeviceScope scope(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t rc = api_.initRankConfig(&comm, size, id, rank, &config);
    while (rc == ncclInProgress) {
      if (cancelled()) {
        api_.abort(comm);
        throw DeviceError("forming the NCCL group was cancelled (the communicator failed)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclResult_t state = ncclSuccess;
      rc = api_.getAsyncError(comm, &state);
      if (rc == ncclSuccess) rc = state;
    }
    if (rc != ncclSuccess) {
      const std::string what = describeFailure(api_, comm, rc, "ncclCommInitRankConfig");
      if (comm) api_.abort(comm);
      throw DeviceError(what);
    }
    return std::make_unique<NcclComm>(api_, comm, device, cancelled);
  }

 private:
  NcclApi api_;
  std::string name_ = "nccl";
  std::string why_;
};

std::shared_ptr<CollectiveLibrary> makeDefault() { return std::make_shared<Nccl>(); }

#else

std::shared_ptr<CollectiveLibrary> makeDefault() { return nullptr; }

#endif

std::mutex libraryMu;
std::shared_ptr<CollectiveLibrary>& installedLibrary() {
  static std::shared_ptr<CollectiveLibrary> lib;
  return lib;
}
bool libraryMade = false;  // guarded by libraryMu

}  // namespace

std::shared_ptr<CollectiveLibrary> collectiveLibrary() {
  std::lock_guard<std::mutex> lock(libraryMu);
  if (!libraryMade) {
    libraryMade = true;
    // Only a runtime that moves device memory can give NCCL a device.
    if (runtime().canMoveDeviceMemory() && runtime().name() == "cuda") installedLibrary() = makeDefault();
  }
  return installedLibrary();
}

std::shared_ptr<CollectiveLibrary> installCollectiveLibrary(std::shared_ptr<CollectiveLibrary> library) {
  std::lock_guard<std::mutex> lock(libraryMu);
  libraryMade = true;
  std::shared_ptr<CollectiveLibrary> previous = std::move(installedLibrary());
  installedLibrary() = std::move(library);
  return previous;
}

}  // namespace gradcomm::device
