#include "transport/ucx/ucx_transport.hpp"

#include <signal.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {

// ---- tag layout -------------------------------------------------------------------

namespace {
constexpr int kSeqShift = UcxTagLayout::kMessageBits + UcxTagLayout::kFingerprintBits;
constexpr int kCommShift = kSeqShift + UcxTagLayout::kSeqBits;
constexpr int kRankShift = kCommShift + UcxTagLayout::kCommBits;
constexpr int kFingerprintShift = UcxTagLayout::kMessageBits;
constexpr uint64_t mask(int bits) { return (uint64_t{1} << bits) - 1; }
uint64_t commBits(const Tag& tag) { return (static_cast<uint64_t>(tag.comm) & mask(UcxTagLayout::kCommBits)) << kCommShift; }
static_assert(kRankShift + UcxTagLayout::kRankBits == 63, "the tag layout must fill 63 bits below the control bit");
}  // namespace

uint64_t UcxTagLayout::data(int source, const Tag& tag) {
  if (tag.message == Tag::kCallCheck || tag.message == Tag::kGossip) {
    // The engine's call check and gossip pushes: apart from every data
    // message, matched on source and sequence (gossip: step) alone; the
    // fingerprint takes no part.
    const uint32_t kind = tag.message == Tag::kCallCheck ? kCallCheck : kGossip;
    return control(source, kind) | commBits(tag) | (tag.seq & mask(kSeqBits)) << kSeqShift;
  }
  if (tag.message == Tag::kAbort) return control(source, kAbort) | commBits(tag);
  return (static_cast<uint64_t>(source) & mask(kRankBits)) << kRankShift | commBits(tag) |
         (tag.seq & mask(kSeqBits)) << kSeqShift |
         (static_cast<uint64_t>(tag.fingerprint) & mask(kFingerprintBits)) << kFingerprintShift |
         (static_cast<uint64_t>(tag.message) & mask(kMessageBits));
}

uint64_t UcxTagLayout::control(int source, uint32_t kind) {
  return kControlBit | (static_cast<uint64_t>(source) & mask(kRankBits)) << kRankShift | kind;
}

uint64_t UcxTagLayout::anySourceMask() { return kControlBit | mask(kCommBits) << kCommShift | mask(kMessageBits); }

uint64_t UcxTagLayout::sourceAndSeqMask() {
  return kControlBit | mask(kRankBits) << kRankShift | mask(kCommBits) << kCommShift | mask(kSeqBits) << kSeqShift;
}

uint32_t UcxTagLayout::fingerprintOf(uint64_t tag) {
  return static_cast<uint32_t>((tag >> kFingerprintShift) & mask(kFingerprintBits));
}

// ---- state ------------------------------------------------------------------------

namespace {

std::string statusText(ucs_status_t s) { return ucs_status_string(s); }

std::string pidNamespace() {
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  return n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string();
}

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

/// UCX_TLS and UCX_NET_DEVICES as the user set them, for error messages.
std::string ucxSettings() {
  return "UCX_TLS=" + envOr("UCX_TLS", "(unset: all)") + ", UCX_NET_DEVICES=" + envOr("UCX_NET_DEVICES", "(unset: all)");
}

}  // namespace

struct UcxTransport::State {
  int rank = 0;
  int size = 1;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> eps;
  /// Per peer: UCS_OK, or the error its endpoint reported (a dead peer).
  std::vector<std::atomic<int>> peerStatus;
  struct ErrArg {
    State* state;
    int peer;
  };
  std::vector<std::unique_ptr<ErrArg>> errArgs;
  std::vector<int> localRanks;
  std::vector<std::vector<int>> hosts;
  std::string hostName;
  /// Process id of each peer on this host (same pid namespace), else 0.
  std::vector<pid_t> peerPid;
  std::chrono::steady_clock::time_point lastLivenessCheck{};

  /// Transfers dropped while under way (their buffers may still be used).
  std::vector<void*> abandoned;

  explicit State(int n) : peerStatus(static_cast<size_t>(n)) {
    for (auto& s : peerStatus) s.store(UCS_OK);
  }

  ~State() {
    for (void* r : abandoned) ucp_request_free(r);
    closeEndpoints();
    drainUnexpected();
    if (worker) ucp_worker_destroy(worker);
    if (context) ucp_cleanup(context);
  }

