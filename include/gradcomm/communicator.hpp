#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradcomm/config.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/export.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm {

namespace detail {
struct OperationState;
class CommunicatorImpl;
}  // namespace detail
namespace compression {
class Residual;
}
class Store;

/// Error-feedback memory of one tensor for compressed allreduce: the part of
/// past gradients that compression has not sent yet, added to the next call.
/// The caller keeps one per tensor (gradient bucket) and passes it with every
/// compressed allreduce of that tensor (CollectiveOptions::errorFeedback);
/// its memory is that tensor's size and goes when the object does. It lives
/// where the calls' buffers do: host memory for host buffers, memory of the
/// buffers' device for device buffers (allocated there by the first call).
/// Passing one that holds host memory with device buffers, or device memory
/// with host buffers or buffers of another device, is an InvalidArgument:
/// clear() it when the tensor moves.
class GRADCOMM_API ErrorFeedback {
 public:
  ErrorFeedback();
  ~ErrorFeedback();
  ErrorFeedback(ErrorFeedback&&) noexcept;
  ErrorFeedback& operator=(ErrorFeedback&&) noexcept;
  /// Forgets the carried error (after a skipped step or a model change).
  void clear();
  /// Elements carried (0 before first use).
  size_t size() const;
  /// The carried error, size() floats; null when empty. Device memory of
  /// device() where that is not -1.
  const float* data() const;
  /// The device whose memory holds the carried error; -1 for host memory
  /// and when empty.
  int device() const;
  /// For the library: the state behind it.
  compression::Residual& residual() { return *impl_; }

 private:
  std::unique_ptr<compression::Residual> impl_;
};

/// Per-call options. Empty fields mean "use the communicator's choice".
struct CollectiveOptions {
  /// Force an algorithm by name for this call ("ring", "rd", "hd", "tree",
  /// "native", ...). An algorithm that cannot run the call falls back to the
  /// default with a warning; an unknown name is an InvalidArgument. With
  /// compression it names the algorithm that moves the compressed payload.
  std::string algorithm;
  /// Gradient compression of a float32 sum or avg allreduce: "none",
  /// "fp16", "bf16", "topk:0.01" (fraction) or "topk:1000" (count), each
  /// optionally followed by ":ef=0|1" (error feedback; on by default for
  /// top-k), ":exact" (top-k), ":prescale" (divide by the ranks before the
  /// cast). Empty: GRADCOMM_COMPRESSION.
  std::string compression;
  /// Where this tensor's error feedback lives, when the compression asks for
  /// error feedback. Null: the call carries no error from earlier calls nor
  /// into later ones (with a warning once), since a buffer address does not
  /// name a tensor (an allocator reuses it for the next one).
  ErrorFeedback* errorFeedback = nullptr;
  /// For device (CUDA) buffers: the cudaStream_t the call is ordered after
  /// (it reads the input once the work already queued on this stream is
  /// done), as NCCL's stream argument; null is the legacy default stream
  /// of the buffers' device (whatever device the calling thread has
  /// current). A stream must belong to the buffers' device. Ignored for host
  /// buffers (a host call does not wait for any stream).
  void* stream = nullptr;
};

/// A timed part of an operation (for example "compress", "decompress").
struct WorkPhase {
  std::string name;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
};

