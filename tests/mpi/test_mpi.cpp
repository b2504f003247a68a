// Collectives over the MPI transport on whatever number of ranks mpirun
// started (ctest runs 1, 2, 3, 4, 5 and 8), including native MPI
// passthrough, mismatched calls, a peer that never arrives, and
// configuration that disagrees between ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "algorithms/catalog.hpp"
#include "core/communicator_impl.hpp"
#include "transport/mpi_env.hpp"
#include "transport/mpi_bootstrap.hpp"
#include "transport/mpi_transport.hpp"
#include "transport/ucx_factory.hpp"
#include "gradcomm/mpi.hpp"
#include "gradcomm/reducer.hpp"
#include "gradcomm/store.hpp"
#include "support/collective_check.hpp"
#include "support/text.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int worldSize() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

Options testOptions(const char* timeout = "60s") {
  Options o;
  o.set("SEGMENT_SIZE", "1K");
  o.set("NET_SEGMENT_SIZE", "1K");
  o.set("TIMEOUT", timeout);
  return o;
}

/// The transport the run asked for (ctest runs this binary with
/// GRADCOMM_TRANSPORT unset and with ucx).
std::string expectedTransport() {
  const char* t = std::getenv("GRADCOMM_TRANSPORT");
  return t && std::string(t) == "ucx" ? "ucx" : "mpi";
}


}  // namespace

TEST(Mpi, EveryAlgorithmOfEveryCollectiveMatchesTheReference) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  ASSERT_EQ(comm.size(), worldSize());
  ASSERT_EQ(comm.rank(), worldRank());
  ASSERT_EQ(comm.transportName(), expectedTransport());
  int cases = 0;
  ASSERT_EQ(checkEveryAlgorithm(comm, &cases), "");
  EXPECT_GT(cases, 100);
}

TEST(Mpi, SplitGroupsRunEveryAlgorithmCorrectlyBesideTheirParent) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  const int p = comm.size(), r = comm.rank();
  // Halves, the upper half numbered in reverse; a single rank is a group too.
  Communicator half = comm.split(r < (p + 1) / 2 ? 0 : 1, r < (p + 1) / 2 ? r : -r);
  ASSERT_TRUE(half.valid());
  EXPECT_EQ(half.size(), r < (p + 1) / 2 ? (p + 1) / 2 : p / 2);
  EXPECT_EQ(half.transportName(), comm.transportName());
  int cases = 0;
  EXPECT_EQ(checkEveryAlgorithm(half, &cases), "") << "rank " << r;
  // A duplicate holds every rank of each host: it shares the hosts' memory.
  Communicator copy = comm.dup();
  EXPECT_EQ(copy.impl()->transport().sharedMemory() != nullptr, comm.impl()->transport().sharedMemory() != nullptr);
  EXPECT_EQ(checkEveryAlgorithm(copy, &cases), "") << "rank " << r;
  // The parent still works, and the groups' sums are their own.
  double x = r, y = r;
  comm.allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum).wait();
  half.allreduce(&y, &y, 1, DataType::kFloat64, ReduceOp::kSum).wait();
  EXPECT_EQ(x, p * (p - 1) / 2.0);
  double want = 0;
  for (int q = 0; q < p; ++q) want += (q < (p + 1) / 2) == (r < (p + 1) / 2) ? q : 0;
  EXPECT_EQ(y, want);
  // A subgroup formed by its members alone: the even ranks, reversed.
  if (r % 2 == 0) {
    std::vector<int> evens;
    for (int q = p - 1; q >= 0; --q) {
      if (q % 2 == 0) evens.push_back(q);
    }
    Communicator even = comm.subgroup(evens);
    int32_t v = r, sum = 0;
    even.allreduce(&v, &sum, 1, DataType::kInt32, ReduceOp::kSum).wait();
    int32_t want2 = 0;
    for (int q : evens) want2 += q;
    EXPECT_EQ(sum, want2);
    EXPECT_EQ(even.rank(), static_cast<int>(std::find(evens.begin(), evens.end(), r) - evens.begin()));
  }
  comm.barrier().wait();
}

