// TcpStore: a rendezvous key-value store served over TCP.
//
// Wire protocol, version 2 (every integer little-endian; a "string" is a u32
// length and that many bytes):
//   client hello  magic u32 "GCST", version u16, reserved u16, channel u64
//   server hello  magic u32, version u16, reserved u16 (then the server closes
//                 if the versions differ, so the client can name both)
//   request       op u8, payload length u32, payload
//   reply         status u8 (0 ok, 1 error), payload length u32, payload
//   SET   key, value                      -> empty
//   GET   timeout u64 (ms), key           -> value, once the key is set
//   ADD   key, delta i64, sequence u64    -> the new value i64
//   CHECK count u32, count keys           -> u8, 1 when every key is set
//   WAIT  timeout u64 (ms), count u32, keys -> empty, once every key is set
//   MGET  timeout u64 (ms), count u32, keys -> count u32, count values (as
//         strings, in the keys' order), once every key is set
//   error reply payload: ErrorCode u32, then the message
// Version 2 added MGET; the versions differ only by it.
// The server answers a GET, WAIT or MGET whose timeout passes with a kTimeout
// error, which keeps the connection in step; the client gives up on its own
// only when even that answer is late (the server is stuck or gone).
// A client sends one request and reads its reply before the next. The
// server drops (closes) a connection that breaks any rule: bad magic, an
// unknown op, a length above the op's limit, a payload that does not parse
// to exactly its length. Counters are stored as decimal text, so get() of a
// key that add() made returns e.g. "42".

#include "gradcomm/store.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/log.hpp"
#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = Store::Bytes;

constexpr uint32_t kMagic = 0x54534347;  // "GCST" in little-endian byte order
constexpr uint16_t kVersion = 2;
constexpr size_t kClientHelloBytes = 16;
constexpr size_t kServerHelloBytes = 8;
constexpr size_t kHeaderBytes = 5;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeysPerRequest = 4096;
constexpr size_t kMaxErrorTextBytes = 4096;
constexpr size_t kMaxReplyPayload = kMaxValueBytes;  // GET's value is the largest reply

// A reconnection follows a broken connection to a store that was there:
// one attempt, because a store that now refuses has gone, and with it the
// keys; waiting for a new one would only meet an empty store.
constexpr std::chrono::milliseconds kReconnectTimeout{5000};
// Connection retries back off from the first to the last interval.
constexpr std::chrono::milliseconds kRetryFirst{10};
constexpr std::chrono::milliseconds kRetryMax{50};
// How long a client waits for a reply beyond the call's own timeout (the
// server times GET and WAIT out itself) before it takes the server for stuck.
constexpr std::chrono::milliseconds kMaxReplyGrace{5000};
// The longest timeout a client asks for (longer ones are cut to it, which
// also keeps deadlines far from overflowing); a server does not time waits
// beyond it that other clients ask for.
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 30)};
constexpr uint64_t kMaxServerTimeoutMs = kMaxTimeout.count();
// Idle connections a client keeps for its next calls; more are closed.
constexpr size_t kMaxIdleChannels = 8;

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kMultiGet = 6 };
enum class Status : uint8_t { kOk = 0, kError = 1 };

const char* opName(Op op) {
  switch (op) {
    case Op::kSet: return "SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kMultiGet: return "MGET";
  }
  return "?";
}

// The largest payload a request of `op` can have; 0 for an unknown op.
size_t maxPayload(uint8_t op) {
  constexpr size_t kString = 4 + kMaxKeyBytes;
  switch (static_cast<Op>(op)) {
    case Op::kSet: return kString + 4 + kMaxValueBytes;
    case Op::kGet: return 8 + kString;
    case Op::kAdd: return kString + 8 + 8;
    case Op::kCheck: return 4 + kMaxKeysPerRequest * kString;
    case Op::kWait:
    case Op::kMultiGet: return 8 + 4 + kMaxKeysPerRequest * kString;
  }
  return 0;
}

/// A malformed request; the server drops the connection that sent it.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Client-side I/O outcomes that decide between retrying and giving up.
struct ConnectionLost {
  std::string why;
};
struct DeadlineReached {};

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

using core::errnoText;

std::string endpointText(const std::string& host, uint16_t port) {
  std::string h = host.empty() ? "*" : host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

// A key as it appears in messages: quoted, escaped, and cut when long.
std::string quoteKey(const std::string& key) {
  constexpr size_t kShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > kShown) out += "...";
  return out + "'";
}

std::string quoteKeys(const std::vector<std::string>& keys) {
  constexpr size_t kListed = 8;
  std::string out = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size() && i < kListed; ++i) out += (i ? ", " : "") + quoteKey(keys[i]);
  if (keys.size() > kListed) out += " and " + std::to_string(keys.size() - kListed) + " more";
  return out;
}

// ---- encoding ---------------------------------------------------------------------