/// Handle to one asynchronous collective. Copies refer to the same operation.
class GRADCOMM_API Work {
 public:
  Work() = default;
  /// True once the operation completed; never blocks. Rethrows its error.
  bool test();
  /// Blocks until the operation completes; rethrows its error (a
  /// TimeoutError when it made no progress for GRADCOMM_TIMEOUT).
  void wait();
  /// Blocks at most `timeout`; false if the operation is still running
  /// (it continues). Rethrows its error.
  bool wait(std::chrono::milliseconds timeout);
  /// False for a default-constructed Work.
  bool valid() const { return state_ != nullptr || done_.algorithm != nullptr; }
  /// Name of the algorithm that runs (or ran) the operation.
  std::string algorithm() const;
  /// Communicator-local sequence number of the operation.
  uint64_t sequence() const;
  /// When the operation started running and finished (steady clock);
  /// default-constructed time points until then.
  std::chrono::steady_clock::time_point startTime() const;
  std::chrono::steady_clock::time_point endTime() const;
  /// Bytes the operation moves (the whole buffer, as gradcomm-bench counts).
  size_t bytes() const;
  /// Timed phases inside the operation (compression), once it finished.
  std::vector<WorkPhase> phases() const;
  /// Calls `callback` once when the operation completes: with a null
  /// exception_ptr when it succeeded, else with its error (the exception
  /// wait() would throw). It runs on the thread that completes the
  /// operation (the communicator's progress thread, or a thread driving
  /// progress inside wait() or test()), or at once on this thread when the
  /// operation already completed (or failed). It must return quickly and
  /// must not block, wait for Works or call the communicator (but it may
  /// hand the result to another thread); an exception it throws is
  /// swallowed and logged. A default-constructed Work calls it at once.
  /// Callbacks added to copies of one Work all run, in the order added.
  /// For device buffers it runs when the communication finished and the
  /// copy of the result into the device buffer is queued, not done: use
  /// synchronize() or wait() before the device data is read.
  void onComplete(std::function<void(std::exception_ptr)> callback);
  /// For a call on device buffers: makes the device stream `stream` (a
  /// cudaStream_t; null is the legacy default stream) wait for the result,
  /// so work queued on it later reads the reduced data. Blocks the host
  /// until the communication finished (as wait() without the last copy) and
  /// then orders `stream` after the copy of the result into the device
  /// buffer, without waiting for that copy. Rethrows the operation's error.
  /// For host buffers it is wait().
  void synchronize(void* stream);
  /// True when the call ran on device buffers.
  bool onDevice() const;

 private:
  friend class detail::CommunicatorImpl;
  explicit Work(std::shared_ptr<detail::OperationState> s) : state_(std::move(s)) {}
  /// A call that finished inside the call that issued it (a small
  /// shared-memory allreduce on an idle engine) has no shared state: the
  /// handle carries its record.
  struct Done {
    const char* algorithm = nullptr;  ///< the catalog's name (static storage); null: not such a call
    uint64_t seq = 0;
    size_t bytes = 0;
    std::chrono::steady_clock::time_point start{};
    std::chrono::steady_clock::time_point end{};
  };
  explicit Work(const Done& done) : done_(done) {}
  std::shared_ptr<detail::OperationState> state_;
  Done done_;
};

/// A group of ranks that run collectives together. Every collective is
/// asynchronous and returns a Work; all ranks must issue the same
/// collectives in the same order (as with MPI and NCCL). Collectives run one
/// at a time, in issue order, on the communicator's progress thread (or on
/// the thread waiting for them). Copies of a Communicator share one state.
///
/// Buffers are host memory, or CUDA device memory on a build with CUDA
/// (every buffer of a call on the one device the communicator's first device
/// call used; CollectiveOptions::stream orders the call after the caller's
/// work; wait() returns once the result is in the device buffer). Counts are
/// elements. A call with bad arguments
/// throws on the calling rank and aborts the communicator, so the other
/// ranks get a RemoteError instead of waiting for a call that never comes.
class GRADCOMM_API Communicator {
 public:
  /// Over MPI_COMM_WORLD. Initialises MPI (MPI_THREAD_MULTIPLE) if the
  /// caller has not. Collective over the MPI communicator.
  Communicator();
  explicit Communicator(const Options& options);
  ~Communicator();
  Communicator(const Communicator&) = default;
  Communicator& operator=(const Communicator&) = default;
  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;

  int rank() const;
  int size() const;
  /// Transport in use ("mpi", "inproc").
  std::string transportName() const;

