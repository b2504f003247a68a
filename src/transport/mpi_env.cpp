#include "transport/mpi_env.hpp"

#include <unistd.h>

#include <cstdio>
#include <chrono>
#include <mutex>
#include <thread>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {

std::string mpiErrorText(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

void checkMpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw TransportError(std::string(what) + " failed: " + mpiErrorText(rc));
}

bool MpiEnvironment::usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

MpiEnvironment::MpiEnvironment() {
  int initialized = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw InvalidUsage("MPI has already been finalised in this process; create gradcomm communicators before "
                       "MPI_Finalize");
  }
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    checkMpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    ownsInit_ = true;
  }
  MPI_Query_thread(&threadLevel_);
}

void MpiEnvironment::markBroken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(reasonMu_);
  if (!broken_.exchange(true)) brokenReason_ = reason;
}

MpiEnvironment::~MpiEnvironment() {
  if (!ownsInit_ || !usable()) return;
  if (broken_.load()) {
    // Runs at exit, after main returned. MPI_Finalize synchronises with
    // every rank, so with a rank gone it would never return; and a job that
    // lost a rank failed, whatever this process's main returned. MPI_Abort
    // ends the whole job at once with a failure status (mpirun exits
    // non-zero), including ranks stuck in MPI calls of their own. Only an
    // MPI that gradcomm itself initialised is ended this way: a caller
    // that owns MPI decides for itself (see the README).
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(reasonMu_);
      reason = brokenReason_.size() > 200 ? brokenReason_.substr(0, 200) + "..." : brokenReason_;
    }
    std::fprintf(stderr,
                 "gradcomm[rank %d]: not finalising MPI: a peer failed or stopped responding (%s); aborting the "
                 "job with MPI_Abort(MPI_COMM_WORLD, %d)\n",
                 rank, reason.c_str(), kBrokenJobExitCode);
    std::fflush(stdout);
    std::fflush(stderr);
    // A moment first, so the other survivors can take the failure notice
    // this rank sent and report their own errors before the job ends.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    MPI_Abort(MPI_COMM_WORLD, kBrokenJobExitCode);
    _exit(kBrokenJobExitCode);  // MPI_Abort does not return; in case this one does
  }
  MPI_Finalize();
}

std::shared_ptr<MpiEnvironment> MpiEnvironment::acquire() {
  // Held by a static so that MPI is finalised at exit, not when the last
  // communicator goes away: MPI cannot be initialised twice in one process.
  static std::mutex mu;
  static std::shared_ptr<MpiEnvironment> env;
  std::lock_guard<std::mutex> lock(mu);
  if (!env) env.reset(new MpiEnvironment());
  return env;
}

}  // namespace gradcomm::transport
