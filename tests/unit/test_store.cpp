// TcpStore and PrefixStore: values, waiting, timeouts, concurrency, and a
// server that outlives misbehaving clients. Everything runs on 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/rendezvous.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/store.hpp"

using namespace gradcomm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Bytes = Store::Bytes;

namespace {
constexpr const char* kLoopback = "127.0.0.1";

std::unique_ptr<TcpStore> makeServer(uint16_t port = 0) {
  TcpStore::Options o;
  o.isServer = true;
  o.connectTimeout = 5s;
  return std::make_unique<TcpStore>(kLoopback, port, o);
}

std::unique_ptr<TcpStore> makeClient(uint16_t port, std::chrono::milliseconds connectTimeout = 5s) {
  TcpStore::Options o;
  o.connectTimeout = connectTimeout;
  return std::make_unique<TcpStore>(kLoopback, port, o);
}

Bytes bytesOf(const std::string& s) { return Bytes(s.begin(), s.end()); }

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

template <typename F> std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A port that was free a moment ago: bound, read back, released.
uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Wire format pieces, written here independently of the library so the tests
// also pin the protocol down.
void putU16(Bytes& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putU32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putU64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
Bytes hello(uint64_t channel = 0, uint32_t magic = 0x54534347) {
  Bytes b;
  putU32(b, magic);
  putU16(b, 2);  // the protocol version
  putU16(b, 0);
  putU64(b, channel);
  return b;
}
Bytes addFrame(const std::string& key, int64_t delta, uint64_t sequence) {
  Bytes b{3};
  putU32(b, static_cast<uint32_t>(4 + key.size() + 16));
  putU32(b, static_cast<uint32_t>(key.size()));
  b.insert(b.end(), key.begin(), key.end());
  putU64(b, static_cast<uint64_t>(delta));
  putU64(b, sequence);
  return b;
}
Bytes getFrame(const std::string& key, uint64_t timeoutMs) {
  Bytes b{2};
  putU32(b, static_cast<uint32_t>(8 + 4 + key.size()));
  putU64(b, timeoutMs);
  putU32(b, static_cast<uint32_t>(key.size()));
  b.insert(b.end(), key.begin(), key.end());
  return b;
}

/// A plain TCP connection to the store, for sending it whatever we like.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  void send(const Bytes& b) {
    ASSERT_EQ(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Reads exactly n bytes, or fewer if the peer closes or `within` passes.
  Bytes read(size_t n, std::chrono::milliseconds within = 2000ms) {
    Bytes out;
    auto deadline = Clock::now() + within;
    while (out.size() < n && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      uint8_t buf[4096];
      ssize_t k = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (k <= 0) break;
      out.insert(out.end(), buf, buf + k);
    }
    return out;
  }
  // True when the server closes this connection within `within`.
  bool closedByPeer(std::chrono::milliseconds within = 2000ms) {
    auto deadline = Clock::now() + within;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      uint8_t buf[4096];
      ssize_t k = ::recv(fd_, buf, sizeof buf, 0);
      if (k == 0 || (k < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

 private:
  int fd_;
};

/// Something that listens on a loopback port and answers each connection's
/// hello with `helloReply`, then reads and ignores whatever comes: a store
/// that is stuck, or not a store at all.
class FakeServer {
 public:
  explicit FakeServer(Bytes helloReply) : helloReply_(std::move(helloReply)) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listen_, 16), 0);
    EXPECT_EQ(::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeServer() {
    stop_ = true;
    thread_.join();
    for (int fd : conns_) ::close(fd);
    ::close(listen_);
  }
  uint16_t port() const { return port_; }

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (int fd : conns_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int fd = ::accept(listen_, nullptr, nullptr);
        if (fd >= 0) conns_.push_back(fd);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        uint8_t buf[4096];
        ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n > 0 && !greeted_.count(fds[i].fd)) {
          greeted_.insert(fds[i].fd);
          ::send(fds[i].fd, helloReply_.data(), helloReply_.size(), MSG_NOSIGNAL);
        }
      }
    }
  }
  Bytes helloReply_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;
  std::set<int> greeted_;
  std::thread thread_;
};

/// A TCP relay between clients and a store that can break the connections
/// it carries: all at once, or one just as a reply passes through it (the
/// reply is lost).
class CuttingProxy {
 public:
  explicit CuttingProxy(uint16_t target) : target_(target) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listen_, 16), 0);
    EXPECT_EQ(::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~CuttingProxy() {
    stop_ = true;
    thread_.join();
    for (Pair& p : pairs_) closePair(p);
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  // Closes every relayed connection; returns once they are closed.
  void cutAll() {
    cutAll_ = true;
    for (int i = 0; i < 200 && cutAll_; ++i) std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(cutAll_.load());
  }
  // The next reply from the store (not a hello) is dropped and its
  // connection closed on both sides.
  void swallowNextReply() { swallow_ = true; }
  int repliesSwallowed() const { return swallowed_.load(); }

 private:
  struct Pair {
    int client = -1;
    int server = -1;
    size_t fromServer = 0;
  };
  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
  }
  static void closePair(Pair& p) {
    if (p.client >= 0) ::close(p.client);
    if (p.server >= 0) ::close(p.server);
    p.client = p.server = -1;
  }
  void run() {
    while (!stop_) {
      if (cutAll_) {
        for (Pair& p : pairs_) closePair(p);
        cutAll_ = false;
      }
      pairs_.erase(std::remove_if(pairs_.begin(), pairs_.end(), [](const Pair& p) { return p.client < 0; }),
                   pairs_.end());
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (const Pair& p : pairs_) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 5) <= 0) continue;
      if (fds[0].revents & POLLIN) accept();
      size_t polled = (fds.size() - 1) / 2;  // accept() may have added one
      for (size_t i = 0; i < polled; ++i) {
        Pair& p = pairs_[i];
        if (fds[1 + 2 * i].revents) relay(p, p.client, p.server, false);
        if (p.client >= 0 && fds[2 + 2 * i].revents) relay(p, p.server, p.client, true);
      }
    }
  }
  void accept() {
    int c = ::accept(listen_, nullptr, nullptr);
    if (c < 0) return;
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(target_);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(s);
      ::close(c);
      return;
    }
    pairs_.push_back(Pair{c, s, 0});
  }
  void relay(Pair& p, int from, int to, bool fromServer) {
    uint8_t buf[65536];
    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      closePair(p);
      return;
    }
    if (fromServer) {
      bool isReply = p.fromServer >= 8;  // the first 8 bytes are the hello
      p.fromServer += static_cast<size_t>(n);
      if (isReply && swallow_.exchange(false)) {
        ++swallowed_;
        closePair(p);
        return;
      }
    }
    if (::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) closePair(p);
  }

  uint16_t target_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false}, cutAll_{false}, swallow_{false};
  std::atomic<int> swallowed_{0};
  std::vector<Pair> pairs_;
  std::thread thread_;
};