/// Appends v, least significant byte first (every integer on the wire).
template <typename T>
void putLe(Bytes& b, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putU16(Bytes& b, uint16_t v) { putLe(b, v); }
void putU32(Bytes& b, uint32_t v) { putLe(b, v); }
void putU64(Bytes& b, uint64_t v) { putLe(b, v); }
void putString(Bytes& b, const void* data, size_t n) {
  putU32(b, static_cast<uint32_t>(n));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  b.insert(b.end(), p, p + n);
}
uint32_t loadU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t loadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint64_t loadU64(const uint8_t* p) { return uint64_t{loadU32(p)} | uint64_t{loadU32(p + 4)} << 32; }

// Starts a request whose length endFrame() fills in.
Bytes startFrame(uint8_t kind, size_t payloadHint = 0) {
  Bytes b(kHeaderBytes, 0);
  b[0] = kind;
  b.reserve(kHeaderBytes + payloadHint);
  return b;
}
void endFrame(Bytes& b) {
  const auto n = static_cast<uint32_t>(b.size() - kHeaderBytes);
  for (int i = 0; i < 4; ++i) b[1 + i] = static_cast<uint8_t>(n >> (8 * i));
}

/// Reads a payload that must parse to exactly its length.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t u32() { return loadU32(take(4)); }
  uint64_t u64() { return loadU64(take(8)); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string string(size_t maxBytes, const char* what) { return blob<std::string>(maxBytes, what); }
  Bytes bytes(size_t maxBytes, const char* what) { return blob<Bytes>(maxBytes, what); }
  std::vector<std::string> keys() {
    uint32_t count = u32();
    if (count > kMaxKeysPerRequest) throw ProtocolError(std::to_string(count) + " keys in one request");
    std::vector<std::string> out;
    out.reserve(count);
    for (uint32_t i = 0; i < count; ++i) out.push_back(string(kMaxKeyBytes, "key"));
    return out;
  }
  void finish() const {
    if (offset_ != size_) throw ProtocolError(std::to_string(size_ - offset_) + " bytes after the payload");
  }

 private:
  /// A length-prefixed run of bytes as a T (std::string or Bytes).
  template <typename T>
  T blob(size_t maxBytes, const char* what) {
    const size_t n = checkedLength(maxBytes, what);
    const uint8_t* p = take(n);
    return T(p, p + n);
  }
  size_t checkedLength(size_t maxBytes, const char* what) {
    uint32_t n = u32();
    if (n > maxBytes) throw ProtocolError(std::string(what) + " of " + std::to_string(n) + " bytes");
    return n;
  }
  const uint8_t* take(size_t n) {
    if (size_ - offset_ < n) throw ProtocolError("truncated payload");
    const uint8_t* p = data_ + offset_;
    offset_ += n;
    return p;
  }
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

bool parseInt64(const Bytes& text, int64_t* out) {
  const char* first = reinterpret_cast<const char*>(text.data());
  const char* last = first + text.size();
  auto [end, ec] = std::from_chars(first, last, *out);
  return ec == std::errc() && end == last && !text.empty();
}

// ---- server -------------------------------------------------------------------------

struct Listener {
  UniqueFd fd;
  uint16_t port = 0;
  std::string selfHost;  // where this process reaches it
};

Listener listenOn(const std::string& host, uint16_t port) {
  const std::string where = endpointText(host, port);
  struct Candidate {
    sockaddr_storage addr{};
    socklen_t len = 0;
    bool anyV6 = false;
  };
  std::vector<Candidate> candidates;
  bool wildcard = host.empty() || host == "::" || host == "0.0.0.0";
  if (host.empty() || host == "::") {
    // Dual stack first (IPv4 clients arrive as mapped addresses), plain
    // IPv4 where the kernel has no IPv6.
    Candidate c6;
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&c6.addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    a6->sin6_port = htons(port);
    c6.len = sizeof(sockaddr_in6);
    c6.anyV6 = true;
    candidates.push_back(c6);
  }
  if (wildcard) {
    Candidate c4;
    auto* a4 = reinterpret_cast<sockaddr_in*>(&c4.addr);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = htons(port);
    c4.len = sizeof(sockaddr_in);
    candidates.push_back(c4);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    AddrInfoPtr list(res);
    if (rc != 0) {
      throw TransportError("TcpStore could not serve on " + where + ": cannot resolve '" + host +
                           "': " + gai_strerror(rc));
    }
    for (addrinfo* a = res; a; a = a->ai_next) {
      Candidate c;
      std::memcpy(&c.addr, a->ai_addr, a->ai_addrlen);
      c.len = a->ai_addrlen;
      candidates.push_back(c);
    }
  }

  int lastErr = EADDRNOTAVAIL;
  for (const Candidate& c : candidates) {
    UniqueFd fd(::socket(c.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      lastErr = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool dualStack = false;
    if (c.anyV6) {
      int zero = 0;
      dualStack = ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0;
    }
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&c.addr), c.len) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0) {
      lastErr = errno;
      // Another address of the same name would split the job between two stores.
      if (lastErr == EADDRINUSE) break;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      lastErr = errno;
      continue;
    }
    Listener l;
    l.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    l.selfHost = !wildcard ? host : (c.anyV6 && !dualStack) ? "::1" : "127.0.0.1";
    l.fd = std::move(fd);
    return l;
  }
  std::string msg = "TcpStore could not serve on " + where + ": " + errnoText(lastErr);
  if (lastErr == EADDRINUSE) msg += " (address in use: another job or store may be running there)";
  throw TransportError(msg);
}

/// The serving side: one thread multiplexes every connection with epoll and
/// owns all state, so nothing here needs a lock.
class Server {
 public:
  Server(UniqueFd listenFd, std::string where) : listen_(std::move(listenFd)), where_(std::move(where)) {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!epoll_ || !wake_) throw TransportError("TcpStore server on " + where_ + ": " + errnoText(errno));
    watch(wake_.get(), kWakeId, EPOLLIN, EPOLL_CTL_ADD);
    watch(listen_.get(), kListenId, EPOLLIN, EPOLL_CTL_ADD);
    thread_ = std::thread([this] { run(); });
  }

  ~Server() {
    stop_.store(true);
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
    (void)ignored;
    thread_.join();
  }

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  static constexpr uint64_t kWakeId = 0;
  static constexpr uint64_t kListenId = 1;
  static constexpr size_t kReadChunk = 256 << 10;
  // Bytes read from one connection before the others get their turn.
  static constexpr size_t kReadBudget = 4 << 20;
  // A connection stops being served while this much reply is unsent.
  static constexpr size_t kMaxUnsentReply = 4 << 20;
  // One whole frame, plus what a read may bring beyond it.
  static constexpr size_t kMaxBufferedInput = kHeaderBytes + 4 + kMaxKeyBytes + 4 + kMaxValueBytes + kReadChunk;

  struct Connection {
    uint64_t id = 0;
    UniqueFd fd;
    bool greeted = false;
    uint64_t channel = 0;
    Bytes in;
    size_t inOffset = 0;
    // Replies not yet sent, in order. A GET's value is shared with the
    // store, not copied: many ranks reading one large value (a rendezvous'
    // combined result) then cost its size once, not once per reader.
    std::deque<std::shared_ptr<const Bytes>> out;
    size_t outOffset = 0;  // into out.front()
    size_t unsent = 0;     // bytes in out, less outOffset
    bool writeWatched = false;
    bool closeAfterFlush = false;
    bool dead = false;
    // The GET, WAIT or MGET this connection waits on, the keys whose values
    // it returns (GET: one, MGET: all, in order), and the keys still missing.
    Op waitingOp = Op::kSet;
    bool waiting = false;
    uint64_t waitSerial = 0;  // tells this wait's timer from an earlier one's
    std::vector<std::string> getKeys;
    std::unordered_set<std::string> missing;
  };

  // The last ADD of each client channel and its result: a client that lost
  // its connection before the reply resends the same sequence number, and
  // gets this result instead of a second addition. One entry per client
  // channel that ever added (a few per process).
  struct AddRecord {
    uint64_t sequence = 0;
    int64_t result = 0;
  };

  struct Timer {
    Clock::time_point at;
    uint64_t conn;
    uint64_t serial;
    bool operator>(const Timer& o) const { return at > o.at; }
  };

  void watch(int fd, uint64_t id, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0 && op != EPOLL_CTL_MOD) {
      throw TransportError("TcpStore server on " + where_ + ": epoll_ctl: " + errnoText(errno));
    }
  }

  void run() {
    ::prctl(PR_SET_NAME, "gradcomm-store", 0, 0, 0);
    std::vector<epoll_event> events(256);
    while (!stop_.load()) {
      int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), nextTimeoutMs());
      if (n < 0) {
        if (errno == EINTR) continue;
        core::log(core::LogLevel::kError, -1,
                  "TcpStore server on " + where_ + " stops: epoll_wait: " + errnoText(errno));
        break;
      }
      if (listenPaused_ && Clock::now() >= listenResume_) {
        listenPaused_ = false;
        watch(listen_.get(), kListenId, EPOLLIN, EPOLL_CTL_MOD);
      }
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        survive([&] {
          if (id == kWakeId) {
            uint64_t count;
            ssize_t ignored = ::read(wake_.get(), &count, sizeof count);
            (void)ignored;
          } else if (id == kListenId) {
            acceptAll();
          } else {
            serve(id, events[i].events);
          }
          serveReady();
        });
        reap();
      }
      survive([&] {
        expireWaits();
        serveReady();
      });
      reap();
    }
    // Listener first: a client that reconnects now is refused at once
    // instead of queueing on a socket about to close.
    listen_.reset();
    conns_.clear();
  }

  // Runs a step of the loop; a failure there (out of memory, most likely)
  // is logged and the other connections are still served.
  template <typename F> void survive(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      core::log(core::LogLevel::kWarn, -1, "TcpStore server on " + where_ + ": " + e.what());
    }
  }

  // Until the next wait's timeout or the listener's resumption; -1: none.
  int nextTimeoutMs() const {
    std::optional<Clock::time_point> next;
    if (listenPaused_) next = listenResume_;
    if (!timers_.empty() && (!next || timers_.top().at < *next)) next = timers_.top().at;
    if (!next) return -1;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
  }

  void expireWaits() {
    auto now = Clock::now();
    while (!timers_.empty() && timers_.top().at <= now) {
      Timer t = timers_.top();
      timers_.pop();
      auto it = conns_.find(t.conn);
      if (it == conns_.end()) continue;
      Connection& c = *it->second;
      if (c.dead || !c.waiting || c.waitSerial != t.serial) continue;
      // Names the keys still missing: among thousands waited for, the
      // caller cannot tell which otherwise.
      std::vector<std::string> missing(c.missing.begin(), c.missing.end());
      std::sort(missing.begin(), missing.end());
      stopWaiting(c);
      replyError(c, ErrorCode::kTimeout, "still missing " + quoteKeys(missing));
      ready_.push_back(c.id);
    }
  }

  void startWaiting(Connection& c, Op op, uint64_t timeoutMs) {
    c.waiting = true;
    c.waitingOp = op;
    ++c.waitSerial;
    for (const std::string& k : c.missing) waiters_[k].push_back(c.id);
    if (timeoutMs <= kMaxServerTimeoutMs) {
      timers_.push(Timer{Clock::now() + std::chrono::milliseconds(timeoutMs), c.id, c.waitSerial});
    }
    // Answered waits leave their timers behind; drop them once they dominate.
    if (timers_.size() > 4096 && timers_.size() > 4 * conns_.size()) {
      std::vector<Timer> live;
      while (!timers_.empty()) {
        Timer t = timers_.top();
        timers_.pop();
        auto it = conns_.find(t.conn);
        if (it != conns_.end() && it->second->waiting && it->second->waitSerial == t.serial) live.push_back(t);
      }
      for (const Timer& t : live) timers_.push(t);
    }
  }

  // Takes the connection off the waiter lists of the keys it still misses.
  void stopWaiting(Connection& c) {
    for (const std::string& key : c.missing) {
      auto w = waiters_.find(key);
      if (w == waiters_.end()) continue;
      auto& ids = w->second;
      ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
      if (ids.empty()) waiters_.erase(w);
    }
    c.missing.clear();
    c.getKeys.clear();
    c.waiting = false;
  }

  void acceptAll() {
    for (;;) {
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        // Out of descriptors or memory: the pending connection stays queued
        // and would wake every epoll_wait; look again a little later.
        core::log(core::LogLevel::kWarn, -1,
                  "TcpStore server on " + where_ + ": accept: " + errnoText(err) + "; retrying in 100 ms");
        listenPaused_ = true;
        listenResume_ = Clock::now() + std::chrono::milliseconds(100);
        watch(listen_.get(), kListenId, 0, EPOLL_CTL_MOD);
        return;
      }
      UniqueFd owned(fd);
      auto c = std::make_unique<Connection>();
      c->fd = std::move(owned);
      c->id = nextId_++;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = c->id;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) continue;  // closes it
      conns_.emplace(c->id, std::move(c));
    }
  }

  // Runs `f` on the connection; whatever it throws drops that connection only.
  template <typename F> void guarded(Connection& c, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      drop(c, e.what());
    }
  }

  void serve(uint64_t id, uint32_t events) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second->dead) return;
    Connection& c = *it->second;
    guarded(c, [&] {
      if (events & EPOLLOUT) flush(c);
      if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) receive(c);
      process(c);
    });
  }

  void serveReady() {
    while (!ready_.empty()) {
      uint64_t id = ready_.back();
      ready_.pop_back();
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second->dead) continue;
      Connection& c = *it->second;
      guarded(c, [&] { process(c); });
    }
  }

  void drop(Connection& c, const std::string& why) {
    if (c.dead) return;
    c.dead = true;
    dead_.push_back(c.id);
    if (core::logEnabled(core::LogLevel::kDebug)) {
      core::log(core::LogLevel::kDebug, -1, "TcpStore server on " + where_ + " drops a connection: " + why);
    }
  }

  void reap() {
    for (uint64_t id : dead_) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      stopWaiting(*it->second);
      conns_.erase(it);  // closing the socket also takes it out of the epoll set
    }
    dead_.clear();
  }

  void receive(Connection& c) {
    size_t budget = kReadBudget;
    while (budget > 0 && !c.dead) {
      if (c.in.size() - c.inOffset >= kMaxBufferedInput) {
        drop(c, "sent more than a frame ahead of its replies");
        return;
      }
      // Through a scratch buffer, so a connection's own buffer grows only
      // by what arrived (a header alone reserves nothing).
      ssize_t n = ::recv(c.fd.get(), scratch_.data(), scratch_.size(), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), scratch_.begin(), scratch_.begin() + n);
        budget -= std::min(budget, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        // Complete requests that came before the close still count.
        process(c);
        drop(c, c.in.size() > c.inOffset ? "closed in the middle of a frame" : "closed");
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      drop(c, "recv: " + errnoText(errno));
      return;
    }
  }

  // Handles complete requests in order while the connection waits for
  // nothing and its replies are not backing up, then sends what it can.
  void process(Connection& c) {
    while (!c.dead && !c.waiting && !c.closeAfterFlush && c.unsent < kMaxUnsentReply) {
      size_t avail = c.in.size() - c.inOffset;
      const uint8_t* p = c.in.data() + c.inOffset;
      if (!c.greeted) {
        if (avail < kClientHelloBytes) {
          if (avail >= 4 && loadU32(p) != kMagic) throw ProtocolError("bad magic in the hello");
          break;
        }
        if (loadU32(p) != kMagic) throw ProtocolError("bad magic in the hello");
        uint16_t version = loadU16(p + 4);
        c.channel = loadU64(p + 8);
        c.inOffset += kClientHelloBytes;
        c.greeted = true;
        Bytes hello;
        putU32(hello, kMagic);
        putU16(hello, kVersion);
        putU16(hello, 0);
        queue(c, std::make_shared<const Bytes>(std::move(hello)));
        if (version != kVersion) c.closeAfterFlush = true;
        continue;
      }
      if (avail < kHeaderBytes) break;
      uint8_t op = p[0];
      uint32_t length = loadU32(p + 1);
      size_t limit = maxPayload(op);
      if (limit == 0) throw ProtocolError("unknown operation " + std::to_string(op));
      if (length > limit) {
        throw ProtocolError(std::string(opName(static_cast<Op>(op))) + " frame of " + std::to_string(length) +
                            " bytes (the limit is " + std::to_string(limit) + ")");
      }
      if (avail < kHeaderBytes + length) break;
      Reader r(p + kHeaderBytes, length);
      c.inOffset += kHeaderBytes + length;
      handle(c, static_cast<Op>(op), r);
    }
    compact(c);
    flush(c);
  }

  static void compact(Connection& c) {
    if (c.inOffset == c.in.size()) {
      c.in.clear();
      c.inOffset = 0;
      // A large value leaves a large buffer; idle connections should not keep it.
      if (c.in.capacity() > kReadChunk * 4) Bytes().swap(c.in);
    } else if (c.inOffset > 0) {
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(c.inOffset));
      c.inOffset = 0;
    }
  }

  static void queue(Connection& c, std::shared_ptr<const Bytes> bytes) {
    if (bytes->empty()) return;
    c.unsent += bytes->size();
    c.out.push_back(std::move(bytes));
  }

  void flush(Connection& c) {
    constexpr size_t kMaxIov = 16;
    while (!c.dead && !c.out.empty()) {
      iovec iov[kMaxIov];
      size_t n = 0;
      for (auto it = c.out.begin(); it != c.out.end() && n < kMaxIov; ++it, ++n) {
        size_t skip = n == 0 ? c.outOffset : 0;
        iov[n].iov_base = const_cast<uint8_t*>((*it)->data() + skip);
        iov[n].iov_len = (*it)->size() - skip;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t sent = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        size_t left = static_cast<size_t>(sent);
        c.unsent -= left;
        while (left > 0) {
          size_t inFront = c.out.front()->size() - c.outOffset;
          if (left < inFront) {
            c.outOffset += left;
            break;
          }
          left -= inFront;
          c.out.pop_front();
          c.outOffset = 0;
        }
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop(c, "send: " + errnoText(errno));
      return;
    }
    if (c.dead) return;
    bool pending = !c.out.empty();
    if (!pending && c.closeAfterFlush) {
      drop(c, "speaks another protocol version");
      return;
    }
    if (pending != c.writeWatched) {
      c.writeWatched = pending;
      watch(c.fd.get(), c.id, EPOLLIN | EPOLLRDHUP | (pending ? EPOLLOUT : 0u), EPOLL_CTL_MOD);
    }
  }

  static Bytes header(Status status, size_t payloadBytes) {
    Bytes h;
    h.reserve(kHeaderBytes + 4);
    h.push_back(static_cast<uint8_t>(status));
    putU32(h, static_cast<uint32_t>(payloadBytes));
    return h;
  }

  static void reply(Connection& c, Bytes payload) {
    Bytes frame = header(Status::kOk, payload.size());
    frame.insert(frame.end(), payload.begin(), payload.end());
    queue(c, std::make_shared<const Bytes>(std::move(frame)));
  }

  // A stored value as the reply's payload, shared rather than copied.
  static void replyValue(Connection& c, const std::shared_ptr<const Bytes>& value) {
    queue(c, std::make_shared<const Bytes>(header(Status::kOk, value->size())));
    queue(c, value);
  }

  static void replyError(Connection& c, ErrorCode code, const std::string& message) {
    const size_t shown = std::min(message.size(), kMaxErrorTextBytes);
    Bytes frame = header(Status::kError, 4 + shown);
    putU32(frame, static_cast<uint32_t>(code));
    frame.insert(frame.end(), message.begin(), message.begin() + static_cast<ptrdiff_t>(shown));
    queue(c, std::make_shared<const Bytes>(std::move(frame)));
  }

  // MGET's reply: every value of c.getKeys, all of which are set.
  void replyValues(Connection& c) {
    size_t total = 4;
    for (const std::string& k : c.getKeys) total += 4 + values_.at(k)->size();
    if (total > kMaxReplyPayload) {
      replyError(c, ErrorCode::kInvalidArgument,
                 "the values of the " + std::to_string(c.getKeys.size()) + " keys come to " + std::to_string(total) +
                     " bytes, above one reply's limit of " + std::to_string(kMaxReplyPayload) +
                     " bytes: fetch fewer keys at once");
      return;
    }
    Bytes payload;
    payload.reserve(total);
    putU32(payload, static_cast<uint32_t>(c.getKeys.size()));
    for (const std::string& k : c.getKeys) {
      const Bytes& v = *values_.at(k);
      putString(payload, v.data(), v.size());
    }
    reply(c, std::move(payload));
  }

  void handle(Connection& c, Op op, Reader& r) {
    switch (op) {
      case Op::kSet: {
        std::string key = r.string(kMaxKeyBytes, "key");
        Bytes value = r.bytes(kMaxValueBytes, "value");
        r.finish();
        values_[key] = std::make_shared<const Bytes>(std::move(value));
        reply(c, {});
        wakeWaiters(key);
        return;
      }
      case Op::kAdd: {
        std::string key = r.string(kMaxKeyBytes, "key");
        int64_t delta = r.i64();
        uint64_t sequence = r.u64();
        r.finish();
        add(c, key, delta, sequence);
        return;
      }
      case Op::kCheck: {
        std::vector<std::string> keys = r.keys();
        r.finish();
        bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return values_.count(k) > 0; });
        reply(c, Bytes{static_cast<uint8_t>(all ? 1 : 0)});
        return;
      }
      case Op::kGet:
      case Op::kWait:
      case Op::kMultiGet: {
        // Answered at once when every key is there, else when the last
        // missing one is set (wakeWaiters) or the timeout passes.
        uint64_t timeoutMs = r.u64();
        std::vector<std::string> keys;
        if (op == Op::kGet) keys.push_back(r.string(kMaxKeyBytes, "key"));
        else keys = r.keys();
        r.finish();
        for (const std::string& k : keys) {
          if (values_.count(k) == 0) c.missing.insert(k);
        }
        if (op != Op::kWait) c.getKeys = std::move(keys);
        if (c.missing.empty()) answer(c, op);
        else startWaiting(c, op, timeoutMs);
        return;
      }
    }
  }

  /// The reply to a GET, WAIT or MGET whose keys are all set.
  void answer(Connection& c, Op op) {
    if (op == Op::kGet) {
      replyValue(c, values_.at(c.getKeys.front()));
    } else if (op == Op::kMultiGet) {
      replyValues(c);
    } else {
      reply(c, {});
    }
    c.getKeys.clear();
  }

  void add(Connection& c, const std::string& key, int64_t delta, uint64_t sequence) {
    const bool recorded = c.channel != 0 && sequence != 0;
    const auto done = recorded ? lastAdd_.find(c.channel) : lastAdd_.end();
    int64_t result = 0;
    if (done != lastAdd_.end() && done->second.sequence == sequence) {
      result = done->second.result;  // a resend: added already
    } else {
      int64_t current = 0;
      auto it = values_.find(key);
      if (it != values_.end() && !parseInt64(*it->second, &current)) {
        replyError(c, ErrorCode::kInvalidArgument,
                   "add to key " + quoteKey(key) + ", which holds a value that is not a decimal integer");
        return;
      }
      if (__builtin_add_overflow(current, delta, &result)) {
        replyError(c, ErrorCode::kInvalidArgument,
                   "add of " + std::to_string(delta) + " to key " + quoteKey(key) + " (" + std::to_string(current) +
                       ") overflows int64");
        return;
      }
      std::string text = std::to_string(result);
      values_[key] = std::make_shared<const Bytes>(text.begin(), text.end());
      if (recorded) lastAdd_[c.channel] = AddRecord{sequence, result};
      wakeWaiters(key);
    }
    Bytes payload;
    putU64(payload, static_cast<uint64_t>(result));
    reply(c, payload);
  }

  void wakeWaiters(const std::string& key) {
    auto w = waiters_.find(key);
    if (w == waiters_.end()) return;
    std::vector<uint64_t> ids = std::move(w->second);
    waiters_.erase(w);
    for (uint64_t id : ids) {
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second->dead) continue;
      Connection& c = *it->second;
      c.missing.erase(key);
      if (!c.missing.empty()) continue;
      c.waiting = false;
      answer(c, c.waitingOp);
      // Sent (and any next request handled) outside this loop, which must
      // not drop connections under its feet.
      ready_.push_back(id);
    }
  }

  UniqueFd listen_;
  std::string where_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::atomic<bool> stop_{false};
  // Everything below belongs to the server thread.
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  // Shared with the replies that still send them (see Connection::out).
  std::unordered_map<std::string, std::shared_ptr<const Bytes>> values_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;
  std::unordered_map<uint64_t, AddRecord> lastAdd_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::vector<uint64_t> ready_;
  std::vector<uint64_t> dead_;
  Bytes scratch_ = Bytes(kReadChunk);
  uint64_t nextId_ = 2;
  bool listenPaused_ = false;
  Clock::time_point listenResume_{};
  std::thread thread_;  // last: starts after everything it uses exists
};

