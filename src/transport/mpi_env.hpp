#pragma once
#include <mpi.h>

#include <memory>

namespace gradcomm::transport {

/// Process-wide MPI lifetime. The first acquire() initialises MPI (with
/// MPI_THREAD_MULTIPLE) unless the caller already did; MPI is finalised at
/// process exit only if gradcomm initialised it.
class MpiEnvironment {
 public:
  static std::shared_ptr<MpiEnvironment> acquire();
  ~MpiEnvironment();
  int threadLevel() const { return threadLevel_; }
  bool ownsInit() const { return ownsInit_; }
  /// False once MPI_Finalize has run (by anyone).
  static bool usable();

 private:
  MpiEnvironment();
  int threadLevel_ = MPI_THREAD_SINGLE;
  bool ownsInit_ = false;
};

/// Throws TransportError naming `what` when rc is not MPI_SUCCESS.
void checkMpi(int rc, const char* what);

}  // namespace gradcomm::transport