// A group is light on every transport: no descriptor, segment or thread of
// its own. A duplicate holds every rank of each host and uses the context's
// shared memory itself (renumbered); halves of a host use none, and say so
// alike on every rank (chunk 0), so every rank chooses alike.
TEST(Mpi, GroupsOpenNothingAndShareTheContextsMemoryWhereTheyFillWholeHosts) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  const int p = comm.size(), r = comm.rank();
  auto descriptors = [] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.path().empty() ? 0 : 1;
    return n;
  };
  comm.barrier().wait();
  const size_t before = descriptors();
  std::vector<Communicator> groups;
  for (int i = 0; i < 10; ++i) groups.push_back(comm.dup());
  for (int i = 0; i < 10; ++i) groups.push_back(comm.split(r % 2, r));
  for (auto& g : groups) g.barrier().wait();
  EXPECT_EQ(descriptors(), before) << "rank " << r;
  const transport::ShmGroup* mine = comm.impl()->transport().sharedMemory();
  if (!mine) return;  // one rank, or GRADCOMM_SHM=0
  const transport::ShmGroup* dups = groups[0].impl()->transport().sharedMemory();
  ASSERT_NE(dups, nullptr);
  EXPECT_EQ(&dups->block(0), &mine->block(0)) << "a duplicate maps a segment of its own";
  EXPECT_EQ(groups[0].impl()->transport().sharedMemoryChunkBytes(), comm.impl()->transport().sharedMemoryChunkBytes());
  // Every rank of these tests is on one host: a half leaves out some of it.
  EXPECT_EQ(groups[10].impl()->transport().sharedMemory(), nullptr);
  EXPECT_EQ(groups[10].impl()->transport().sharedMemoryChunkBytes(), 0u);
  double x = r;
  groups[10].allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum).wait();
  double want = 0;
  for (int q = r % 2; q < p; q += 2) want += q;
  EXPECT_EQ(x, want);
}

TEST(Mpi, LargeMessagesUseManySegmentsAndStayExact) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  for (const char* algo : {"ring", "hd", "tree", "rd", "native"}) {
    if (std::string(algo) == "native" && expectedTransport() != "mpi") continue;  // falls back without MPI
    CollectiveCase c{Collective::kAllreduce, algo, DataType::kFloat32, ReduceOp::kSum, (1u << 20) + 3, 0, false, 7};
    EXPECT_EQ(runAndCheck(comm, c), "");
    c.inPlace = true;
    c.op = ReduceOp::kAvg;
    EXPECT_EQ(runAndCheck(comm, c), "");
  }
}

// From 4 ranks, Open MPI's in-place MPI_Iallreduce of 64 KiB and more is
// staged through a copy of the input that later calls reuse
// (mpi_native.cpp): two calls queued together, three times over with new
// data, each sum what its own buffer held when it was called.
TEST(Mpi, InPlaceNativeAllreducesQueuedTogetherSumTheirOwnInputs) {
  if (expectedTransport() != "mpi") GTEST_SKIP() << "native needs the MPI transport";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  CollectiveOptions o;
  o.algorithm = "native";
  const size_t n = (64 * 1024) + 5;  // floats: 256 KiB and a tail
  const double ranks = comm.size(), r = comm.rank() + 1;
  const double rankSum = ranks * (ranks + 1) / 2;  // sum over ranks of (rank + 1)
  std::vector<float> a(n), b(n);
  for (int round = 1; round <= 3; ++round) {
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(r * round + static_cast<double>(i % 7));
      b[i] = static_cast<float>(-2 * r * round);
    }
    Work wa = comm.allreduce(a.data(), a.data(), n, DataType::kFloat32, ReduceOp::kSum, o);
    Work wb = comm.allreduce(b.data(), b.data(), n, DataType::kFloat32, ReduceOp::kSum, o);
    wa.wait();
    wb.wait();
    EXPECT_EQ(wa.algorithm(), "native");
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      wrong += a[i] != static_cast<float>(rankSum * round + ranks * static_cast<double>(i % 7));
      wrong += b[i] != static_cast<float>(-2 * rankSum * round);
    }
    EXPECT_EQ(wrong, 0u) << "round " << round << " on rank " << comm.rank();
  }
  comm.destroy();
}