Bytes serverHello(uint16_t version, uint32_t magic = 0x54534347) {
  Bytes b;
  putU32(b, magic);
  putU16(b, version);
  putU16(b, 0);
  return b;
}

// The store still answers a proper client after whatever happened before.
void expectStoreWorks(uint16_t port, const std::string& key) {
  auto c = makeClient(port);
  c->set(key, bytesOf("still-serving"));
  EXPECT_EQ(c->getString(key, 2000ms), "still-serving");
}
}  // namespace

TEST(TcpStore, SetThenGetRoundTripsEmptyTextAndBinaryValues) {
  auto server = makeServer();
  auto writer = makeClient(server->port());
  auto reader = makeClient(server->port());

  Bytes binary(1 << 20);
  std::mt19937 gen(7);
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = (i % 7 == 0) ? 0 : static_cast<uint8_t>(gen());
  writer->set("empty", {});
  writer->setString("text", "tcp://10.0.0.1:1234");
  writer->set("binary", binary);

  EXPECT_TRUE(reader->get("empty", 2000ms).empty());
  EXPECT_EQ(reader->getString("text", 2000ms), "tcp://10.0.0.1:1234");
  EXPECT_EQ(reader->get("binary", 2000ms), binary);

  writer->setString("text", "replaced");
  EXPECT_EQ(reader->getString("text", 2000ms), "replaced");
}

TEST(TcpStore, ServingObjectIsAlsoAStore) {
  auto server = makeServer();
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->host(), kLoopback);
  EXPECT_EQ(server->describe(), "tcp://127.0.0.1:" + std::to_string(server->port()));
  server->setString("k", "v");
  EXPECT_EQ(server->getString("k", 1000ms), "v");
  EXPECT_EQ(server->add("n", 3), 3);
  EXPECT_TRUE(server->check({"k", "n"}));
  auto client = makeClient(server->port());
  EXPECT_EQ(client->describe(), server->describe());
  EXPECT_EQ(client->getString("k", 1000ms), "v");
  EXPECT_EQ(client->add("n", 4), 7);
}

