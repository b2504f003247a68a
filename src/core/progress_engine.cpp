#include "core/progress_engine.hpp"

#include <immintrin.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>

#include "algorithms/plan_runner.hpp"
#include "base/log.hpp"
#include "base/units.hpp"
#include "device/runtime.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::core {

using detail::Clock;
using detail::OperationState;

namespace {

/// What host-local `peer` announced for operation `seq`, where this
/// communicator can see it.
bool announcedBy(const algorithms::RunContext& ctx, const HostControl& host, int peer, uint64_t seq,
                 transport::CallSignature* out) {
  if (!ctx.announcements) return false;
  const int local = host.group()->localIndexOf(peer);
  return local >= 0 && host.announced(local, seq, out);
}

// How long the thread leaves an operation to the caller that just drove it.
constexpr int64_t kCallerGraceNs = 50'000;
// The same when ranks outnumber cores (yield mode). A caller that drove may
// lose its core for a while before it waits; a thread that takes the drive
// lock meanwhile can be descheduled holding it (the transport yields inside
// its progress calls), and the caller cannot drive until it runs again:
// the longer grace keeps the thread from taking over mid-call.
constexpr int64_t kYieldCallerGraceNs = 1'000'000;

// Abort notices start with the kind of failure in brackets ("[timeout]
// rank 2: ..."): the peers' users see what happened, and the peers learn
// whether a rank may be gone.
constexpr const char* kUnusable = "communicator is unusable after an earlier failure: ";

std::string notice(ErrorCode code, const std::string& reason) {
  return "[" + std::string(toString(code)) + "] " + reason;
}

// A timeout or a transport failure may mean a dead or hung peer.
bool meansPeerFailure(ErrorCode code) { return code == ErrorCode::kTimeout || code == ErrorCode::kTransport; }

bool noticeMeansPeerFailure(const std::string& text) {
  for (ErrorCode code : {ErrorCode::kTimeout, ErrorCode::kTransport}) {
    if (text.find("[" + std::string(toString(code)) + "] ") != std::string::npos) return true;
  }
  return false;
}
}  // namespace

void Backoff::idle() {
  ++idle_;
  if (idle_ <= spins_) {
    _mm_pause();
    return;
  }
  if (idle_ <= spins_ + yields_) {
    std::this_thread::yield();
    return;
  }
  // 1us, 2us, 4us, ... up to the cap.
  int doublings = std::min(idle_ - spins_ - yields_, 30);
  auto sleep = std::chrono::nanoseconds(1000LL << std::min(doublings, 20));
  if (sleep > maxSleep_) sleep = maxSleep_;
  std::this_thread::sleep_for(sleep);
}

ProgressEngine::ProgressEngine(std::unique_ptr<transport::Transport> transport, std::unique_ptr<AbortChannel> aborts,
                               EngineSettings settings)
    : transport_(std::move(transport)),
      aborts_(std::move(aborts)),
      host_(transport_->sharedMemory()),
      settings_(settings) {}

ProgressEngine::~ProgressEngine() {
  shutdown("the communicator was destroyed");
  // Receives abandoned by a failed operation may still land (late data
  // from a peer that is slow, not dead): the scratch they target must not
  // go back to the heap.
  if (transport_->abandonedTransfersPending()) {
    workspace_.abandonMemory();
    check_.abandonMemory();
  }
}

void ProgressEngine::start() {
  thread_ = std::thread([this] { threadMain(); });
}