// ---- client I/O -------------------------------------------------------------------------

// Waits until `fd` is ready for `events`; false when the deadline passes first.
bool waitReady(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = deadline - Clock::now();
    int ms = left <= Clock::duration::zero()
                 ? 0
                 : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // the next send or recv reports the error
  }
}

/// Sends (or receives) exactly `size` bytes by `deadline`.
void transferAll(int fd, uint8_t* data, size_t size, Clock::time_point deadline, bool send) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = send ? ::send(fd, data + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                           : ::recv(fd, data + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !send) throw ConnectionLost{"the store closed the connection"};
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitReady(fd, send ? POLLOUT : POLLIN, deadline)) throw DeadlineReached{};
      continue;
    }
    throw ConnectionLost{errnoText(errno)};
  }
}
void sendAll(int fd, const uint8_t* data, size_t size, Clock::time_point deadline) {
  transferAll(fd, const_cast<uint8_t*>(data), size, deadline, true);
}
void recvAll(int fd, uint8_t* data, size_t size, Clock::time_point deadline) {
  transferAll(fd, data, size, deadline, false);
}

uint64_t newChannelId() {
  static std::mutex mu;
  static std::mt19937_64 gen;
  static pid_t seededIn = 0;
  std::lock_guard<std::mutex> lock(mu);
  // Seeded again in a forked child: children forked after this process made
  // a client would otherwise draw the same ids, and the server would take one
  // child's first ADD for a resend of another's.
  if (seededIn != ::getpid()) {
    seededIn = ::getpid();
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(seededIn),
                      static_cast<unsigned>(Clock::now().time_since_epoch().count())};
    gen.seed(seq);
  }
  uint64_t id = 0;
  while (id == 0) id = gen();  // 0 means "no channel": never deduplicated
  return id;
}

