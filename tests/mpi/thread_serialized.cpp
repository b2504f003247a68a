// A program that initialised MPI with MPI_THREAD_SERIALIZED: gradcomm's
// progress thread calls MPI while the program's own threads may too, which
// that level forbids, so creating a communicator must fail on every rank
// with an error that says which level to ask for. Every rank checks and
// leaves its verdict for scripts/mpirun-test.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gradcomm/mpi.hpp"
#include "support/marker.hpp"

using namespace gradcomm;
using gradcomm::testing::mark;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string verdict;
  if (provided != MPI_THREAD_SERIALIZED) {
    verdict = "FAIL: asked MPI for MPI_THREAD_SERIALIZED and got level " + std::to_string(provided) +
              ": this MPI cannot run the test";
  } else {
    for (const char* transport : {"mpi", "auto"}) {
      Options o;
      o.set("TRANSPORT", transport);
      o.set("TIMEOUT", "20s");
      try {
        Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
        verdict = std::string("FAIL: a communicator (transport ") + transport +
                  ") was created over MPI_THREAD_SERIALIZED";
        comm.destroy();
      } catch (const UnsupportedError& e) {
        const std::string what = e.what();
        if (what.find("MPI_THREAD_MULTIPLE") == std::string::npos ||
            what.find("MPI_THREAD_SERIALIZED") == std::string::npos) {
          verdict = "FAIL: the error does not name the level given and the one needed: " + what;
        }
      } catch (const std::exception& e) {
        verdict = std::string("FAIL: wrong error type: ") + e.what();
      }
      if (!verdict.empty()) break;
    }
#if GRADCOMM_TEST_HAVE_UCX
    // Over UCX, MPI only forms the communicator, on this thread: the level
    // the program asked for is enough, and the communicator works.
    if (verdict.empty()) {
      Options o;
      o.set("TRANSPORT", "ucx");
      o.set("TIMEOUT", "20s");
      try {
        Communicator comm = communicatorFromMpi(MPI_COMM_WORLD, o);
        std::vector<float> v(1000, 1.0f);
        comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        if (v[999] != static_cast<float>(comm.size())) verdict = "FAIL: wrong sum over UCX";
        comm.destroy();
      } catch (const std::exception& e) {
        verdict = std::string("FAIL: over UCX: ") + e.what();
      }
    }
#endif
    if (verdict.empty()) verdict = "PASS";
  }
  mark(rank, verdict);
  MPI_Finalize();
  return verdict == "PASS" ? 0 : 1;
}