void ProgressEngine::submit(const std::shared_ptr<OperationState>& op, bool eager) {
  op->engine = weak_from_this();
  op->queuedAt = Clock::now();
  if (eager) {
    // Idle engine: this operation becomes the active one at once and the
    // submitting thread takes its first step (never a long earlier one).
    std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
    // A concurrent submission from another thread may still queue behind
    // this one: calls from several threads at once have no order anyway.
    if (drive.owns_lock() && idleForCaller()) {
      // A thread that wakes during this step leaves the operation to the
      // caller: the step may yield the core (on a host whose ranks
      // outnumber its cores, for tens of microseconds).
      callerSubmitting_.store(true, std::memory_order_relaxed);
      active_ = op;
      busy_.store(true);
      this->drive();
      drive.unlock();
      // A clock read only for calls that go on (one whose first step
      // finished it has its time).
      const bool finished = op->finished();
      afterCallerStep(finished ? op->queuedAt : Clock::now(), finished ? nullptr : op.get());
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (failed_) {
      op->finish(makeErrorPtr(failCode_, kUnusable + failReason_));
      return;
    }
    if (stop_.load()) {
      op->finish(std::make_exception_ptr(InvalidUsage("the communicator was destroyed")));
      return;
    }
    queue_.push_back(op);
    busy_.store(true);
  }
  // Only a thread asleep on the condition variable needs the (system call)
  // wake-up; while it lingers it polls busy_ by itself.
  if (blocked_.load() || standingAside_.load()) wakeThread();
}

void ProgressEngine::afterCallerStep(Clock::time_point droveAt, const OperationState* unfinished) {
  // The caller is about to wait (and drive): the thread leaves the rest to
  // it for a grace period from here.
  callerDroveAt_.store(droveAt.time_since_epoch().count(), std::memory_order_relaxed);
  callerSubmitting_.store(false, std::memory_order_release);
  // Not done in one step: a blocked thread must carry on if the caller does
  // not wait soon (a lingering one sees busy_ by itself). A napping one
  // (yield mode) is left asleep while callers wait at once: a wake-up per
  // call took the core from a peer rank, and the nap ends within kNap if
  // this caller does not wait after all.
  if (unfinished && !unfinished->finished() &&
      (blocked_.load() || (standingAside_.load() && !callerWaitsAtOnce_.load(std::memory_order_relaxed)))) {
    wakeThread();
  }
}

ProgressEngine::InlineOutcome ProgressEngine::submitInline(const algorithms::Algorithm& algo,
                                                           const algorithms::CollectiveCall& call,
                                                           algorithms::RunContext ctx,
                                                           const transport::CallSignature& signature, size_t bytes) {
  InlineOutcome out;
  std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
  if (!drive.owns_lock() || !idleForCaller()) return out;
  // The call starts when it is submitted: one clock read serves both.
  const auto now = Clock::now();
  if (host_.failedPeer() >= 0) return out;  // a host-local peer failed
  // The look for a failed peer's notice that operations make at their
  // start (see drive()), when due: after the call's first messages left,
  // and before it can be reported complete.
  const bool pollAbort = now - lastAbortPoll_ >= std::chrono::microseconds(50);
  out.taken = true;
  callerSubmitting_.store(true, std::memory_order_relaxed);
  // No operation holds a signature or phases for the algorithm to point at:
  // the call's signature lives as long as runInline(), no longer (see
  // Algorithm::runInline).
  ctx.workspace = &workspace_;
  ctx.signature = &signature;
  ctx.phases = nullptr;
  // The operation that carries on when the call does not finish here.
  auto makeOperation = [&] {
    auto op = OperationState::forCall(&algo, call, ctx, signature, bytes);
    op->ctx.signature = &op->signature;
    op->ctx.phases = &op->phases;
    op->engine = weak_from_this();
    op->queuedAt = op->startedAt = now;
    op->status.store(OperationState::kRunning);
    return op;
  };
  try {
    if (ctx.announcements) host_.announce(signature);
    algorithms::SchedulePtr rest;
    const bool finished = algo.runInline(call, ctx, {kInlinePatience, settings_.yieldWhenIdle}, &rest);
    if (pollAbort) {
      lastAbortPoll_ = Clock::now();
      if (auto remote = aborts_->poll()) {
        if (!out.op) out.op = makeOperation();
        if (rest) out.op->schedule = std::move(rest);  // its transfers are abandoned with it
        throw RemoteError(out.op->describe() + " cannot run because " + *remote);
      }
    }
    if (finished) {
      out.finished = true;
      out.start = now;
      out.end = Clock::now();
    } else {
      out.op = makeOperation();
      active_ = out.op;
      busy_.store(true);
      if (rest) {
        // Peers are late: the engine carries on with the schedule as if it
        // had started the operation itself.
        out.op->schedule = std::move(rest);
        lastProgress_ = lastHealthCheck_ = lastProbe_ = Clock::now();
      } else {
        // It did not start after all: the usual first step.
        this->drive();
      }
    }
  } catch (...) {
    if (!out.op) out.op = makeOperation();
    active_ = out.op;
    busy_.store(true);
    failActive(std::current_exception());
  }
  drive.unlock();
  afterCallerStep(out.finished ? now : Clock::now(), out.op.get());
  return out;
}

void ProgressEngine::wakeThread() {
  // Under queueMu_: a thread between its predicate check and its sleep
  // cannot miss the wake-up.
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    wakeUp_ = true;
  }
  queueCv_.notify_one();
}

