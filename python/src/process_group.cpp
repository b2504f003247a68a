#include "process_group.hpp"

#include <Python.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include <ATen/ATen.h>

#include "gradcomm/error.hpp"
#include "gradcomm/timeline.hpp"
#include "store_adapter.hpp"

namespace gradcomm::torch_backend {

/// Wakes the thread that completes point-to-point Works: each transfer's
/// Work::onComplete pokes it. Its mutex also guards the list of calls that
/// thread watches (the process group's).
struct P2pSignal {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;  ///< guarded by mu; bumped by notify()
  void notify() {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++generation;
    }
    cv.notify_all();
  }
};

/// Set once one transfer completed or failed (its Work's onComplete).
struct P2pTicket {
  std::atomic<bool> done{false};
};

namespace {

using Clock = std::chrono::steady_clock;

const char* kSupportedTypes = "float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool";
const char* kGlooHint = "create a gloo group for it: dist.new_group(backend=\"gloo\") and pass group=";

/// gradcomm's type for a tensor's dtype, if it has one.
bool gradcommType(at::ScalarType s, DataType* out) {
  switch (s) {
    case at::kFloat: *out = DataType::kFloat32; return true;
    case at::kDouble: *out = DataType::kFloat64; return true;
    case at::kHalf: *out = DataType::kFloat16; return true;
    case at::kBFloat16: *out = DataType::kBFloat16; return true;
    case at::kChar: *out = DataType::kInt8; return true;
    case at::kByte: *out = DataType::kUInt8; return true;
    case at::kInt: *out = DataType::kInt32; return true;
    case at::kLong: *out = DataType::kInt64; return true;
    case at::kBool: *out = DataType::kUInt8; return true;  // one byte, 0 or 1
    default: return false;
  }
}

/// How a tensor's bytes move in a collective that does not reduce: as its
/// own gradcomm type where it has one (so ranks that disagree on the dtype
/// are told so), else as bytes.
struct Movement {
  DataType type;
  size_t count;
};
Movement movementOf(const at::Tensor& t) {
  DataType dt;
  if (gradcommType(t.scalar_type(), &dt)) return {dt, static_cast<size_t>(t.numel())};
  return {DataType::kUInt8, static_cast<size_t>(t.numel()) * t.element_size()};
}

std::string opName(c10d::ReduceOp op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "op " + std::to_string(static_cast<int>(op.op_));
  }
}

std::string shapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string describeTensor(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + shapeOf(t);
}

/// A contiguous tensor holding t's values: t itself when it already is.
at::Tensor contiguousBuffer(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

/// A flat view of `count` elements of `flat` from element `offset`, shaped like `like`.
at::Tensor slab(const at::Tensor& flat, int64_t offset, const at::Tensor& like) {
  return flat.narrow(0, offset, like.numel()).view(like.sizes());
}

/// Copies `parts` one after another into the leading elements of `flat`.
void flattenInto(const at::Tensor& flat, const std::vector<at::Tensor>& parts) {
  int64_t offset = 0;
  for (const auto& t : parts) {
    slab(flat, offset, t).copy_(t);
    offset += t.numel();
  }
}

/// The reverse: fills `parts` one after another from `flat`.
void unflattenFrom(const at::Tensor& flat, const std::vector<at::Tensor>& parts) {
  int64_t offset = 0;
  for (const auto& t : parts) {
    t.copy_(slab(flat, offset, t));
    offset += t.numel();
  }
}

/// Adds to `finish` the copy of `from` into `to` where the call ran on a
/// contiguous copy of `to` (they are not one tensor).
void addCopyBack(std::function<void()>& finish, const at::Tensor& to, const at::Tensor& from) {
  if (from.is_same(to)) return;
  finish = [prev = std::move(finish), to, from] {
    if (prev) prev();
    to.copy_(from);
  };
}

int64_t toNs(Clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); }

Communicator formCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                              std::chrono::milliseconds timeout) {
  Options options;
  // torch's timeout is the communicator's: rendezvous, and any collective
  // that makes no progress for that long.
  if (timeout.count() > 0) options.set("TIMEOUT", std::to_string(timeout.count()) + "ms");
  return communicatorFromStore(std::make_shared<C10dStoreAdapter>(store), rank, size, options);
}

}  // namespace

// ---- WorkGradcomm ---------------------------------------------------------------

WorkGradcomm::WorkGradcomm(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                           std::optional<c10::Device> device)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      device_(device),
      // A CUDA future records events on the completing thread's current
      // stream when marked completed; waiting on it (or a then() callback)
      // makes the waiter's current stream wait for them.
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       device ? std::vector<c10::Device>{*device}
                                                              : std::vector<c10::Device>{})) {}

void WorkGradcomm::synchronize() {
  // The future is completed just after the Work (complete()); its wait()
  // then only orders the current stream after the result's events.
  if (device_) future_->wait();
}

bool WorkGradcomm::wait(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  struct Record {
    WorkGradcomm* w;
    Clock::time_point start;
    ~Record() {
      if (!w->telemetry) return;
      const auto end = Clock::now();
      w->telemetry->exposedNs += toNs(end - start);
      if (w->telemetry->timeline) {
        w->telemetry->timeline->span("wait", "exposed", start, end, Timeline::kCompute);
      }
    }
  } record{this, start};
  const bool done = c10d::Work::wait(timeout);  // rethrows the call's error
  synchronize();
  return done;
}

