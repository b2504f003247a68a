// Communicators formed without MPI: through a Store, or from the
// launcher's environment (GRADCOMM_*, torchrun's or mpirun's variables).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "core/agreement.hpp"
#include "core/communicator_impl.hpp"
#include "core/rendezvous.hpp"
#include "base/units.hpp"
#include "gradcomm/communicator.hpp"
#include "gradcomm/store.hpp"
#include "transport/bootstrap.hpp"
#include "transport/inproc_transport.hpp"
#include "transport/ucx_factory.hpp"

namespace gradcomm {
namespace {

using std::chrono::milliseconds;

/// How many communicators this process formed through each store: every
/// rank forms them in the same order, so the count names the same
/// communicator everywhere and keeps their keys apart.
int nextIndex(const std::shared_ptr<Store>& store) {
  // Keyed by the object, and forgotten when it is gone: a new store that
  // reuses a freed one's address starts again at 0, as on every other rank.
  static std::mutex mu;
  static std::map<const Store*, std::pair<std::weak_ptr<Store>, int>> formed;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = formed.begin(); it != formed.end();) {
    it = it->second.first.expired() ? formed.erase(it) : std::next(it);
  }
  auto& entry = formed[store.get()];
  if (entry.first.expired()) entry = {store, 0};
  return entry.second++;
}

milliseconds rendezvousTimeout(const Options& options) {
  try {
    return core::connectTimeout(core::Config::resolve(options));
  } catch (const Error&) {
    return std::chrono::seconds(300);  // the agreement reports the bad value
  }
}

/// Waits for `key` (set by another rank) in one blocking request: a rank
/// that polled instead would cost the store a request per poll, which with
/// thousands of ranks waiting is what keeps the store too busy to answer.
std::string awaitKey(transport::StoreBootstrap& boot, const std::string& key, const std::string& whose) {
  try {
    return boot.store().getString(key, boot.timeout());
  } catch (const TimeoutError&) {
    throw TimeoutError("rank " + std::to_string(boot.rank()) + ": " + whose + " did not arrive at the rendezvous " +
                       boot.describe() + " within " + core::formatSeconds(boot.timeout()) +
                       " (GRADCOMM_TIMEOUT): check that it was started and uses the same rendezvous address");
  }
}

struct EnvValue {
  std::string name;
  std::string value;
};

/// The first of `names` set in the environment.
std::optional<EnvValue> firstSet(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v && *v) return EnvValue{n, v};
  }
  return std::nullopt;
}

int parseRankValue(const EnvValue& v, long long lo, long long hi) {
  return static_cast<int>(core::parseInteger(v.value, v.name, lo, hi));
}

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string from;  ///< which variables gave it
};

Endpoint parseHostPort(const std::string& text, const std::string& from) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw InvalidArgument(from + "='" + text + "' is not host:port (for example 10.0.0.1:29400 or [::1]:29400)");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  Endpoint e;
  e.host = host;
  e.port = static_cast<uint16_t>(core::parseInteger(text.substr(colon + 1), from + " (port)", 1, 65535));
  e.from = from;
  return e;
}