/// One connection of a client, and what names it to the server across reconnects.
struct Channel {
  UniqueFd fd;
  uint64_t id = newChannelId();
  uint64_t nextAddSequence = 1;
};

/// The result of one connection attempt: a greeted socket, or why not.
struct Attempt {
  UniqueFd fd;
  std::string error;
  bool fatal = false;  // retrying cannot help
};

// Tries every address of host:port once, each until `deadline`, and greets
// the first that accepts.
Attempt connectOnce(const std::string& host, uint16_t port, uint64_t channel, Clock::time_point deadline) {
  Attempt result;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  AddrInfoPtr list(res);
  if (rc != 0) {
    result.error = "cannot resolve '" + host + "': " + (rc == EAI_SYSTEM ? errnoText(errno) : gai_strerror(rc));
    return result;
  }
  for (addrinfo* a = res; a; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      result.error = errnoText(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        result.error = errnoText(errno);
        continue;
      }
      if (!waitReady(fd.get(), POLLOUT, deadline)) {
        result.error = "connection attempt timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        result.error = errnoText(err);
        continue;
      }
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Bytes hello;
    putU32(hello, kMagic);
    putU16(hello, kVersion);
    putU16(hello, 0);
    putU64(hello, channel);
    uint8_t answer[kServerHelloBytes];
    try {
      sendAll(fd.get(), hello.data(), hello.size(), deadline);
      recvAll(fd.get(), answer, sizeof answer, deadline);
    } catch (const ConnectionLost& lost) {
      result.error = "connected, but the hello failed: " + lost.why;
      continue;
    } catch (const DeadlineReached&) {
      result.error = "connected, but no reply to the hello";
      continue;
    }
    if (loadU32(answer) != kMagic) {
      // Another service holds the port: retrying until the connect timeout
      // cannot help (it kept retrying, and a last attempt cut short by the
      // deadline then reported "no reply" instead of this).
      result.error = "something that is not a gradcomm store answers there";
      result.fatal = true;
      return result;
    }
    uint16_t version = loadU16(answer + 4);
    if (version != kVersion) {
      result.error = "the store speaks protocol version " + std::to_string(version) + ", this client version " +
                     std::to_string(kVersion) + " (mixed gradcomm builds?)";
      result.fatal = true;
      return result;
    }
    result.fd = std::move(fd);
    return result;
  }
  return result;
}

}  // namespace