TEST(TcpStore, GetOfAMissingKeyTimesOutNamingTheKeyAndTheStore) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  auto start = Clock::now();
  std::string msg;
  try {
    client->get("rank/3/address", 300ms);
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  double elapsed = msSince(start);
  EXPECT_GE(elapsed, 295);
  EXPECT_LT(elapsed, 1300);
  EXPECT_NE(msg.find("'rank/3/address'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tcp://127.0.0.1:" + std::to_string(server->port())), std::string::npos) << msg;
}

TEST(TcpStore, ZeroTimeoutGetAndWaitSucceedWhenTheKeysAreThere) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  server->setString("here", "yes");
  EXPECT_EQ(client->getString("here", 0ms), "yes");
  client->wait({"here"}, 0ms);
  EXPECT_THROW(client->get("absent", 0ms), TimeoutError);
  EXPECT_THROW(client->wait({"here", "absent"}, -5ms), TimeoutError);
}

TEST(TcpStore, StuckServerEndsCallsWithTimeoutErrorInsteadOfHanging) {
  FakeServer stuck(serverHello(2));  // greets, then never answers
  auto client = makeClient(stuck.port(), 300ms);
  auto start = Clock::now();
  std::string msg;
  try {
    client->setString("k", "v");
    ADD_FAILURE() << "set returned without a reply";
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  EXPECT_GE(msSince(start), 290);
  EXPECT_LT(msSince(start), 1500);
  EXPECT_NE(msg.find("no reply"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'k'"), std::string::npos) << msg;
  // get: its own timeout, then the grace (here the connect timeout).
  start = Clock::now();
  EXPECT_THROW(client->get("k", 100ms), TimeoutError);
  EXPECT_GE(msSince(start), 390);
  EXPECT_LT(msSince(start), 1600);
}

TEST(TcpStore, ClientRefusesAStoreOfAnotherProtocolVersionAtOnce) {
  FakeServer future(serverHello(3));
  auto start = Clock::now();
  std::string msg = errorOf([&] { makeClient(future.port(), 3000ms); });
  EXPECT_LT(msSince(start), 1000);
  EXPECT_NE(msg.find("version 3"), std::string::npos) << msg;
}

TEST(TcpStore, ClientDoesNotTakeAnotherServiceForAStore) {
  FakeServer other(serverHello(1, 0x50545448));
  // The wrong magic is refused as soon as it arrives; the generous timeout
  // only covers a loaded machine (sanitizer builds, other tests).
  auto start = Clock::now();
  std::string msg = errorOf([&] { makeClient(other.port(), 3000ms); });
  EXPECT_NE(msg.find("not a gradcomm store"), std::string::npos) << msg;
  // At once: retrying cannot help (it used to retry for the whole timeout,
  // and the last attempt, cut short by it, could report "no reply").
  EXPECT_LT(msSince(start), 1000);
}

TEST(TcpStore, TimedOutGetDoesNotConfuseTheNextReply) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  server->setString("b", "value-of-b");
  EXPECT_THROW(client->get("a", 100ms), TimeoutError);
  // The late answer to the timed-out get must not be taken for this one's.
  server->setString("a", "value-of-a");
  EXPECT_EQ(client->getString("b", 1000ms), "value-of-b");
  EXPECT_EQ(client->getString("a", 1000ms), "value-of-a");
}

TEST(TcpStore, GetWaitsUntilAnotherClientSets) {
  auto server = makeServer();
  auto waiter = makeClient(server->port());
  auto setter = makeClient(server->port());
  auto start = Clock::now();
  auto got = std::async(std::launch::async, [&] { return waiter->getString("late", 5000ms); });
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(got.wait_for(0ms), std::future_status::timeout) << "get returned before the key was set";
  setter->setString("late", "here");
  EXPECT_EQ(got.get(), "here");
  double elapsed = msSince(start);
  EXPECT_GE(elapsed, 140);
  EXPECT_LT(elapsed, 2000);
}

TEST(TcpStore, OneObjectSetsFromOneThreadWhileAnotherWaitsInGet) {
  auto server = makeServer();
  auto shared = makeClient(server->port());
  auto got = std::async(std::launch::async, [&] { return shared->getString("k", 5000ms); });
  std::this_thread::sleep_for(50ms);
  auto start = Clock::now();
  shared->setString("k", "v");
  EXPECT_EQ(got.get(), "v");
  EXPECT_LT(msSince(start), 1000) << "the set waited behind the get";
}

TEST(TcpStore, AddFromEightThreadsTimesAThousandIsExact) {
  auto server = makeServer();
  auto shared = makeClient(server->port());
  auto own = makeClient(server->port());
  constexpr int kThreads = 8, kAdds = 1000;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Half share one object, half another: both contend on the server.
    TcpStore* store = t % 2 ? shared.get() : own.get();
    threads.emplace_back([&, t, store] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(store->add("counter", 1));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(server->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(server->getString("counter", 1000ms), std::to_string(kThreads * kAdds));
  // Every add returned a different value: none was lost or applied twice.
  std::set<int64_t> all;
  for (auto& s : seen) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TEST(TcpStore, AddHandlesNegativeDeltasAndRejectsNonIntegerValues) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  EXPECT_EQ(client->add("n", -5), -5);
  EXPECT_EQ(client->add("n", 12), 7);
  client->setString("text", "not a number");
  std::string msg = errorOf([&] { client->add("text", 1); });
  EXPECT_NE(msg.find("'text'"), std::string::npos) << msg;
  EXPECT_THROW(client->add("text", 1), InvalidArgument);
  EXPECT_EQ(client->getString("text", 1000ms), "not a number");
  client->setString("big", std::to_string(INT64_MAX));
  EXPECT_THROW(client->add("big", 1), InvalidArgument);
  EXPECT_EQ(client->add("n", 0), 7);  // the connection is still in step
}

TEST(TcpStore, ReconnectsOnceAndRetriesWhenTheConnectionBreaks) {
  auto server = makeServer();
  CuttingProxy proxy(server->port());
  auto client = makeClient(proxy.port());
  client->setString("k", "v1");
  proxy.cutAll();
  EXPECT_EQ(client->getString("k", 1000ms), "v1");
  proxy.cutAll();
  client->setString("k", "v2");
  EXPECT_EQ(server->getString("k", 1000ms), "v2");
  proxy.cutAll();
  EXPECT_TRUE(client->check({"k"}));
  proxy.cutAll();
  client->wait({"k"}, 1000ms);
}

TEST(TcpStore, AddWhoseReplyIsLostIsAppliedOnce) {
  auto server = makeServer();
  CuttingProxy proxy(server->port());
  auto client = makeClient(proxy.port());
  EXPECT_EQ(client->add("n", 1), 1);
  proxy.swallowNextReply();
  // The server adds, the reply is lost with the connection, the client
  // reconnects and resends: the answer is the first addition's.
  EXPECT_EQ(client->add("n", 5), 6);
  EXPECT_EQ(proxy.repliesSwallowed(), 1);
  EXPECT_EQ(server->add("n", 0), 6);
  EXPECT_EQ(client->add("n", 1), 7);
}

TEST(TcpStore, ResentAddWithTheSameSequenceIsAppliedOnce) {
  // What a client does after its connection broke before the reply: it
  // reconnects with the same channel id and resends the same sequence.
  auto server = makeServer();
  Bytes reply;
  for (int attempt = 0; attempt < 2; ++attempt) {
    RawSocket s(server->port());
    s.send(hello(0xC0FFEE));
    ASSERT_EQ(s.read(8).size(), 8u);
    s.send(addFrame("once", 5, 1));
    reply = s.read(13);
    ASSERT_EQ(reply.size(), 13u);
    EXPECT_EQ(reply[0], 0);  // ok
    EXPECT_EQ(reply[5], 5);  // the new value, little-endian
  }
  EXPECT_EQ(server->add("once", 0), 5);
  // The next sequence number is a new addition.
  RawSocket s(server->port());
  s.send(hello(0xC0FFEE));
  ASSERT_EQ(s.read(8).size(), 8u);
  s.send(addFrame("once", 5, 2));
  ASSERT_EQ(s.read(13).size(), 13u);
  EXPECT_EQ(server->add("once", 0), 10);
}

TEST(TcpStore, ClientsInProcessesForkedAfterAStoreWasMadeCountOnce) {
  // A launcher that makes the store, then forks its ranks (gradcomm-device-
  // bench does): each child's client must be a channel of its own, or the
  // server takes the second child's first ADD for a resend of the first's.
  auto server = makeServer();
  EXPECT_EQ(server->add("made", 1), 1);  // the parent's own client is in use
  const uint16_t port = server->port();
  std::vector<pid_t> kids;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 1;
      try {
        rc = makeClient(port)->add("ranks", 1) >= 1 ? 0 : 1;
      } catch (...) {
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(waitpid(k, &st, 0), k);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_EQ(server->add("ranks", 0), 3);
}

TEST(TcpStore, CheckIsTrueOnlyWhenEveryKeyIsSet) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  EXPECT_TRUE(client->check({}));
  EXPECT_FALSE(client->check({"a"}));
  client->setString("a", "1");
  EXPECT_TRUE(client->check({"a"}));
  EXPECT_FALSE(client->check({"a", "b"}));
  client->add("b", 0);  // add creates the key
  EXPECT_TRUE(client->check({"a", "b"}));
  EXPECT_TRUE(client->check({"b", "a", "a"}));
}

TEST(TcpStore, WaitReturnsOnlyWhenSeveralKeysSetLaterByAnotherClientAreAllThere) {
  auto server = makeServer();
  auto waiter = makeClient(server->port());
  auto setter = makeClient(server->port());
  setter->setString("k0", "early");
  std::atomic<bool> done{false};
  auto waited = std::async(std::launch::async, [&] {
    waiter->wait({"k0", "k1", "k2", "k3", "k2"}, 5000ms);
    done = true;
  });
  for (const char* k : {"k1", "k2"}) {
    std::this_thread::sleep_for(50ms);
    setter->setString(k, "x");
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(done.load()) << "wait returned with k3 missing";
  setter->add("k3", 1);
  EXPECT_EQ(waited.wait_for(2000ms), std::future_status::ready);
  waited.get();
  EXPECT_TRUE(done.load());
  waiter->wait({"k0", "k3"}, 0ms);  // all there: no wait
}

TEST(TcpStore, MultiGetReturnsTheValuesInOrderOnceAnotherClientSetsTheLast) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  server->set("b", bytesOf("2"));
  server->set("a", bytesOf(""));
  auto setter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    server->set("c", bytesOf("three"));
  });
  auto start = Clock::now();
  auto values = client->multiGet({"c", "a", "b", "c"}, 5000ms);
  EXPECT_GE(msSince(start), 80);
  setter.get();
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(values[0], bytesOf("three"));
  EXPECT_EQ(values[1], bytesOf(""));
  EXPECT_EQ(values[2], bytesOf("2"));
  EXPECT_EQ(values[3], bytesOf("three"));
  EXPECT_TRUE(client->multiGet({}, 0ms).empty());
}

TEST(TcpStore, MultiGetOfMoreKeysThanOneRequestCarriesIsSplitAndTimesOutNamingAMissingKey) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  std::vector<std::string> keys;
  for (int i = 0; i < 9000; ++i) {
    keys.push_back("k" + std::to_string(i));
    server->set(keys.back(), bytesOf(std::to_string(i * 7)));
  }
  auto values = client->multiGet(keys, 5000ms);
  ASSERT_EQ(values.size(), keys.size());
  for (int i = 0; i < 9000; ++i) ASSERT_EQ(values[static_cast<size_t>(i)], bytesOf(std::to_string(i * 7))) << i;
  keys.push_back("absent");
  try {
    client->multiGet(keys, 200ms);
    ADD_FAILURE() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, MultiGetWhoseValuesExceedOneReplyIsAnErrorAndTheConnectionStaysUsable) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  const Bytes big(40u << 20, 7);
  server->set("big1", big);
  server->set("big2", big);
  std::string msg = errorOf([&] { client->multiGet({"big1", "big2"}, 1000ms); });
  EXPECT_NE(msg.find("fetch fewer keys at once"), std::string::npos) << msg;
  EXPECT_EQ(client->multiGet({"big1"}, 1000ms).at(0).size(), big.size());
}

TEST(TcpStore, WaitTimesOutNamingTheKeys) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  server->setString("present", "1");
  auto start = Clock::now();
  std::string msg;
  try {
    client->wait({"present", "absent/one", "absent/two"}, 200ms);
    ADD_FAILURE() << "wait returned";
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  double elapsed = msSince(start);
  EXPECT_GE(elapsed, 195);
  EXPECT_LT(elapsed, 1200);
  EXPECT_NE(msg.find("'absent/one'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'absent/two'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tcp://127.0.0.1:"), std::string::npos) << msg;
}

TEST(TcpStore, ServesThirtyTwoClientsAtOnce) {
  auto server = makeServer();
  constexpr int kClients = 32;
  std::vector<std::string> keys;
  for (int r = 0; r < kClients; ++r) keys.push_back("rank/" + std::to_string(r));
  std::vector<std::string> peerValue(kClients);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kClients; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto c = makeClient(server->port());
        c->setString(keys[r], "address-of-" + std::to_string(r));
        c->wait(keys, 5000ms);
        peerValue[r] = c->getString(keys[(r + 1) % kClients], 1000ms);
        c->add("arrived", 1);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << r << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int r = 0; r < kClients; ++r) EXPECT_EQ(peerValue[r], "address-of-" + std::to_string((r + 1) % kClients));
  EXPECT_EQ(server->add("arrived", 0), kClients);
}