// Counts that differ are one cause with one error on every transport (this
// suite also runs with GRADCOMM_TRANSPORT=ucx): a MismatchError naming the
// count where a rank saw the difference, a RemoteError elsewhere, whichever
// algorithm moves the data.
TEST(Mpi, MismatchedCountsFailOnEveryRank) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  for (const char* algo : {"", "ring", "rd", "tree", "hd"}) {
    SCOPED_TRACE(std::string("algorithm '") + algo + "'");
    Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("30s"));
    std::vector<float> buf(4096, 1.0f);
    CollectiveOptions o;
    o.algorithm = algo;
    auto t0 = std::chrono::steady_clock::now();
    std::string what;
    ErrorCode code = ErrorCode::kInternal;
    try {
      // Rank 2 calls late: rank 0 then gets rank 1's larger message before
      // any call check could tell it that the counts differ.
      if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      size_t count = comm.rank() == 1 ? 2000 : 1000;
      comm.allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, o).wait();
      comm.barrier().wait();
    } catch (const Error& e) {
      what = e.what();
      code = e.code();
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(code == ErrorCode::kMismatch || code == ErrorCode::kRemote)
        << "code " << toString(code) << ": " << what;
    EXPECT_TRUE(contains(what, "count")) << what;
    EXPECT_LT(seconds, 10.0);
    int mismatch = code == ErrorCode::kMismatch ? 1 : 0, anyMismatch = 0;
    MPI_Allreduce(&mismatch, &anyMismatch, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(anyMismatch, 1) << what;
    comm.destroy();
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A message of another size than the receive expects is one cause, counts
// that differ between the ranks, whichever transport carries it (this suite
// also runs with GRADCOMM_TRANSPORT=ucx): a MismatchError naming the count
// on both. Point-to-point operations, which have no call check, and calls
// whose tags cannot tell them apart meet it there. (UCX called it a
// TransportError.)
TEST(Mpi, AMessageOfAnotherSizeIsAMismatchErrorNamingTheCountOnEveryTransport) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  const char* which = std::getenv("GRADCOMM_TRANSPORT");
  const bool ucx = which && std::string(which) == "ucx";
  std::unique_ptr<transport::Transport> t;
  if (ucx) {
    transport::MpiBootstrap boot(MPI_COMM_WORLD);
    transport::HostLayout hosts;
    t = transport::makeUcxTransport(boot, 0, std::chrono::seconds(30), &hosts);
  } else {
    t = std::make_unique<transport::MpiTransport>(MPI_COMM_WORLD, transport::MpiEnvironment::acquire(), 0);
  }
  // Rank 0 sends 8000 bytes, then 2000; rank 1 expects 4000 each time.
  for (const size_t sent : {size_t{8000}, size_t{2000}}) {
    SCOPED_TRACE(std::to_string(sent) + " bytes sent, 4000 expected");
    transport::Tag tag;
    tag.seq = sent;
    tag.fingerprint = 7;
    std::vector<char> buf(8000, 1);
    std::string what;
    ErrorCode code = ErrorCode::kInternal;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (t->rank() == 0) {
      auto r = t->isend(1, buf.data(), sent, tag);
      while (!r->test() && std::chrono::steady_clock::now() < deadline) {
      }
    } else if (t->rank() == 1) {
      try {
        auto r = t->irecv(0, buf.data(), 4000, tag);
        while (!r->test() && std::chrono::steady_clock::now() < deadline) {
        }
        what = "no error";
      } catch (const Error& e) {
        code = e.code();
        what = e.what();
      }
      EXPECT_EQ(code, ErrorCode::kMismatch) << (ucx ? "ucx" : "mpi") << ": " << what;
      EXPECT_TRUE(contains(what, "count")) << what;
      EXPECT_TRUE(contains(what, "rank 0")) << what;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  t.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Every field of a call is part of what the ranks agree on, whatever the
// size and algorithm. A tree broadcast whose ranks pass different roots has
// no message that could mismatch (each "root" only sends, and small sends
// complete at once over MPI): it used to complete silently with wrong data.
// Now every rank fails, and the message names the field and both values.
TEST(Mpi, MismatchedCallsFailOnEveryRankAndNameTheField) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  struct Variant {
    const char* field;
    const char* algorithm;  // "" is the default choice
    std::string rank0Value;  // as the message prints them
    std::string otherValue;
    std::function<Work(Communicator&, std::vector<float>&, const CollectiveOptions&)> call;
  };
  auto root = [](Communicator& c, std::vector<float>& b, const CollectiveOptions& o) {
    return c.broadcast(b.data(), b.data(), 1000, DataType::kFloat32, c.rank() == 0 ? 0 : 1, o);
  };
  auto count = [](Communicator& c, std::vector<float>& b, const CollectiveOptions& o) {
    return c.allreduce(b.data(), b.data(), c.rank() == 0 ? 1000 : 999, DataType::kFloat32, ReduceOp::kSum, o);
  };
  auto type = [](Communicator& c, std::vector<float>& b, const CollectiveOptions& o) {
    return c.allreduce(b.data(), b.data(), 1000, c.rank() == 0 ? DataType::kFloat32 : DataType::kInt32,
                       ReduceOp::kSum, o);
  };
  auto op = [](Communicator& c, std::vector<float>& b, const CollectiveOptions& o) {
    return c.allreduce(b.data(), b.data(), 1000, DataType::kFloat32, c.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMin,
                       o);
  };
  const std::vector<Variant> variants = {
      {"root", "", "root 0", "root 1", root},
      {"root", "native", "root 0", "root 1", root},
      {"count", "", "count 1000", "count 999", count},
      {"count", "ring", "count 1000", "count 999", count},
      {"data type", "", "float32", "int32", type},
      {"data type", "hd", "float32", "int32", type},
      {"data type", "native", "float32", "int32", type},
      {"op", "", "sum", "min", op},
      {"op", "tree", "sum", "min", op},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(std::string(v.field) + " with algorithm '" + v.algorithm + "'");
    Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("30s"));
    std::vector<float> buf(1000, 1.0f);
    CollectiveOptions o;
    o.algorithm = v.algorithm;
    auto t0 = std::chrono::steady_clock::now();
    std::string what;
    ErrorCode code = ErrorCode::kInternal;
    try {
      v.call(comm, buf, o).wait();
      comm.barrier().wait();
    } catch (const Error& e) {
      what = e.what();
      code = e.code();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(code == ErrorCode::kMismatch || code == ErrorCode::kRemote) << what;
    EXPECT_TRUE(contains(what, std::string(v.field) + " differs: this rank ")) << what;
    EXPECT_LT(seconds, 10.0);
    // Some rank saw the difference and printed both values.
    int named = contains(what, "passed " + v.rank0Value) && contains(what, "passed " + v.otherValue) ? 1 : 0;
    int anyNamed = 0;
    MPI_Allreduce(&named, &anyNamed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(anyNamed, 1) << what;
    comm.destroy();
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST(Mpi, NativeAlgorithmDetectsMismatchedCallsBeforeMovingData) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("30s"));
  std::vector<float> buf(4096, 1.0f);
  CollectiveOptions o;
  o.algorithm = "native";
  std::string what;
  try {
    comm.allreduce(buf.data(), buf.data(), comm.rank() == 0 ? 10 : 20, DataType::kFloat32, ReduceOp::kSum, o).wait();
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_TRUE(contains(what, "ranks called different collectives") || contains(what, "rank ")) << what;
  comm.destroy();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Mpi, APeerThatNeverArrivesIsATimeoutOnTheWaitingRanks) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("500ms"));
  std::vector<float> buf(1000, 1.0f);
  const int absent = comm.size() - 1;
  if (comm.rank() != absent) {
    try {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      ADD_FAILURE() << "expected an error";
    } catch (const TimeoutError& e) {
      EXPECT_TRUE(contains(e.what(), "made no progress")) << e.what();
    } catch (const RemoteError& e) {
      EXPECT_TRUE(contains(e.what(), "made no progress")) << e.what();  // another waiting rank timed out first
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == absent) {
    // The absent rank learns that the communicator failed.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_THROW(comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait(), Error);
  }
  comm.destroy();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Mpi, ConfigurationThatDiffersBetweenRanksIsRejectedEverywhere) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Options o = testOptions();
  o.set("ALGO", worldRank() == 1 ? "allreduce:tree" : "allreduce:ring");
  try {
    Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "GRADCOMM_ALGO differs between ranks")) << e.what();
  }
}

// Ranks with different timeouts would give up at different times: the
// README promises that configuration which differs fails at creation.
TEST(Mpi, ATimeoutThatDiffersBetweenRanksIsRejectedEverywhere) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Options o = testOptions(worldRank() == 1 ? "10s" : "5s");
  try {
    Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "GRADCOMM_TIMEOUT differs between ranks")) << e.what();
    EXPECT_TRUE(contains(e.what(), "has '10s'") && contains(e.what(), "has '5s'")) << e.what();
  }
}

