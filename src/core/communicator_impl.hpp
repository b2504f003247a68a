#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "algorithms/algorithm.hpp"
#include "algorithms/selector.hpp"
#include "compression/compression.hpp"
#include "base/params.hpp"
#include "core/progress_engine.hpp"
#include "gradcomm/communicator.hpp"
#include "topology/topology_view.hpp"

namespace gradcomm::transport {
class GroupTransport;
}
namespace gradcomm::device {
class DeviceComm;
}

namespace gradcomm::detail {

struct P2pTransfer;
class P2pChannel;
class DeviceStaging;

/// What an NCCL engine call's kernels use, given back to the staging once
/// its event completed: device blocks, and a pinned block (or null).
struct DirectBlocks {
  std::vector<std::pair<void*, size_t>> device;
  void* pinned = nullptr;
  size_t pinnedCapacity = 0;
};

/// Fingerprint of point-to-point messages (no collective hashes to it in practice).
inline constexpr uint32_t kPointToPointFingerprint = 0x7e2d5a91u;
/// Fingerprint of the creation-time calibration exchange (see setUpSelection).
inline constexpr uint32_t kCalibrationFingerprint = 0x3c1b6d27u;

/// What the communicators split from one another share (a process may hold
/// several): the progress engine, which owns the transport the first of
/// them was formed over, and the group ids in use on that transport.
struct Context {
  /// Group ids (Tag::comm) one transport can tell apart.
  static constexpr uint32_t kMaxGroups = 1024;
  /// Id 0 is the first communicator's; this one carries the exchanges that
  /// form groups (their members agree on an id through it).
  static constexpr uint32_t kFormingGroup = kMaxGroups - 1;

  std::shared_ptr<core::ProgressEngine> engine;
  /// The hosts of the engine's transport's ranks (the first communicator's view).
  std::shared_ptr<const topology::TopologyView> view;
  std::mutex mu;
  std::vector<uint8_t> idInUse = std::vector<uint8_t>(kMaxGroups, 0);  // guarded by mu
  int alive = 0;  ///< communicators not yet destroyed; guarded by mu
  /// Point-to-point channels still taking transfers, of every communicator
  /// of the context: a collective on any of them closes them all, since one
  /// engine runs the operations of all of them in one order (a transfer
  /// issued after the collective must not join a channel ahead of it).
  std::mutex channelsMu;
  std::vector<std::weak_ptr<P2pChannel>> openChannels;  // guarded by channelsMu
  std::atomic<bool> channelsOpen{false};                 ///< openChannels is not empty
  /// Device calls: the device the context serves (its first device call's)
  /// with its copy streams and pinned blocks; null before the first.
  std::mutex deviceMu;
  std::shared_ptr<DeviceStaging> device;  // guarded by deviceMu
  /// Point-to-point operations with device receives, whose data is copied
  /// in when they complete: a call on the NCCL engine (queued on the
  /// caller's stream at once, not in the engine's order) waits for them.
  std::vector<std::weak_ptr<OperationState>> deviceReceives;  // guarded by deviceMu
};

/// The state behind every Communicator handle.
class CommunicatorImpl : public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  /// `hosts`: what the transport's set-up found about the hosts (the one
  /// source of the communicator's TopologyView).
  /// `onPeerFailure`: EngineSettings::onPeerFailure.
  CommunicatorImpl(std::unique_ptr<transport::Transport> transport, const transport::HostLayout& hosts,
                   core::Config config, std::function<void(const std::string&)> onPeerFailure = {});
  ~CommunicatorImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const core::Config& config() const { return config_; }
  core::ProgressEngine& engine() { return *engine_; }
  /// Which ranks share a host (identical on every rank).
  const topology::TopologyView& topology() const { return view_; }
  /// The selector, with its cost model once creation finished.
  const algorithms::Selector& selector() const { return selector_; }
  /// This communicator's transport (a group's, for a split communicator;
  /// the engine's transport is the context's).
  transport::Transport& transport() const { return *transport_; }