  /// Closes every endpoint, flushing what is still queued for a live peer,
  /// within a bound: a peer that went away must not hold up destruction.
  void closeEndpoints() {
    std::vector<void*> closing;
    for (size_t p = 0; p < eps.size(); ++p) {
      if (!eps[p]) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = peerStatus[p].load() == UCS_OK ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(eps[p], &param);
      if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
      eps[p] = nullptr;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (void* r : closing) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker);
      }
      ucp_request_free(r);
    }
  }

  /// Receives and drops messages nobody will ask for (a failed call's, or a
  /// peer's that raced with our destruction), so UCX does not warn about
  /// each one when the worker goes.
  void drainUnexpected() {
    if (!worker) return;
    std::vector<char> sink;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    for (int i = 0; i < 100000 && std::chrono::steady_clock::now() < end; ++i) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);
      if (!msg) break;
      sink.resize(std::max(sink.size(), info.length));
      ucp_request_param_t p{};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, sink.data(), info.length, msg, &p);
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < end) {
          ucp_worker_progress(worker);
        }
        if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
        ucp_request_free(r);
      }
    }
  }

  static void onPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* a = static_cast<ErrArg*>(arg);
    a->state->peerStatus[static_cast<size_t>(a->peer)].store(status);
  }

  /// Throws when `peer`'s endpoint reported an error, or `peer` (on this
  /// host) no longer exists.
  void checkPeer(int peer, const char* what) {
    const pid_t pid = peerPid[static_cast<size_t>(peer)];
    if (pid != 0 && peerStatus[static_cast<size_t>(peer)].load() == UCS_OK) {
      const auto now = std::chrono::steady_clock::now();
      if (now - lastLivenessCheck >= std::chrono::milliseconds(10)) {
        lastLivenessCheck = now;
        if (::kill(pid, 0) != 0 && errno == ESRCH) {
          throw TransportError("rank " + std::to_string(rank) + ": UCX " + what + " rank " + std::to_string(peer) +
                               " failed: that rank's process (pid " + std::to_string(pid) +
                               ") on this host has exited");
        }
      }
    }
    const int s = peerStatus[static_cast<size_t>(peer)].load();
    if (s == UCS_OK) return;
    throw TransportError("rank " + std::to_string(rank) + ": UCX " + what + " rank " + std::to_string(peer) +
                         " failed: the connection reported '" + statusText(static_cast<ucs_status_t>(s)) +
                         "' (the peer process may have exited)");
  }
};

// ---- requests ---------------------------------------------------------------------

namespace {

class UcxRequest : public Request {
 public:
  UcxRequest(std::shared_ptr<UcxTransport::State> st, bool isRecv, int peer, size_t bytes, bool upTo = false)
      : st_(std::move(st)), isRecv_(isRecv), upTo_(upTo), peer_(peer), expected_(bytes) {}
  ~UcxRequest() override {
    if (!request_) return;
    // A receive is cancelled; one already matched (a rendezvous transfer
    // under way) cannot be, and may still write into its buffer. A send
    // goes on and may still read its buffer. Either is parked when a few
    // progress calls do not end it, and the buffers' owners keep them
    // while any is (Transport::abandonedTransfersPending).
    if (isRecv_) ucp_request_cancel(st_->worker, request_);
    for (int i = 0; i < 10 && ucp_request_check_status(request_) == UCS_INPROGRESS; ++i) {
      ucp_worker_progress(st_->worker);
    }
    if (ucp_request_check_status(request_) == UCS_INPROGRESS) {
      st_->abandoned.push_back(request_);
      return;
    }
    ucp_request_free(request_);
  }

  /// Takes what ucp_*_nbx returned.
  void start(ucs_status_ptr_t r) {
    if (UCS_PTR_IS_ERR(r)) fail(UCS_PTR_STATUS(r));
    request_ = r;
    if (!request_) finish(UCS_OK);
  }

  ucp_request_param_t params() {
    ucp_request_param_t p{};
    if (isRecv_) {
      // UCX 1.13 does not fill the receive info of a receive that completes
      // at once, and the length is needed: always take a request.
      p.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.recv_info.tag_info = &info_;
    }
    return p;
  }

