#include "gradcomm/store.hpp"

#include <algorithm>
#include <utility>

#include "gradcomm/error.hpp"

namespace gradcomm {

void Store::setString(const std::string& key, const std::string& value) {
  set(key, Bytes(value.begin(), value.end()));
}

std::string Store::getString(const std::string& key, std::chrono::milliseconds timeout) {
  Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

std::vector<Store::Bytes> Store::multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // One deadline for all of them, as a single wait would have.
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::vector<Bytes> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    out.push_back(get(k, std::max(left, std::chrono::milliseconds(0))));
  }
  return out;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidArgument("PrefixStore '" + prefix_ + "': the base store is null");
}

void PrefixStore::set(const std::string& k, const Bytes& value) { base_->set(key(k), value); }

Store::Bytes PrefixStore::get(const std::string& k, std::chrono::milliseconds timeout) {
  return base_->get(key(k), timeout);
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return base_->add(key(k), delta); }

bool PrefixStore::check(const std::vector<std::string>& ks) { return base_->check(keys(ks)); }

void PrefixStore::wait(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  base_->wait(keys(ks), timeout);
}

std::vector<Store::Bytes> PrefixStore::multiGet(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  return base_->multiGet(keys(ks), timeout);
}

std::string PrefixStore::describe() const { return base_->describe() + " (prefix '" + prefix_ + "')"; }

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const std::string& k : ks) out.push_back(key(k));
  return out;
}

}  // namespace gradcomm