void WorkGradcomm::complete(std::exception_ptr error) {
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// ---- ProcessGroupGradcomm -------------------------------------------------------------

ProcessGroupGradcomm::ProcessGroupGradcomm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      comm_(formCommunicator(store, rank, size, timeout)),
      binding_(std::make_shared<DeviceBinding>()),
      telemetry_(std::make_shared<Telemetry>()) {
  init();
  printStats_ = statsWanted();
  const std::string timelinePath = comm_.parameter("GRADCOMM_TIMELINE");
  if (!timelinePath.empty()) {
    telemetry_->timeline = std::make_unique<Timeline>(Timeline::perRankPath(timelinePath, rank), rank);
  }
  lastFlush_ = Clock::now();
  completer_ = std::make_shared<Completer>();
}

ProcessGroupGradcomm::ProcessGroupGradcomm(Communicator comm, std::chrono::milliseconds timeout,
                                           std::shared_ptr<Completer> completer,
                                           std::shared_ptr<DeviceBinding> binding)
    : c10d::Backend(comm.rank(), comm.size()),
      timeout_(timeout),
      comm_(std::move(comm)),
      completer_(std::move(completer)),
      binding_(std::move(binding)),
      telemetry_(std::make_shared<Telemetry>()) {
  init();
  // GRADCOMM_STATS as for the first group; the timeline (one file per rank)
  // stays the first group's.
  printStats_ = statsWanted();
  lastFlush_ = Clock::now();
}

bool ProcessGroupGradcomm::statsWanted() const {
  const int statsEvery = std::stoi(comm_.parameter("GRADCOMM_STATS"));
  const bool statsAllRanks = comm_.parameter("GRADCOMM_STATS_ALL_RANKS") == "1";
  return statsEvery > 0 && (statsAllRanks || rank_ == 0);
}

c10::intrusive_ptr<ProcessGroupGradcomm> ProcessGroupGradcomm::subgroup(const std::vector<int64_t>& ranks,
                                                                        std::chrono::milliseconds timeout) {
  std::vector<int> r;
  for (int64_t x : ranks) {
    if (x < 0 || x >= size_) {
      throw std::invalid_argument("gradcomm backend: subgroup: rank " + std::to_string(x) +
                                  " is not a rank of this group (size " + std::to_string(size_) + ")");
    }
    r.push_back(static_cast<int>(x));
  }
  if (shutDown_.load()) throw std::runtime_error("gradcomm backend: subgroup of a group that was shut down");
  return c10::make_intrusive<ProcessGroupGradcomm>(comm_.subgroup(r), timeout, completer_, binding_);
}

// ---- Completer ---------------------------------------------------------------

Completer::Completer() : thread_([this] { loop(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Completer::push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every call finished
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

ProcessGroupGradcomm::~ProcessGroupGradcomm() { shutdown(); }

void ProcessGroupGradcomm::shutdown() {
  // torch's destroy_process_group calls this; the destructor does too.
  if (shutDown_.exchange(true)) return;
  if (p2pSignal_) {
    {
      std::lock_guard<std::mutex> lock(p2pSignal_->mu);
      p2pStopping_ = true;
    }
    p2pSignal_->cv.notify_all();
  }
  {
    // The completion threads run future callbacks, which may be Python
    // (DDP comm hooks) and take the GIL: never hold it while waiting.
    PyThreadState* saved = nullptr;
    if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
    {
      std::unique_lock<std::mutex> lock(outstandingMu_);
      outstandingCv_.wait(lock, [this] { return outstanding_ == 0; });
    }
    if (p2pCompleter_.joinable()) p2pCompleter_.join();
    completer_.reset();  // the last group of the context joins its thread
    if (saved) PyEval_RestoreThread(saved);
  }
  {
    std::lock_guard<std::mutex> lock(scratchMu_);
    scratch_.clear();
  }
  if (printStats_) {
    for (const auto& [what, s] : stats()) {
      std::fprintf(stderr, "gradcomm[rank %d] %-20s calls %8llu  bytes %14llu  comm %10.3f ms\n", rank_, what.c_str(),
                   static_cast<unsigned long long>(s.calls), static_cast<unsigned long long>(s.bytes), s.commMs);
    }
    std::fprintf(stderr, "gradcomm[rank %d] callers blocked in Work.wait: %.3f ms\n", rank_, exposedMs());
  }
  if (telemetry_->timeline) telemetry_->timeline->flush();
}

void ProcessGroupGradcomm::reject(const std::string& what, const std::string& why) {
  // An error for this call only: it was checked before anything was
  // issued, so the communicator stays usable (all ranks passing the same
  // bad tensor each get this error and carry on). A rank that made the
  // call with valid tensors is not left waiting for ever: this rank's next
  // call fails the call check on both sides with a MismatchError naming
  // both calls; without one, theirs ends at the group's timeout.
  TORCH_CHECK(false, "gradcomm backend: ", what, ": ", why, " (nothing was issued; the process group stays usable)");
}

void ProcessGroupGradcomm::unsupported(const std::string& what, const std::string& instead) const {
  TORCH_CHECK(false, "gradcomm backend: ", what, " is not supported; ", instead);
}

at::Tensor ProcessGroupGradcomm::scratch(int64_t numel, const at::TensorOptions& options) {
  constexpr size_t kScratchBuffers = 4;
  // Device memory: no cache. A cached buffer is free for the next call as
  // soon as the host released it, while the copies out of it may still be
  // queued on a stream; torch's caching allocator (recordOnStream) keeps a
  // released buffer until its streams are past it.
  if (!options.device().is_cpu()) return at::empty({numel}, options);
  std::lock_guard<std::mutex> lock(scratchMu_);
  for (auto& buf : scratch_) {
    // One owner (this cache): no pending call still reads or writes it.
    if (buf.scalar_type() != options.dtype().toScalarType() || buf.device() != options.device() ||
        buf.storage().use_count() != 1) {
      continue;
    }
    if (buf.numel() < numel) buf = at::empty({numel}, options);
    return buf.narrow(0, 0, numel);
  }
  at::Tensor fresh = at::empty({numel}, options);
  if (scratch_.size() < kScratchBuffers) scratch_.push_back(fresh);
  return fresh;
}

void ProcessGroupGradcomm::checkTensor(const std::string& what, const at::Tensor& t, CallDevice& call) {
  if (!t.defined()) reject(what, "got an undefined tensor");
  // One device per call first: a call mixing CPU and CUDA tensors (or two
  // CUDA devices) is told so, whatever the devices.
  if (std::string why = call.check(t); !why.empty()) reject(what, why);
  const c10::Device d = t.device();
  if (d.is_cuda()) {
    if (!cudaSupported()) {
      reject(what, "got a tensor on " + d.str() +
                       "; this build of the gradcomm backend takes CPU tensors only (it was compiled against a torch "
                       "whose c10::Stream has no native_handle); move it with .cpu(), or use the nccl backend");
    }
    std::lock_guard<std::mutex> lock(binding_->mu);
    if (!binding_->device) {
      binding_->device = d;
    } else if (*binding_->device != d) {
      reject(what, "got a tensor on " + d.str() + "; this process group runs its CUDA calls on " +
                       binding_->device->str() + " (the device of its first CUDA call: gradcomm takes one device "
                       "per communicator); use one process group per device");
    }
  } else if (!d.is_cpu()) {
    reject(what, "got a tensor on " + d.str() +
                     "; the gradcomm backend takes CPU and CUDA tensors (move it with .cpu() or .cuda())");
  }
  if (t.layout() != at::kStrided) reject(what, "got a sparse tensor; gradcomm takes dense tensors (use .to_dense())");
}

CollectiveOptions ProcessGroupGradcomm::callOptions(const CallDevice& call) const {
  CollectiveOptions o;
  // gradcomm reads the inputs once the caller's queued work is done (and
  // writes nothing before): no host synchronisation at issue.
  if (auto cuda = call.cuda()) o.stream = nativeHandle(currentStream(*cuda));
  return o;
}

ProcessGroupGradcomm::Pending ProcessGroupGradcomm::pending(const std::string& what, c10d::OpType type,
                                                            std::vector<at::Tensor> outputs, const CallDevice& call) {
  Pending p;
  p.what = what;
  p.device = call.cuda();
  p.work = c10::make_intrusive<WorkGradcomm>(rank_, type, std::move(outputs), p.device);
  return p;
}

std::exception_ptr ProcessGroupGradcomm::awaitOps(Pending& p) {
  try {
    if (p.device) {
      // The host waits for the communication; p.stream (the completing
      // thread's current stream, where `finish` then copies) waits for the
      // copy of each result into its device buffer.
      void* stream = nativeHandle(*p.stream);
      for (auto& op : p.ops) op.synchronize(stream);
    } else {
      for (auto& op : p.ops) op.wait();
    }
    if (p.finish) p.finish();
    return nullptr;
  } catch (const std::exception& e) {
    return std::make_exception_ptr(std::runtime_error("gradcomm backend: " + p.what + " failed: " + e.what()));
  } catch (...) {
    return std::current_exception();
  }
}

DataType ProcessGroupGradcomm::reductionType(const std::string& what, const at::Tensor& t, c10d::ReduceOp op,
                                             ReduceOp* gcOp) {
  DataType dt;
  if (!gradcommType(t.scalar_type(), &dt)) {
    reject(what, std::string("cannot reduce dtype ") + c10::toString(t.scalar_type()) + " (gradcomm reduces " +
                     kSupportedTypes + "); cast the tensor, or " + kGlooHint);
  }
  const bool isBool = t.scalar_type() == at::kBool;
  const bool isFloat = at::isFloatingType(t.scalar_type());
  switch (op.op_) {
    case c10d::ReduceOp::SUM: *gcOp = isBool ? ReduceOp::kMax : ReduceOp::kSum; break;  // bool sum = logical or
    case c10d::ReduceOp::PRODUCT: *gcOp = isBool ? ReduceOp::kMin : ReduceOp::kProd; break;  // logical and
    case c10d::ReduceOp::MIN: *gcOp = ReduceOp::kMin; break;
    case c10d::ReduceOp::MAX: *gcOp = ReduceOp::kMax; break;
    case c10d::ReduceOp::AVG:
      if (!isFloat) {
        reject(what, std::string("AVG of a ") + c10::toString(t.scalar_type()) +
                         " tensor is not defined; use SUM and divide (or convert to a floating type)");
      }
      *gcOp = ReduceOp::kAvg;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
      if (isBool) {
        *gcOp = op.op_ == c10d::ReduceOp::BAND ? ReduceOp::kMin : ReduceOp::kMax;
        break;
      }
      [[fallthrough]];
    default:
      reject(what, "reduce op " + opName(op) + " is not supported on " + c10::toString(t.scalar_type()) +
                       " (gradcomm has SUM, PRODUCT, MIN, MAX, AVG; BAND/BOR on bool); " +
                       (op.op_ == c10d::ReduceOp::PREMUL_SUM ? "multiply first and use SUM, or "
                                                              : std::string()) +
                       kGlooHint);
  }
  return dt;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::enqueue(Pending p) {
  if (shutDown_.load()) {
    TORCH_CHECK(false, "gradcomm backend: ", p.what, " after the process group was shut down");
  }
  auto work = p.work;
  work->telemetry = telemetry_;
  if (telemetry_->timeline) {
    telemetry_->timeline->instant(p.what + " issued", "issue", Clock::now(), Timeline::kCompute,
                                  "\"bytes\": " + std::to_string(p.bytes));
  }
  {
    std::lock_guard<std::mutex> lock(outstandingMu_);
    ++outstanding_;
  }
  completer_->push([this, pending = std::make_shared<Pending>(std::move(p))] {
    complete(*pending);
    {
      std::lock_guard<std::mutex> lock(outstandingMu_);
      --outstanding_;
    }
    outstandingCv_.notify_all();
  });
  return work;
}

void ProcessGroupGradcomm::complete(Pending& p) {
  // CUDA: the side stream stays current until the Work and its future are
  // completed (finishCall), so the future's events are recorded on it.
  std::optional<CompletionStream> scope;
  if (p.device) {
    scope.emplace(*p.device);
    p.stream = scope->stream();
  }
  const std::exception_ptr error = awaitOps(p);
  double commMs = 0;
  for (auto& op : p.ops) {
    if (op.endTime() == Clock::time_point{} || op.startTime() == Clock::time_point{}) continue;
    commMs += std::chrono::duration<double, std::milli>(op.endTime() - op.startTime()).count();
    if (telemetry_->timeline) {
      telemetry_->timeline->span(p.what, "collective", op.startTime(), op.endTime(), Timeline::kComm,
                                 "\"algorithm\": \"" + op.algorithm() + "\", \"bytes\": " +
                                     std::to_string(op.bytes()));
    }
  }
  finishCall(p, error, commMs);
  if (telemetry_->timeline && Clock::now() - lastFlush_ > std::chrono::seconds(1)) {
    telemetry_->timeline->flush();
    lastFlush_ = Clock::now();
  }
}

void ProcessGroupGradcomm::finishCall(Pending& p, std::exception_ptr error, double commMs) {
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    auto& s = stats_[p.what];
    ++s.calls;
    s.bytes += p.bytes;
    s.commMs += commMs;
  }
  // Release tensors before anyone sees the completion. CUDA: the copies
  // queued on p.stream may still read or write them; the caching allocator
  // keeps their memory until that stream is past this point.
  if (p.stream) {
    for (const auto& t : p.keep) recordOnStream(t, *p.stream);
    if (p.work) {
      for (const auto& t : p.work->result()) recordOnStream(t, *p.stream);
    }
  }
  p.keep.clear();
  p.finish = nullptr;
  p.work->complete(error);
}

void ProcessGroupGradcomm::p2pCompletionLoop() {
  std::vector<Pending> waiting;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(p2pSignal_->mu);
      const uint64_t seen = p2pSignal_->generation;
      if (waiting.empty()) {
        p2pSignal_->cv.wait(lock, [this] { return p2pStopping_ || !p2pIncoming_.empty(); });
        if (p2pIncoming_.empty()) return;  // stopping, and every call finished
      } else {
        // Each transfer's onComplete notifies; the 10 ms are a backstop.
        p2pSignal_->cv.wait_for(lock, std::chrono::milliseconds(10), [&] {
          return !p2pIncoming_.empty() || p2pSignal_->generation != seen;
        });
      }
      for (auto& p : p2pIncoming_) waiting.push_back(std::move(p));
      p2pIncoming_.clear();
    }
    // Outside the lock: the transfers' callbacks notify under it.
    for (size_t i = 0; i < waiting.size();) {
      Pending& p = waiting[i];
      if (!p.ticket->done.load()) {
        ++i;
        continue;
      }
      std::optional<CompletionStream> scope;  // CUDA: as in complete()
      if (p.device) {
        scope.emplace(*p.device);
        p.stream = scope->stream();
      }
      const std::exception_ptr error = awaitOps(p);  // completed: its failure, if any
      const auto now = Clock::now();
      if (telemetry_->timeline && !error) {
        telemetry_->timeline->span(p.what, "p2p", p.issued, now, Timeline::kComm,
                                   "\"bytes\": " + std::to_string(p.bytes));
      }
      finishCall(p, error, std::chrono::duration<double, std::milli>(now - p.issued).count());
      waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

std::map<std::string, CollectiveStats> ProcessGroupGradcomm::stats() const {
  std::lock_guard<std::mutex> lock(statsMu_);
  return stats_;
}

void ProcessGroupGradcomm::checkRoot(const std::string& what, int64_t rootRank, int64_t rootTensor) {
  if (rootRank < 0 || rootRank >= size_ || rootTensor != 0) {
    reject(what, "root rank " + std::to_string(rootRank) + " is not in [0, " + std::to_string(size_) + ")" +
                     (rootTensor != 0 ? " or root tensor " + std::to_string(rootTensor) + " is not 0" : ""));
  }
}

void ProcessGroupGradcomm::checkPerRank(const std::string& what, const std::vector<at::Tensor>& list,
                                        const at::Tensor& like, const std::string& role, CallDevice& call) {
  if (static_cast<int>(list.size()) != size_) {
    reject(what, "the " + role + " list has " + std::to_string(list.size()) + " tensors; it needs one per rank (" +
                     std::to_string(size_) + ")");
  }
  for (const auto& t : list) {
    checkTensor(what, t, call);
    if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
      reject(what, role + " tensor " + describeTensor(t) + " does not match the " +
                       (role == "output" ? "input " : "output ") + describeTensor(like));
    }
  }
}

void ProcessGroupGradcomm::checkWorldTimes(const std::string& what, const at::Tensor& big, const std::string& bigRole,
                                           const at::Tensor& small, const std::string& smallRole, int64_t index) {
  if (big.numel() == size_ * small.numel() && big.scalar_type() == small.scalar_type()) return;
  const std::string i = index < 0 ? "" : " " + std::to_string(index);
  reject(what, (index < 0 ? "the " : "") + bigRole + i + " " + describeTensor(big) + " must hold world_size (" +
                   std::to_string(size_) + ") times " + (index < 0 ? "the " : "") + smallRole + i + " " +
                   describeTensor(small) + " of the same dtype");
}

// ---- collectives ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  const std::string what = "allreduce";
  if (tensors.size() != 1) {
    unsupported("allreduce of " + std::to_string(tensors.size()) + " tensors in one call",
                "pass one tensor per process (or use allreduce_coalesced)");
  }
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor t = tensors[0];
  checkTensor(what, t, call);
  ReduceOp op;
  const DataType dt = reductionType(what, t, opts.reduceOp, &op);
  at::Tensor buf = contiguousBuffer(t);
  Pending p = pending(what, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{t}, call);
  p.bytes = t.nbytes();
  p.ops.push_back(comm_.allreduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, op, callOptions(call)));
  addCopyBack(p.finish, t, buf);
  p.keep = {t, buf};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allreduceCompressed(at::Tensor& tensor,
                                                                         const std::string& compression,
                                                                         std::shared_ptr<ErrorFeedback> feedback) {
  const std::string what = "allreduce[" + compression + "]";
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor t = tensor;
  checkTensor(what, t, call);
  ReduceOp op;
  const DataType dt = reductionType(what, t, c10d::ReduceOp::AVG, &op);
  at::Tensor buf = contiguousBuffer(t);
  CollectiveOptions o = callOptions(call);
  // Compression applies to float32; other buckets are averaged exactly.
  if (dt == DataType::kFloat32) {
    o.compression = compression;
    o.errorFeedback = feedback.get();
  } else {
    o.compression = "none";
  }
  Pending p = pending(what, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{t}, call);
  p.bytes = t.nbytes();
  try {
    p.ops.push_back(comm_.allreduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, op, o));
  } catch (const Error& e) {
    TORCH_CHECK(false, "gradcomm backend: ", what, ": ", e.what());
  }
  addCopyBack(p.finish, t, buf);
  p.keep = {t, buf};
  p.keepOther = feedback;
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const std::string what = "allreduce_coalesced";
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  if (tensors.empty()) reject(what, "got no tensors");
  ReduceOp op;
  DataType dt = DataType::kFloat32;
  int64_t total = 0;
  for (const auto& t : tensors) {
    checkTensor(what, t, call);
    if (t.scalar_type() != tensors[0].scalar_type()) {
      reject(what, "every tensor must have the same dtype (got " + describeTensor(tensors[0]) + " and " +
                       describeTensor(t) + "); call it once per dtype");
    }
    total += t.numel();
  }
  dt = reductionType(what, tensors[0], opts.reduceOp, &op);
  // One collective for all of them: flatten, reduce, copy back.
  at::Tensor flat = scratch(total, tensors[0].options());
  flattenInto(flat, tensors);
  Pending p = pending(what, c10d::OpType::ALLREDUCE_COALESCED, tensors, call);
  p.bytes = flat.nbytes();
  p.ops.push_back(comm_.allreduce(flat.data_ptr(), flat.data_ptr(), static_cast<size_t>(total), dt, op,
                                  callOptions(call)));
  std::vector<at::Tensor> outs = tensors;
  p.finish = [outs, flat] { unflattenFrom(flat, outs); };
  p.keep = tensors;
  p.keep.push_back(flat);
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  const std::string what = "broadcast";
  if (tensors.size() != 1) {
    unsupported("broadcast of " + std::to_string(tensors.size()) + " tensors in one call", "pass one tensor per process");
  }
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor t = tensors[0];
  checkTensor(what, t, call);
  checkRoot(what, opts.rootRank, opts.rootTensor);
  at::Tensor buf = contiguousBuffer(t);
  const Movement m = movementOf(buf);
  Pending p = pending(what, c10d::OpType::BROADCAST, std::vector<at::Tensor>{t}, call);
  p.bytes = t.nbytes();
  p.ops.push_back(comm_.broadcast(buf.data_ptr(), buf.data_ptr(), m.count, m.type, static_cast<int>(opts.rootRank),
                                  callOptions(call)));
  if (rank_ != opts.rootRank) addCopyBack(p.finish, t, buf);
  p.keep = {t, buf};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  const std::string what = "reduce";
  if (tensors.size() != 1) {
    unsupported("reduce of " + std::to_string(tensors.size()) + " tensors in one call", "pass one tensor per process");
  }
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor t = tensors[0];
  checkTensor(what, t, call);
  checkRoot(what, opts.rootRank, opts.rootTensor);
  ReduceOp op;
  const DataType dt = reductionType(what, t, opts.reduceOp, &op);
  at::Tensor buf = contiguousBuffer(t);
  const bool root = rank_ == opts.rootRank;
  Pending p = pending(what, c10d::OpType::REDUCE, std::vector<at::Tensor>{t}, call);
  p.bytes = t.nbytes();
  p.ops.push_back(comm_.reduce(buf.data_ptr(), root ? buf.data_ptr() : nullptr, buf.numel(), dt, op,
                               static_cast<int>(opts.rootRank), callOptions(call)));
  if (root) addCopyBack(p.finish, t, buf);
  p.keep = {t, buf};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions&) {
  const std::string what = "allgather";
  if (inputs.size() != 1 || outputs.size() != 1) {
    unsupported("allgather with several input tensors per process", "pass one input tensor and one output list");
  }
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor in = inputs[0];
  checkTensor(what, in, call);
  std::vector<at::Tensor> outs = outputs[0];
  checkPerRank(what, outs, in, "output", call);
  at::Tensor src = contiguousBuffer(in);
  at::Tensor flat = scratch(static_cast<int64_t>(size_) * in.numel(), in.options());
  const Movement m = movementOf(src);
  Pending p = pending(what, c10d::OpType::ALLGATHER, outs, call);
  p.bytes = flat.nbytes();
  p.ops.push_back(comm_.allgather(src.data_ptr(), flat.data_ptr(), m.count, m.type, callOptions(call)));
  p.finish = [outs, flat] { unflattenFrom(flat, outs); };
  p.keep = outs;
  p.keep.push_back(src);
  p.keep.push_back(flat);
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::pairwise(const std::string& what, c10d::OpType type,
                                                             const std::vector<at::Tensor>& outputs,
                                                             const std::vector<at::Tensor>& inputs, bool coalesced,
                                                             const c10d::ReduceOp* reduceOp) {
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  if (outputs.size() != inputs.size()) {
    reject(what, "got " + std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
                     " outputs; it needs one output per input");
  }
  std::vector<DataType> types;
  ReduceOp op = ReduceOp::kSum;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& input = inputs[i];
    const at::Tensor& output = outputs[i];
    checkTensor(what, input, call);
    checkTensor(what, output, call);
    const int64_t index = coalesced ? static_cast<int64_t>(i) : -1;
    if (!reduceOp) {
      checkWorldTimes(what, output, "output", input, "input", index);
    } else {
      checkWorldTimes(what, input, "input", output, "output", index);
      types.push_back(reductionType(what, output, *reduceOp, &op));
    }
  }
  // Checked all first: a rejected call issues nothing.
  Pending p = pending(what, type, outputs, call);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor in = contiguousBuffer(inputs[i]);
    at::Tensor out = contiguousBuffer(outputs[i]);
    if (!reduceOp) {
      const Movement m = movementOf(in);
      p.bytes += out.nbytes();
      p.ops.push_back(comm_.allgather(in.data_ptr(), out.data_ptr(), m.count, m.type, callOptions(call)));
    } else {
      p.bytes += in.nbytes();
      p.ops.push_back(comm_.reduceScatter(in.data_ptr(), out.data_ptr(), outputs[i].numel(), types[i], op,
                                            callOptions(call)));
    }
    addCopyBack(p.finish, outputs[i], out);
    p.keep.insert(p.keep.end(), {inputs[i], outputs[i], in, out});
  }
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::AllgatherOptions&) {
  return pairwise("_allgather_base", c10d::OpType::_ALLGATHER_BASE, {output}, {input}, false, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  return pairwise("allgather_into_tensor_coalesced", c10d::OpType::COALESCED, outputs, inputs, true, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather_coalesced(std::vector<std::vector<at::Tensor>>&,
                                                                         std::vector<at::Tensor>&,
                                                                         const c10d::AllgatherOptions&) {
  unsupported("allgather_coalesced (deprecated in torch)",
              "flatten the tensors into one and use all_gather or _all_gather_base");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::GatherOptions& opts) {
  const std::string what = "gather";
  if (inputs.size() != 1) unsupported("gather of several tensors per process", "pass one input tensor");
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor in = inputs[0];
  checkTensor(what, in, call);
  checkRoot(what, opts.rootRank);
  const bool root = rank_ == opts.rootRank;
  std::vector<at::Tensor> outs;
  if (root) {
    if (outputs.size() != 1) reject(what, "the root needs one output list, of world_size tensors");
    outs = outputs[0];
    checkPerRank(what, outs, in, "output", call);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    reject(what, "only the root (rank " + std::to_string(opts.rootRank) + ") passes output tensors");
  }
  // gradcomm has no gather: an allgather moves every rank's input to every
  // rank (world_size times the memory and traffic a gather needs).
  at::Tensor src = contiguousBuffer(in);
  at::Tensor flat = scratch(static_cast<int64_t>(size_) * in.numel(), in.options());
  const Movement m = movementOf(src);
  Pending p = pending(what, c10d::OpType::GATHER, outs, call);
  p.bytes = flat.nbytes();
  p.ops.push_back(comm_.allgather(src.data_ptr(), flat.data_ptr(), m.count, m.type, callOptions(call)));
  if (root) p.finish = [outs, flat] { unflattenFrom(flat, outs); };
  p.keep = outs;
  p.keep.push_back(src);
  p.keep.push_back(flat);
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::scatter(std::vector<at::Tensor>& outputs,
                                                             std::vector<std::vector<at::Tensor>>& inputs,
                                                             const c10d::ScatterOptions& opts) {
  const std::string what = "scatter";
  if (outputs.size() != 1) unsupported("scatter into several tensors per process", "pass one output tensor");
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor out = outputs[0];
  checkTensor(what, out, call);
  checkRoot(what, opts.rootRank);
  const bool root = rank_ == opts.rootRank;
  at::Tensor flat = scratch(static_cast<int64_t>(size_) * out.numel(), out.options());
  if (root) {
    if (inputs.size() != 1) reject(what, "the root needs one input list, of world_size tensors");
    checkPerRank(what, inputs[0], out, "input", call);
    flattenInto(flat, inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    reject(what, "only the root (rank " + std::to_string(opts.rootRank) + ") passes input tensors");
  }
  // gradcomm has no scatter: the root broadcasts every rank's part and each
  // keeps its own (world_size times the traffic a scatter needs).
  const Movement m = movementOf(flat);
  Pending p = pending(what, c10d::OpType::SCATTER, std::vector<at::Tensor>{out}, call);
  p.bytes = flat.nbytes();
  p.ops.push_back(comm_.broadcast(flat.data_ptr(), flat.data_ptr(), m.count, m.type, static_cast<int>(opts.rootRank),
                                  callOptions(call)));
  const int r = rank_;
  p.finish = [out, flat, r] { out.copy_(slab(flat, static_cast<int64_t>(r) * out.numel(), out)); };
  p.keep = {out, flat};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                                    const c10d::ReduceScatterOptions& opts) {
  const std::string what = "reduce_scatter";
  if (outputs.size() != 1 || inputs.size() != 1) {
    unsupported("reduce_scatter of several tensors per process", "pass one output tensor and one input list");
  }
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor out = outputs[0];
  checkTensor(what, out, call);
  checkPerRank(what, inputs[0], out, "input", call);
  ReduceOp op;
  const DataType dt = reductionType(what, out, opts.reduceOp, &op);
  at::Tensor flat = scratch(static_cast<int64_t>(size_) * out.numel(), out.options());
  flattenInto(flat, inputs[0]);
  at::Tensor dst = contiguousBuffer(out);
  Pending p = pending(what, c10d::OpType::REDUCE_SCATTER, std::vector<at::Tensor>{out}, call);
  p.bytes = flat.nbytes();
  p.ops.push_back(comm_.reduceScatter(flat.data_ptr(), dst.data_ptr(), out.numel(), dt, op, callOptions(call)));
  addCopyBack(p.finish, out, dst);
  p.keep = {out, dst, flat};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                          const c10d::ReduceScatterOptions& opts) {
  return pairwise("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input}, false,
                  &opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return pairwise("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, outputs, inputs, true,
                  &opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                   std::vector<int64_t>& outputSplits,
                                                                   std::vector<int64_t>& inputSplits,
                                                                   const c10d::AllToAllOptions&) {
  const std::string what = "alltoall_base";
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  checkTensor(what, input, call);
  checkTensor(what, output, call);
  if (input.scalar_type() != output.scalar_type()) {
    reject(what, "input " + describeTensor(input) + " and output " + describeTensor(output) + " differ in dtype");
  }
  const int64_t n = size_;
  // Rows are slices along dim 0; both tensors must agree on a row's size.
  const int64_t inRows = input.dim() ? input.size(0) : 1;
  const int64_t outRows = output.dim() ? output.size(0) : 1;
  const int64_t rowElems = inRows ? input.numel() / inRows : (outRows ? output.numel() / outRows : 0);
  if ((outRows ? output.numel() / outRows : rowElems) != rowElems) {
    reject(what, "input " + describeTensor(input) + " and output " + describeTensor(output) +
                     " differ in the size of a row (all dims but the first)");
  }
  const bool equal = inputSplits.empty() && outputSplits.empty();
  std::vector<int64_t> inSplit = inputSplits, outSplit = outputSplits;
  if (inSplit.empty()) {
    if (inRows % n) reject(what, "input " + describeTensor(input) + ": dim 0 is not divisible by world_size");
    inSplit.assign(n, inRows / n);
  }
  if (outSplit.empty()) {
    if (outRows % n) reject(what, "output " + describeTensor(output) + ": dim 0 is not divisible by world_size");
    outSplit.assign(n, outRows / n);
  }
  if (static_cast<int64_t>(inSplit.size()) != n || static_cast<int64_t>(outSplit.size()) != n ||
      std::accumulate(inSplit.begin(), inSplit.end(), int64_t{0}) != inRows ||
      std::accumulate(outSplit.begin(), outSplit.end(), int64_t{0}) != outRows) {
    reject(what, "split sizes must have world_size entries that add up to dim 0 of their tensor");
  }
  // gradcomm has no all-to-all: every rank allgathers every rank's whole
  // input (padded to the largest) and keeps the rows meant for it, which is
  // world_size times the traffic of a true all-to-all. With uneven splits
  // the ranks first exchange their split sizes (a small synchronous
  // allgather) to know where each part starts.
  std::vector<int64_t> allSplits(static_cast<size_t>(n * n));  // [j * n + r]: rows j sends to r
  int64_t maxRows = inRows;
  if (equal) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t r = 0; r < n; ++r) allSplits[j * n + r] = inSplit[r];
    }
  } else {
    comm_.allgather(inSplit.data(), allSplits.data(), static_cast<size_t>(n), DataType::kInt64).wait();
    maxRows = 0;
    for (int64_t j = 0; j < n; ++j) {
      maxRows = std::max(maxRows, std::accumulate(allSplits.begin() + j * n, allSplits.begin() + (j + 1) * n,
                                                  int64_t{0}));
      if (allSplits[j * n + rank_] != outSplit[j]) {
        reject(what, "rank " + std::to_string(j) + " sends " + std::to_string(allSplits[j * n + rank_]) +
                         " rows to rank " + std::to_string(rank_) + ", whose output_split_sizes expect " +
                         std::to_string(outSplit[j]));
      }
    }
  }
  const int64_t rowBytes = rowElems * static_cast<int64_t>(input.element_size());
  at::Tensor padded = at::zeros({maxRows * rowBytes}, input.options().dtype(at::kByte));
  if (input.numel()) padded.narrow(0, 0, inRows * rowBytes).copy_(contiguousBuffer(input).view({-1}).view(at::kByte));
  at::Tensor everything = at::empty({n * maxRows * rowBytes}, padded.options());
  Pending p = pending(what, c10d::OpType::ALLTOALL_BASE, std::vector<at::Tensor>{output}, call);
  p.bytes = everything.nbytes();
  p.ops.push_back(comm_.allgather(padded.data_ptr(), everything.data_ptr(), static_cast<size_t>(maxRows * rowBytes),
                                  DataType::kUInt8, callOptions(call)));
  at::Tensor out = output;
  const int r = rank_;
  p.finish = [out, everything, allSplits, n, r, maxRows, rowBytes] {
    at::Tensor dst = contiguousBuffer(out);
    at::Tensor bytes = dst.view({-1}).view(at::kByte);
    int64_t pos = 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t start = 0;  // where rank j's rows for rank r begin in its input
      for (int64_t k = 0; k < r; ++k) start += allSplits[j * n + k];
      const int64_t rows = allSplits[j * n + r];
      if (rows) {
        bytes.narrow(0, pos * rowBytes, rows * rowBytes)
            .copy_(everything.narrow(0, (j * maxRows + start) * rowBytes, rows * rowBytes));
      }
      pos += rows;
    }
    if (!dst.is_same(out)) out.copy_(dst);
  };
  p.keep = {input, output, padded, everything};
  return enqueue(std::move(p));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                                                              const c10d::AllToAllOptions&) {
  unsupported("all_to_all of tensor lists",
              "concatenate into one tensor and use dist.all_to_all_single (alltoall_base), or " +
                  std::string(kGlooHint));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return pointToPoint(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return pointToPoint(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::recvAnysource(std::vector<at::Tensor>&, int) {
  // Matching a receive to whichever sender comes first would need every
  // rank's messages probed; gradcomm's transfers are matched by sender.
  unsupported("recv from any source (dist.recv/irecv without src)",
              "pass src= to name the sender, or " + std::string(kGlooHint));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::pointToPoint(bool isSend, std::vector<at::Tensor>& tensors,
                                                                  int peer, int tag) {
  const std::string what = isSend ? "send" : "recv";
  if (tensors.size() != 1) unsupported(what + " of " + std::to_string(tensors.size()) + " tensors", "pass one tensor");
  std::lock_guard<std::mutex> lock(issueMu_);
  CallDevice call;
  at::Tensor t = tensors[0];
  checkTensor(what, t, call);
  const std::string role = isSend ? "destination" : "source";
  if (peer < 0 || peer >= size_) {
    reject(what, role + " rank " + std::to_string(peer) + " is not in [0, " + std::to_string(size_) + ")");
  }
  if (peer == rank_) {
    reject(what, role + " rank " + std::to_string(peer) + " is this rank itself; copy the tensor instead");
  }
  if (tag < 0 || tag > Communicator::kMaxTag) {
    reject(what, "tag " + std::to_string(tag) + " is not in [0, " + std::to_string(Communicator::kMaxTag) +
                     "] (gradcomm matches sends to receives per sender and tag, with room for 3 bits of tag)");
  }
  at::Tensor buf = contiguousBuffer(t);
  // As its own gradcomm type where it has one (the receiver then checks
  // the dtype and count), else as bytes (the receiver checks the size).
  const Movement m = movementOf(t);
  if (!p2pSignal_) {
    p2pSignal_ = std::make_shared<P2pSignal>();
    p2pCompleter_ = std::thread([this] { p2pCompletionLoop(); });
  }
  if (auto cuda = call.cuda()) {
    // gradcomm's send and recv take no stream: the host waits for the work
    // queued on the caller's current stream (which writes the tensor to
    // send, or still reads the one to receive into) before issuing.
    currentStream(*cuda).synchronize();
  }
  // Transfers issued one after another run together in the communicator
  // (a send does not hold back a later recv); a collective issued after
  // them runs after them.
  Work op = isSend ? comm_.send(buf.data_ptr(), m.count, m.type, peer, tag)
                   : comm_.recv(buf.data_ptr(), m.count, m.type, peer, tag);
  auto ticket = std::make_shared<P2pTicket>();
  op.onComplete([ticket, signal = p2pSignal_](std::exception_ptr) {
    ticket->done.store(true);
    signal->notify();
  });
  Pending p = pending(what, isSend ? c10d::OpType::SEND : c10d::OpType::RECV, std::vector<at::Tensor>{t}, call);
  p.bytes = t.nbytes();
  p.ops.push_back(op);
  if (!isSend && !buf.is_same(t)) p.finish = [t, buf] { t.copy_(buf); };
  p.keep = {t, buf};
  p.ticket = ticket;
  p.issued = Clock::now();
  auto work = p.work;
  work->telemetry = telemetry_;
  if (telemetry_->timeline) {
    telemetry_->timeline->instant(what + " issued", "issue", p.issued, Timeline::kCompute,
                                  "\"bytes\": " + std::to_string(p.bytes));
  }
  {
    std::lock_guard<std::mutex> lock(p2pSignal_->mu);
    p2pIncoming_.push_back(std::move(p));
  }
  p2pSignal_->cv.notify_all();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::barrier(const c10d::BarrierOptions&) {
  std::lock_guard<std::mutex> lock(issueMu_);
  Pending p;
  p.what = "barrier";
  p.work = c10::make_intrusive<WorkGradcomm>(rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  p.ops.push_back(comm_.barrier());
  return enqueue(std::move(p));
}

}  // namespace gradcomm::torch_backend