  /// A communicator of the ranks `ranks` (this communicator's numbering;
  /// the new one numbers them in this order) that shares this one's
  /// context. Only the members call it, all with the same list.
  std::shared_ptr<CommunicatorImpl> subgroup(const std::vector<int>& ranks);
  /// MPI_Comm_split: collective over this communicator; null for color < 0.
  std::shared_ptr<CommunicatorImpl> split(int color, int key);

  /// Validates, selects an algorithm, and queues the call. Invalid
  /// arguments throw here and abort the communicator on every rank.
  Work submit(const algorithms::CollectiveCall& call, const CollectiveOptions& options);
  /// Communicator::send, recv and pointToPoint (core/point_to_point.cpp):
  /// numbers the checked transfers per peer and tag and adds them to the
  /// open channel, or queues a new one; the Work completes with them.
  Work submitTransfers(std::vector<P2pTransfer> transfers, size_t bytes);
  /// A collective was issued: later transfers go to a new channel, after it.
  void closePointToPoint();
  /// The configuration's parameters, as describeParameters() lists them.
  const std::vector<ParamDescription>& parameters() const;
  /// Communicator::deviceEngine: directEngine's choice, asked as a call of
  /// its own (after the ranks agreed that each can make device calls).
  Communicator::DeviceEngine deviceEngine(int device);
  algorithms::RunContext runContext(const algorithms::CollectiveCall& call, const transport::Tag& tag) const;

  /// Keeps `what` alive as long as the communicator (the store it was
  /// formed through, which rank 0 may be serving to the others).
  void keepAlive(std::shared_ptr<void> what) { keepAlive_.push_back(std::move(what)); }

  void destroy();
  bool destroyed() const { return destroyed_.load(); }
  /// Throws InvalidUsage naming `what` once destroyed, or the engine's
  /// earlier failure.
  void checkUsable(std::string_view what) const;
  /// Aborts the communicator on every rank with `e` (prefixed with this
  /// rank and `what`) and throws it here.
  [[noreturn]] void abortAndThrow(const Error& e, const std::string& what);

 private:
  void validate(const algorithms::CollectiveCall& call) const;
  /// The buffer checks of validate() (they depend on the pointers, so a
  /// cached signature does not cover them).
  void validateBuffers(const algorithms::CollectiveCall& call, size_t elem) const;
  /// Compression that applies to `call`, from the options or the default;
  /// throws when the options ask for one that cannot apply.
  compression::Spec compressionFor(const algorithms::CollectiveCall& call, const CollectiveOptions& options) const;
  [[noreturn]] void reject(const Error& e, const algorithms::CollectiveCall& call);
  /// Part of creation (collective, before the progress engine starts):
  /// rank 0's calibration or calibration file and its tuning file reach
  /// every rank over `t`, and the selector gets its cost model.
  void setUpSelection(transport::Transport& t, core::AbortChannel& aborts);
  /// GRADCOMM_LOG_LEVEL=info: version, build, transport and topology, as
  /// users of NCCL_DEBUG=INFO expect them at start-up.
  void logStartup() const;
  /// info: the algorithm of a collective and size class, once per process
  /// (rank 0: every rank chooses alike); debug: every operation.
  void logChoice(const algorithms::CollectiveCall& call, uint64_t seq, const std::string& algorithm,
                 const std::string& why) const;

  struct Member {};
  /// A subgroup of `parent` over `transport`; `contextRanks` are its ranks
  /// in the context transport's numbering.
  CommunicatorImpl(Member, CommunicatorImpl& parent, std::shared_ptr<transport::Transport> transport,
                   std::vector<int> contextRanks, topology::TopologyView view);
  /// The selector's cost model over view_, with `tuning` unless it was
  /// measured on another layout.
  void useModel(const topology::MachineCosts& costs, std::shared_ptr<topology::TuningTable> tuning,
                const std::string& tuningName);
  /// The group ids no member of `members` (context ranks) uses, agreed by
  /// an allgather among them; the lowest is the new group's.
  uint32_t agreeOnGroupId(const std::vector<int>& members);