  /// out[i] = OP over ranks of in[i]. in == out is in place.
  Work allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                 const CollectiveOptions& options = {});
  /// Copies root's `in` into every rank's `out` (in == out is in place;
  /// non-roots may pass in = nullptr).
  Work broadcast(const void* in, void* out, size_t count, DataType type, int root,
                 const CollectiveOptions& options = {});
  /// out (at root only; may be null elsewhere) = OP over ranks of in.
  Work reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root,
              const CollectiveOptions& options = {});
  /// out (size * count elements) = every rank's `in` (count elements), in
  /// rank order. In place when in == out + rank * count.
  Work allgather(const void* in, void* out, size_t count, DataType type, const CollectiveOptions& options = {});
  /// in holds size * count elements; out (count elements) = OP over ranks of
  /// block `rank` of in. In place when out == in + rank * count.
  Work reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                     const CollectiveOptions& options = {});
  /// Completes once every rank has called it.
  Work barrier(const CollectiveOptions& options = {});

  /// A communicator of the ranks that pass the same `color`, numbered by
  /// `key` (ties by rank here), as MPI_Comm_split. Collective: every rank
  /// calls it; a rank that passes a negative color joins no group and gets
  /// an empty handle (valid() false). The new communicator is light: it
  /// shares this one's context (its transport connections, progress
  /// thread and cost model); its messages carry its own group id (on the
  /// MPI transport: an MPI communicator of its members). It has no shared
  /// memory of its own: where its members are, on each of their hosts, all
  /// the ranks of the context's first communicator there, in its order, it
  /// uses that communicator's; otherwise its same-host messages go through
  /// the transport.
  /// Operations of all communicators of a context run one at a time in the
  /// order this process issues them, as on one CUDA stream: ranks must
  /// issue the calls of communicators they share in the same order.
  /// Destroying a communicator does not end the others; the progress
  /// thread stops with the last of them.
  Communicator split(int color, int key) const;
  /// The same ranks in the same order, a communicator of their own (as
  /// split(0, rank()), collective over this communicator).
  Communicator dup() const;
  /// The ranks `ranks` (this communicator's numbers; rank i of the new
  /// communicator is ranks[i]) as a communicator of their own, formed by
  /// them alone (as MPI_Comm_create_group): every listed rank calls it with
  /// the same list, the others do not. InvalidArgument when the list is
  /// empty, repeats a rank, names one outside this communicator or does not
  /// hold the calling rank.
  Communicator subgroup(const std::vector<int>& ranks) const;

  /// What the selector decides for a call (no per-call option), why, and
  /// the cost model's predictions.
  struct Selection {
    std::string algorithm;
    std::string why;
    /// (name, seconds) of every registered algorithm that can run the call,
    /// fastest first; empty with GRADCOMM_SELECT=rule.
    std::vector<std::pair<std::string, double>> predictedSeconds;
  };
  /// The selector's decision for a sum of `count` elements of `type`
  /// (allgather and reduce-scatter: count per rank; root 0).
  Selection explainSelection(Collective collective, size_t count, DataType type) const;
  /// The engine this communicator's calls on device buffers take.
  struct DeviceEngine {
    /// "nccl" (NVIDIA's NCCL on the caller's stream), "staged" (through
    /// pinned host memory into the host algorithms) or "none" (some rank
    /// cannot make device calls: no CUDA device, or a build without CUDA).
    std::string engine;
    std::string why;
  };
  /// Collective: decides the engine as the communicator's first device
  /// call would (once per communicator; later calls keep it), for buffers
  /// on CUDA device `device` (-1: the calling thread's current device),
  /// and says which it is and why (compressed calls take it too).
  DeviceEngine deviceEngine(int device = -1) const;
  /// The ranks' layout, "HxL" (hosts x ranks per host), or "P+Q+..." when hosts differ.
  std::string layout() const;
  /// The topology and the cost model's inputs, one line each.
  std::string describeTopology() const;
  /// The cost model's inputs as a calibration file for this layout, which
  /// GRADCOMM_CALIBRATE=PATH loads (`gradcomm-bench --calibrate FILE`
  /// writes one measured with GRADCOMM_CALIBRATE=1). InvalidUsage with
  /// GRADCOMM_SELECT=rule (no cost model).
  std::string calibration() const;

  /// Ends the communicator for every handle: later calls throw
  /// InvalidUsage. The last communicator of a context (this one and those
  /// split from it) also stops the progress thread and fails pending
  /// operations; while others live, this one's queued operations still run.
  /// Local: it does not synchronise with other ranks. Called by the last
  /// handle's destructor.
  void destroy();
  /// False after destroy() or for a moved-from handle.
  bool valid() const;

  /// One transfer of pointToPoint(): `count` elements of `type` sent from
  /// `buffer` to rank `peer`, or received from `peer` into `buffer`.
  struct Transfer {
    enum class Kind : uint8_t { kSend, kRecv };
    Kind kind = Kind::kSend;
    void* buffer = nullptr;
    size_t count = 0;
    DataType type = DataType::kUInt8;
    int peer = -1;
    /// Sends match receives per (sender, receiver, tag), in issue order.
    int tag = 0;
    static Transfer send(const void* in, size_t count, DataType type, int peer, int tag = 0) {
      return {Kind::kSend, const_cast<void*>(in), count, type, peer, tag};
    }
    static Transfer recv(void* out, size_t count, DataType type, int peer, int tag = 0) {
      return {Kind::kRecv, out, count, type, peer, tag};
    }
  };
  /// Largest point-to-point tag (tags are 0 to kMaxTag).
  static constexpr int kMaxTag = 7;
  /// Sends `count` elements of `type` from `in` to rank `peer`. Only the
  /// two ranks call it (no sequence number of the communicator's): the k-th
  /// send from A to B with a tag matches B's k-th recv from A with that
  /// tag, and both must name the same type and count (else both fail with
  /// an InvalidArgument that names the two). The Work completes once the
  /// receiver took the data (`in` may be reused then). Point-to-point calls
  /// issued one after another run together (a send does not hold back a
  /// later recv of this rank); a collective issued after them runs after
  /// them, as with NCCL. Throws InvalidArgument (and aborts the
  /// communicator) for a peer outside [0, size) or this rank itself, a
  /// count too large to address (a negative count converted to size_t), a
  /// null buffer with count > 0, an unknown type or a tag outside
  /// [0, kMaxTag]. Device buffers move through pinned host memory and the
  /// call takes no stream: a send copies `in` out before it returns, after
  /// the work queued so far on the device's legacy default stream and
  /// gradcomm's earlier staged calls (work on other streams that writes
  /// `in` must be synchronised first); a receive's data is in `out` once the
  /// Work completed (wait(), or synchronize() for a stream).
  Work send(const void* in, size_t count, DataType type, int peer, int tag = 0);
  /// Receives `count` elements of `type` from rank `peer` into `out`; see send().
  Work recv(void* out, size_t count, DataType type, int peer, int tag = 0);
  /// Issues `transfers` at once, as one Work that completes when all did
  /// (as ncclGroupStart/End around ncclSend/ncclRecv, or torch's
  /// batch_isend_irecv): no transfer waits for another of the batch. Here
  /// a transfer may name this rank itself: its k-th send to itself is
  /// copied into its k-th recv from itself (same tag), which must be in
  /// the same batch, with the same type and count. Checks as send(); an
  /// empty batch completes at once.
  Work pointToPoint(const std::vector<Transfer>& transfers);

  /// Fails the communicator on every rank with `reason`: this rank's
  /// pending and later operations fail with an InvalidUsage naming it (its
  /// progress thread stops, as with destroy()), the other ranks' with a
  /// RemoteError naming this rank and `reason`, as soon as they look (at
  /// their next progress step). Does not wait for the others; the handle
  /// stays valid (valid() is true; destroy() still releases it). After a
  /// failure, or a second time, the first failure's reason stays. Not from
  /// a Work::onComplete callback (it must not call the communicator).
  /// Failure belongs to the context: communicators split from one another
  /// (split, dup, subgroup) all fail with it, on every rank of the context.
  void abort(const std::string& reason);
  /// Why the communicator cannot be used any more (a failed operation, a
  /// peer's abort notice that its progress thread saw, abort(), destroy()),
  /// as the exception its operations throw; null while it is usable. Never
  /// blocks (as ncclCommGetAsyncError).
  std::exception_ptr failure() const;

  /// The parameters this communicator resolved at creation (from Options,
  /// the environment and defaults), one per known name, as
  /// describeParameters() lists them.
  std::vector<ParamDescription> parameters() const;
  /// The resolved value of one parameter ("GRADCOMM_TIMEOUT" or "TIMEOUT"),
  /// normalised as parameters() shows it; InvalidArgument for an unknown name.
  std::string parameter(const std::string& name) const;

  /// For the library's own frontends and tests: the implementation.
  std::shared_ptr<detail::CommunicatorImpl> impl() const { return impl_; }
  explicit Communicator(std::shared_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}

 private:
  detail::CommunicatorImpl& checked() const;
  std::shared_ptr<detail::CommunicatorImpl> impl_;
};