  bool test() override {
    if (done_) return true;
    ucp_worker_progress(st_->worker);
    const ucs_status_t s = isRecv_ ? ucp_tag_recv_request_test(request_, &info_) : ucp_request_check_status(request_);
    if (s == UCS_INPROGRESS) {
      if (peer_ >= 0) st_->checkPeer(peer_, isRecv_ ? "receive from" : "send to");
      return false;
    }
    ucp_request_free(request_);
    request_ = nullptr;
    finish(s);
    return true;
  }
  size_t received() const override { return isRecv_ && done_ ? info_.length : 0; }
  int source() const override {
    return isRecv_ && done_ ? static_cast<int>((info_.sender_tag >> kRankShift) & mask(UcxTagLayout::kRankBits)) : -1;
  }

 private:
  void finish(ucs_status_t s) {
    if (s != UCS_OK) fail(s);
    // A message of another size than the receive's is the ranks' calls
    // differing (their tags carry only part of the calls' fingerprints, and
    // point-to-point operations none): a MismatchError, as over MPI.
    if (isRecv_ && !upTo_ && info_.length != expected_) {
      throw MismatchError("rank " + std::to_string(st_->rank) + " received " + std::to_string(info_.length) +
                          " bytes from rank " + std::to_string(peer_) + " where " + std::to_string(expected_) +
                          " were expected: the count (or data type) differs between the ranks' calls");
    }
    done_ = true;
  }
  [[noreturn]] void fail(ucs_status_t s) const {
    if (s == UCS_ERR_MESSAGE_TRUNCATED) {
      throw MismatchError("rank " + std::to_string(st_->rank) + " received a larger message from rank " +
                          std::to_string(peer_) + " than the " + std::to_string(expected_) +
                          " bytes expected: the count (or data type) differs between the ranks' calls");
    }
    if (peer_ >= 0) st_->checkPeer(peer_, isRecv_ ? "receive from" : "send to");
    throw TransportError("rank " + std::to_string(st_->rank) + ": UCX " + (isRecv_ ? "receive from" : "send to") +
                         " rank " + std::to_string(peer_) + " failed: " + statusText(s));
  }

  std::shared_ptr<UcxTransport::State> st_;
  bool isRecv_;
  bool upTo_;  ///< a call-check receive: the message may be shorter than the buffer
  int peer_;
  size_t expected_;
  void* request_ = nullptr;
  ucp_tag_recv_info_t info_{};
  bool done_ = false;
};

/// A send of `bytes` to `peer` under the UCX tag `tag`.
RequestPtr postSend(const std::shared_ptr<UcxTransport::State>& st, int peer, const void* data, size_t bytes,
                    uint64_t tag) {
  auto req = std::make_unique<UcxRequest>(st, false, peer, bytes);
  ucp_request_param_t p = req->params();
  req->start(ucp_tag_send_nbx(st->eps[static_cast<size_t>(peer)], data, bytes, tag, &p));
  return req;
}

/// A receive into `bytes` of a message whose UCX tag matches `tag` under
/// `mask`, from `peer` (-1: any); `upTo`: it may be shorter.
RequestPtr postRecv(const std::shared_ptr<UcxTransport::State>& st, int peer, void* data, size_t bytes, uint64_t tag,
                    uint64_t mask, bool upTo) {
  auto req = std::make_unique<UcxRequest>(st, true, peer, bytes, upTo);
  ucp_request_param_t p = req->params();
  req->start(ucp_tag_recv_nbx(st->worker, data, bytes, tag, mask, &p));
  return req;
}

/// Initialises a UCX context for tag matching, naming UCX_TLS when it fails.
ucp_context_h createContext(int size) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) {
    throw TransportError("UCX could not read its configuration (" + ucxSettings() + "): " + statusText(s));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG;
  params.estimated_num_eps = static_cast<size_t>(size);
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    throw TransportError("UCX could not start (" + ucxSettings() + "): " + statusText(s) +
                         ". Check that UCX_TLS names transports that exist here (ucx_info -d lists them)");
  }
  return context;
}

}  // namespace

// ---- the transport ------------------------------------------------------------------