// ---- TcpStore -------------------------------------------------------------------------

struct TcpStore::Impl {
  std::string host;
  uint16_t port = 0;
  Options options;
  std::string connectHost;  // the server's own channels use loopback for a wildcard host
  std::string endpoint;     // host:port
  std::string description;  // tcp://host:port
  std::unique_ptr<Server> server;  // before the channels: they close first
  std::mutex mu;
  std::vector<std::unique_ptr<Channel>> idle;

  /// A channel borrowed for one call; back to the pool when done.
  class Lease {
   public:
    Lease(Impl& impl, std::unique_ptr<Channel> channel) : impl_(impl), channel_(std::move(channel)) {}
    ~Lease() { impl_.giveBack(std::move(channel_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Channel& operator*() const { return *channel_; }
    Channel* operator->() const { return channel_.get(); }

   private:
    Impl& impl_;
    std::unique_ptr<Channel> channel_;
  };

  // Connects `channel`: retrying until the connect timeout for the first
  // connection (the server may start after its clients), once otherwise.
  void open(Channel& channel, bool retry, const std::string& lostWhy) {
    auto start = Clock::now();
    auto window = retry ? options.connectTimeout : std::min(options.connectTimeout, kReconnectTimeout);
    auto deadline = start + window;
    std::minstd_rand jitter(static_cast<unsigned>(channel.id));
    auto pause = kRetryFirst;
    for (;;) {
      Attempt a = connectOnce(connectHost, port, channel.id, std::max(deadline, Clock::now() + kRetryFirst));
      if (a.fd) {
        channel.fd = std::move(a.fd);
        return;
      }
      auto now = Clock::now();
      if (a.fatal || !retry || now >= deadline) {
        if (!lostWhy.empty()) {
          throw TransportError("lost the connection to the rendezvous store at " + description + " (" + lostWhy +
                               ") and could not reconnect: " + a.error);
        }
        if (!retry) {
          throw TransportError("could not open another connection to the rendezvous store at " + description +
                               ": " + a.error);
        }
        throw TransportError("could not reach the rendezvous store at " + endpoint + " within " +
                             core::formatSeconds(options.connectTimeout) + ": " + a.error);
      }
      // Jitter keeps a job's clients from retrying in lockstep.
      auto sleep = pause / 2 + std::chrono::milliseconds(jitter() % static_cast<unsigned>(pause.count() / 2 + 1));
      std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - now));
      pause = std::min(pause * 2, kRetryMax);
    }
  }