void ProgressEngine::recordFailureLocked(ErrorCode code, const std::string& reason) {
  failed_ = true;
  failedFlag_.store(true);
  failCode_ = code;
  failReason_ = reason;
}

std::shared_ptr<detail::OperationState> ProgressEngine::takeActive() {
  std::shared_ptr<detail::OperationState> op = std::move(active_);
  if (op) op->schedule.reset();  // cancels its outstanding transfers
  return op;
}

void ProgressEngine::throwIfFailed() const {
  if (!failedFlag_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(queueMu_);
  if (failed_) rethrowAs(failCode_, kUnusable + failReason_);
}

void ProgressEngine::abort(ErrorCode code, const std::string& reason, bool tellPeers) {
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (failed_) return;
    recordFailureLocked(code, reason);
  }
  if (tellPeers) {
    std::lock_guard<std::mutex> drive(driveMu_);
    aborts_->broadcast(notice(code, reason));
  }
  host_.markFailed();
  queueCv_.notify_all();
}

void ProgressEngine::failQueued() {
  std::deque<std::shared_ptr<OperationState>> pending;
  std::string reason;
  ErrorCode code;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    pending.swap(queue_);
    reason = failReason_;
    code = failCode_;
  }
  for (auto& op : pending) {
    op->finish(makeErrorPtr(code, kUnusable + reason));
  }
}

void ProgressEngine::failActive(std::exception_ptr e) {
  std::string reason = "unknown error";
  ErrorCode code = ErrorCode::kInternal;
  bool remote = false;
  try {
    std::rethrow_exception(e);
  } catch (const algorithms::SignedCallMismatch& m) {
    // A signed message's check found the peer's call: named here, inline
    // and in drive() alike, as this rank's operation against that call.
    reason = transport::mismatchMessage(active_->ctx.transport->rank(), active_->describe(), active_->signature,
                                        m.peer, &m.theirs);
    code = ErrorCode::kMismatch;
    e = std::make_exception_ptr(MismatchError(reason));
  } catch (const Error& err) {
    reason = err.what();
    code = err.code();
    remote = code == ErrorCode::kRemote;
  } catch (const std::exception& err) {
    reason = err.what();
    e = std::make_exception_ptr(InternalError(reason));
  }
  if (code == ErrorCode::kTransport && active_) {
    // A peer that fails cancels its transfers before its notice goes out,
    // so the abandoned transfer may fail here first: wait briefly for the
    // notice, whose reason is the cause. Bounded: this is the failure path,
    // and a peer that died sends none.
    if (auto notice = awaitNotice()) {
      reason = active_->describe() + " failed because " + *notice;
      code = ErrorCode::kRemote;
      remote = true;
      e = std::make_exception_ptr(RemoteError(reason));
    }
  }
  check_.reset();
  auto op = takeActive();
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (!failed_) recordFailureLocked(code, reason);
  }
  if (meansPeerFailure(code) || (remote && noticeMeansPeerFailure(reason))) {
    if (settings_.onPeerFailure) settings_.onPeerFailure(reason);
  }
  // Peers are told before the caller hears of the failure: a process that
  // exits on the error at once must not take its notice with it. A failure
  // that came from a peer need not be echoed back.
  if (!remote) aborts_->broadcast(notice(code, reason));
  host_.markFailed();
  if (op) op->finish(std::move(e));
  failQueued();
}

void ProgressEngine::addBackground(std::shared_ptr<BackgroundTask> task) {
  std::lock_guard<std::mutex> drive(driveMu_);
  std::lock_guard<std::mutex> lock(backgroundMu_);
  background_.push_back(std::move(task));
  hasBackground_.store(true);
}