Endpoint rendezvousFromEnvironment(int size) {
  if (auto v = firstSet({"GRADCOMM_RENDEZVOUS"})) return parseHostPort(v->value, v->name);
  auto addr = firstSet({"MASTER_ADDR"});
  auto port = firstSet({"MASTER_PORT"});
  if (addr && port) {
    Endpoint e;
    e.host = addr->value;
    // torchrun's agent serves its own store on MASTER_PORT.
    e.port = static_cast<uint16_t>(core::parseInteger(port->value, "MASTER_PORT", 1, 65534) + 1);
    e.from = "MASTER_ADDR and MASTER_PORT + 1";
    return e;
  }
  auto job = firstSet({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"});
  auto local = firstSet({"OMPI_COMM_WORLD_LOCAL_SIZE"});
  if (job && local && parseRankValue(*local, 1, 1 << 30) == size) {
    // Every rank on this host: loopback, a port derived from the job id.
    Endpoint e;
    e.host = "127.0.0.1";
    e.port = core::mpirunRendezvousPort(job->value, core::ephemeralPortRange());
    e.from = "mpirun's job id " + job->value + " (all ranks on this host)";
    return e;
  }
  throw InvalidUsage(
      "no rendezvous address in the environment: set GRADCOMM_RENDEZVOUS=host:port (rank 0's host and a free "
      "port), or MASTER_ADDR and MASTER_PORT as torchrun does" +
      std::string(job ? "; mpirun across hosts needs GRADCOMM_RENDEZVOUS (pass it with -x)" : ""));
}

Communicator formThroughStore(transport::StoreBootstrap& boot, Store& scoped, const Options& options) {
  const int rank = boot.rank(), size = boot.size();
  // Claims first: two processes with one rank would otherwise each take
  // the other's messages. Every process then stops with the reason.
  if (scoped.add("claims/" + std::to_string(rank), 1) > 1) {
    const std::string why = "two processes claimed rank " + std::to_string(rank) + " at the rendezvous " +
                            scoped.describe() + ": every process needs its own rank (check GRADCOMM_RANK or RANK)";
    boot.fail(why);
    throw InvalidArgument(why);
  }
  // Rank 0's world size is the world size; any other is a launch error.
  if (rank == 0) scoped.setString("world_size", std::to_string(size));
  const std::string theirs = rank == 0 ? std::to_string(size) : awaitKey(boot, "world_size", "rank 0");
  if (theirs != std::to_string(size)) {
    const std::string why = "the world size differs between ranks: rank " + std::to_string(rank) + " was given " +
                            std::to_string(size) + ", rank 0 " + theirs + " (check GRADCOMM_WORLD_SIZE or WORLD_SIZE)";
    boot.fail(why);
    throw ConfigError(why);
  }

  core::Config config = core::agreeOnConfiguration(options, boot);
  if (config.transport == "mpi") {
    throw ConfigError("GRADCOMM_TRANSPORT=mpi needs a communicator formed from MPI (communicatorFromMpi, or "
                      "Communicator() under mpirun); a communicator formed through a store uses 'ucx' or 'auto'");
  }
  if (size == 1 && config.transport == "auto" && !transport::haveUcx()) {
    // One rank moves no bytes between processes: a world of one in-process
    // rank serves it in a build without UCX.
    auto world = transport::InProcWorld::create(1);
    const transport::HostLayout hosts = world->hostLayout(0);
    return Communicator(std::make_shared<detail::CommunicatorImpl>(world->transport(0), hosts, std::move(config)));
  }
  transport::HostLayout hosts;
  auto t = transport::makeUcxTransport(boot, config.shm ? config.shmChunkBytes : 0, boot.timeout(), &hosts);
  return Communicator(std::make_shared<detail::CommunicatorImpl>(std::move(t), hosts, std::move(config)));
}

/// Every rank counts itself out when it is done with the store; the last
/// one sets "left/all". Rank 0, which may be serving the store, waits for
/// that key (at most `limit`) in one request.
void leaveRendezvous(transport::StoreBootstrap& boot, Store& scoped, milliseconds limit) {
  try {
    if (scoped.add("left", 1) == boot.size()) scoped.setString("left/all", "");
    if (boot.rank() != 0) return;
    (void)scoped.get("left/all", limit);
  } catch (const Error&) {
    // The store is gone (nobody is left to wait for), or some rank did not
    // leave within the limit (it failed, and rank 0 stops waiting for it).
  }
}

}  // namespace

namespace core {

PortRange ephemeralPortRange() {
  PortRange r{32768, 60999};
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo >= 1 && lo <= hi && hi <= 65535) r = {lo, hi};
  return r;
}

uint16_t mpirunRendezvousPort(const std::string& jobId, PortRange ephemeral) {
  // The kernel binds outgoing connections to ports of the ephemeral range:
  // a port there may be some connection's local port already, or become
  // one while the job starts, and rank 0 could not serve. Ports below it
  // (from 20000 where there is room, clear of the low ports services use)
  // or else above it are never handed out that way.
  constexpr int kLowest = 1024, kPreferred = 20000, kMinPorts = 1024;
  PortRange below{std::max(kLowest, ephemeral.lo - 1 >= kPreferred + kMinPorts ? kPreferred : kLowest),
                  ephemeral.lo - 1};
  PortRange above{std::max(kLowest, ephemeral.hi + 1), 65535};
  const int belowSize = below.hi - below.lo + 1, aboveSize = above.hi - above.lo + 1;
  const PortRange use = belowSize >= aboveSize ? below : above;
  const int size = std::max(belowSize, aboveSize);
  if (size < kMinPorts) {
    throw ConfigError("cannot derive a rendezvous port from mpirun's job id: the ephemeral port range (" +
                      std::to_string(ephemeral.lo) + "-" + std::to_string(ephemeral.hi) +
                      ", /proc/sys/net/ipv4/ip_local_port_range) leaves fewer than " + std::to_string(kMinPorts) +
                      " ports outside it; set GRADCOMM_RENDEZVOUS=127.0.0.1:PORT with a port outside that range");
  }
  return static_cast<uint16_t>(use.lo + static_cast<int>(std::hash<std::string>{}(jobId) % static_cast<size_t>(size)));
}

}  // namespace core

