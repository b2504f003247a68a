#include "core/point_to_point.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "core/communicator_impl.hpp"
#include "core/device_staging.hpp"
#include "device/runtime.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::detail {
namespace {

/// What a send tells its receiver before the data: the receiver compares it
/// with its own buffer before it takes the data, so a mismatch is named
/// (and fails both ranks) instead of truncating or misreading bytes.
struct Header {
  uint64_t count = 0;
  int64_t type = -1;
};

/// The three messages of one transfer. A send's completion waits for the
/// receiver's acknowledgement, so it fails with the receiver when the
/// receiver rejects the header.
enum Kind : uint32_t { kHeader = 0, kData = 1, kAck = 2 };

/// 14 bits (the narrowest message field of any transport's tag): the kind,
/// the tag and the low 9 bits of the per-(peer, tag) sequence number.
/// Transfers with equal message numbers in flight at once still match in
/// order: every transport matches equal tags first in, first out.
uint32_t messageOf(Kind kind, const P2pTransfer& t) {
  return (static_cast<uint32_t>(kind) << 12) | (static_cast<uint32_t>(t.tag) << 9) | (t.sequence & 0x1ffu);
}

std::string typeName(int64_t type) {
  if (type < 0 || type >= kNumDataTypes) return "type #" + std::to_string(type);
  return toString(static_cast<DataType>(type));
}

}  // namespace