void ProgressEngine::removeBackground(const BackgroundTask* task) {
  std::lock_guard<std::mutex> drive(driveMu_);
  std::lock_guard<std::mutex> lock(backgroundMu_);
  background_.erase(std::remove_if(background_.begin(), background_.end(),
                                   [&](const std::shared_ptr<BackgroundTask>& t) { return t.get() == task; }),
                    background_.end());
  hasBackground_.store(!background_.empty());
}

void ProgressEngine::withTransport(const std::function<void(transport::Transport&)>& fn) {
  {
    std::lock_guard<std::mutex> drive(driveMu_);
    fn(*transport_);
  }
  // A thread blocked on the condition variable would leave the new
  // transfers untouched until the next operation: wake it.
  if (blocked_.load() || standingAside_.load()) wakeThread();
}

bool ProgressEngine::backgroundPending() const {
  if (!hasBackground_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(backgroundMu_);
  for (const auto& t : background_) {
    if (t->pending()) return true;
  }
  return false;
}

bool ProgressEngine::driveBackground() {
  if (!hasBackground_.load(std::memory_order_relaxed)) return false;
  bool moved = false;
  for (const auto& t : background_) moved = t->advance(*transport_) || moved;
  return moved;
}

bool ProgressEngine::drive() {
  const bool backgroundMoved = driveBackground();
  if (!active_) {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (queue_.empty()) {
      busy_.store(false);
      return backgroundMoved;
    }
    active_ = queue_.front();
    queue_.pop_front();
  }
  // Whoever queued or started active_ is synchronised with (queueMu_,
  // driveMu_): a device it serves is visible here.
  if (const int d = device_.load(std::memory_order_relaxed); d != threadDevice_ && d >= 0 &&
      std::this_thread::get_id() == thread_.get_id()) {
    threadDevice_ = d;
    try {
      device::runtime().setCurrentDevice(d);
    } catch (const Error& e) {
      log(LogLevel::kWarn, transport_->rank(), std::string("progress thread: could not make device ") + std::to_string(d) +
                                      " current: " + e.what());
    }
  }
  bool pollAbortNow = false;
  bool fresh = false;
  try {
    if (!active_->schedule) {
      fresh = true;
      const auto now = Clock::now();
      active_->startedAt = now;
      active_->status.store(OperationState::kRunning);
      active_->ctx.workspace = &workspace_;
      active_->ctx.signature = &active_->signature;
      active_->ctx.phases = &active_->phases;
      // A peer that failed earlier may have left messages that would let
      // this operation "complete" with stale data: its notice is looked for
      // below, after the first step posted this rank's sends and before
      // the operation can complete (at most every 50 us: back-to-back small
      // calls need not pay for it). Not before the first step: with Open
      // MPI yielding when idle, that look would give the core away before
      // this rank had sent anything.
      pollAbortNow = now - lastAbortPoll_ >= std::chrono::microseconds(50);
      if (const int peer = host_.failedPeer(); peer >= 0) throwPeerFailed(peer);
      if (!active_->pointToPoint) {
        // The operation's own transport: a group's, when the communicator
        // was split from another (the engine's transport is the context's).
        transport::Transport& t = *active_->ctx.transport;
        // Published in the host's control areas where this communicator's
        // operations number them.
        if (active_->ctx.announcements) host_.announce(active_->signature);
        // Algorithms that compare every rank's call themselves, or whose
        // messages carry the signature, skip the check.
        const auto* algo = active_->algo;
        active_->ctx.signedMessages = algo && algo->signsMessages(active_->signature, active_->ctx);
        if (!algo || (!algo->checksCalls() && !active_->ctx.signedMessages)) {
          check_.start(t, active_->signature, active_->ctx.announcements ? &host_ : nullptr);
        }
      }
      active_->schedule = active_->makeSchedule();
      lastProgress_ = now;
      lastHealthCheck_ = now;
      lastProbe_ = now;
    }
    bool moved = !check_.done() && check_.advance(active_->describe());
    try {
      // Advanced at least once; once finished, it waits here for the call
      // check alone and is not advanced again (Schedule's contract: an
      // algorithm that finished may not redo its last step, e.g. reduce
      // again into an output that a copy back is already reading).
      if (fresh || !active_->schedule->done()) moved = active_->schedule->advance() || moved;
      if (pollAbortNow) {
        lastAbortPoll_ = Clock::now();
        if (auto remote = aborts_->poll()) {
          throw RemoteError(active_->describe() + " cannot run because " + *remote);
        }
      }
    } catch (const MismatchError&) {
      nameMismatch();  // returns at once for a signed message's mismatch: its call runs no check
      throw;
    }
    if (active_->schedule->done() && check_.done()) {
      auto op = takeActive();
      {
        // Nothing left: the next submission may start itself (eager).
        std::lock_guard<std::mutex> lock(queueMu_);
        if (queue_.empty()) busy_.store(false);
      }
      op->finish(nullptr);
      return true;
    }
    if (moved) {
      lastProgress_ = Clock::now();
    } else {
      checkHealth(Clock::now());
    }
    return moved;
  } catch (...) {
    failActive(std::current_exception());
    return true;
  }
}

void ProgressEngine::throwIfPeerAborted(std::chrono::milliseconds wait, const std::string& what) {
  const auto deadline = Clock::now() + wait;
  std::optional<std::string> notice;
  do {
    throwIfFailed();
    {
      std::lock_guard<std::mutex> lock(driveMu_);  // transport calls are serialised
      notice = aborts_->poll();
    }
    if (notice) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } while (Clock::now() < deadline);
  if (!notice) return;
  abort(ErrorCode::kRemote, what + " cannot finish because " + *notice, false);
  throwIfFailed();
}

std::optional<std::string> ProgressEngine::awaitNotice() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(50);
  do {
    if (auto notice = aborts_->poll()) return notice;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } while (Clock::now() < deadline);
  return std::nullopt;
}