TEST(TcpStore, ClientStartedBeforeTheServerConnectsOnceItAppears) {
  uint16_t port = freePort();
  auto start = Clock::now();
  auto client = std::async(std::launch::async, [&] { return makeClient(port, 5000ms); });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(client.wait_for(0ms), std::future_status::timeout) << "connected to a store that did not exist";
  auto server = makeServer(port);
  auto c = client.get();
  EXPECT_LT(msSince(start), 2000);
  c->setString("hello", "world");
  EXPECT_EQ(server->getString("hello", 1000ms), "world");
}

TEST(TcpStore, ClientOfAnAddressNobodyServesFailsAfterTheConnectTimeout) {
  uint16_t port = freePort();
  auto start = Clock::now();
  std::string msg;
  try {
    makeClient(port, 300ms);
    ADD_FAILURE() << "connected to nobody";
  } catch (const TransportError& e) {
    msg = e.what();
  }
  double elapsed = msSince(start);
  EXPECT_GE(elapsed, 250);
  EXPECT_LT(elapsed, 2000);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("could not reach"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
}

TEST(TcpStore, BindingAPortInUseFailsNamingHostAndPort) {
  auto server = makeServer();
  std::string msg = errorOf([&] { makeServer(server->port()); });
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(server->port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("address in use"), std::string::npos) << msg;
  EXPECT_THROW(makeServer(server->port()), TransportError);
  expectStoreWorks(server->port(), "after-bind-failure");
}

TEST(TcpStore, ServerDropsGarbageAndKeepsServingOthers) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  client->setString("before", "1");

  std::vector<std::pair<std::string, Bytes>> garbage;
  Bytes random(4096);
  std::mt19937 gen(11);
  for (auto& b : random) b = static_cast<uint8_t>(gen());
  random[0] = 'X';  // not the magic's first byte
  garbage.emplace_back("random bytes", random);
  garbage.emplace_back("bad magic", hello(0, 0xDEADBEEF));
  Bytes absurd = hello();
  absurd.push_back(1);  // SET
  putU32(absurd, 0xFFFFFFFFu);
  garbage.emplace_back("absurd length", absurd);
  Bytes unknownOp = hello();
  unknownOp.push_back(99);
  putU32(unknownOp, 0);
  garbage.emplace_back("unknown op", unknownOp);
  Bytes lyingKey = hello();
  lyingKey.push_back(2);  // GET whose key claims more bytes than the payload has
  putU32(lyingKey, 8);
  putU32(lyingKey, 1000);
  putU32(lyingKey, 0);
  garbage.emplace_back("key longer than its payload", lyingKey);
  Bytes bigKey = hello();
  bigKey.push_back(1);  // SET with a 5000-byte key inside an allowed frame
  putU32(bigKey, 4 + 5000 + 4);
  putU32(bigKey, 5000);
  bigKey.resize(bigKey.size() + 5000, 'k');
  putU32(bigKey, 0);
  garbage.emplace_back("oversize key", bigKey);

  for (auto& [what, bytes] : garbage) {
    RawSocket s(server->port());
    s.send(bytes);
    EXPECT_TRUE(s.closedByPeer()) << what << ": the server kept the connection";
    EXPECT_EQ(client->getString("before", 1000ms), "1") << what;
  }
  expectStoreWorks(server->port(), "after-garbage");
}