/// The device buffers of one send/recv call, moved through pinned blocks
/// of the context's staging (point-to-point transfers run on host memory):
/// a send's data is copied out on the to-host stream before the call
/// returns, after the work queued so far on the device's legacy default
/// stream and on the to-device stream (the results of the context's
/// earlier staged calls); a receive's copied in on the to-device stream when the
/// transfers finished (the operation's first completion callback, ahead of
/// the caller's). The blocks go back to the staging with the operation, so
/// they outlive its transfers; a failed copy in is the Work's error.
class P2pDeviceCopies final : public DeviceCompletion {
 public:
  explicit P2pDeviceCopies(std::shared_ptr<DeviceStaging> staging) : staging_(std::move(staging)) {}
  ~P2pDeviceCopies() override {
    for (const auto& [block, capacity] : blocks_) staging_->release(block, capacity);
  }
  /// Takes over `t`'s device buffer: `t` moves a pinned block instead, and
  /// a send's copy out is queued (copyOut() waits for them all).
  void stage(P2pTransfer& t) {
    size_t capacity = 0;
    void* host = staging_->acquire(t.bytes, &capacity);
    blocks_.emplace_back(host, capacity);
    if (t.send) {
      if (!sendsOrdered_) orderSends();
      staging_->runtime().copy(host, t.data, t.bytes, staging_->toHost());
    } else {
      copiesIn_.push_back({t.data, host, t.bytes});
    }
    t.data = host;
  }
  bool receives() const { return !copiesIn_.empty(); }
  /// Waits for the sends' data to be in their blocks.
  void copyOut() { waitFor(staging_->toHost()); }
  /// Copies the received data in (once); a device error is kept for the
  /// Work's waiters.
  void copyIn() {
    std::lock_guard<std::mutex> lock(mu_);
    if (copiedIn_) return;
    copiedIn_ = true;
    try {
      for (const CopyIn& c : copiesIn_) staging_->runtime().copy(c.device, c.host, c.bytes, staging_->toDevice());
      if (!copiesIn_.empty()) waitFor(staging_->toDevice());
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  bool done() override {
    wait();
    return true;
  }
  void wait() override {
    copyIn();
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }
  void streamWait(device::Stream) override { wait(); }  // the data is there when it returns

 private:
  struct CopyIn {
    void* device;
    const void* host;
    size_t bytes;
  };
  void orderSends() {
    sendsOrdered_ = true;
    device::Runtime& rt = staging_->runtime();
    device::CurrentDevice current(rt, staging_->device());  // null: this device's legacy stream
    for (device::Stream before : {device::Stream{}, staging_->toDevice()}) {
      afterQueued(before, [&](device::Event e) { rt.streamWait(staging_->toHost(), e); });
    }
  }
  /// Blocks until what is queued on `stream` so far ran.
  void waitFor(device::Stream stream) {
    afterQueued(stream, [&](device::Event e) { staging_->runtime().synchronize(e); });
  }
  /// Runs `use` with an event of the staging recorded on `stream` (after
  /// what is queued there so far); the event goes back to the pool after.
  template <typename F>
  void afterQueued(device::Stream stream, F&& use) {
    const device::Event event = staging_->takeEvent();
    try {
      staging_->runtime().record(event, stream);
      use(event);
    } catch (...) {
      staging_->giveEvent(event);
      throw;
    }
    staging_->giveEvent(event);
  }
  std::shared_ptr<DeviceStaging> staging_;
  std::vector<std::pair<void*, size_t>> blocks_;  // pinned, with their capacities
  std::vector<CopyIn> copiesIn_;
  std::mutex mu_;
  bool sendsOrdered_ = false;
  bool copiedIn_ = false;     // guarded by mu_
  std::exception_ptr error_;  // guarded by mu_
};

void P2pCompletion::finish(std::exception_ptr e) {
  if (finished.exchange(true)) return;
  state->finish(std::move(e));
}

void P2pCompletion::transferDone() {
  if (remaining.fetch_sub(1) == 1) finish(nullptr);
}

class P2pChannelSchedule : public algorithms::Schedule {
 public:
  P2pChannelSchedule(std::shared_ptr<P2pChannel> channel, const algorithms::RunContext& ctx)
      : channel_(std::move(channel)), ctx_(ctx) {}

  bool advance() override {
    bool moved = takeNew();
    for (auto& s : states_) {
      if (s.done) continue;
      moved = step(s) || moved;
    }
    return moved;
  }

  bool done() const override {
    if (remaining_ > 0) return false;
    // Closing under the lock: a transfer added after this check goes to a
    // new channel instead of one nobody runs any more.
    std::lock_guard<std::mutex> lock(channel_->mu_);
    if (channel_->transfers_.size() != taken_) return false;
    channel_->closed_ = true;
    return true;
  }

  std::string waitingFor() const override {
    for (const auto& s : states_) {
      if (s.done) continue;
      const P2pTransfer& t = s.transfer;
      std::string what = t.send ? "send to rank " : "recv from rank ";
      what += std::to_string(t.peer) + " (" + std::to_string(t.count) + " elements of " + toString(t.type) +
              ", tag " + std::to_string(t.tag) + ", ";
      if (t.send) {
        what += "waiting for the receiver to take it: is rank " + std::to_string(t.peer) +
                " calling recv from this rank before its next collective?)";
      } else {
        what += "waiting for rank " + std::to_string(t.peer) + " to send it)";
      }
      return what;
    }
    return "nothing";
  }

  std::vector<int> awaitedPeers() const override {
    std::vector<int> peers;
    for (const auto& s : states_) {
      if (!s.done) peers.push_back(s.transfer.peer);
    }
    return peers;
  }

 private:
  struct State {
    P2pTransfer transfer;
    Header header;  ///< this rank's (send) or the sender's (recv)
    uint8_t ack = 0;
    std::vector<transport::RequestPtr> requests;  ///< of the current stage
    int stage = 0;                                ///< recv: 0 header, 1 data, 2 ack
    bool done = false;
  };

  transport::Tag tagFor(Kind kind, const P2pTransfer& t) const {
    transport::Tag tag = ctx_.tag;
    tag.message = messageOf(kind, t);
    return tag;
  }

  /// Starts the transfers added since the last call.
  bool takeNew() {
    std::vector<P2pTransfer> fresh;
    {
      std::lock_guard<std::mutex> lock(channel_->mu_);
      for (size_t i = taken_; i < channel_->transfers_.size(); ++i) fresh.push_back(channel_->transfers_[i]);
      taken_ = channel_->transfers_.size();
    }
    const int self = ctx_.transport->rank();
    for (auto& t : fresh) {
      if (t.peer == self) {
        takeSelf(std::move(t));
        continue;
      }
      states_.emplace_back();
      State& s = states_.back();
      s.transfer = std::move(t);
      ++remaining_;
      start(s);
    }
    return !fresh.empty();
  }

  /// A transfer to or from this rank itself: the k-th send (per tag) is
  /// copied into the k-th recv (Communicator::pointToPoint checked that
  /// they pair up in their batch, with equal sizes).
  void takeSelf(P2pTransfer t) {
    auto& mine = t.send ? selfSends_[t.tag] : selfRecvs_[t.tag];
    auto& other = t.send ? selfRecvs_[t.tag] : selfSends_[t.tag];
    if (other.empty()) {
      mine.push_back(std::move(t));
      ++remaining_;
      return;
    }
    P2pTransfer o = std::move(other.front());
    other.pop_front();
    --remaining_;
    const P2pTransfer& send = t.send ? t : o;
    const P2pTransfer& recv = t.send ? o : t;
    if (send.bytes && send.data != recv.data) std::memmove(recv.data, send.data, send.bytes);
    send.completion->transferDone();
    recv.completion->transferDone();
  }

  void start(State& s) {
    transport::Transport& tr = *ctx_.transport;
    const P2pTransfer& t = s.transfer;
    if (t.send) {
      // Header, data and the wait for the acknowledgement go out at once.
      s.header.count = t.count;
      s.header.type = static_cast<int64_t>(t.type);
      s.requests.push_back(tr.isend(t.peer, &s.header, sizeof(Header), tagFor(kHeader, t)));
      s.requests.push_back(tr.isend(t.peer, t.data, t.bytes, tagFor(kData, t)));
      s.requests.push_back(tr.irecv(t.peer, &s.ack, 1, tagFor(kAck, t)));
    } else {
      s.requests.push_back(tr.irecv(t.peer, &s.header, sizeof(Header), tagFor(kHeader, t)));
    }
  }

  /// True when a request of `s` completed.
  bool step(State& s) {
    bool moved = false;
    for (size_t i = 0; i < s.requests.size();) {
      if (s.requests[i]->test()) {
        s.requests[i] = std::move(s.requests.back());
        s.requests.pop_back();
        moved = true;
      } else {
        ++i;
      }
    }
    if (!s.requests.empty()) return moved;
    const P2pTransfer& t = s.transfer;
    if (t.send || s.stage == 2) {
      s.done = true;
      --remaining_;
      t.completion->transferDone();
      return true;
    }
    transport::Transport& tr = *ctx_.transport;
    if (s.stage == 0) {
      if (s.header.count != t.count || s.header.type != static_cast<int64_t>(t.type)) {
        throw InvalidArgument("rank " + std::to_string(tr.rank()) + ": recv from rank " + std::to_string(t.peer) +
                              " (tag " + std::to_string(t.tag) + "): rank " + std::to_string(t.peer) + " sent " +
                              std::to_string(s.header.count) + " elements of " + typeName(s.header.type) +
                              " but this rank's recv takes " + std::to_string(t.count) + " elements of " +
                              toString(t.type) + ": a send and its recv need the same dtype and number of elements");
      }
      s.requests.push_back(tr.irecv(t.peer, t.data, t.bytes, tagFor(kData, t)));
      s.stage = 1;
    } else {
      s.ack = 1;
      s.requests.push_back(tr.isend(t.peer, &s.ack, 1, tagFor(kAck, t)));
      s.stage = 2;
    }
    return true;
  }

  std::shared_ptr<P2pChannel> channel_;
  algorithms::RunContext ctx_;
  std::deque<State> states_;  // a deque: posted buffers (header, ack) must not move
  std::map<int, std::deque<P2pTransfer>> selfSends_, selfRecvs_;  ///< unpaired, per tag
  size_t taken_ = 0;  ///< transfers of the channel taken so far
  size_t remaining_ = 0;
};

bool P2pChannel::add(const std::vector<P2pTransfer>& transfers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  transfers_.insert(transfers_.end(), transfers.begin(), transfers.end());
  return true;
}

void P2pChannel::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void P2pChannel::fail(std::exception_ptr e) {
  std::vector<P2pTransfer> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    all = transfers_;
  }
  for (auto& t : all) t.completion->finish(e);
}

algorithms::SchedulePtr P2pChannel::makeSchedule(const algorithms::RunContext& ctx) {
  return algorithms::makeSchedule<P2pChannelSchedule>(ctx.workspace, shared_from_this(), ctx);
}

// ---- CommunicatorImpl's part ----------------------------------------------------------

void CommunicatorImpl::closePointToPoint() {
  if (!context_->channelsOpen.load(std::memory_order_acquire)) return;
  std::vector<std::weak_ptr<P2pChannel>> open;
  {
    std::lock_guard<std::mutex> lock(context_->channelsMu);
    open.swap(context_->openChannels);
    context_->channelsOpen.store(false, std::memory_order_release);
  }
  // A closed channel refuses transfers: its communicator starts a new one.
  for (auto& w : open) {
    if (auto channel = w.lock()) channel->close();
  }
}

Work CommunicatorImpl::submitTransfers(std::vector<P2pTransfer> transfers, size_t bytes) {
  checkUsable("send/recv");
  auto completion = std::make_shared<P2pCompletion>();
  auto op = OperationState::create();
  op->algorithm = "p2p";
  op->customWhat = "send/recv";
  op->fingerprint = kPointToPointFingerprint;
  op->bytes = bytes;
  op->pointToPoint = true;
  op->engine = engine_;
  op->queuedAt = Clock::now();
  op->startedAt = op->queuedAt;
  op->status.store(OperationState::kRunning);
  completion->state = op;
  completion->remaining.store(transfers.size());
  device::Runtime& rt = device::runtime();
  if (rt.devicesPresent()) {
    std::shared_ptr<P2pDeviceCopies> copies;
    try {
      for (auto& t : transfers) {
        const device::Memory m = t.bytes ? rt.classify(t.data) : device::Memory{};
        if (!m.device) continue;
        if (!copies) copies = std::make_shared<P2pDeviceCopies>(deviceStaging(m.ordinal));
        copies->stage(t);
      }
      if (copies) copies->copyOut();
    } catch (const Error& e) {
      // Another device than the context's, or a failed copy: peers would wait.
      abortAndThrow(e, "could not move its send/recv buffers through host memory");
    }
    op->deviceDone = copies;
    if (copies) {
      if (copies->receives()) {
        std::lock_guard<std::mutex> lock(context_->deviceMu);
        auto& list = context_->deviceReceives;
        list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }), list.end());
        list.push_back(op);
      }
      op->addCallback([copies](std::exception_ptr e) {
        if (!e) copies->copyIn();
      });
    }
  }
  if (transfers.empty()) {
    completion->finish(nullptr);
    return Work(op);
  }
  std::lock_guard<std::mutex> lock(p2pMu_);
  const size_t slots = static_cast<size_t>(size_) * (Communicator::kMaxTag + 1);
  if (sendSeq_.empty()) {
    sendSeq_.assign(slots, 0);
    recvSeq_.assign(slots, 0);
  }
  for (auto& t : transfers) {
    t.completion = completion;
    auto& counters = t.send ? sendSeq_ : recvSeq_;
    t.sequence = counters[static_cast<size_t>(t.peer) * (Communicator::kMaxTag + 1) + static_cast<size_t>(t.tag)]++;
  }
  if (p2pChannel_ && p2pChannel_->add(transfers)) return Work(op);
  auto channel = std::make_shared<P2pChannel>();
  channel->add(transfers);
  // The channel's operation. Only the ranks that exchange messages queue
  // it, so it consumes no sequence number: its messages carry the number of
  // the next collective and kPointToPointFingerprint, and the schedule
  // numbers them per peer.
  auto run = OperationState::create();
  run->algorithm = "p2p";
  run->fingerprint = kPointToPointFingerprint;
  run->bytes = bytes;
  run->pointToPoint = true;
  {
    std::lock_guard<std::mutex> seqLock(submitMu_);
    run->seq = nextSeq_;
  }
  transport::Tag tag;
  tag.seq = run->seq;
  tag.fingerprint = kPointToPointFingerprint;
  algorithms::CollectiveCall none;
  none.collective = Collective::kBarrier;
  run->ctx = runContext(none, tag);
  run->custom = [channel](const algorithms::RunContext& ctx) { return channel->makeSchedule(ctx); };
  run->customWhat = "send/recv";
  // A failed channel fails the Works of its transfers (the engine fails the
  // channel's operation on a timeout, a peer's abort or a mismatch).
  run->addCallback([channel](std::exception_ptr e) {
    if (e) channel->fail(e);
  });
  enqueue(run);
  p2pChannel_ = channel;
  {
    std::lock_guard<std::mutex> contextLock(context_->channelsMu);
    context_->openChannels.push_back(channel);
    context_->channelsOpen.store(true, std::memory_order_release);
  }
  return Work(op);
}

}  // namespace gradcomm::detail

