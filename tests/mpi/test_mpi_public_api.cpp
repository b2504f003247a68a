// The public point-to-point calls and Communicator::abort over the MPI
// transport (and UCX, where ctest runs this binary with it), on whatever
// number of ranks mpirun started.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gradcomm/communicator.hpp"
#include "gradcomm/mpi.hpp"
#include "support/text.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

Options options(const char* timeout) {
  Options o;
  o.set("TIMEOUT", timeout);
  return o;
}


std::vector<float> pattern(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
  return v;
}

}  // namespace

TEST(MpiPublicApi, SendRecvAndABatchShiftARing) {
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, options("60s"));
  const int p = comm.size(), rank = comm.rank();
  const int right = (rank + 1) % p, left = (rank + p - 1) % p;
  for (size_t n : {size_t{1}, size_t{4099}, size_t{1} << 20}) {
    auto mine = pattern(rank, n);
    std::vector<float> got(n, -1.0f);
    using T = Communicator::Transfer;
    // One batch, to neighbours and (with one rank) to itself.
    comm.pointToPoint({T::send(mine.data(), n, DataType::kFloat32, right),
                       T::recv(got.data(), n, DataType::kFloat32, left)})
        .wait();
    EXPECT_EQ(got, pattern(left, n)) << "batch, n=" << n;
    if (p < 2) continue;
    // Separate calls, every rank sending first.
    std::fill(got.begin(), got.end(), -1.0f);
    Work s = comm.send(mine.data(), n, DataType::kFloat32, right, 5);
    Work r = comm.recv(got.data(), n, DataType::kFloat32, left, 5);
    r.wait();
    s.wait();
    EXPECT_EQ(got, pattern(left, n)) << "send/recv, n=" << n;
  }
  // A collective after point-to-point calls still agrees on every rank.
  std::vector<double> one(10, 1.0);
  comm.allreduce(one.data(), one.data(), one.size(), DataType::kFloat64, ReduceOp::kSum).wait();
  EXPECT_EQ(one[0], static_cast<double>(p));
  comm.destroy();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiPublicApi, AbortFailsEveryRankWithTheReason) {
  int worldSize = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  if (worldSize < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, options("30s"));
  const int aborter = comm.size() - 1;
  std::vector<float> buf(1000, 1.0f);
  std::string what;
  int code = -1;
  try {
    if (comm.rank() == aborter) {
      // Pending when the abort comes: a recv that nobody sends.
      Work pending = comm.recv(buf.data(), buf.size(), DataType::kFloat32, 0);
      comm.abort("the loss became NaN");
      pending.wait();
    } else {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    }
  } catch (const Error& e) {
    what = e.what();
    code = static_cast<int>(e.code());
  }
  EXPECT_TRUE(contains(what, "rank " + std::to_string(aborter) + " aborted the communicator: the loss became NaN"))
      << what;
  EXPECT_EQ(code, static_cast<int>(comm.rank() == aborter ? ErrorCode::kInvalidUsage : ErrorCode::kRemote)) << what;
  EXPECT_TRUE(comm.valid());
  comm.destroy();
  MPI_Barrier(MPI_COMM_WORLD);
}