  Lease borrow() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        std::unique_ptr<Channel> c = std::move(idle.back());
        idle.pop_back();
        return Lease(*this, std::move(c));
      }
    }
    // Every channel is busy (another thread may wait in get): open one more,
    // so a set from this thread is never queued behind that get.
    auto c = std::make_unique<Channel>();
    open(*c, false, "");
    return Lease(*this, std::move(c));
  }

  void giveBack(std::unique_ptr<Channel> channel) {
    if (!channel || !channel->fd) return;
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < kMaxIdleChannels) idle.push_back(std::move(channel));
  }

  /// One request, and how its failures read.
  struct Call {
    const Bytes& request;
    std::chrono::milliseconds replyWindow;  // for the reply to begin arriving
    std::string what;                       // "TcpStore get of key 'k'"
    std::string timeoutText;                // the server timed the wait out
    bool nameMissing = false;               // add which keys the server still missed
  };

  // Sends a request and returns its reply's payload. A broken connection is
  // reopened once and the request sent again: every request is idempotent
  // except ADD, whose sequence number lets the server answer a resent one
  // from its record instead of adding again.
  Bytes call(Channel& channel, const Call& c) {
    auto deadline = Clock::now() + c.replyWindow;
    std::string lostWhy;
    for (int attempt = 0;; ++attempt) {
      if (!channel.fd) open(channel, false, lostWhy);
      try {
        sendAll(channel.fd.get(), c.request.data(), c.request.size(), deadline);
        uint8_t header[kHeaderBytes];
        recvAll(channel.fd.get(), header, sizeof header, deadline);
        uint32_t length = loadU32(header + 1);
        if (header[0] > static_cast<uint8_t>(Status::kError) || length > kMaxReplyPayload) {
          channel.fd.reset();
          throw TransportError(c.what + ": malformed reply from the rendezvous store at " + description);
        }
        // A large value may take a while to arrive once it has begun to.
        Bytes payload(length);
        recvAll(channel.fd.get(), payload.data(), length, std::max(deadline, Clock::now() + options.connectTimeout));
        if (header[0] == static_cast<uint8_t>(Status::kError)) throwReplyError(c, payload);
        return payload;
      } catch (const ConnectionLost& lost) {
        channel.fd.reset();
        if (attempt > 0) {
          throw TransportError(c.what + ": lost the connection to the rendezvous store at " + description +
                               " twice: " + lost.why);
        }
        lostWhy = lost.why;
      } catch (const DeadlineReached&) {
        // The reply may still come; on this connection it would be taken
        // for the next request's, so close it and let the next call open
        // another.
        channel.fd.reset();
        throw TimeoutError(c.what + ": no reply from the rendezvous store " + description + " within " +
                           core::formatSeconds(c.replyWindow));
      }
    }
  }

  [[noreturn]] void throwReplyError(const Call& c, const Bytes& payload) const {
    uint32_t code = payload.size() >= 4 ? loadU32(payload.data()) : 0;
    const std::string message(payload.begin() + static_cast<ptrdiff_t>(std::min<size_t>(4, payload.size())),
                              payload.end());
    if (code == static_cast<uint32_t>(ErrorCode::kTimeout)) {
      // The server names the keys it still missed (version 2).
      if (c.nameMissing && message.rfind("still missing ", 0) == 0) {
        throw TimeoutError(c.timeoutText + " (" + message + ")");
      }
      throw TimeoutError(c.timeoutText);
    }
    if (code < static_cast<uint32_t>(ErrorCode::kInvalidArgument) ||
        code > static_cast<uint32_t>(ErrorCode::kDevice)) {
      code = static_cast<uint32_t>(ErrorCode::kInternal);
    }
    rethrowAs(static_cast<ErrorCode>(code), c.what + ": " + message + " (store " + description + ")");
  }

  // Calls that do not wait for keys: the connect timeout bounds them.
  Bytes callSimple(Channel& channel, const Bytes& request, std::string what) {
    return call(channel, Call{request, options.connectTimeout, std::move(what), ""});
  }

  // GET and WAIT: the server answers by `timeout`; beyond it by a grace,
  // the client stops trusting the server.
  Bytes callWaiting(Channel& channel, const Bytes& request, std::chrono::milliseconds timeout, std::string what,
                    const std::string& keysText, bool nameMissing = false) {
    std::string timeoutText = "timed out after " + std::to_string(timeout.count()) + " ms waiting for " + keysText +
                              " in the rendezvous store " + description;
    auto window = timeout + std::min(options.connectTimeout, kMaxReplyGrace);
    return call(channel, Call{request, window, std::move(what), std::move(timeoutText), nameMissing});
  }
};