TEST(Mpi, AnInvalidConfigurationOnOneRankIsReportedOnAll) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Options o = testOptions();
  if (worldRank() == 1) o.set("PIPELINE_DEPTH", "lots");
  try {
    Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "GRADCOMM_PIPELINE_DEPTH='lots'")) << e.what();
  }
}

TEST(Mpi, DestroyingWithAnOperationPendingFailsItAndTellsThePeers) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("20s"));
  std::vector<float> buf(1000, 1.0f);
  if (comm.rank() == 0) {
    Work w = comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    comm.destroy();
    EXPECT_THROW(w.wait(), InvalidUsage);
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    try {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "destroyed")) << e.what();
    }
    comm.destroy();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Mpi, CountsAboveTwoGigabytesWork) {
  if (!std::getenv("GRADCOMM_TEST_LARGE")) GTEST_SKIP() << "set GRADCOMM_TEST_LARGE=1 (needs ~2.2 GB per rank)";
  Options o;
  o.set("TIMEOUT", "120s");  // default segment size: 1K segments would mean millions of steps
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
  const size_t n = (size_t{1} << 31) + 13;  // bytes, as uint8
  std::vector<uint8_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(i * 7 + static_cast<size_t>(comm.rank()));
  // rd sends the whole vector in one transfer: over MPI, parts of at most
  // 1 GiB (MpiRequest's first part and the rest).
  for (const char* algo : {"ring", "native", "rd"}) {
    std::vector<uint8_t> work = buf;
    CollectiveOptions o;
    o.algorithm = algo;
    comm.allreduce(work.data(), work.data(), n, DataType::kUInt8, ReduceOp::kSum, o).wait();
    const int p = comm.size();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      uint8_t want = static_cast<uint8_t>(p * static_cast<int>(static_cast<uint8_t>(i * 7)) + p * (p - 1) / 2);
      bad += work[i] != want;
    }
    EXPECT_EQ(bad, 0u) << algo;
  }
}

