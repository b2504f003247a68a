#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "device.hpp"
#include "gradcomm/communicator.hpp"

namespace gradcomm {
class Timeline;
}

namespace gradcomm::torch_backend {

struct Telemetry;
struct P2pSignal;
struct P2pTicket;

/// One c10d call: completes once every gradcomm operation behind it has,
/// then its future holds the output tensors (or the error).
///
/// A call on CUDA tensors (`device` set) completes on the completion
/// thread once the communication finished and the copies into the output
/// tensors are queued on a side stream; its future is CUDA-aware (events
/// recorded on that stream). wait() then blocks the host only until that
/// point and makes the caller's current stream wait for the copies, as
/// NCCL's Work does; so does the future's wait() and its callbacks.
class WorkGradcomm : public c10d::Work {
 public:
  WorkGradcomm(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
               std::optional<c10::Device> device = std::nullopt);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override;
  /// CUDA: makes the current stream wait for the result (blocking the host
  /// until the call completed, as wait() without its timeout). Host: nothing.
  void synchronize() override;
  /// Called once, by the process group's completion thread (for a CUDA
  /// call with its side stream current).
  void complete(std::exception_ptr error);
  /// Where wait() records the time callers were blocked (may be null).
  std::shared_ptr<Telemetry> telemetry;