Communicator communicatorFromStore(std::shared_ptr<Store> store, int rank, int size, const Options& options) {
  if (!store) throw InvalidArgument("communicatorFromStore: the store is null");
  if (size < 1) throw InvalidArgument("communicatorFromStore: the world size must be at least 1, got " +
                                      std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument("communicatorFromStore: rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(size) + ")");
  }
  auto scoped = std::make_shared<PrefixStore>("gradcomm/comm" + std::to_string(nextIndex(store)), store);
  transport::StoreBootstrap boot(scoped, rank, size, rendezvousTimeout(options));
  try {
    Communicator comm = formThroughStore(boot, *scoped, options);
    leaveRendezvous(boot, *scoped, std::min(boot.timeout(), milliseconds(30000)));
    comm.impl()->keepAlive(store);  // the store must outlive every rank's last read
    return comm;
  } catch (...) {
    // Rank 0 may be serving the store: the others must still read why.
    leaveRendezvous(boot, *scoped, std::min(boot.timeout(), milliseconds(5000)));
    throw;
  }
}

std::vector<Communicator> localCommunicators(int n, const Options& options) {
  constexpr int kMaxLocalRanks = 1024;
  if (n < 1 || n > kMaxLocalRanks) {
    throw InvalidArgument("localCommunicators: n must be in [1, " + std::to_string(kMaxLocalRanks) + "], got " +
                          std::to_string(n));
  }
  // GRADCOMM_TRANSPORT names how processes reach each other: not read here.
  const core::Config config = core::Config::resolve(options);
  auto world = transport::InProcWorld::create(n);
  // Forming is collective (the ranks agree on what selection reads): one
  // thread per rank, as the ranks of a job would.
  std::vector<std::shared_ptr<detail::CommunicatorImpl>> made(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  std::string noThread;
  for (int r = 0; r < n && noThread.empty(); ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          made[static_cast<size_t>(r)] =
              std::make_shared<detail::CommunicatorImpl>(world->transport(r), world->hostLayout(r), config);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    } catch (const std::system_error& e) {
      // The ranks started wait for this one until GRADCOMM_TIMEOUT.
      noThread = "localCommunicators: no thread could be started for rank " + std::to_string(r) + " of " +
                 std::to_string(n) + " (" + e.what() + ")";
    }
  }
  for (auto& t : threads) t.join();
  if (!noThread.empty()) throw InvalidUsage(noThread);
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  std::vector<Communicator> comms;
  comms.reserve(made.size());
  for (auto& impl : made) comms.emplace_back(std::move(impl));
  return comms;
}

Communicator communicatorFromEnvironment(const Options& options) {
  auto rankVar = firstSet({"GRADCOMM_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
  auto sizeVar = firstSet({"GRADCOMM_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  if (!rankVar || !sizeVar) {
    throw InvalidUsage(std::string("no ") + (!rankVar ? "rank" : "world size") +
                       " in the environment: set GRADCOMM_RANK and GRADCOMM_WORLD_SIZE (and GRADCOMM_RENDEZVOUS), "
                       "or launch with torchrun or mpirun, which set their own");
  }
  const int size = parseRankValue(*sizeVar, 1, 1 << 30);
  const int rank = parseRankValue(*rankVar, 0, size - 1);
  const Endpoint at = rendezvousFromEnvironment(size);
  TcpStore::Options so;
  so.isServer = rank == 0;
  so.connectTimeout = rendezvousTimeout(options);
  std::shared_ptr<Store> store;
  try {
    store = std::make_shared<TcpStore>(rank == 0 ? std::string() : at.host, at.port, so);
  } catch (const Error& e) {
    rethrowAs(e.code(), std::string(e.what()) + " (rendezvous from " + at.from + ")");
  }
  return communicatorFromStore(store, rank, size, options);
}

}  // namespace gradcomm