// ---- the public calls -------------------------------------------------------------------

namespace gradcomm {

using detail::P2pTransfer;

namespace {

std::string describe(const Communicator::Transfer& t) {
  return std::string(t.kind == Communicator::Transfer::Kind::kSend ? "send to" : "recv from") + " rank " +
         std::to_string(t.peer);
}

/// Why `t` cannot run on a communicator of `size` ranks at `rank`; empty
/// when it can.
std::string checkTransfer(const Communicator::Transfer& t, int rank, int size, bool selfAllowed) {
  const std::string what = describe(t) + ": ";
  if (t.kind != Communicator::Transfer::Kind::kSend && t.kind != Communicator::Transfer::Kind::kRecv) {
    return "transfer kind #" + std::to_string(static_cast<int>(t.kind)) + " is neither send nor recv";
  }
  if (t.peer < 0 || t.peer >= size) {
    return what + "peer " + std::to_string(t.peer) + " is not a rank of this communicator (ranks 0 to " +
           std::to_string(size - 1) + ")";
  }
  if (t.peer == rank && !selfAllowed) {
    return what + "peer " + std::to_string(t.peer) +
           " is this rank itself; copy the data instead (or pair a send and a recv to this rank in one "
           "pointToPoint batch)";
  }
  if (static_cast<int>(t.type) >= kNumDataTypes) {
    return what + "data type #" + std::to_string(static_cast<int>(t.type)) + " is not a DataType";
  }
  const size_t elem = dataTypeSize(t.type);
  const size_t maxCount = static_cast<size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / elem;
  if (t.count > maxCount) {
    return what + "count " + std::to_string(t.count) + " is too large (at most " + std::to_string(maxCount) +
           " elements of " + toString(t.type) + "; a negative count converted to size_t?)";
  }
  if (t.buffer == nullptr && t.count > 0) {
    return what + "the buffer is null but count is " + std::to_string(t.count);
  }
  if (t.tag < 0 || t.tag > Communicator::kMaxTag) {
    return what + "tag " + std::to_string(t.tag) + " is not in [0, " + std::to_string(Communicator::kMaxTag) + "]";
  }
  if (t.count > 0 && device::runtime().devicesPresent() && !device::runtime().canMoveDeviceMemory() &&
      device::runtime().classify(t.buffer).device) {
    return what + "the buffer is device memory, but this gradcomm was built without CUDA (GRADCOMM_WITH_CUDA=OFF, "
                  "or no CUDA compiler when it was built); pass host memory, or use a build with CUDA";
  }
  return {};
}

}  // namespace

Work Communicator::send(const void* in, size_t count, DataType type, int peer, int tag) {
  auto& impl = checked();
  const Transfer t = Transfer::send(in, count, type, peer, tag);
  const std::string why = checkTransfer(t, impl.rank(), impl.size(), false);
  if (!why.empty()) impl.abortAndThrow(InvalidArgument("send: " + why), "rejected its send call");
  return pointToPoint({t});
}

Work Communicator::recv(void* out, size_t count, DataType type, int peer, int tag) {
  auto& impl = checked();
  const Transfer t = Transfer::recv(out, count, type, peer, tag);
  const std::string why = checkTransfer(t, impl.rank(), impl.size(), false);
  if (!why.empty()) impl.abortAndThrow(InvalidArgument("recv: " + why), "rejected its recv call");
  return pointToPoint({t});
}

Work Communicator::pointToPoint(const std::vector<Transfer>& transfers) {
  auto& impl = checked();
  const int rank = impl.rank();
  std::vector<P2pTransfer> out;
  out.reserve(transfers.size());
  size_t bytes = 0;
  // Sends to self minus receives from self, per tag, and their sizes in order.
  std::map<int, std::deque<std::pair<size_t, DataType>>> selfSends, selfRecvs;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const std::string why = checkTransfer(t, rank, impl.size(), true);
    if (!why.empty()) {
      impl.abortAndThrow(InvalidArgument("pointToPoint: transfer " + std::to_string(i) + ", " + why),
                         "rejected its pointToPoint call");
    }
    P2pTransfer p;
    p.send = t.kind == Transfer::Kind::kSend;
    p.peer = t.peer;
    p.data = t.buffer;
    p.count = t.count;
    p.type = t.type;
    p.bytes = t.count * dataTypeSize(t.type);
    p.tag = t.tag;
    bytes += p.bytes;
    if (t.peer == rank) (p.send ? selfSends : selfRecvs)[t.tag].emplace_back(t.count, t.type);
    out.push_back(p);
  }
  for (auto& [tag, sends] : selfSends) {
    if (sends != selfRecvs[tag]) {
      impl.abortAndThrow(InvalidArgument("pointToPoint: the sends to this rank itself (tag " + std::to_string(tag) +
                                         ") need receives from itself of the same type and count, one for one, "
                                         "in the same batch"),
                         "rejected its pointToPoint call");
    }
  }
  for (auto& [tag, recvs] : selfRecvs) {
    if (!selfSends.count(tag)) {
      impl.abortAndThrow(InvalidArgument("pointToPoint: a recv from this rank itself (tag " + std::to_string(tag) +
                                         ") needs a send to itself of the same type and count in the same batch"),
                         "rejected its pointToPoint call");
    }
  }
  return impl.submitTransfers(std::move(out), bytes);
}

}  // namespace gradcomm