namespace {

/// Sends an empty hello to every peer and waits for every peer's: UCX
/// connects endpoints lazily, and a connection still being wired up when
/// the first collective (or an abort notice) needs it costs that call
/// several round trips. A peer that does not answer within `timeout` is
/// an error naming it.
void connectAll(const std::shared_ptr<UcxTransport::State>& state, std::chrono::milliseconds timeout) {
  UcxTransport::State& st = *state;
  std::vector<std::pair<int, RequestPtr>> pending;  // (peer, hello to or from it)
  for (int r = 0; r < st.size; ++r) {
    if (r == st.rank) continue;
    const uint64_t theirs = UcxTagLayout::control(r, UcxTagLayout::kHello);
    pending.emplace_back(r, postRecv(state, r, nullptr, 0, theirs, UcxTagLayout::kFullMask, false));
    pending.emplace_back(r, postSend(state, r, nullptr, 0, UcxTagLayout::control(st.rank, UcxTagLayout::kHello)));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& [peer, request] : pending) {
    while (!request->test()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw TimeoutError("rank " + std::to_string(st.rank) + ": UCX could not connect to rank " +
                           std::to_string(peer) + " within " + std::to_string(timeout.count()) + " ms (" +
                           ucxSettings() + "): check that the transports in UCX_TLS reach that host");
      }
    }
  }
}

}  // namespace

UcxTransport::UcxTransport(Bootstrap& boot, size_t shmChunkBytes, std::chrono::milliseconds connectTimeout)
    : shmChunkBytes_(shmChunkBytes) {
  const int rank = boot.rank(), size = boot.size();
  if (size > UcxTagLayout::kMaxRanks) {
    throw UnsupportedError("the UCX transport supports at most " + std::to_string(UcxTagLayout::kMaxRanks) +
                           " ranks; this communicator has " + std::to_string(size));
  }
  auto st = std::make_shared<State>(size);
  st->rank = rank;
  st->size = size;

  // Any local failure is published before the exchange below, so no rank
  // is left waiting for an address that never comes.
  std::string address;
  std::string why;
  try {
    st->context = createContext(size);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the progress engine serialises every call
    ucs_status_t s = ucp_worker_create(st->context, &wp, &st->worker);
    if (s != UCS_OK) throw TransportError("UCX could not create a worker (" + ucxSettings() + "): " + statusText(s));
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    s = ucp_worker_get_address(st->worker, &addr, &len);
    if (s != UCS_OK) throw TransportError("UCX could not give this worker's address: " + statusText(s));
    address.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(st->worker, addr);
  } catch (const Error& e) {
    why = e.what();
  }
  const auto addresses = boot.allgather(why.empty() ? "A" + address : "E" + why);
  if (!why.empty()) throw TransportError("rank " + std::to_string(rank) + ": " + why);
  for (int r = 0; r < size; ++r) {
    const std::string& a = addresses[static_cast<size_t>(r)];
    if (a.empty() || a[0] != 'A') {
      throw TransportError("rank " + std::to_string(r) + " could not start UCX: " +
                           (a.empty() ? std::string("no reason given") : a.substr(1)));
    }
  }

  // Host keys and process ids: which peers share this host.
  const std::string pidNs = pidNamespace();
  const auto ids = boot.allgather(hostKey() + "\n" + std::to_string(getpid()) + "\n" + pidNs);
  std::vector<std::string> keys;
  st->peerPid.assign(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    std::istringstream in(ids[static_cast<size_t>(r)]);
    std::string key, pid, ns;
    std::getline(in, key);
    std::getline(in, pid);
    std::getline(in, ns);
    keys.push_back(key);
    if (r != rank && !ns.empty() && ns == pidNs) st->peerPid[static_cast<size_t>(r)] = std::atoi(pid.c_str());
  }
  st->localRanks = ranksWithKey(keys, rank);
  {
    std::vector<long long> hostOf(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) hostOf[static_cast<size_t>(r)] = ranksWithKey(keys, r).front();
    st->hosts = groupHosts(hostOf);
  }
  const std::string& mine = keys[static_cast<size_t>(rank)];
  st->hostName = mine.substr(0, mine.find('|')) + "/node-of-rank" + std::to_string(st->localRanks.front());
  for (int r = 0; r < size; ++r) {
    if (keys[static_cast<size_t>(r)] != mine) st->peerPid[static_cast<size_t>(r)] = 0;
  }

  st->eps.assign(static_cast<size_t>(size), nullptr);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const std::string& a = addresses[static_cast<size_t>(r)];
    st->errArgs.push_back(std::make_unique<State::ErrArg>(State::ErrArg{st.get(), r}));
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(a.data() + 1);
    // UCX 1.13 keeps its shared-memory transports (posix, sysv, cma) off
    // endpoints that ask for peer failure handling, which would send
    // same-host traffic through TCP loopback. Same-host peers are watched
    // through their process ids instead (State::checkPeer).
    const bool local = st->peerPid[static_cast<size_t>(r)] != 0;
    ep.err_mode = local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &State::onPeerError;
    ep.err_handler.arg = st->errArgs.back().get();
    ucs_status_t s = ucp_ep_create(st->worker, &ep, &st->eps[static_cast<size_t>(r)]);
    if (s != UCS_OK) {
      throw TransportError("rank " + std::to_string(rank) + ": UCX cannot reach rank " + std::to_string(r) +
                           " (" + ucxSettings() + "): " + statusText(s) +
                           ". The transports in UCX_TLS must connect these hosts (tcp does everywhere)");
    }
  }
  connectAll(st, connectTimeout);

  state_ = std::move(st);
  if (shmChunkBytes > 0) shm_ = setUpSharedMemory(boot, state_->localRanks, shmChunkBytes);
}

