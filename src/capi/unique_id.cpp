// An ncclUniqueId is a rendezvous address: "GCNCCL1" magic, the port and
// host of the TcpStore that the process calling ncclGetUniqueId serves, and
// 16 random bytes naming the job's keys in it (so several jobs, or several
// communicators, can share one store).
#include <cstring>

#include "capi/comm.hpp"

namespace gradcomm::capi {
namespace {
constexpr char kMagic[8] = "GCNCCL1";
constexpr size_t kPortAt = 8;
constexpr size_t kKeyAt = 10;
constexpr size_t kHostAt = 26;
constexpr size_t kHostMax = NCCL_UNIQUE_ID_BYTES - kHostAt - 1;
}  // namespace

std::string UniqueIdContents::keyHex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : key) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

void encodeUniqueId(const UniqueIdContents& c, ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, kMagic, sizeof kMagic);
  id->internal[kPortAt] = static_cast<char>(c.port >> 8);
  id->internal[kPortAt + 1] = static_cast<char>(c.port & 0xff);
  std::memcpy(id->internal + kKeyAt, c.key, sizeof c.key);
  std::memcpy(id->internal + kHostAt, c.host.data(), std::min(c.host.size(), kHostMax));
}

bool decodeUniqueId(const ncclUniqueId& id, UniqueIdContents* c, std::string* why) {
  if (std::memcmp(id.internal, kMagic, sizeof kMagic) != 0) {
    *why = "commId was not made by gradcomm's ncclGetUniqueId (every rank must get the id from the one process "
           "that called ncclGetUniqueId, through gradcomm's NCCL library)";
    return false;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  c->port = static_cast<uint16_t>(p[kPortAt] << 8 | p[kPortAt + 1]);
  std::memcpy(c->key, p + kKeyAt, sizeof c->key);
  const char* host = id.internal + kHostAt;
  c->host.assign(host, strnlen(host, kHostMax));
  if (c->port == 0 || c->host.empty()) {
    *why = "commId is damaged (no port or host in it)";
    return false;
  }
  return true;
}

}  // namespace gradcomm::capi