 private:
  std::vector<at::Tensor> outputs_;
  std::optional<c10::Device> device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// The CUDA device a group's device calls run on: gradcomm takes the
/// buffers of one device per communicator (that of its first device call).
/// Subgroups made over the same context share their parent's binding (at
/// least as strict as the library); a call on another device is rejected
/// before it reaches gradcomm, which would fail the communicator.
struct DeviceBinding {
  std::mutex mu;
  std::optional<c10::Device> device;  ///< guarded by mu
};

/// What a group records about its calls: counters (GRADCOMM_STATS) and
/// the Chrome trace (GRADCOMM_TIMELINE). Shared with Works that outlive it.
struct Telemetry {
  std::atomic<int64_t> exposedNs{0};        ///< callers blocked in Work::wait
  std::unique_ptr<Timeline> timeline;  ///< null when off
};

/// Per-collective counters for GRADCOMM_STATS and ProcessGroupGradcomm.stats().
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double commMs = 0;  ///< summed running time of the gradcomm operations
};

/// A c10d backend (torch 2.x's c10d::Backend, registered for "cpu" and
/// "cuda") whose collectives run on a gradcomm Communicator formed through
/// the process group's store.
///
/// CUDA tensors go to gradcomm as device buffers, ordered after the work
/// queued on the caller's current stream (CollectiveOptions::stream); a
/// call's tensors must all be on one device, and a group's CUDA calls on
/// one CUDA device.
///
/// Every call validates its tensors, issues gradcomm operations (in issue
/// order, under one lock, so every rank issues the same sequence) and
/// returns at once. One completion thread (a Completer, shared by the
/// groups of one context) waits for them in that order, copies results out
/// of temporaries, and completes the Work and its future. A call whose tensors it cannot take fails on that rank before
/// anything is issued, and the group stays usable.
/// Completes queued calls one at a time, in queue order, on one thread:
/// the groups of one context share it (their operations run in one order
/// too), so the threads of a process do not grow with its groups.
class Completer {
 public:
  Completer();
  /// Finishes what is queued and joins the thread. Not with the GIL held:
  /// jobs may run Python future callbacks.
  ~Completer();
  void push(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

class ProcessGroupGradcomm : public c10d::Backend {
 public:
  ProcessGroupGradcomm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  /// A group over `comm` (a subgroup of another group's communicator) that
  /// shares that group's completion thread.
  ProcessGroupGradcomm(Communicator comm, std::chrono::milliseconds timeout, std::shared_ptr<Completer> completer,
                       std::shared_ptr<DeviceBinding> binding);
  ~ProcessGroupGradcomm() override;

  /// The group of the ranks `ranks` (this group's numbers, in the new
  /// group's order), formed by them alone over this group's context: no
  /// new connections, threads or shared memory (Communicator::subgroup).
  c10::intrusive_ptr<ProcessGroupGradcomm> subgroup(const std::vector<int64_t>& ranks,
                                                    std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "gradcomm"; }
  /// Finishes the calls already issued, stops the completion threads, prints
  /// GRADCOMM_STATS and flushes the timeline. Idempotent.
  void shutdown() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  /// Allreduce (average) of one float32 tensor with gradcomm's compression
  /// ("fp16", "bf16", "topk:0.01", ...) and the given error feedback (may
  /// be null). Other dtypes are averaged uncompressed. For DDP comm hooks.
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(at::Tensor& tensor, const std::string& compression,
                                                     std::shared_ptr<ErrorFeedback> feedback);

  /// Counters per collective name, and the time callers were blocked.
  std::map<std::string, CollectiveStats> stats() const;
  double exposedMs() const { return static_cast<double>(telemetry_->exposedNs.load()) / 1e6; }
  /// Where the communicator stands: algorithm choices, transport.
  std::string transportName() const { return comm_.transportName(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The communicator (for the Reducer-driven DistributedDataParallel).
  Communicator communicator() const { return comm_; }

 private:
  /// What the completion thread finishes for one c10d call.
  struct Pending {
    std::string what;  ///< "allreduce", ...
    c10::intrusive_ptr<WorkGradcomm> work;
    std::vector<Work> ops;
    std::optional<c10::Device> device;  ///< the CUDA device of the call; nullopt: host
    std::optional<c10::Stream> stream;  ///< CUDA: where the completion thread finishes it
    std::function<void()> finish;     ///< copies results out of temporaries
    std::vector<at::Tensor> keep;     ///< inputs and temporaries in use
    std::shared_ptr<void> keepOther;  ///< error feedback in use
    size_t bytes = 0;
    /// Point-to-point: set when this call's transfer completed or failed
    /// (ops then holds its Work).
    std::shared_ptr<P2pTicket> ticket;
    std::chrono::steady_clock::time_point issued;
  };

  /// A contiguous 1-D temporary of `numel` elements for flattening a call's
  /// tensors. Reuses a cached buffer that no pending call holds (a cached
  /// buffer's storage has one owner, the cache, once the call that used it
  /// released its views), so large calls do not map, fault in and unmap
  /// fresh pages every time: on 2 ranks that tripled the time of a 64 MiB
  /// list all_gather against the flat collective it wraps.
  at::Tensor scratch(int64_t numel, const at::TensorOptions& options);
  /// Fails this call on this rank (a c10 error) before it issues anything;
  /// the communicator stays usable. Throws.
  [[noreturn]] void reject(const std::string& what, const std::string& why);
  /// Throws (without aborting) for calls this backend never supports.
  [[noreturn]] void unsupported(const std::string& what, const std::string& instead) const;
  /// Checks one tensor: CPU or CUDA (where this build takes CUDA tensors),
  /// strided, dense, on the device of the call's other tensors (`call`,
  /// which the first tensor sets) and, for CUDA, on the group's device.
  /// Rejects otherwise.
  void checkTensor(const std::string& what, const at::Tensor& t, CallDevice& call);
  /// The options of a call on `call`'s device: for CUDA tensors, ordered
  /// after the caller's current stream.
  CollectiveOptions callOptions(const CallDevice& call) const;
  /// A Pending for the call `what` on `call`'s device, with its Work.
  Pending pending(const std::string& what, c10d::OpType type, std::vector<at::Tensor> outputs,
                  const CallDevice& call);
  /// Waits for the operations of `p` (CUDA: orders p.stream, the current
  /// stream of the completing thread, after their results) and runs its
  /// finish; their failure as the backend reports it, or null.
  static std::exception_ptr awaitOps(Pending& p);
  /// Rejects (as reject()) a root outside [0, size) or a root tensor other than 0.
  void checkRoot(const std::string& what, int64_t rootRank, int64_t rootTensor = 0);
  /// A list of one tensor per rank (`role`: "output" or "input"), each
  /// checked and of the size and dtype of `like`; rejects the call if not.
  void checkPerRank(const std::string& what, const std::vector<at::Tensor>& list, const at::Tensor& like,
                    const std::string& role, CallDevice& call);
  /// `big` holds world_size times `small`'s elements, of its dtype
  /// (`index`: the pair's place in a coalesced call, or -1); rejects if not.
  void checkWorldTimes(const std::string& what, const at::Tensor& big, const std::string& bigRole,
                       const at::Tensor& small, const std::string& smallRole, int64_t index);
  DataType reductionType(const std::string& what, const at::Tensor& t, c10d::ReduceOp op, ReduceOp* gcOp);
  /// Allgathers (reduceOp null) or reduce-scatters of paired tensors, one
  /// output per input, all checked before anything is issued; `coalesced`
  /// names a pair's index in the errors.
  c10::intrusive_ptr<c10d::Work> pairwise(const std::string& what, c10d::OpType type,
                                          const std::vector<at::Tensor>& outputs,
                                          const std::vector<at::Tensor>& inputs, bool coalesced,
                                          const c10d::ReduceOp* reduceOp);
  /// send (isSend) or recv of one tensor (Communicator::send or recv).
  c10::intrusive_ptr<c10d::Work> pointToPoint(bool isSend, std::vector<at::Tensor>& tensors, int peer, int tag);
  /// Queues a finished issue for the completion thread; returns its Work.
  c10::intrusive_ptr<c10d::Work> enqueue(Pending p);
  /// GRADCOMM_STATS asks this rank to print statistics at shutdown.
  bool statsWanted() const;
  /// Waits for one call's operations and completes it (on the completer).
  void complete(Pending& p);
  /// Completes point-to-point Works as their own transfers complete (in any
  /// order: a send must not wait for a receive issued before it).
  void p2pCompletionLoop();
  /// Records statistics, releases the tensors and completes the Work.
  void finishCall(Pending& p, std::exception_ptr error, double commMs);

  std::chrono::milliseconds timeout_;
  Communicator comm_;
  std::mutex scratchMu_;
  std::vector<at::Tensor> scratch_;  // 1-D buffers, at most kScratchBuffers (scratch())
  std::mutex issueMu_;  // one call issues at a time: every rank issues in the same order
  // Point-to-point calls for p2pCompleter_, guarded by p2pSignal_->mu.
  std::shared_ptr<P2pSignal> p2pSignal_;
  std::deque<Pending> p2pIncoming_;
  bool p2pStopping_ = false;
  std::thread p2pCompleter_;  // started by the first point-to-point call

  std::atomic<bool> shutDown_{false};
  std::shared_ptr<Completer> completer_;
  std::shared_ptr<DeviceBinding> binding_;  ///< shared with subgroups (one context)
  std::mutex outstandingMu_;
  std::condition_variable outstandingCv_;
  size_t outstanding_ = 0;  ///< calls queued on completer_ and not yet completed

  mutable std::mutex statsMu_;
  std::map<std::string, CollectiveStats> stats_;
  bool printStats_ = false;
  std::shared_ptr<Telemetry> telemetry_;
  std::chrono::steady_clock::time_point lastFlush_;
};

}  // namespace gradcomm::torch_backend