UcxTransport::~UcxTransport() {
  shm_.reset();
  state_.reset();  // requests still alive keep the worker until they go
}

int UcxTransport::rank() const { return state_->rank; }
int UcxTransport::size() const { return state_->size; }
ShmGroup* UcxTransport::sharedMemory() { return shm_.get(); }
HostLayout UcxTransport::hostLayout() const { return {size(), state_->hosts, state_->hostName}; }

bool UcxTransport::abandonedTransfersPending() {
  State& st = *state_;
  if (st.abandoned.empty()) return false;
  ucp_worker_progress(st.worker);
  auto done = [](void* r) {
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    return true;
  };
  st.abandoned.erase(std::remove_if(st.abandoned.begin(), st.abandoned.end(), done), st.abandoned.end());
  return !st.abandoned.empty();
}

RequestPtr UcxTransport::isend(int peer, const void* data, size_t bytes, const Tag& tag) {
  state_->checkPeer(peer, "send to");
  return postSend(state_, peer, data, bytes, UcxTagLayout::data(state_->rank, tag));
}

RequestPtr UcxTransport::irecv(int peer, void* data, size_t bytes, const Tag& tag) {
  return postRecv(state_, peer, data, bytes, UcxTagLayout::data(peer, tag), UcxTagLayout::kFullMask,
                  tag.message == Tag::kCallCheck);
}

RequestPtr UcxTransport::irecvAny(void* data, size_t capacity, const Tag& tag) {
  return postRecv(state_, -1, data, capacity, UcxTagLayout::data(0, tag), UcxTagLayout::anySourceMask(), true);
}

bool UcxTransport::probeMismatch(int peer, const Tag& expected) {
  ucp_worker_progress(state_->worker);
  Tag probe;
  probe.seq = expected.seq;
  probe.comm = expected.comm;
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg =
      ucp_tag_probe_nb(state_->worker, UcxTagLayout::data(peer, probe), UcxTagLayout::sourceAndSeqMask(), 0, &info);
  if (!msg) return false;
  return UcxTagLayout::fingerprintOf(info.sender_tag) != UcxTagLayout::fingerprintOf(UcxTagLayout::data(0, expected));
}

// ---- information ----------------------------------------------------------------------

std::string ucxVersion() { return ucp_get_version_string(); }

std::string ucxTransportsFound() {
  ucp_context_h context = nullptr;
  try {
    context = createContext(1);
  } catch (const Error& e) {
    return std::string("unavailable: ") + e.what();
  }
  // UCX reports its resources only as text: keep the "transport/device" names.
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  std::set<std::string> found;
  if (f) {
    ucp_context_print_info(context, f);
    std::fclose(f);
    std::istringstream in(std::string(text, len));
    std::free(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("resource") == std::string::npos) continue;
      auto pos = line.find_last_of(' ');
      if (pos != std::string::npos && line.find('/', pos) != std::string::npos) found.insert(line.substr(pos + 1));
    }
  }
  ucp_cleanup(context);
  std::string out;
  for (const auto& t : found) out += (out.empty() ? "" : " ") + t;
  return out.empty() ? "none" : out;
}

}  // namespace gradcomm::transport
