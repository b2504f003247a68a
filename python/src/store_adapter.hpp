#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gradcomm/store.hpp"

namespace gradcomm::torch_backend {

/// gradcomm's Store over the c10d::Store that init_process_group hands a
/// backend (a PrefixStore over torchrun's, tcp:// or file:// store), so the
/// communicator rendezvouses where torch.distributed already did.
class C10dStoreAdapter : public Store {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  /// c10d's get blocks for the store's own timeout: wait for the key with
  /// ours first, then read it.
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  /// "tcp://host:port (torch.distributed store)", "file://path (...)", ...
  std::string describe() const override { return where_; }

 private:
  /// Rethrows a c10d error as gradcomm's TimeoutError or TransportError,
  /// naming the keys and the store.
  [[noreturn]] void translate(const std::exception& e, const std::string& what) const;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
};

}  // namespace gradcomm::torch_backend
