#include "transport/mpi_env.hpp"

#include <mutex>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {

void checkMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
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

MpiEnvironment::~MpiEnvironment() {
  if (ownsInit_ && usable()) MPI_Finalize();
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