  std::shared_ptr<Context> context_;
  /// The transport of this communicator: the engine's, or a group's (owned).
  transport::Transport* transport_ = nullptr;
  std::shared_ptr<transport::Transport> own_;
  std::vector<int> contextRanks_;  ///< rank r of this communicator is contextRanks_[r] of the context
  std::shared_ptr<topology::TuningTable> tuning_;
  std::string tuningName_;
  /// Records a group's queued operation (see lastOp_).
  void noteQueued(const std::shared_ptr<OperationState>& op);
  /// Records `op` (noteQueued) and submits it to the engine; its Work.
  Work enqueue(const std::shared_ptr<OperationState>& op, bool eager = false);
  /// A group's last queued operation: its transport must outlive it.
  std::shared_ptr<OperationState> lastOp_;  // guarded by submitMu_
  core::Config config_;
  int rank_;
  int size_;
  kernels::SimdLevel simd_;
  topology::TopologyView view_;
  /// topology::hdSameHostDistances(view_), for every call's Tuning (set
  /// once the view is final, in setUpSelection).
  uint32_t hdSameHostDistances_ = 0;
  topology::WaitPolicy wait_;  ///< GRADCOMM_WAIT resolved for this host
  algorithms::Selector selector_;
  std::shared_ptr<core::ProgressEngine> engine_;
  /// What compressedOperation chose: the algorithm that moves the payloads
  /// and the tensor's error feedback (null: none).
  struct CompressedChoice {
    const algorithms::Algorithm* inner = nullptr;
    compression::Residual* residual = nullptr;
  };
  /// The operation of a compressed allreduce (not yet submitted), running
  /// the host compressors on the call's buffers; `onDevice`: a call on
  /// device buffers, whose caller replaces the operation's schedule (see
  /// `choice`).
  std::shared_ptr<OperationState> compressedOperation(const algorithms::CollectiveCall& call,
                                                      const compression::Spec& spec, const CollectiveOptions& options,
                                                      bool onDevice, CompressedChoice* choice = nullptr);
  /// The residual of a compressed call: the caller's ErrorFeedback's where
  /// the compression asks for error feedback (else null, with a warning
  /// when the call passes none).
  compression::Residual* residualFor(const compression::Spec& spec, const CollectiveOptions& options,
                                     bool onDevice) const;
  /// A compressed allreduce on device buffers of `device`: compressed and
  /// decompressed on the device; fp16/bf16 payloads summed by the NCCL
  /// engine where this communicator has it, other payloads exchanged
  /// through pinned host memory (core/device_compressed.cpp).
  Work submitDeviceCompressed(const algorithms::CollectiveCall& call, const compression::Spec& spec,
                              const CollectiveOptions& options, int device);
  /// A call whose buffers are device memory (core/device_calls.cpp).
  Work submitDevice(const algorithms::CollectiveCall& call, const CollectiveOptions& options);
  /// The device of a call's buffers; throws for buffers that mix host and
  /// device memory or devices, a stream of another device, or a build
  /// without CUDA.
  int deviceOf(const algorithms::CollectiveCall& call, const CollectiveOptions& options) const;
  /// The context's staging for `device` (made by the first device call).
  std::shared_ptr<DeviceStaging> deviceStaging(int device);
  /// The NCCL engine of this communicator's device calls, or null when they
  /// are staged; the first call to need it chooses, with the other ranks
  /// (core/device_engine.cpp), in `call`'s place in the order of calls.
  std::shared_ptr<device::DeviceComm> directEngine(const algorithms::CollectiveCall& call, int device);
  /// Queues `call` on the NCCL engine, on the caller's stream, beside a
  /// host operation that checks the ranks' calls.
  Work submitDirect(const std::shared_ptr<device::DeviceComm>& comm, const algorithms::CollectiveCall& call,
                    const CollectiveOptions& options, int device);
  /// The NCCL engine's operation for `call` (its host part: the call
  /// check; its device part: an event recorded after what `queue` queues
  /// on the caller's stream, given the operation's sequence number).
  /// `queue` returns a check to run once the event completed (empty: none;
  /// it throws what makes the call fail). `label` names the compression
  /// ("" for none); blocks taken from the staging for the kernels go back
  /// once they finished.
  Work submitDirectOperation(const std::shared_ptr<device::DeviceComm>& comm, const algorithms::CollectiveCall& call,
                             const std::string& label, const CollectiveOptions& options, int device,
                             const std::function<std::function<void()>(uint64_t seq)>& queue,
                             DirectBlocks blocks = {});
  /// A compressed allreduce on the NCCL engine, all on the caller's stream:
  /// compress, ncclAllReduce of summable payloads (fp16, bf16) or
  /// ncclAllGather of top-k slots, decompress; a top-k call's payloads are
  /// checked once its event completed.
  Work submitDirectCompressed(const std::shared_ptr<device::DeviceComm>& comm, const algorithms::CollectiveCall& call,
                              const compression::Spec& spec, const CollectiveOptions& options, int device);
  /// An allgather of `bytes` per rank among this communicator's ranks, run
  /// in `call`'s place and checked as `call` (the engine choice's exchanges).
  /// `what` names the exchange in the check (each exchange of one size has
  /// its own name, so that two that differ in size never pass for each other).
  std::vector<char> exchangeForDeviceCall(const algorithms::CollectiveCall& call, const void* mine, size_t bytes,
                                          const char* what = "engine-choice");
  /// The library's own exchanges (a group's id, the device engine's
  /// choice): a ring allgather of `bytes` per rank from `mine` into `all`
  /// (rank order; `mine` may be this rank's place in it) over `over` (null:
  /// this communicator's transport), checked as `signature`, run by the
  /// engine and waited for.
  void internalAllgather(const void* mine, void* all, size_t bytes, const transport::CallSignature& signature,
                         const transport::Tag& tag, transport::Transport* over);

