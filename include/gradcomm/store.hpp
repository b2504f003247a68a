#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// A key-value store that the ranks of a job share, used only to form
/// communicators: ranks publish their transport addresses, host keys and
/// configuration, and read each other's. Values are bytes. Implementations
/// are safe to call from several threads.
///
/// Every blocking call takes a timeout and throws TimeoutError (naming the
/// keys and the store) when it runs out, never blocks forever; a store that
/// cannot be reached throws TransportError.
class GRADCOMM_API Store {
 public:
  using Bytes = std::vector<uint8_t>;
  virtual ~Store() = default;

  /// Sets `key` to `value` (replacing any earlier value).
  virtual void set(const std::string& key, const Bytes& value) = 0;
  /// The value of `key`, waiting up to `timeout` for it to be set.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Adds `delta` to the integer stored at `key` (0 when absent) and
  /// returns the new value. add(key, 0) reads the counter.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// True when every key is set; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Waits up to `timeout` until every key is set.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// The values of `keys`, in their order, waiting up to `timeout` until
  /// every one is set. The default gets them one at a time; TcpStore fetches
  /// up to 4,096 keys per request (the values of one request must fit in
  /// 64 MiB, else InvalidArgument).
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Where the store lives, for error messages ("tcp://host:port", "mpi").
  virtual std::string describe() const = 0;

  /// Convenience: set/get of text values.
  void setString(const std::string& key, const std::string& value);
  std::string getString(const std::string& key, std::chrono::milliseconds timeout);
};

/// A view of a store in which every key is prefixed with `prefix` + "/", so
/// several communicators can rendezvous through one store.
class GRADCOMM_API PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::string describe() const override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

/// A store served over TCP by one process (usually rank 0's) from a
/// background thread; every other process is a client.
///
/// The server accepts any number of clients at once and survives a client
/// that disconnects or sends bytes that are not the protocol (it drops that
/// connection). Clients retry the connection until `connectTimeout` (the
/// server may start later than they do), then throw TransportError naming
/// host:port.
class GRADCOMM_API TcpStore : public Store {
 public:
  struct Options {
    /// Serve the store from this process (binds host:port; port 0 picks a
    /// free port, see port()).
    bool isServer = false;
    /// How long a client keeps trying to connect, and the default for
    /// operations without their own timeout.
    std::chrono::milliseconds connectTimeout{std::chrono::seconds(60)};
  };

  /// Server: binds `host` ("" or "0.0.0.0" for every interface) and
  /// `port`, then connects to itself. Client: connects to host:port.
  TcpStore(const std::string& host, uint16_t port, const Options& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  /// The port served or connected to (the chosen one when 0 was asked).
  uint16_t port() const;
  const std::string& host() const;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradcomm
