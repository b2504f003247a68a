// Communicators of the NCCL ABI: unique ids, creation, split, destruction,
// queries and errors. A communicator is a gradcomm Communicator formed
// through the TcpStore named by the unique id, plus the real NCCL's
// communicator where device buffers can occur.
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>

#include "capi/api_common.hpp"
#include "capi/cuda_probe.hpp"
#include "capi/forward.hpp"
#include "capi/group.hpp"
#include "capi/real_init.hpp"

using namespace gradcomm;
using namespace gradcomm::capi;

namespace {

constexpr unsigned int kConfigMagic = 0xcafebeef;

/// Stores this process serves (it called ncclGetUniqueId), by job key. The
/// server is held here until a communicator of this process is formed
/// through it; from then on only the communicators formed through it hold
/// it (and the server thread and its sockets end with the last of them).
/// An id no communicator of this process uses stays served: another
/// process may join through it at any time before this one exits.
struct Served {
  std::shared_ptr<TcpStore> unused;  ///< held until the first communicator forms
  std::weak_ptr<TcpStore> live;      ///< held by the communicators formed through it
};
struct Stores {
  std::mutex mu;
  std::map<std::string, Served> served;
};
Stores& stores() {
  static Stores* s = new Stores();
  return *s;
}

/// The store this process serves for job `key`, or null when it serves
/// none (any more): the caller then connects to it as a client.
std::shared_ptr<Store> servedStore(const std::string& key) {
  std::lock_guard<std::mutex> lock(stores().mu);
  auto it = stores().served.find(key);
  if (it == stores().served.end()) return nullptr;
  std::shared_ptr<TcpStore> s = it->second.unused ? std::move(it->second.unused) : it->second.live.lock();
  if (!s) {
    stores().served.erase(it);
    return nullptr;
  }
  it->second.live = s;
  return s;
}

/// gradcomm's options for the shim's communicators: NCCL_DEBUG (WARN, INFO,
/// TRACE) sets the log level where GRADCOMM_LOG_LEVEL is not set. Device
/// calls the real NCCL cannot serve are staged (GRADCOMM_DEVICE_ENGINE
/// where not set): the shim forwards the others itself, and choosing
/// gradcomm's engine is an exchange with every rank at the first device
/// call, which ranks of ncclCommInitAll driven by one thread (one call
/// after another in a group) would wait on forever.
Options shimOptions() {
  Options options;
  if (!std::getenv("GRADCOMM_DEVICE_ENGINE")) options.set("GRADCOMM_DEVICE_ENGINE", "staged");
  const char* own = std::getenv("GRADCOMM_LOG_LEVEL");
  const char* nccl = std::getenv("NCCL_DEBUG");
  if ((own && *own) || !nccl) return options;
  std::string level(nccl);
  for (char& ch : level) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // NCCL's VERSION and ABORT have no gradcomm level: the default stands.
  if (level == "warn") options.set("GRADCOMM_LOG_LEVEL", "warn");
  else if (level == "info") options.set("GRADCOMM_LOG_LEVEL", "info");
  else if (level == "trace") options.set("GRADCOMM_LOG_LEVEL", "debug");
  return options;
}

std::chrono::milliseconds storeTimeout() {
  try {
    const auto t = operationTimeout();
    if (t.count() > 0) return std::chrono::duration_cast<std::chrono::milliseconds>(t);
  } catch (const Error&) {
  }
  return std::chrono::seconds(300);
}

/// Forms comm->host through the store at `prefix`, scoped in `base`.
void formHost(ncclComm& comm, std::shared_ptr<Store> base, const std::string& prefix) {
  auto scoped = std::make_shared<PrefixStore>(prefix, base);
  comm.host = communicatorFromStore(scoped, comm.rank, comm.nranks, shimOptions());
  comm.store = std::move(base);
  comm.prefix = prefix;
}

/// Every rank's `state` for one step of the real NCCL's creation (1 done,
/// 0 not possible here, -1 failed with `why`). When any rank failed, throws
/// on every rank, naming the first that failed and its reason: a failed
/// rank leaves it in the job's store before the allgather, so every rank can
/// read it after. Returns the lowest state otherwise.
int32_t agreeOnRealStep(ncclComm& comm, const char* step, int32_t state, ncclResult_t result,
                        const std::string& why) {
  PrefixStore failures(comm.prefix + "/realinit/" + step, comm.store);
  if (state < 0) failures.set("rank" + std::to_string(comm.rank), Store::Bytes(why.begin(), why.end()));
  std::vector<int32_t> states(static_cast<size_t>(comm.nranks), 0);
  comm.host.allgather(&state, states.data(), 1, DataType::kInt32).wait();
  const auto lowest = std::min_element(states.begin(), states.end());
  if (*lowest >= 0) return *lowest;
  const int failed = static_cast<int>(lowest - states.begin());
  std::string reason = why;
  if (failed != comm.rank) {
    const Store::Bytes b = failures.get("rank" + std::to_string(failed), storeTimeout());
    reason.assign(b.begin(), b.end());
  }
  throw NcclError(failed == comm.rank ? result : ncclRemoteError,
                  "the real NCCL's communicator creation failed on rank " + std::to_string(failed) + " of " +
                      std::to_string(comm.nranks) + " (so every rank's fails): " + reason);
}

/// Why the ranks of `comm` cannot have a real NCCL communicator because two
/// of them use one GPU (`identity`: this rank's, see
/// RealInitHooks::deviceIdentity), or "". The same on every rank. Where
/// every rank sets NCCL_MULTI_RANK_GPU_ENABLE=1 (newer NCCL releases accept
/// ranks that share a GPU when asked), the real NCCL decides.
std::string sharedGpu(ncclComm& comm, const std::string& identity) {
  constexpr size_t kSlot = 128;  // byte 0: the opt-in; then the identity
  std::vector<char> all(kSlot * static_cast<size_t>(comm.nranks), 0);
  std::vector<char> mine(kSlot, 0);
  const char* optIn = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  mine[0] = optIn && std::string(optIn) == "1" ? 1 : 0;
  std::memcpy(mine.data() + 1, identity.data(), std::min(identity.size(), kSlot - 2));
  comm.host.allgather(mine.data(), all.data(), kSlot, DataType::kUInt8).wait();
  bool everyOptedIn = true;
  for (int r = 0; r < comm.nranks; ++r) everyOptedIn = everyOptedIn && all[static_cast<size_t>(r) * kSlot] == 1;
  if (everyOptedIn) return {};
  std::map<std::string, int> first;  // identity -> its lowest rank
  for (int r = 0; r < comm.nranks; ++r) {
    const std::string id(all.data() + static_cast<size_t>(r) * kSlot + 1);
    if (id.empty()) continue;
    const auto seen = first.emplace(id, r);
    if (seen.second) continue;
    return "ranks " + std::to_string(seen.first->second) + " and " + std::to_string(r) + " share one GPU (" + id +
           "), which the real NCCL refuses: collectives and point-to-point transfers on device buffers go "
           "through gradcomm's staged path (host memory)";
  }
  return {};
}

/// Forms the real NCCL's communicator of the same ranks on `device` (the
/// caller's current device when it called ncclCommInitRank), when every
/// rank has a working GPU and a real NCCL. The ranks agree over the host
/// communicator before the real init (so no rank enters it, to wait there
/// for a rank whose device cannot be selected) and after: when the
/// creation failed on any rank, every rank gives its real communicator
/// back and throws, naming that rank and why.
void attachReal(ncclComm& comm, int device, ncclConfig_t* config) {
  const auto hooks = realInitHooks();
  const std::string unusable = hooks->unusable();
  int32_t state = unusable.empty() ? 1 : 0;
  ncclResult_t r = ncclSuccess;
  std::string why;
  if (state == 1) {
    r = hooks->selectDevice(device);
    if (r != ncclSuccess) {
      state = -1;
      why = lastError();
    }
  }
  if (agreeOnRealStep(comm, "device", state, r, why) == 0) {
    comm.realWhy = unusable.empty() ? "another rank has no working GPU or no real NCCL" : unusable;
    return;
  }
  // Ranks that share a GPU never enter the real init (NCCL refuses them
  // there, failing every rank's creation).
  comm.realWhy = sharedGpu(comm, hooks->deviceIdentity ? hooks->deviceIdentity(device) : std::string());
  if (!comm.realWhy.empty()) {
    comm.cudaDevice = device;
    noteOnce(comm.rank, "NCCL shim: no real NCCL communicator: " + comm.realWhy);
    return;
  }
  // Byte 0: whether rank 0 got a real id; then the id.
  std::vector<char> msg(1 + sizeof(ncclUniqueId), 0);
  if (comm.rank == 0) {
    ncclUniqueId rid;
    if (hooks->getUniqueId(&rid) == ncclSuccess) {
      msg[0] = 1;
      std::memcpy(msg.data() + 1, &rid, sizeof rid);
    }
  }
  comm.host.broadcast(msg.data(), msg.data(), msg.size(), DataType::kUInt8, 0).wait();
  if (!msg[0]) {
    comm.realWhy = "the real NCCL's ncclGetUniqueId failed on rank 0";
    return;
  }
  ncclUniqueId rid;
  std::memcpy(&rid, msg.data() + 1, sizeof rid);
  ncclComm_t real = nullptr;
  r = hooks->initRank(&real, comm.nranks, rid, comm.rank, device, config);
  why = r == ncclSuccess ? std::string() : std::string(lastError());
  try {
    agreeOnRealStep(comm, "init", r == ncclSuccess ? 1 : -1, r, why);
  } catch (...) {
    if (real) hooks->destroy(real, /*abort=*/true);  // a peer has none
    throw;
  }
  comm.real = real;
  comm.cudaDevice = device;
}

/// A caller's ncclConfig_t and the strings it points to, owned: the
/// caller's may be gone by the time a group's communicators form.
struct ConfigCopy {
  explicit ConfigCopy(const ncclConfig_t& from) {
    // A program built against an older nccl.h passes a shorter struct
    // (its `size` says how long); the rest keeps NCCL's defaults.
    const size_t bytes = std::min(from.size, sizeof(ncclConfig_t));
    if (bytes > 0) std::memcpy(static_cast<void*>(&config), &from, bytes);
    config.size = sizeof(ncclConfig_t);
    if (config.netName) config.netName = (netName = config.netName).c_str();
    if (config.commName) config.commName = (commName = config.commName).c_str();
  }
  ConfigCopy(const ConfigCopy&) = delete;
  ConfigCopy& operator=(const ConfigCopy&) = delete;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::string netName, commName;
};

ncclResult_t checkConfig(const char* fn, const ncclConfig_t* config) {
  if (config && config->magic != kConfigMagic) {
    return invalidArgument(fn, "config", "not initialised with NCCL_CONFIG_INITIALIZER");
  }
  return ncclSuccess;
}

ncclResult_t initRank(const char* fn, ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank,
                      ncclConfig_t* config) {
  if (!newcomm) return invalidArgument(fn, "comm", "NULL");
  *newcomm = nullptr;
  if (nranks < 1) return invalidArgument(fn, "nranks", std::to_string(nranks) + " (must be at least 1)");
  if (rank < 0 || rank >= nranks) {
    return invalidArgument(fn, "rank", std::to_string(rank) + " is outside [0, " + std::to_string(nranks) + ")");
  }
  if (auto r = checkConfig(fn, config)) return r;
  UniqueIdContents ids;
  std::string why;
  if (!decodeUniqueId(id, &ids, &why)) return invalidArgument(fn, "commId", why);

  auto comm = std::make_unique<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  ncclComm* c = comm.get();
  // Inside a group this forms at ncclGroupEnd, on another thread: the
  // caller's config (often on its stack) and current device are taken now.
  std::shared_ptr<ConfigCopy> configCopy = config ? std::make_shared<ConfigCopy>(*config) : nullptr;
  const int device = realInitHooks()->currentDevice();
  auto form = [c, ids, configCopy, device] {
    std::shared_ptr<Store> base = servedStore(ids.keyHex());
    if (!base) {
      TcpStore::Options so;
      so.connectTimeout = storeTimeout();
      base = std::make_shared<TcpStore>(ids.host, ids.port, so);
    }
    formHost(*c, base, "nccl/" + ids.keyHex());
    attachReal(*c, device, configCopy ? &configCopy->config : nullptr);
  };
  // In a group it forms at ncclGroupEnd, concurrently with the other inits.
  if (inGroup()) enqueue(PendingInit{c, form});
  else form();
  *newcomm = comm.release();
  return ncclSuccess;
}

/// Ends `comm` and frees it once no host call uses it: a call blocked on
/// another thread (ncclCommAbort from a watchdog) is woken, as its waits
/// fail, and leaves before the memory goes.
void destroyComm(ncclComm_t comm, bool abort) {
  {
    std::lock_guard<std::mutex> lock(comm->useMu);
    comm->closing = true;
  }
  if (comm->real) {
    realInitHooks()->destroy(comm->real, abort);
    comm->real = nullptr;
  }
  if (comm->host.valid()) comm->host.destroy();
  {
    std::unique_lock<std::mutex> lock(comm->useMu);
    comm->useCv.wait(lock, [comm] { return comm->users == 0; });
  }
  comm->magic = 0;
  delete comm;
}

/// ncclCommDestroy (abort false) and ncclCommAbort (true).
ncclResult_t endComm(const char* fn, ncclComm_t comm, bool abort) {
  return guarded(fn, [&]() -> ncclResult_t {
    if (!comm) return ncclSuccess;  // as NCCL: ending NULL is a no-op
    if (auto r = checkHandle(comm, fn)) return r;
    destroyComm(comm, abort);
    return ncclSuccess;
  });
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return invalidArgument("ncclGetVersion", "version", "NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  static const char* fn = "ncclGetUniqueId";
  return guarded(fn, [&]() -> ncclResult_t {
    if (!uniqueId) return invalidArgument(fn, "uniqueId", "NULL");
    UniqueIdContents ids;
    if (getrandom(ids.key, sizeof ids.key, 0) != static_cast<ssize_t>(sizeof ids.key)) {
      return fail(ncclSystemError, std::string(fn) + ": getrandom failed: " + std::strerror(errno));
    }
    // The id carries an address the other ranks can reach: this host's name,
    // unless GRADCOMM_NCCL_ID_ADDR names the interface address to use.
    const char* addr = std::getenv("GRADCOMM_NCCL_ID_ADDR");
    if (addr && *addr) {
      ids.host = addr;
    } else {
      char name[256] = {};
      if (gethostname(name, sizeof name - 1) != 0) {
        return fail(ncclSystemError, std::string(fn) + ": gethostname failed: " + std::strerror(errno));
      }
      ids.host = name;
    }
    TcpStore::Options so;
    so.isServer = true;
    so.connectTimeout = storeTimeout();
    auto server = std::make_shared<TcpStore>("", 0, so);
    ids.port = server->port();
    {
      std::lock_guard<std::mutex> lock(stores().mu);
      // Forget the jobs whose communicators are all gone.
      for (auto it = stores().served.begin(); it != stores().served.end();) {
        it = !it->second.unused && it->second.live.expired() ? stores().served.erase(it) : std::next(it);
      }
      stores().served[ids.keyHex()].unused = server;
    }
    encodeUniqueId(ids, uniqueId);
    return ncclSuccess;
  });
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  static const char* fn = "ncclCommInitRank";
  return guarded(fn, [&] { return initRank(fn, comm, nranks, commId, rank, nullptr); });
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  static const char* fn = "ncclCommInitRankConfig";
  return guarded(fn, [&] { return initRank(fn, comm, nranks, commId, rank, config); });
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  static const char* fn = "ncclCommInitRankScalable";
  return guarded(fn, [&]() -> ncclResult_t {
    if (nId < 1 || !commIds) return invalidArgument(fn, "commIds", "at least one unique id is needed");
    // One store serves every rank: the first id names it.
    return initRank(fn, newcomm, nranks, commIds[0], myrank, config);
  });
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  static const char* fn = "ncclCommInitAll";
  return guarded(fn, [&]() -> ncclResult_t {
    if (!comms) return invalidArgument(fn, "comm", "NULL");
    if (ndev < 1) return invalidArgument(fn, "ndev", std::to_string(ndev) + " (must be at least 1)");
    // One process, ndev ranks, driven by the caller's thread through group
    // calls (as NCCL requires for such communicators).
    std::vector<Communicator> hosts = localCommunicators(ndev, shimOptions());
    std::vector<std::unique_ptr<ncclComm>> made;
    for (int r = 0; r < ndev; ++r) {
      auto c = std::make_unique<ncclComm>();
      c->rank = r;
      c->nranks = ndev;
      c->host = std::move(hosts[static_cast<size_t>(r)]);
      made.push_back(std::move(c));
    }
    // Devices the real NCCL would refuse are not offered to it: its
    // ncclCommInitAll then fails inside its own group and leaves the
    // thread's group state (and a CUDA error) behind.
    int devices = 0;
    std::string refuse;
    if (cudaUsable() && nccl::available()) {
      if (cudaGetDeviceCount(&devices) != cudaSuccess) cudaGetLastError();
      std::vector<int> sorted(static_cast<size_t>(ndev));
      for (int i = 0; i < ndev; ++i) sorted[static_cast<size_t>(i)] = devlist ? devlist[i] : i;
      std::sort(sorted.begin(), sorted.end());
      if (sorted.front() < 0 || sorted.back() >= devices) {
        refuse = "device " + std::to_string(sorted.back() >= devices ? sorted.back() : sorted.front()) +
                 " is not one of this process's " + std::to_string(devices) + " CUDA device(s)";
      } else if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        refuse = "two ranks on device " + std::to_string(*std::adjacent_find(sorted.begin(), sorted.end())) +
                 ", which the real NCCL refuses: device buffers go through gradcomm's staged path";
      }
    }
    if (!refuse.empty()) {
      for (int i = 0; i < ndev; ++i) {
        made[i]->realWhy = refuse;
        made[i]->cudaDevice = devlist ? devlist[i] : i;
      }
    } else if (cudaUsable() && nccl::available()) {
      std::vector<ncclComm_t> real(ndev, nullptr);
      auto f = GRADCOMM_REAL(ncclCommInitAll);
      const ncclResult_t r = f ? fromReal(fn, f(real.data(), ndev, devlist)) : realMissing(fn);
      for (int i = 0; i < ndev; ++i) {
        made[i]->real = r == ncclSuccess ? real[i] : nullptr;
        if (r != ncclSuccess) made[i]->realWhy = lastError();
        if (devlist) made[i]->cudaDevice = devlist[i]; else made[i]->cudaDevice = i;
      }
    } else {
      for (auto& c : made) c->realWhy = cudaUsable() ? nccl::unavailableReason() : "no CUDA device works in this process";
    }
    for (int r = 0; r < ndev; ++r) comms[r] = made[r].release();
    return ncclSuccess;
  });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  static const char* fn = "ncclCommSplit";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (!newcomm) return invalidArgument(fn, "newcomm", "NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
      return invalidArgument(fn, "color", std::to_string(color) + " (must be >= 0 or NCCL_SPLIT_NOCOLOR)");
    }
    if (auto r = checkConfig(fn, config)) return r;
    *newcomm = nullptr;
    CommUse use(comm);  // the split waits for every rank: an abort must not free comm under it
    if (!use.entered()) return abortedCall(fn);
    if (!comm->store) {
      return fail(ncclInvalidUsage, std::string(fn) + ": communicators from ncclCommInitAll cannot be split by gradcomm");
    }
    // Every rank learns every rank's (color, key); the new ranks are ordered
    // by key, then by old rank, as in NCCL.
    int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * static_cast<size_t>(comm->nranks));
    try {
      comm->host.allgather(mine, all.data(), 2, DataType::kInt32).wait();
    } catch (const Error& e) {
      if (comm->isClosing()) return abortedCall(fn);
      comm->setFailed(resultOf(e.code()), std::string(fn) + ": " + e.what());
      throw;
    }
    const int index = comm->splits++;
    ncclComm_t realNew = nullptr;
    if (comm->real) {
      auto f = GRADCOMM_REAL(ncclCommSplit);
      if (auto r = f ? settleReal(fn, fromReal(fn, f(comm->real, color, key, &realNew, config)), &realNew)
                     : realMissing(fn)) {
        return r;
      }
    }
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    std::vector<std::pair<int32_t, int>> members;  // (key, old rank)
    for (int r = 0; r < comm->nranks; ++r) {
      if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
    }
    std::sort(members.begin(), members.end());
    auto c = std::make_unique<ncclComm>();
    c->nranks = static_cast<int>(members.size());
    for (int i = 0; i < c->nranks; ++i) {
      if (members[i].second == comm->rank) c->rank = i;
    }
    formHost(*c, comm->store, comm->prefix + "/split" + std::to_string(index) + "/color" + std::to_string(color));
    c->real = realNew;
    c->realWhy = comm->realWhy;
    c->cudaDevice = comm->cudaDevice;
    *newcomm = c.release();
    return ncclSuccess;
  });
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* /*excludeRanksList*/, int /*excludeRanksCount*/,
                            ncclComm_t* /*newcomm*/, ncclConfig_t* /*config*/, int /*shrinkFlags*/) {
  static const char* fn = "ncclCommShrink";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkHandle(comm, fn)) return r;
    // A gradcomm communicator that lost a rank cannot be repaired in place
    // yet; form a new one with a fresh unique id instead.
    return fail(ncclInvalidUsage, std::string(fn) + ": not supported by gradcomm's NCCL library: create a new "
                                                    "communicator from a new ncclUniqueId with the surviving ranks");
  });
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  static const char* fn = "ncclCommFinalize";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkHandle(comm, fn)) return r;
    // Host operations complete before their call returns: nothing is left
    // to flush but the real NCCL's.
    if (comm->real) {
      auto f = GRADCOMM_REAL(ncclCommFinalize);
      if (f) return fromReal(fn, f(comm->real));
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return endComm("ncclCommDestroy", comm, false); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return endComm("ncclCommAbort", comm, true); }

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  static const char* fn = "ncclCommRevoke";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkHandle(comm, fn)) return r;
    if (revokeFlags != NCCL_REVOKE_DEFAULT) return invalidArgument(fn, "revokeFlags", "must be NCCL_REVOKE_DEFAULT");
    if (comm->real) {
      auto f = GRADCOMM_REAL(ncclCommRevoke);
      if (f) fromReal(fn, f(comm->real, revokeFlags));
    }
    // Nothing is in flight on the host between calls: revoking stops the
    // communicator, and later calls say so.
    comm->setFailed(ncclInvalidUsage, "the communicator was revoked (ncclCommRevoke)");
    if (comm->host.valid()) comm->host.destroy();
    return ncclSuccess;
  });
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;  // as in NCCL, the last error of the calling thread, whatever the communicator
  return lastError();
}

// NCCL 2.30's nccl.h declares it only where NCCL_OS_LINUX is defined and
// otherwise makes it an empty macro; the library still exports the symbol.
#ifdef ncclResetDebugInit
#undef ncclResetDebugInit
#undef pncclResetDebugInit
extern "C" void ncclResetDebugInit();
#endif
void ncclResetDebugInit() {}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  static const char* fn = "ncclCommGetAsyncError";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkHandle(comm, fn)) return r;
    if (!asyncError) return invalidArgument(fn, "asyncError", "NULL");
    if (comm->asyncError.load() == ncclSuccess && comm->host.valid()) {
      // A failure the progress engine saw (a peer's abort notice) but no
      // call has reported yet.
      try {
        if (auto failure = comm->host.failure()) std::rethrow_exception(failure);
      } catch (const Error& e) {
        comm->setFailed(resultOf(e.code()), e.what());
      }
    }
    *asyncError = static_cast<ncclResult_t>(comm->asyncError.load());
    if (*asyncError == ncclSuccess && comm->real) {
      auto f = GRADCOMM_REAL(ncclCommGetAsyncError);
      if (f) return fromReal(fn, f(comm->real, asyncError));
    }
    if (*asyncError != ncclSuccess) {
      std::lock_guard<std::mutex> lock(comm->errorMu);
      fail(*asyncError, comm->asyncMessage);
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  static const char* fn = "ncclCommCount";
  if (auto r = checkHandle(comm, fn)) return r;
  if (!count) return invalidArgument(fn, "count", "NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  static const char* fn = "ncclCommUserRank";
  if (auto r = checkHandle(comm, fn)) return r;
  if (!rank) return invalidArgument(fn, "rank", "NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  static const char* fn = "ncclCommCuDevice";
  if (auto r = checkHandle(comm, fn)) return r;
  if (!device) return invalidArgument(fn, "device", "NULL");
  if (comm->cudaDevice < 0) {
    return fail(ncclInvalidUsage, std::string(fn) + ": this communicator has no CUDA device: " + comm->realWhy);
  }
  *device = comm->cudaDevice;
  return ncclSuccess;
}

}  // extern "C"

GRADCOMM_NCCL_ALIAS(ncclGetVersion)
GRADCOMM_NCCL_ALIAS(ncclGetUniqueId)
GRADCOMM_NCCL_ALIAS(ncclCommInitRank)
GRADCOMM_NCCL_ALIAS(ncclCommInitRankConfig)
GRADCOMM_NCCL_ALIAS(ncclCommInitRankScalable)
GRADCOMM_NCCL_ALIAS(ncclCommInitAll)
GRADCOMM_NCCL_ALIAS(ncclCommSplit)
GRADCOMM_NCCL_ALIAS(ncclCommShrink)
GRADCOMM_NCCL_ALIAS(ncclCommFinalize)
GRADCOMM_NCCL_ALIAS(ncclCommDestroy)
GRADCOMM_NCCL_ALIAS(ncclCommAbort)
GRADCOMM_NCCL_ALIAS(ncclCommRevoke)
GRADCOMM_NCCL_ALIAS(ncclGetErrorString)
GRADCOMM_NCCL_ALIAS(ncclGetLastError)
GRADCOMM_NCCL_ALIAS(ncclResetDebugInit)
GRADCOMM_NCCL_ALIAS(ncclCommGetAsyncError)
GRADCOMM_NCCL_ALIAS(ncclCommCount)
GRADCOMM_NCCL_ALIAS(ncclCommUserRank)
GRADCOMM_NCCL_ALIAS(ncclCommCuDevice)
