// What a build without MPI and/or UCX can and cannot do, the way a caller
// meets it: communicators formed through a store (ranks as threads of this
// process), and the MPI-only entry point Communicator().
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/gradcomm.hpp"
#include "gradcomm/store.hpp"

using namespace gradcomm;

namespace {

std::shared_ptr<TcpStore> serveStore() {
  TcpStore::Options o;
  o.isServer = true;
  o.connectTimeout = std::chrono::seconds(10);
  return std::make_shared<TcpStore>("127.0.0.1", 0, o);
}

Options tenSecondTimeout() {
  Options o;
  o.set("TIMEOUT", "10s");
  return o;
}

}  // namespace

// One rank moves nothing between processes: it needs neither UCX nor MPI.
TEST(BuildOptions, OneRankCommunicatorFromAStoreWorksInEveryBuild) {
  auto store = serveStore();
  Communicator comm = communicatorFromStore(store, 0, 1, tenSecondTimeout());
  ASSERT_EQ(comm.size(), 1);
  std::vector<float> v = {1.5f, -2.0f, 3.0f};
  comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  std::vector<float> all(3);
  comm.allgather(v.data(), all.data(), v.size(), DataType::kFloat32).wait();
  EXPECT_EQ(all, v);
  comm.barrier().wait();
}

// Several processes through a store need UCX: without it, every rank gets
// an UnsupportedError that names what to install, and none hangs.
TEST(BuildOptions, SeveralRanksFromAStoreWithoutUcxSayWhatToInstall) {
  if (GRADCOMM_HAVE_UCX) GTEST_SKIP() << "built with UCX: ranks formed through a store connect over it";
  // Each rank its own store handle, as separate processes would have:
  // communicators are numbered per store object.
  constexpr int kRanks = 2;
  std::vector<std::shared_ptr<Store>> stores = {serveStore()};
  TcpStore::Options client;
  client.connectTimeout = std::chrono::seconds(10);
  const uint16_t port = static_cast<TcpStore*>(stores[0].get())->port();
  for (int r = 1; r < kRanks; ++r) stores.push_back(std::make_shared<TcpStore>("127.0.0.1", port, client));
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Communicator comm = communicatorFromStore(stores[static_cast<size_t>(r)], r, kRanks, tenSecondTimeout());
        errors[static_cast<size_t>(r)] = "formed a communicator of " + std::to_string(comm.size());
      } catch (const UnsupportedError& e) {
        errors[static_cast<size_t>(r)] = std::string("Unsupported: ") + e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("other error: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + e);
    EXPECT_EQ(e.rfind("Unsupported: ", 0), 0u);
    EXPECT_NE(e.find("built without UCX"), std::string::npos);
    EXPECT_NE(e.find("pip install libucx-cu13"), std::string::npos);
    EXPECT_NE(e.find("apt-get install libucx-dev"), std::string::npos);
    EXPECT_NE(e.find("mpirun"), std::string::npos);
  }
}

// Communicator() is over MPI_COMM_WORLD: without MPI it says so and how to
// form a communicator instead.
TEST(BuildOptions, DefaultCommunicatorWithoutMpiSaysWhatToDo) {
  if (GRADCOMM_HAVE_MPI) GTEST_SKIP() << "built with MPI: Communicator() is over MPI_COMM_WORLD (tests/mpi)";
  try {
    Communicator comm;
    FAIL() << "Communicator() formed a communicator of " << comm.size() << " in a build without MPI";
  } catch (const UnsupportedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("built without MPI"), std::string::npos) << what;
    EXPECT_NE(what.find("libopenmpi-dev"), std::string::npos) << what;
    EXPECT_NE(what.find("communicatorFromEnvironment"), std::string::npos) << what;
  }
}