TEST(Mpi, ReducerAveragesEveryStepWhateverTheReadyOrder) {
  Options o = testOptions();
  o.set("BUCKET_CAP", "32K");
  o.set("FIRST_BUCKET", "8K");
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
  const std::vector<size_t> sizes = {5000, 3, 12000, 1, 700, 9000, 64};
  for (bool view : {false, true}) {
    std::vector<std::vector<double>> grads;
    std::vector<GradientSpec> specs;
    for (size_t c : sizes) grads.emplace_back(c, 0.0);
    for (auto& g : grads) specs.push_back({g.size(), DataType::kFloat64, view ? nullptr : g.data()});
    ReducerOptions ro;
    ro.gradientAsBucketView = view;
    Reducer red(comm, specs, ro);
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        // A different ready order on every rank and step.
        const size_t g = (k * 3 + static_cast<size_t>(comm.rank() + step)) % sizes.size();
        double* d = view ? static_cast<double*>(red.gradient(g)) : grads[g].data();
        for (size_t i = 0; i < sizes[g]; ++i) d[i] = comm.rank() + step + static_cast<double>(i % 5);
        red.markReady(g);
      }
      red.finalize();
      const double meanRank = (comm.size() - 1) / 2.0;
      for (size_t g = 0; g < sizes.size(); ++g) {
        const double* d = view ? static_cast<const double*>(red.gradient(g)) : grads[g].data();
        for (size_t i = 0; i < sizes[g]; ++i) ASSERT_DOUBLE_EQ(d[i], meanRank + step + static_cast<double>(i % 5));
      }
    }
    // Every rank adopted rank 0's layout.
    std::vector<int64_t> first(sizes.size(), -1), all(sizes.size() * static_cast<size_t>(comm.size()));
    auto b = red.buckets();
    for (size_t k = 0; k < b.size(); ++k) {
      for (size_t g : b[k]) first[g] = static_cast<int64_t>(k);
    }
    comm.allgather(first.data(), all.data(), first.size(), DataType::kInt64).wait();
    for (int r = 0; r < comm.size(); ++r) {
      for (size_t g = 0; g < sizes.size(); ++g) EXPECT_EQ(all[static_cast<size_t>(r) * sizes.size() + g], first[g]);
    }
  }
}

