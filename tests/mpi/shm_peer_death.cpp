// A rank dies (SIGKILL) in the middle of a shared-memory allreduce. The
// survivors must get an error that names it, well before GRADCOMM_TIMEOUT,
// and no gradcomm segment may be left in /dev/shm. Run by ctest as
//   mpirun-test --dying-rank R N shm_peer_death   (with orte_abort_on_non_zero_status 0)
#include <dirent.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/mpi.hpp"
#include "support/marker.hpp"

using namespace gradcomm;
using gradcomm::testing::mark;

namespace {

int leftoverSegments() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind("gradcomm-", 0) == 0;
    closedir(d);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int dying = size - 1;
  Options o;
  o.set("ALGO", "allreduce:shm");
  o.set("TIMEOUT", "30s");
  Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
  std::vector<float> buf(16u << 20, 1.0f);
  // One healthy round first: every rank has the segment mapped and in use.
  comm.allreduce(buf.data(), buf.data(), 1024, DataType::kFloat32, ReduceOp::kSum).wait();
  if (leftoverSegments() != 0) {
    mark(rank, "FAIL: a gradcomm segment is still linked in /dev/shm after setup");
    _exit(1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == dying) {
    mark(rank, "PASS");  // its part is to die
    Work w = comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(getpid(), SIGKILL);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string status;
  try {
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    status = "FAIL: the allreduce completed although rank " + std::to_string(dying) + " died";
  } catch (const Error& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string what = e.what();
    const bool names = what.find("rank " + std::to_string(dying)) != std::string::npos;
    if (!names) status = "FAIL: the error does not name rank " + std::to_string(dying) + ": " + what;
    else if (s > 10) status = "FAIL: the error took " + std::to_string(s) + " s";
    else status = "PASS";
    std::printf("rank %d got after %.2f s: %s\n", rank, s, what.c_str());
  }
  if (status == "PASS" && leftoverSegments() != 0) status = "FAIL: a gradcomm segment was left in /dev/shm";
  mark(rank, status);
  // The job is broken (a rank is gone): leave without MPI_Finalize.
  _exit(status == "PASS" ? 0 : 1);
}