TEST(TcpStore, ClientsThatDisconnectMidFrameOrWhileWaitingDoNotBreakTheServer) {
  auto server = makeServer();
  {
    RawSocket s(server->port());
    Bytes partial = hello();
    partial.push_back(1);  // SET of 100 bytes, of which 10 arrive
    putU32(partial, 100);
    partial.resize(partial.size() + 10, 'x');
    s.send(partial);
  }
  {
    RawSocket s(server->port());
    Bytes halfHello = hello();
    halfHello.resize(6);
    s.send(halfHello);
  }
  {
    // A waiter that goes away: setting its key later must not write to it.
    RawSocket s(server->port());
    s.send(hello());
    ASSERT_EQ(s.read(8).size(), 8u);
    s.send(getFrame("abandoned", 10000));
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(50ms);
  server->setString("abandoned", "nobody listens");
  expectStoreWorks(server->port(), "after-disconnects");
  EXPECT_EQ(server->getString("abandoned", 1000ms), "nobody listens");
}

TEST(TcpStore, RecreatedClientSeesTheOldKeys) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  client->setString("config", "ring");
  client->add("epoch", 2);
  client.reset();
  client = makeClient(server->port());
  EXPECT_EQ(client->getString("config", 1000ms), "ring");
  EXPECT_EQ(client->add("epoch", 1), 3);
}

