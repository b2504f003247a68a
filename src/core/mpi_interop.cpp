// gradcomm/mpi.hpp: communicators formed over an MPI communicator (MPI
// bootstrap, MPI or UCX transport), and storeFromMpi, a TcpStore served by
// rank 0 whose address is handed out through MPI.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <sstream>

#include "core/agreement.hpp"
#include "core/communicator_impl.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/mpi.hpp"
#include "transport/bootstrap.hpp"
#include "transport/mpi_bootstrap.hpp"
#include "transport/mpi_env.hpp"
#include "transport/mpi_transport.hpp"
#include "transport/ucx_factory.hpp"

namespace gradcomm {
namespace {

/// This host's IPv4 addresses, loopback last.
std::vector<std::string> localAddresses() {
  std::vector<std::string> out, loop;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
      (std::string(text).rfind("127.", 0) == 0 ? loop : out).push_back(text);
    }
    freeifaddrs(list);
  }
  out.insert(out.end(), loop.begin(), loop.end());
  return out;
}

std::string threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "thread level " + std::to_string(level);
  }
}

}  // namespace

std::shared_ptr<Store> storeFromMpi(MPI_Comm comm, std::chrono::milliseconds timeout) {
  auto env = transport::MpiEnvironment::acquire();
  if (comm == MPI_COMM_NULL) throw InvalidArgument("storeFromMpi: the MPI communicator is MPI_COMM_NULL");
  transport::MpiBootstrap boot(comm);
  // Rank 0: serve, and publish "port hostkey addr addr ...".
  std::shared_ptr<TcpStore> store;
  std::string served, why;
  if (boot.rank() == 0) {
    try {
      TcpStore::Options o;
      o.isServer = true;
      o.connectTimeout = timeout;
      store = std::make_shared<TcpStore>("", 0, o);
      served = std::to_string(store->port()) + "\n" + transport::hostKey();
      for (const auto& a : localAddresses()) served += "\n" + a;
    } catch (const Error& e) {
      why = e.what();
    }
  }
  const std::string at = boot.allgather(boot.rank() == 0 ? (why.empty() ? "S" + served : "E" + why) : "")[0];
  if (at.empty() || at[0] != 'S') throw TransportError("storeFromMpi: rank 0 could not serve a store: " + at.substr(1));
  if (boot.rank() != 0) {
    std::istringstream in(at.substr(1));
    std::string port, key, addr;
    std::getline(in, port);
    std::getline(in, key);
    std::vector<std::string> candidates;
    if (key == transport::hostKey()) candidates.push_back("127.0.0.1");
    while (std::getline(in, addr)) candidates.push_back(addr);
    // Each candidate gets a share of the timeout; the first that answers wins.
    TcpStore::Options o;
    o.connectTimeout = std::max(std::chrono::milliseconds(200),
                                timeout / static_cast<long>(std::max<size_t>(candidates.size(), 1)));
    for (const auto& c : candidates) {
      try {
        store = std::make_shared<TcpStore>(c, static_cast<uint16_t>(std::stoi(port)), o);
        break;
      } catch (const Error& e) {
        why = std::string(e.what());
      }
    }
  }
  const auto oks = boot.allgather(store ? "1" : "0" + why);
  for (int r = 0; r < boot.size(); ++r) {
    const std::string& ok = oks[static_cast<size_t>(r)];
    if (ok != "1") {
      throw TransportError("storeFromMpi: rank " + std::to_string(r) + " could not reach the store served by rank 0: " +
                           ok.substr(1));
    }
  }
  return store;
}

Communicator communicatorFromMpi(MPI_Comm comm, const Options& options) {
  auto env = transport::MpiEnvironment::acquire();
  if (comm == MPI_COMM_NULL) throw InvalidArgument("communicatorFromMpi: the MPI communicator is MPI_COMM_NULL");

  // Forming the communicator calls MPI on this thread only, which any
  // thread level allows.
  transport::MpiBootstrap boot(comm);
  core::Config config = core::agreeOnConfiguration(options, boot);
  if (config.transport != "ucx") {
    // The MPI transport's progress thread calls MPI while the program's own
    // threads may too: only MPI_THREAD_MULTIPLE allows that. Serialising
    // gradcomm's own calls would not do, since the program's calls are
    // outside its reach. The lowest level of any rank decides, so every
    // rank fails alike.
    int mine = env->threadLevel(), lowest = mine;
    transport::checkMpi(MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (thread level)");
    if (lowest < MPI_THREAD_MULTIPLE) {
      throw UnsupportedError(
          "MPI was initialised with " + threadLevelName(lowest) + (lowest == mine ? "" : " on some rank") +
          ", but the MPI transport calls MPI from gradcomm's progress thread while the program's threads may call "
          "it too, which needs MPI_THREAD_MULTIPLE: initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, "
          "...) (or let gradcomm initialise it), or use GRADCOMM_TRANSPORT=ucx, which calls MPI only while forming "
          "the communicator");
    }
  }
  // A peer that died or hung leaves an MPI that cannot be finalised, even
  // where MPI only formed the communicator. Weak: the environment ends at
  // exit (finalised or aborted there), whatever communicators still live.
  auto onPeerFailure = [weak = std::weak_ptr<transport::MpiEnvironment>(env)](const std::string& reason) {
    if (auto e = weak.lock()) e->markBroken(reason);
  };
  if (config.transport == "ucx") {
    // Bootstrapped through MPI, every byte through UCX.
    transport::HostLayout hosts;
    auto t = transport::makeUcxTransport(boot, config.shm ? config.shmChunkBytes : 0, core::connectTimeout(config),
                                         &hosts);
    return Communicator(
        std::make_shared<detail::CommunicatorImpl>(std::move(t), hosts, std::move(config), onPeerFailure));
  }
  auto t = std::make_unique<transport::MpiTransport>(comm, env, config.shm ? config.shmChunkBytes : 0);
  const transport::HostLayout hosts = t->hostLayout();
  return Communicator(
      std::make_shared<detail::CommunicatorImpl>(std::move(t), hosts, std::move(config), onPeerFailure));
}

Communicator::Communicator() : Communicator(Options{}) {}

Communicator::Communicator(const Options& options) : impl_(communicatorFromMpi(MPI_COMM_WORLD, options).impl_) {}

}  // namespace gradcomm
