#include "capi/group.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "capi/cuda_probe.hpp"
#include "capi/errors.hpp"
#include "capi/real_nccl.hpp"

namespace gradcomm::capi {
namespace {

struct GroupState {
  int depth = 0;
  bool realGroupOpen = false;
  std::vector<PendingInit> inits;
  std::vector<HostCall> calls;
  std::vector<HostTransfer> transfers;
  ncclResult_t firstError = ncclSuccess;  ///< a call in the group that failed at once
  std::string firstErrorText;
};

thread_local GroupState state;

/// Records the first failure of a group and marks its communicator failed
/// when the failure came from the communicator (not from the arguments).
struct Outcome {
  ncclResult_t result = ncclSuccess;
  std::string text;
  void add(ncclResult_t r, const std::string& message) {
    if (result == ncclSuccess && r != ncclSuccess) {
      result = r;
      text = message;
    }
  }
};

/// Records that an abort on another thread interrupted the group.
void addAborted(const char* function, Outcome& out) {
  const ncclResult_t r = abortedCall(function);
  out.add(r, lastError());
}

void failComm(ncclComm_t comm, ncclResult_t r, const std::string& message, Outcome& out) {
  comm->setFailed(r, message);
  out.add(r, message);
}

template <typename F>
void runGuarded(ncclComm_t comm, const char* function, Outcome& out, F&& body) {
  const ncclResult_t r = guarded(function, std::forward<F>(body));
  if (r == ncclSuccess) return;
  if (comm->isClosing()) {
    addAborted(function, out);
  } else {
    failComm(comm, r, lastError(), out);
  }
}

/// The group's communicators, each held (CommUse) while the group runs so
/// that an abort on another thread cannot free one under it. A
/// communicator already being aborted is not touched at all.
class GroupUses {
 public:
  explicit GroupUses(const GroupState& g) {
    for (const auto& i : g.inits) add(i.comm);
    for (const auto& c : g.calls) add(c.comm);
    for (const auto& t : g.transfers) add(t.comm);
  }
  /// False when `comm` was being aborted or destroyed as the group began.
  bool usable(ncclComm_t comm) const {
    auto it = uses_.find(comm);
    return it != uses_.end() && it->second->entered();
  }
  bool anyAborted() const {
    for (const auto& u : uses_) {
      if (!u.second->entered()) return true;
    }
    return false;
  }