  /// The selector's choice and the fingerprint of recent call signatures
  /// (they do not depend on the buffers): repeated calls skip both.
  struct SignatureCache {
    struct Entry {
      bool valid = false;
      Collective collective;
      DataType type;
      ReduceOp op;
      size_t count;
      int root;
      bool inPlace;
      std::string forced;
      std::string compression;  ///< CollectiveOptions::compression as given
      const algorithms::Algorithm* algorithm;
      transport::CallSignature signature;  ///< seq left 0
      uint32_t fingerprint;
      size_t bytes;
      algorithms::RunContext ctx;  ///< runContext() of the call, tag left empty
      /// The algorithm runs the call inline (Algorithm::runsInline): it
      /// tries ProgressEngine::submitInline before making an operation.
      bool runsInline;
    };
    static constexpr size_t kSize = 16;
    Entry entries[kSize];
  };
  SignatureCache cache_;  // guarded by submitMu_

  compression::Spec defaultCompression_;
  std::mutex submitMu_;
  uint64_t nextSeq_ = 0;  // guarded by submitMu_
  /// Gives `signature` the next sequence number; the tag of its messages.
  transport::Tag numberCall(transport::CallSignature& signature);
  std::atomic<bool> destroyed_{false};
  std::mutex deviceEngineMu_;
  bool deviceEngineChosen_ = false;                  // guarded by deviceEngineMu_
  std::shared_ptr<device::DeviceComm> deviceComm_;   // guarded by deviceEngineMu_
  std::string deviceEngineWhy_;                      // guarded by deviceEngineMu_: why that engine
  std::vector<std::shared_ptr<void>> keepAlive_;
  /// Point-to-point: the channel later transfers join, and the next
  /// sequence number per (peer, tag) of sends and of receives.
  std::mutex p2pMu_;
  std::shared_ptr<P2pChannel> p2pChannel_;  // guarded by p2pMu_
  std::vector<uint32_t> sendSeq_, recvSeq_;  // guarded by p2pMu_
  mutable std::once_flag parametersOnce_;
  mutable std::vector<ParamDescription> parameters_;
};

/// Which of a call's buffers it uses on `rank`: broadcast reads the input
/// only on its root, reduce writes the output only there.
struct BufferUses {
  bool in;
  bool out;
};
BufferUses buffersUsed(const algorithms::CollectiveCall& call, int rank);

/// What ranks agree on for `call` run by `algorithm` (seq left 0).
transport::CallSignature callSignature(const algorithms::CollectiveCall& call, const std::string& algorithm,
                                       const std::string& compression);

}  // namespace gradcomm::detail
