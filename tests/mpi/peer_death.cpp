// A rank is SIGKILLed in the middle of large allreduces, in a program that
// never touches MPI itself: gradcomm initialised MPI, so gradcomm tears it
// down. Every survivor must get an error within GRADCOMM_TIMEOUT (plus a
// little), and the job must end: a broken MPI cannot be finalised (the
// survivors would wait in MPI_Finalize for the dead rank forever), so
// gradcomm aborts it and mpirun exits non-zero. Run by ctest as
//   mpirun-test --job-fails-within S 3 peer_death ALGORITHM
// (also with GRADCOMM_TRANSPORT=ucx: MPI only forms the communicator).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/gradcomm.hpp"
#include "support/marker.hpp"

using namespace gradcomm;
using gradcomm::testing::mark;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ring|hd|tree|shm\n", argv[0]);
    return 2;
  }
  const std::string algo = argv[1];
  Options o;
  o.set("ALGO", "allreduce:" + algo);
  Communicator comm(o);  // MPI_COMM_WORLD; gradcomm initialises MPI
  const int rank = comm.rank();
  const int dying = comm.size() - 1;
  // GRADCOMM_TRANSPORT (the ucx variant) must have been taken.
  const char* wanted = std::getenv("GRADCOMM_TRANSPORT");
  if (wanted && comm.transportName().rfind(wanted, 0) != 0) {
    mark(rank, "FAIL: GRADCOMM_TRANSPORT=" + std::string(wanted) + " but the transport is " + comm.transportName());
    return 1;
  }
  // GRADCOMM_TIMEOUT in seconds ("5s"), as the test sets it.
  const char* timeoutText = std::getenv("GRADCOMM_TIMEOUT");
  const double timeoutS = timeoutText ? std::atof(timeoutText) : 300.0;
  std::vector<float> buf(1u << 20, 1.0f);
  // Healthy rounds first: every rank is connected and in step.
  for (int i = 0; i < 3; ++i) {
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
  }
  if (rank == dying) {
    mark(rank, "PASS");  // its part is to die, in the middle of an allreduce
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::kill(getpid(), SIGKILL);
    }).detach();
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string status = "FAIL: 500 allreduces completed although rank " + std::to_string(dying) + " died";
  try {
    for (int i = 0; i < 500; ++i) {
      t0 = std::chrono::steady_clock::now();
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    }
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool kind = e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kTransport ||
                      e.code() == ErrorCode::kRemote;
    if (!kind) status = std::string("FAIL: unexpected ") + toString(e.code()) + ": " + e.what();
    else if (s > timeoutS + 3) status = "FAIL: the error took " + std::to_string(s) + " s";
    else status = "PASS";
    std::printf("rank %d: error after %.2f s (%s): %s\n", rank, s, toString(e.code()), e.what());
  }
  mark(rank, status);
  // Return normally: gradcomm owns MPI and must end the broken job itself.
  return status == "PASS" ? 0 : 1;
}
