#pragma once
// A transport that passes every point-to-point call on to another one, for
// tests that watch or disturb some of them: derive and override those.
// Shared memory is not passed on (sharedMemory() stays null), so every
// peer is reached by messages.
#include <memory>
#include <string>

#include "transport/transport.hpp"

namespace gradcomm::testing {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    return inner_->isend(peer, data, bytes, tag);
  }
  transport::RequestPtr irecv(int peer, void* data, size_t bytes, const transport::Tag& tag) override {
    return inner_->irecv(peer, data, bytes, tag);
  }
  bool probeMismatch(int peer, const transport::Tag& expected) override { return inner_->probeMismatch(peer, expected); }
  transport::RequestPtr irecvAny(void* data, size_t capacity, const transport::Tag& tag) override {
    return inner_->irecvAny(data, capacity, tag);
  }

 protected:
  transport::Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace gradcomm::testing