void ProgressEngine::throwPeerFailed(int peer) {
  // Its notice says why; it may still be on its way (bounded wait: this is
  // the failure path).
  if (auto notice = awaitNotice()) throw RemoteError(active_->describe() + " cannot run because " + *notice);
  throw RemoteError(active_->describe() + " cannot run because rank " + std::to_string(peer) +
                    " on this host failed (its reason did not arrive)");
}

void ProgressEngine::nameMismatch() {
  // The schedule found a mismatch its own way (a message of the wrong
  // size): the previous rank's signature, due any moment, may say which
  // field differs. Bounded: this is the failure path.
  const auto deadline = Clock::now() + std::chrono::milliseconds(20);
  while (!check_.done() && Clock::now() < deadline) {
    check_.advance(active_->describe());  // throws the named error when the calls differ
  }
}

std::string ProgressEngine::waitingFor() const {
  std::string what = active_->schedule ? active_->schedule->waitingFor() : std::string("the start");
  const std::string check = check_.waitingFor();
  return check.empty() ? what : what + "; " + check;
}

void ProgressEngine::checkHealth(Clock::time_point now) {
  using std::chrono::milliseconds;
  if (now - lastHealthCheck_ < milliseconds(1)) return;
  lastHealthCheck_ = now;
  if (auto remote = aborts_->poll()) {
    throw RemoteError(active_->describe() + " failed because " + *remote);
  }
  active_->schedule->healthCheck();
  const auto stalled = now - lastProgress_;
  // Point-to-point operations share their sequence number with the next
  // collective, which ranks outside the pair may already be running.
  if (!active_->pointToPoint && stalled >= milliseconds(20) && now - lastProbe_ >= milliseconds(20)) {
    lastProbe_ = now;
    transport::Tag expected;
    expected.seq = active_->seq;
    expected.fingerprint = active_->fingerprint;
    // Every peer, not only those we wait for: two ranks that both believe
    // they are the root only send, and each finds the other's message.
    transport::Transport& t = *active_->ctx.transport;
    for (int peer = 0; peer < t.size(); ++peer) {
      if (peer == t.rank()) continue;
      // What a host-local peer announced names its call; a waiting message
      // of this operation with another fingerprint says only that it differs.
      transport::CallSignature theirs;
      const bool announced = announcedBy(active_->ctx, host_, peer, active_->seq, &theirs);
      if ((announced && theirs.fingerprint() != active_->fingerprint) || (!announced && t.probeMismatch(peer, expected))) {
        throw MismatchError(transport::mismatchMessage(t.rank(), active_->describe(), active_->signature,
                                                       peer, announced ? &theirs : nullptr));
      }
    }
  }
  // A timeout of 0 means none: wait as long as it takes.
  if (settings_.timeout.count() > 0 && stalled >= settings_.timeout) {
    throw TimeoutError("rank " + std::to_string(active_->ctx.transport->rank()) + ": " + active_->describe() +
 " made no progress for " + formatSeconds(stalled) + " (GRADCOMM_TIMEOUT=" +
                       formatDuration(settings_.timeout) + "); waiting for " + waitingFor() +
                       ". A peer may have died or stopped calling collectives, or the ranks issued different "
                       "collectives: check that every rank makes the same calls in the same order");
  }
}