TEST(TcpStore, DestroyingTheServerEndsAWaitingGetWithAnError) {
  auto server = makeServer();
  auto client = makeClient(server->port());
  auto got = std::async(std::launch::async, [&] {
    try {
      client->get("never", 10000ms);
      return std::string("returned a value");
    } catch (const TransportError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("wrong error: ") + e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  auto start = Clock::now();
  server.reset();
  ASSERT_EQ(got.wait_for(3000ms), std::future_status::ready) << "the get hangs on a destroyed server";
  std::string msg = got.get();
  EXPECT_LT(msSince(start), 2000);
  EXPECT_NE(msg.find("rendezvous store"), std::string::npos) << msg;
  // And the next call fails at once rather than waiting out its timeout.
  start = Clock::now();
  EXPECT_THROW(client->get("never", 10000ms), TransportError);
  EXPECT_LT(msSince(start), 2000);
}

TEST(TcpStore, LeavesNoDescriptorsOpenOnceDestroyed) {
  auto openFds = [] {
    size_t n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd"); it != std::filesystem::directory_iterator(); ++it) ++n;
    return n;
  };
  size_t before = openFds();
  {
    auto server = makeServer();
    std::vector<std::unique_ptr<TcpStore>> clients;
    for (int i = 0; i < 3; ++i) clients.push_back(makeClient(server->port()));
    auto waiting = std::async(std::launch::async, [&] { return clients[0]->getString("k", 2000ms); });
    std::this_thread::sleep_for(20ms);
    clients[0]->setString("k", "v");  // a second connection of the same client
    EXPECT_EQ(waiting.get(), "v");
    EXPECT_THROW(clients[1]->get("absent", 10ms), TimeoutError);
    clients[2]->add("n", 1);
    RawSocket garbage(server->port());
    garbage.send(hello(0, 0xBAD));
    EXPECT_TRUE(garbage.closedByPeer());
  }
  EXPECT_EQ(openFds(), before);
  // Failed constructions too.
  EXPECT_THROW(makeClient(freePort(), 50ms), TransportError);
  EXPECT_EQ(openFds(), before);
  auto holder = makeServer();
  size_t withHolder = openFds();
  EXPECT_THROW(makeServer(holder->port()), TransportError);
  EXPECT_EQ(openFds(), withHolder);
}

TEST(TcpStore, RejectsOversizeKeysAndValuesBeforeSending) {
  auto server = makeServer();
  EXPECT_THROW(server->set(std::string(4097, 'k'), {}), InvalidArgument);
  EXPECT_THROW(server->get(std::string(4097, 'k'), 10ms), InvalidArgument);
  EXPECT_THROW(server->set("k", Bytes((size_t{64} << 20) + 1)), InvalidArgument);
  server->set(std::string(4096, 'k'), bytesOf("max key"));
  EXPECT_EQ(server->getString(std::string(4096, 'k'), 1000ms), "max key");
}

TEST(PrefixStore, IsolatesTwoPrefixes) {
  auto server = makeServer();
  auto base = std::shared_ptr<Store>(makeClient(server->port()));
  PrefixStore a("comm0", base), b("comm1", base);
  a.setString("rank0", "A");
  b.setString("rank0", "B");
  EXPECT_EQ(a.getString("rank0", 1000ms), "A");
  EXPECT_EQ(b.getString("rank0", 1000ms), "B");
  EXPECT_EQ(base->getString("comm0/rank0", 1000ms), "A");
  a.setString("only-a", "1");
  EXPECT_TRUE(a.check({"rank0", "only-a"}));
  EXPECT_FALSE(b.check({"only-a"}));
  EXPECT_THROW(b.get("only-a", 50ms), TimeoutError);
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_EQ(a.add("n", 0), 2);
  b.setString("only-a", "now b too");
  b.wait({"rank0", "only-a"}, 1000ms);
  EXPECT_NE(a.describe().find("comm0"), std::string::npos) << a.describe();
  EXPECT_NE(a.describe().find(base->describe()), std::string::npos) << a.describe();
  std::string msg = errorOf([&] { b.get("missing", 20ms); });
  EXPECT_NE(msg.find("comm1/missing"), std::string::npos) << msg;
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
}

// ---- the rendezvous port of an mpirun job on one host ----------------------------------

namespace {

/// What this machine's kernel hands out to outgoing connections, read here
/// independently of the library.
gradcomm::core::PortRange ephemeralFromProc() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  gradcomm::core::PortRange r{32768, 60999};
  in >> r.lo >> r.hi;
  return r;
}

std::vector<std::string> someJobIds() {
  // Open MPI's jobids of consecutive runs, PMIx namespaces, small numbers.
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i) ids.push_back(std::to_string(3456565249u + 65536u * static_cast<unsigned>(i)));
  for (int i = 0; i < 32; ++i) ids.push_back("prterun-node1-" + std::to_string(4000 + i) + "@1");
  for (int i = 0; i < 32; ++i) ids.push_back(std::to_string(i));
  return ids;
}

}  // namespace

// A derived port inside the ephemeral range can already be some outgoing
// connection's local port (rank 0 then cannot serve the store), or be taken
// by one while the job starts.
TEST(MpirunRendezvousPort, NeverLiesInTheEphemeralRangeThisMachineUses) {
  const auto eph = ephemeralFromProc();
  const auto lib = gradcomm::core::ephemeralPortRange();
  EXPECT_EQ(lib.lo, eph.lo);
  EXPECT_EQ(lib.hi, eph.hi);
  for (const auto& id : someJobIds()) {
    const int port = gradcomm::core::mpirunRendezvousPort(id, lib);
    EXPECT_TRUE(port < eph.lo || port > eph.hi) << "job " << id << ": port " << port << " is inside " << eph.lo
                                                 << "-" << eph.hi;
    EXPECT_GE(port, 1024) << "job " << id;
  }
}

TEST(MpirunRendezvousPort, JobsWithDifferentIdsGetDifferentPorts) {
  const auto eph = ephemeralFromProc();
  const auto ids = someJobIds();
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_NE(gradcomm::core::mpirunRendezvousPort(ids[i], eph), gradcomm::core::mpirunRendezvousPort(ids[i + 1], eph))
        << ids[i] << " and " << ids[i + 1];
  }
  // Every rank of one job computes the same port.
  EXPECT_EQ(gradcomm::core::mpirunRendezvousPort("3456565249", eph),
            gradcomm::core::mpirunRendezvousPort("3456565249", eph));
}

// Other ephemeral ranges: the port stays outside whatever the range is, and
// where no room is left the error says what to set instead.
TEST(MpirunRendezvousPort, FollowsOtherEphemeralRangesAndSaysWhatToDoWhenNoneIsLeft) {
  for (const gradcomm::core::PortRange eph : {gradcomm::core::PortRange{32768, 60999}, {10000, 65535},
                                             {1024, 30000}, {15000, 40000}, {49152, 65535}}) {
    for (const auto& id : someJobIds()) {
      const int port = gradcomm::core::mpirunRendezvousPort(id, eph);
      EXPECT_TRUE(port < eph.lo || port > eph.hi) << eph.lo << "-" << eph.hi << ": " << port;
      EXPECT_GE(port, 1024);
    }
  }
  try {
    gradcomm::core::mpirunRendezvousPort("1", {1024, 65535});
    ADD_FAILURE() << "no error with every unprivileged port ephemeral";
  } catch (const gradcomm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("GRADCOMM_RENDEZVOUS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ip_local_port_range"), std::string::npos) << e.what();
  }
}