TEST(Mpi, ReducerAccumulatesOverUnsynchronisedSteps) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions());
  std::vector<std::vector<float>> grads = {std::vector<float>(3000, 0.0f), std::vector<float>(7, 0.0f)};
  std::vector<GradientSpec> specs;
  for (auto& g : grads) specs.push_back({g.size(), DataType::kFloat32, g.data()});
  Reducer red(comm, specs);
  red.setSynchronization(false);
  for (int micro = 0; micro < 2; ++micro) {
    for (size_t g = 0; g < grads.size(); ++g) {
      for (auto& v : grads[g]) v += static_cast<float>(comm.rank() + 1);
      red.markReady(g);
    }
    red.finalize();
  }
  red.setSynchronization(true);
  for (size_t g = 0; g < grads.size(); ++g) {
    for (auto& v : grads[g]) v += static_cast<float>(comm.rank() + 1);
    red.markReady(g);
  }
  red.finalize();
  // Each rank accumulated 3 * (rank + 1); the average is 3 * (p + 1) / 2.
  const float want = 3.0f * static_cast<float>(comm.size() + 1) / 2.0f;
  for (const auto& g : grads) {
    for (float v : g) ASSERT_FLOAT_EQ(v, want);
  }
}

TEST(Mpi, ReducerMisuseOnOneRankFailsOnEveryRank) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, testOptions("30s"));
  std::vector<std::vector<float>> grads = {std::vector<float>(1000, 1.0f), std::vector<float>(500, 1.0f),
                                           std::vector<float>(20, 1.0f)};
  std::vector<GradientSpec> specs;
  for (auto& g : grads) specs.push_back({g.size(), DataType::kFloat32, g.data()});
  std::string what;
  auto t0 = std::chrono::steady_clock::now();
  try {
    // Inside the try: a slow rank may still be constructing (a collective
    // step) when rank 1 has already failed and aborted the communicator.
    Reducer red(comm, specs);
    for (size_t g = 0; g < grads.size(); ++g) {
      if (comm.rank() == 1 && g == 1) continue;  // rank 1 forgets gradient 1
      red.markReady(g);
    }
    red.finalize();
  } catch (const Error& e) {
    what = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() == 1) {
    EXPECT_TRUE(contains(what, "gradient(s) 1 were never marked ready")) << what;
  } else {
    EXPECT_TRUE(contains(what, "rank 1")) << what;
  }
  EXPECT_LT(seconds, 10.0);
  comm.destroy();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Mpi, AStoreOverMpiFormsAUcxCommunicatorThatMatchesTheReference) {
  auto store = storeFromMpi(MPI_COMM_WORLD, std::chrono::seconds(30));
  // Every rank sees what rank 0 sets, and counters add up across ranks.
  if (worldRank() == 0) store->setString("hello", "from rank 0");
  EXPECT_EQ(store->getString("hello", std::chrono::seconds(30)), "from rank 0");
  store->add("arrived", 1);
  store->wait({"hello"}, std::chrono::seconds(5));
  Communicator comm = communicatorFromStore(store, worldRank(), worldSize(), testOptions());
  EXPECT_EQ(comm.transportName(), "ucx");
  uint64_t seed = 900;
  for (const char* algo : {"ring", "hd", "tree", "rd"}) {
    for (size_t count : {size_t{1}, size_t{37}, size_t{3001}}) {
      CollectiveCase c{Collective::kAllreduce, algo, DataType::kFloat32, ReduceOp::kSum, count, 0, false, seed++};
      EXPECT_EQ(runAndCheck(comm, c), "");
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(store->add("arrived", 0), worldSize());
  // Rank 0 serves the store: it must not take it down (by leaving the test)
  // while another rank still reads it.
  MPI_Barrier(MPI_COMM_WORLD);
}

namespace {

// The cost model decides from rank 0's constants, sent to every rank: a
// rank that chose differently would deadlock its collective. Every rank's
// choices for allreduces of 8 B to 64 MiB are allgathered and compared, and
// the cost model must say where its numbers came from (`source`).
void expectEveryRankChoosesAlike(const Options& o, const std::string& source) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
  std::string mine;
  for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 4) {
    mine += comm.explainSelection(Collective::kAllreduce, bytes / 4, DataType::kFloat32).algorithm + ",";
  }
  mine += comm.describeTopology();
  // The cost model's numbers are part of the description: they must agree too.
  const int len = static_cast<int>(mine.size());
  int maxLen = 0;
  MPI_Allreduce(&len, &maxLen, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  std::vector<char> all(static_cast<size_t>(maxLen) * static_cast<size_t>(worldSize()), 0);
  std::vector<char> padded(static_cast<size_t>(maxLen), 0);
  std::copy(mine.begin(), mine.end(), padded.begin());
  MPI_Allgather(padded.data(), maxLen, MPI_CHAR, all.data(), maxLen, MPI_CHAR, MPI_COMM_WORLD);
  const std::string rank0(all.data(), strnlen(all.data(), static_cast<size_t>(maxLen)));
  // The host label and hardware line differ between hosts; the choices and
  // the cost model line must not.
  auto comparable = [](const std::string& s) {
    return s.substr(0, s.find("topology: ")) + s.substr(s.find("\ncost model: "));
  };
  EXPECT_TRUE(contains(rank0, "(" + source + ")") || (source == "calibrated" && worldSize() == 1)) << rank0;
  EXPECT_EQ(comparable(mine), comparable(rank0)) << "rank " << worldRank();
  std::vector<float> v(1000, 1.0f);
  comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
  EXPECT_EQ(v[0], static_cast<float>(worldSize()));
}

}  // namespace

TEST(Mpi, EveryRankChoosesTheSameAlgorithmsAfterCalibration) {
  Options o = testOptions();
  o.set("CALIBRATE", "1");
  expectEveryRankChoosesAlike(o, "calibrated");
}

// The default (GRADCOMM_CALIBRATE=0): rank 0's static constants, nothing measured.
TEST(Mpi, EveryRankChoosesTheSameAlgorithmsWithTheStaticModel) {
  expectEveryRankChoosesAlike(testOptions(), "static");
}

// The receive of abort notices stays open, so every progress pass tests
// it with the other transfers (and the look for a notice costs no progress
// call of its own): a notice that a pass completed must still be reported,
// once, with its sender.
TEST(Mpi, AnAbortNoticeThatArrivesDuringTransfersIsReportedOnce) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  auto env = transport::MpiEnvironment::acquire();
  transport::MpiTransport t(MPI_COMM_WORLD, env);
  core::AbortChannel aborts(t);
  MPI_Barrier(MPI_COMM_WORLD);
  if (t.rank() == 1) {
    aborts.broadcast("notice from the test");
  } else if (t.rank() == 0) {
    transport::Tag tag;
    tag.seq = 80;  // never sent: the receive stays open and every test runs a pass
    std::vector<char> buf(64);
    auto r = t.irecv(1, buf.data(), buf.size(), tag);
    // Passes only, until the notice must have arrived; then one look.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until) EXPECT_FALSE(r->test());
    auto notice = aborts.poll();
    EXPECT_EQ(notice.value_or("(none)"), "rank 1: notice from the test") << "the notice a pass received was lost";
    EXPECT_FALSE(aborts.poll().has_value()) << "reported twice";
  }
  // Rank 1's sends complete as their receivers take them.
  for (int i = 0; i < 100; ++i) (void)aborts.poll();
  MPI_Barrier(MPI_COMM_WORLD);
}