 private:
  void add(ncclComm_t comm) {
    if (!uses_.count(comm)) uses_.emplace(comm, std::make_unique<CommUse>(comm));
  }
  std::map<ncclComm_t, std::unique_ptr<CommUse>> uses_;
};

/// The real NCCL takes part in the group only where device calls can happen.
bool realGroupsMatter() { return cudaUsable() && nccl::available(); }

ncclResult_t runGroup(GroupState& g, const char* function) {
  Outcome out;
  if (g.firstError != ncclSuccess) out.add(g.firstError, g.firstErrorText);
  const GroupUses uses(g);
  if (uses.anyAborted()) {
    addAborted(function, out);
    // Nothing of an aborted communicator may be touched: drop its work.
    auto gone = [&](const auto& item) { return !uses.usable(item.comm); };
    g.inits.erase(std::remove_if(g.inits.begin(), g.inits.end(), gone), g.inits.end());
    g.calls.erase(std::remove_if(g.calls.begin(), g.calls.end(), gone), g.calls.end());
    g.transfers.erase(std::remove_if(g.transfers.begin(), g.transfers.end(), gone), g.transfers.end());
  }

  // Communicators first: several may need each other (one thread forming
  // the communicators of several ranks), so they form concurrently.
  if (g.inits.size() == 1) {
    runGuarded(g.inits[0].comm, function, out, [&] { g.inits[0].form(); return ncclSuccess; });
  } else if (!g.inits.empty()) {
    std::vector<std::thread> threads;
    std::vector<ncclResult_t> results(g.inits.size(), ncclSuccess);
    std::vector<std::string> texts(g.inits.size());
    for (size_t i = 0; i < g.inits.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = guarded(function, [&] { g.inits[i].form(); return ncclSuccess; });
        if (results[i] != ncclSuccess) texts[i] = lastError();
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < g.inits.size(); ++i) {
      if (results[i] == ncclSuccess) continue;
      if (g.inits[i].comm->isClosing()) {
        addAborted(function, out);
      } else {
        failComm(g.inits[i].comm, results[i], texts[i], out);
      }
    }
  }

  // The callers' streams may still be writing the buffers.
  std::vector<cudaStream_t> streams;
  for (const auto& c : g.calls) streams.push_back(c.stream);
  for (const auto& t : g.transfers) streams.push_back(t.stream);
  std::sort(streams.begin(), streams.end());
  streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
  for (cudaStream_t s : streams) {
    const std::string err = waitForStream(s);
    if (!err.empty()) out.add(ncclUnhandledCudaError, std::string(function) + ": " + err);
  }
  if (out.result == ncclUnhandledCudaError) return fail(out.result, out.text);

  struct Running {
    ncclComm_t comm;
    Work work;
    std::function<void()> finish;
  };
  std::vector<Running> running;
  running.reserve(g.calls.size() + 4);
  for (auto& c : g.calls) {
    if (c.comm->asyncError.load() != ncclSuccess) continue;  // failed to form, or failed earlier in the group
    runGuarded(c.comm, function, out, [&] {
      running.push_back({c.comm, c.start(), std::move(c.finish)});
      return ncclSuccess;
    });
  }

  // One point-to-point operation per communicator, in order of first use.
  std::vector<ncclComm_t> comms;
  for (const auto& t : g.transfers) {
    if (std::find(comms.begin(), comms.end(), t.comm) == comms.end()) comms.push_back(t.comm);
  }
  for (ncclComm_t comm : comms) {
    if (comm->asyncError.load() != ncclSuccess) continue;
    std::vector<Communicator::Transfer> mine;
    std::vector<size_t> selfSends, selfRecvs;
    for (const auto& t : g.transfers) {
      if (t.comm != comm) continue;
      const Communicator::Transfer& p = t.transfer;
      const bool send = p.kind == Communicator::Transfer::Kind::kSend;
      if (p.peer == comm->rank) (send ? selfSends : selfRecvs).push_back(mine.size());
      mine.push_back(p);
    }
    bool selfOk = selfSends.size() == selfRecvs.size();
    for (size_t k = 0; selfOk && k < selfSends.size(); ++k) {
      selfOk = mine[selfSends[k]].count == mine[selfRecvs[k]].count;
    }
    if (!selfOk) {
      out.add(ncclInvalidUsage, std::string(function) +
                                    ": a send to this rank itself needs a receive from itself of the same size "
                                    "in the same group (and the other way round)");
      continue;
    }
    runGuarded(comm, function, out, [&] {
      // One Work for all of them: no transfer of the group waits for another.
      Work w = comm->host.pointToPoint(mine);
      running.push_back({comm, w, {}});
      return ncclSuccess;
    });
  }

  // Every wait is bounded: the engine fails an operation that makes no
  // progress for GRADCOMM_TIMEOUT.
  for (auto& r : running) {
    runGuarded(r.comm, function, out, [&] {
      r.work.wait();
      if (r.finish) r.finish();
      return ncclSuccess;
    });
  }
  if (out.result != ncclSuccess) return fail(out.result, out.text);
  return ncclSuccess;
}

}  // namespace

bool inGroup() { return state.depth > 0; }

ncclResult_t groupStart() {
  if (state.depth++ == 0 && realGroupsMatter()) {
    auto start = realNccl<ncclResult_t (*)()>("ncclGroupStart");
    if (start && start() == ncclSuccess) state.realGroupOpen = true;
  }
  return ncclSuccess;
}

ncclResult_t groupEnd(const char* function) {
  if (state.depth == 0) {
    return fail(ncclInvalidUsage, std::string(function) + ": no group is open (ncclGroupEnd without ncclGroupStart)");
  }
  if (--state.depth > 0) return ncclSuccess;
  GroupState g = std::move(state);
  state = GroupState{};
  ncclResult_t realResult = ncclSuccess;
  if (g.realGroupOpen) {
    auto end = realNccl<ncclResult_t (*)()>("ncclGroupEnd");
    realResult = end ? end() : ncclInternalError;
  }
  const ncclResult_t r = runGroup(g, function);
  return r != ncclSuccess ? r : realResult;
}

ncclResult_t groupSimulateEnd(float* estimatedUs) {
  if (state.depth == 0) {
    return fail(ncclInvalidUsage, "ncclGroupSimulateEnd: no group is open");
  }
  if (--state.depth > 0) return ncclSuccess;
  GroupState g = std::move(state);
  state = GroupState{};
  // A latency-bandwidth guess (5 us per operation, 5 GB/s = 5000 bytes/us):
  // gradcomm's cost model does not exist yet. Nothing ran, so no message
  // numbers were used.
  double us = 0;
  for (const auto& c : g.calls) us += 5 + static_cast<double>(c.bytes) / 5000;
  for (const auto& t : g.transfers) us += 5 + static_cast<double>(t.transfer.count) / 5000;
  if (g.realGroupOpen) {
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    auto simEnd = realNccl<ncclResult_t (*)(ncclSimInfo_t*)>("ncclGroupSimulateEnd");
    if (simEnd && simEnd(&sim) == ncclSuccess && sim.estimatedTime > 0) us += sim.estimatedTime;
  }
  *estimatedUs = static_cast<float>(us);
  if (!g.inits.empty()) {
    // Communicators cannot be simulated: they still form.
    GroupState initsOnly;
    initsOnly.inits = std::move(g.inits);
    return runGroup(initsOnly, "ncclGroupSimulateEnd");
  }
  return ncclSuccess;
}

ncclResult_t enqueue(HostCall call, const char* function) {
  if (state.depth > 0) {
    state.calls.push_back(std::move(call));
    return ncclSuccess;
  }
  GroupState g;
  g.calls.push_back(std::move(call));
  return runGroup(g, function);
}

ncclResult_t enqueue(HostTransfer transfer, const char* function) {
  std::vector<HostTransfer> v;
  v.push_back(transfer);
  return enqueue(std::move(v), function);
}

ncclResult_t enqueue(std::vector<HostTransfer> transfers, const char* function) {
  if (state.depth > 0) {
    for (auto& t : transfers) state.transfers.push_back(t);
    return ncclSuccess;
  }
  GroupState g;
  g.transfers = std::move(transfers);
  return runGroup(g, function);
}

void enqueue(PendingInit init) { state.inits.push_back(std::move(init)); }

}  // namespace gradcomm::capi