bool ProgressEngine::waitFor(OperationState& op, Clock::time_point deadline) {
  // A waiting caller has nothing else to do: it drives progress itself and
  // yields for a while (a few milliseconds on a free core) before it sleeps,
  // since a sleep costs the kernel's timer slack (50 us by default) on top
  // of the latency. While anyone waits, the background thread stands aside.
  struct Waiting {
    ProgressEngine& e;
    explicit Waiting(ProgressEngine& engine) : e(engine) { ++e.waiters_; }
    ~Waiting() {
      // The last caller to leave wakes the thread if it stood aside asleep
      // and work is left (this operation, or a queued one). Not otherwise:
      // a wake-up per call is what its standing aside saves.
      if (--e.waiters_ == 0 && e.busy_.load() && e.standingAside_.load()) e.wakeThread();
    }
  } waiting(*this);
  // A wait that begins within the grace of its call's submission: callers
  // wait at once (a clock read only while the mark is clear).
  if (!callerWaitsAtOnce_.load(std::memory_order_relaxed) && !op.finished() &&
      Clock::now() - op.queuedAt < std::chrono::nanoseconds(kYieldCallerGraceNs)) {
    callerWaitsAtOnce_.store(true, std::memory_order_relaxed);
  }
  Backoff backoff(spinsBeforeYield(), 10000, settings_.pollMaxSleep);
  while (!op.finished()) {
    if (Clock::now() >= deadline) return false;
    driveOrBackOff(backoff);
  }
  callerDroveAt_.store(op.finishedAt.time_since_epoch().count(), std::memory_order_relaxed);
  return true;
}

void ProgressEngine::driveOrBackOff(Backoff& backoff) {
  // When another thread is in the middle of a step, it lets go shortly.
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  bool moved = false;
  if (lock.owns_lock()) {
    moved = drive();
    lock.unlock();
  }
  if (moved) {
    backoff.reset();
  } else {
    backoff.idle();
  }
}

void ProgressEngine::threadMain() {
  // Short sleeps must be short: the default timer slack would stretch a
  // 1 us back-off sleep to about 50 us. Affects this thread only.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  if (settings_.yieldWhenIdle) {
    threadMainYielding();
    return;
  }
  Backoff backoff(spinsBeforeYield(), 16, settings_.pollMaxSleep);
  auto idleSince = Clock::now();
  while (!stop_.load()) {
    if (!busy_.load()) {
      // Background transfers in flight (gossip) need progress even with an
      // empty queue; nobody else drives them while the caller computes.
      if (backgroundPending()) {
        driveOrBackOff(backoff);
        idleSince = Clock::now();
        continue;
      }
      // Idle: keep polling (with back-off) for a while, so that the next
      // submission needs no wake-up; then block.
      if (Clock::now() - idleSince < settings_.linger) {
        backoff.idle();
        continue;
      }
      std::unique_lock<std::mutex> lock(queueMu_);
      blocked_.store(true);
      // withTransport() wakes the thread when it posts background transfers.
      queueCv_.wait(lock, [&] { return stop_.load() || busy_.load() || wakeUp_ || backgroundPending(); });
      blocked_.store(false);
      wakeUp_ = false;
      threadWakeups_.fetch_add(1, std::memory_order_relaxed);
      backoff.reset();
      continue;
    }
    const auto now = Clock::now();
    if (waiters_.load() > 0 ||
        now.time_since_epoch().count() - callerDroveAt_.load(std::memory_order_relaxed) < kCallerGraceNs) {
      // A caller drives, or drove a moment ago and is about to wait: stand
      // aside (on a busy host a polling thread here would take the core
      // a peer rank needs); look again shortly.
      backoff.idle();
      idleSince = now;
      continue;
    }
    driveOrBackOff(backoff);
    idleSince = Clock::now();
  }
}

