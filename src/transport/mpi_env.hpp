#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace gradcomm::transport {

/// Process-wide MPI lifetime. The first acquire() initialises MPI (with
/// MPI_THREAD_MULTIPLE) unless the caller already did; MPI is finalised at
/// process exit only if gradcomm initialised it.
class MpiEnvironment {
 public:
  static std::shared_ptr<MpiEnvironment> acquire();
  ~MpiEnvironment();
  int threadLevel() const { return threadLevel_; }
  /// False once MPI_Finalize has run (by anyone).
  static bool usable();
  /// Records that a peer may have died or hung. MPI_Finalize would then
  /// wait for it forever, so at exit an MPI that gradcomm initialised is
  /// aborted (MPI_Abort: the job fails, mpirun exits non-zero) instead.
  /// Never ends anything by itself.
  void markBroken(const std::string& reason);

 private:
  MpiEnvironment();
  int threadLevel_ = MPI_THREAD_SINGLE;
  bool ownsInit_ = false;
  std::atomic<bool> broken_{false};
  std::mutex reasonMu_;
  std::string brokenReason_;  // the first one, guarded by reasonMu_
};

/// Exit status of a process whose gradcomm-owned MPI job broke (MPI_Abort's errorcode).
constexpr int kBrokenJobExitCode = 1;

/// MPI's text for an error code.
std::string mpiErrorText(int rc);

/// Throws TransportError naming `what` when rc is not MPI_SUCCESS.
void checkMpi(int rc, const char* what);

}  // namespace gradcomm::transport