// The transport's requests come from a per-thread pool of freed blocks
// (mpi_transport.cpp). Requests made on one thread are completed and freed
// on another after the first has ended (its pool, holding blocks, went back
// to the heap), and that thread's next requests reuse the blocks: every
// exchange must still deliver its bytes. Under AddressSanitizer a pooled
// block is poisoned, so a request touched after its free fails the
// sanitizer stage, which runs this test.
TEST(Mpi, TransportRequestsMadeOnOneThreadAreCompletedAndFreedOnAnother) {
  if (worldSize() < 2) GTEST_SKIP() << "needs two ranks";
  auto env = transport::MpiEnvironment::acquire();
  transport::MpiTransport t(MPI_COMM_WORLD, env);
  const int to = (t.rank() + 1) % t.size(), from = (t.rank() + t.size() - 1) % t.size();
  struct Exchange {
    std::vector<int> out, in;
    transport::RequestPtr send, recv;
  };
  // Exchange k: this rank sends k * 1000 + its rank to the next rank.
  auto post = [&](Exchange& x, int k) {
    transport::Tag tag;
    tag.seq = static_cast<uint64_t>(100 + k);
    x.out.assign(16, k * 1000 + t.rank());
    x.in.assign(16, -1);
    x.recv = t.irecv(from, x.in.data(), x.in.size() * sizeof(int), tag);
    x.send = t.isend(to, x.out.data(), x.out.size() * sizeof(int), tag);
  };
  auto finish = [&](Exchange& x, int k) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool sent = false, received = false;
    while (!(sent && received) && std::chrono::steady_clock::now() < deadline) {
      sent = sent || x.send->test();
      received = received || x.recv->test();
    }
    ASSERT_TRUE(sent && received) << "exchange " << k << " did not complete";
    EXPECT_EQ(x.in, std::vector<int>(16, k * 1000 + from)) << "exchange " << k;
    x.send.reset();
    x.recv.reset();
  };
  Exchange handed;
  std::thread maker([&] {
    // A whole exchange here first, so that this thread's pool holds blocks
    // when it ends; then requests it leaves to the main thread.
    Exchange first;
    post(first, 1);
    finish(first, 1);
    post(handed, 2);
  });
  maker.join();
  finish(handed, 2);  // freed here: the blocks join this thread's pool
  for (int k = 3; k < 6; ++k) {
    Exchange x;
    post(x, k);  // made from those blocks
    finish(x, k);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