void ProgressEngine::threadMainYielding() {
  // Ranks outnumber cores: every look this thread takes with nothing to
  // drive is a context switch that takes the core from a peer rank. So it
  // never polls while idle or while a caller drives: it sleeps on the
  // condition variable, napping (at most kNap) while the communicator is in
  // use and blocking once it has been idle for `linger`. It drives only
  // calls that nobody waits for (or background transfers), and a caller
  // that starts to wait takes over at the thread's next look (no wake-up
  // per call).
  Backoff backoff(0, 16, settings_.pollMaxSleep);
  auto activeAt = Clock::now();
  while (!stop_.load()) {
    const auto now = Clock::now();
    const int64_t sinceCaller = now.time_since_epoch().count() - callerDroveAt_.load(std::memory_order_relaxed);
    const bool callerWaits = waiters_.load() > 0 || callerSubmitting_.load(std::memory_order_acquire);
    const bool busy = busy_.load();
    if (busy && !callerWaits && sinceCaller >= kYieldCallerGraceNs) {
      // A call nobody drives: its caller did not wait at once, so the
      // next ones wake this thread when they are submitted.
      if (callerWaitsAtOnce_.load(std::memory_order_relaxed)) callerWaitsAtOnce_.store(false, std::memory_order_relaxed);
      driveOrBackOff(backoff);
      activeAt = Clock::now();
      continue;
    }
    if (backgroundPending()) {
      driveOrBackOff(backoff);
      activeAt = Clock::now();
      continue;
    }
    backoff.reset();
    std::unique_lock<std::mutex> lock(queueMu_);
    if (busy || now - activeAt < settings_.linger) {
      // A caller that drove a moment ago is about to wait: look again when
      // its grace ends, not a whole nap later.
      const auto nap = busy && !callerWaits ? std::chrono::nanoseconds(kYieldCallerGraceNs - sinceCaller)
                                            : std::chrono::nanoseconds(kNap);
      standingAside_.store(true);
      queueCv_.wait_for(lock, nap, [&] { return stop_.load() || wakeUp_; });
      standingAside_.store(false);
    } else {
      blocked_.store(true);
      queueCv_.wait(lock, [&] { return stop_.load() || busy_.load() || wakeUp_ || backgroundPending(); });
      blocked_.store(false);
      activeAt = Clock::now();
    }
    wakeUp_ = false;
    threadWakeups_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ProgressEngine::shutdown(const std::string& reason) {
  if (!stop_.exchange(true)) {
    // Pass through the lock: a thread between its predicate check and its
    // wait would otherwise miss this wake-up and never be joined.
    { std::lock_guard<std::mutex> lock(queueMu_); }
    queueCv_.notify_all();
    if (thread_.joinable()) {
      // Never join from the progress thread itself (a listener or a
      // completion callback may drop the last reference).
      if (thread_.get_id() == std::this_thread::get_id()) {
        thread_.detach();
      } else {
        thread_.join();
      }
    }
    std::lock_guard<std::mutex> drive(driveMu_);
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(queueMu_);
      pending = active_ != nullptr || !queue_.empty();
      if (!failed_) recordFailureLocked(ErrorCode::kInvalidUsage, reason);
    }
    if (pending) {
      aborts_->broadcast(notice(ErrorCode::kInvalidUsage, reason + " with operations pending"));
      host_.markFailed();
    }
    check_.reset();
    if (auto op = takeActive()) {
      op->finish(std::make_exception_ptr(InvalidUsage(reason + " before the operation completed")));
    }
    failQueued();
  }
}

}  // namespace gradcomm::core