namespace {
void checkKey(const std::string& key, const char* op) {
  if (key.size() > kMaxKeyBytes) {
    throw InvalidArgument(std::string("TcpStore ") + op + ": key of " + std::to_string(key.size()) +
                          " bytes (the limit is " + std::to_string(kMaxKeyBytes) + ")");
  }
}

void checkKeys(const std::vector<std::string>& keys, const char* op) {
  if (keys.size() > kMaxKeysPerRequest) {
    throw InvalidArgument(std::string("TcpStore ") + op + ": " + std::to_string(keys.size()) +
                          " keys in one call (the limit is " + std::to_string(kMaxKeysPerRequest) + ")");
  }
  for (const std::string& k : keys) checkKey(k, op);
}

void putKeys(Bytes& b, const std::vector<std::string>& keys) {
  putU32(b, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) putString(b, k.data(), k.size());
}

std::chrono::milliseconds clampTimeout(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0), kMaxTimeout);
}
}  // namespace

TcpStore::TcpStore(const std::string& host, uint16_t port, const Options& options) : impl_(std::make_unique<Impl>()) {
  if (options.connectTimeout.count() < 0) {
    throw InvalidArgument("TcpStore: negative connect timeout (" + std::to_string(options.connectTimeout.count()) +
                          " ms)");
  }
  Impl& d = *impl_;
  d.host = host;
  d.port = port;
  d.options = options;
  d.options.connectTimeout = clampTimeout(options.connectTimeout);
  d.connectHost = host.empty() ? "127.0.0.1" : host;
  if (options.isServer) {
    Listener l = listenOn(host, port);
    d.port = l.port;
    d.connectHost = l.selfHost;
    d.server = std::make_unique<Server>(std::move(l.fd), endpointText(host, d.port));
  }
  d.endpoint = endpointText(host, d.port);
  d.description = "tcp://" + d.endpoint;
  auto first = std::make_unique<Channel>();
  d.open(*first, true, "");
  d.idle.push_back(std::move(first));
}