/// Forms a communicator of `size` processes that meet through `store`
/// (collective: every process calls it with its own `rank` in [0, size)).
/// Bytes move through UCX (GRADCOMM_TRANSPORT=auto or ucx); ranks on one
/// host also share memory. Each rank validates its configuration and all
/// ranks agree on it, as with MPI. Fails on every rank, never hangs: a rank
/// that does not arrive within GRADCOMM_TIMEOUT (named in the TimeoutError),
/// two processes with the same rank, or a world size that differs.
/// Communicators formed through one store must be formed in the same order
/// on every rank.
GRADCOMM_API Communicator communicatorFromStore(std::shared_ptr<Store> store, int rank, int size,
                                                const Options& options = {});

/// Forms a communicator from the launcher's environment, without MPI:
/// rank from GRADCOMM_RANK, RANK (torchrun) or OMPI_COMM_WORLD_RANK
/// (mpirun); world size from GRADCOMM_WORLD_SIZE, WORLD_SIZE or
/// OMPI_COMM_WORLD_SIZE; rendezvous at GRADCOMM_RENDEZVOUS=host:port, else
/// MASTER_ADDR and MASTER_PORT + 1 (torchrun's agent serves its own store
/// on MASTER_PORT), else, when mpirun started every rank on this host, a
/// loopback port derived from the job id. Rank 0 serves a TcpStore there.
GRADCOMM_API Communicator communicatorFromEnvironment(const Options& options = {});

/// Forms `n` ranks of one communicator inside this process (NCCL's
/// ncclCommInitAll: one rank per device, or per thread): element r is rank
/// r. Their bytes move through memory; each rank has its own progress, so
/// one thread may issue every rank's collectives and then wait for them
/// all, or each rank may have a thread of its own. What forms or decides
/// something with the other ranks before it returns (split, subgroup,
/// deviceEngine, and the first call on device buffers) needs a thread per
/// rank, as forming them does inside this call. n must be in [1, 1024];
/// `options` serve every rank (GRADCOMM_TRANSPORT does not apply).
GRADCOMM_API std::vector<Communicator> localCommunicators(int n, const Options& options = {});

/// Names of the algorithms that implement `collective`, for CollectiveOptions
/// and GRADCOMM_ALGO ("ring", "rd", "hd", "tree", "shm", "native" for allreduce).
GRADCOMM_API std::vector<std::string> algorithmNames(Collective collective);

}  // namespace gradcomm
