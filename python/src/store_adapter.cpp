#include "store_adapter.hpp"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "gradcomm/error.hpp"

namespace gradcomm::torch_backend {
namespace {

std::string describeStore(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> s = store;
  // init_process_group wraps the rendezvous store in PrefixStores.
  for (int depth = 0; depth < 16; ++depth) {
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(s.get());
    if (!prefix) break;
    s = prefix->getUnderlyingStore();
  }
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) {
    return "tcp://" + tcp->getHost() + ":" + std::to_string(tcp->getPort()) + " (torch.distributed TCPStore)";
  }
  if (auto* file = dynamic_cast<c10d::FileStore*>(s.get())) {
    return "file://" + file->getPath() + " (torch.distributed FileStore)";
  }
  if (dynamic_cast<c10d::HashStore*>(s.get())) return "torch.distributed HashStore (this process only)";
  return "the torch.distributed store of init_process_group";
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > 4) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

}  // namespace

C10dStoreAdapter::C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store)
    : store_(std::move(store)), where_(describeStore(store_)) {}

void C10dStoreAdapter::translate(const std::exception& e, const std::string& what) const {
  const std::string msg = e.what();
  // c10d reports every timeout as an error whose text says so.
  if (msg.find("imeout") != std::string::npos || msg.find("imed out") != std::string::npos) {
    throw TimeoutError(what + " at the rendezvous " + where_ + " timed out: " + msg);
  }
  throw TransportError(what + " at the rendezvous " + where_ + " failed: " + msg);
}

void C10dStoreAdapter::set(const std::string& key, const Bytes& value) {
  try {
    store_->set(key, value);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    translate(e, "set(" + key + ")");
  }
}

Store::Bytes C10dStoreAdapter::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  try {
    return store_->get(key);
  } catch (const std::exception& e) {
    translate(e, "get(" + key + ")");
  }
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    translate(e, "add(" + key + ")");
  }
}

bool C10dStoreAdapter::check(const std::vector<std::string>& keys) {
  try {
    return store_->check(keys);
  } catch (const std::exception& e) {
    translate(e, "check(" + joinKeys(keys) + ")");
  }
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    // c10d treats a zero timeout as "none"; gradcomm's callers never pass 0.
    store_->wait(keys, std::max(timeout, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    translate(e, "wait(" + joinKeys(keys) + ")");
  }
}

}  // namespace gradcomm::torch_backend