TcpStore::~TcpStore() = default;

uint16_t TcpStore::port() const { return impl_->port; }

const std::string& TcpStore::host() const { return impl_->host; }

std::string TcpStore::describe() const { return impl_->description; }

void TcpStore::set(const std::string& key, const Bytes& value) {
  checkKey(key, "set");
  if (value.size() > kMaxValueBytes) {
    throw InvalidArgument("TcpStore set of key " + quoteKey(key) + ": value of " + std::to_string(value.size()) +
                          " bytes (the limit is " + std::to_string(kMaxValueBytes) + ")");
  }
  Bytes request = startFrame(static_cast<uint8_t>(Op::kSet), 8 + key.size() + value.size());
  putString(request, key.data(), key.size());
  putString(request, value.data(), value.size());
  endFrame(request);
  auto lease = impl_->borrow();
  impl_->callSimple(*lease, request, "TcpStore set of key " + quoteKey(key));
}

Store::Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  checkKey(key, "get");
  timeout = clampTimeout(timeout);
  Bytes request = startFrame(static_cast<uint8_t>(Op::kGet));
  putU64(request, static_cast<uint64_t>(timeout.count()));
  putString(request, key.data(), key.size());
  endFrame(request);
  auto lease = impl_->borrow();
  return impl_->callWaiting(*lease, request, timeout, "TcpStore get of key " + quoteKey(key), "key " + quoteKey(key));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  checkKey(key, "add");
  std::string what = "TcpStore add to key " + quoteKey(key);
  auto lease = impl_->borrow();
  Bytes request = startFrame(static_cast<uint8_t>(Op::kAdd));
  putString(request, key.data(), key.size());
  putU64(request, static_cast<uint64_t>(delta));
  // Taken once: a resend after a reconnect carries the same number.
  putU64(request, lease->nextAddSequence++);
  endFrame(request);
  Bytes reply = impl_->callSimple(*lease, request, what);
  if (reply.size() != 8) throw TransportError(what + ": malformed reply from the store " + impl_->description);
  return static_cast<int64_t>(loadU64(reply.data()));
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  checkKeys(keys, "check");
  if (keys.empty()) return true;
  Bytes request = startFrame(static_cast<uint8_t>(Op::kCheck));
  putKeys(request, keys);
  endFrame(request);
  std::string what = "TcpStore check of " + quoteKeys(keys);
  auto lease = impl_->borrow();
  Bytes reply = impl_->callSimple(*lease, request, what);
  if (reply.size() != 1 || reply[0] > 1) {
    throw TransportError(what + ": malformed reply from the store " + impl_->description);
  }
  return reply[0] == 1;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  checkKeys(keys, "wait");
  if (keys.empty()) return;
  timeout = clampTimeout(timeout);
  Bytes request = startFrame(static_cast<uint8_t>(Op::kWait));
  putU64(request, static_cast<uint64_t>(timeout.count()));
  putKeys(request, keys);
  endFrame(request);
  auto lease = impl_->borrow();
  impl_->callWaiting(*lease, request, timeout, "TcpStore wait for " + quoteKeys(keys), quoteKeys(keys), true);
}

std::vector<Store::Bytes> TcpStore::multiGet(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) {
  for (const std::string& k : keys) checkKey(k, "multiGet");
  timeout = clampTimeout(timeout);
  const auto end = Clock::now() + timeout;
  std::vector<Bytes> out;
  out.reserve(keys.size());
  // Requests of at most kMaxKeysPerRequest keys, sharing one deadline.
  for (size_t first = 0; first < keys.size(); first += kMaxKeysPerRequest) {
    const size_t count = std::min(kMaxKeysPerRequest, keys.size() - first);
    const std::vector<std::string> chunk(keys.begin() + static_cast<ptrdiff_t>(first),
                                         keys.begin() + static_cast<ptrdiff_t>(first + count));
    auto left =
        std::max(std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now()), std::chrono::milliseconds(0));
    Bytes request = startFrame(static_cast<uint8_t>(Op::kMultiGet));
    putU64(request, static_cast<uint64_t>(left.count()));
    putKeys(request, chunk);
    endFrame(request);
    const std::string what = "TcpStore multiGet of " + quoteKeys(chunk);
    auto lease = impl_->borrow();
    Bytes reply = impl_->callWaiting(*lease, request, left, what, quoteKeys(chunk), true);
    try {
      Reader r(reply.data(), reply.size());
      if (r.u32() != count) throw ProtocolError("value count");
      for (size_t i = 0; i < count; ++i) out.push_back(r.bytes(kMaxValueBytes, "value"));
      r.finish();
    } catch (const ProtocolError&) {
      throw TransportError(what + ": malformed reply from the store " + impl_->description);
    }
  }
  return out;
}

}  // namespace gradcomm
