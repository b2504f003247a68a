#include "transport/ucx_factory.hpp"

#include "gradcomm/error.hpp"

#if GRADCOMM_HAVE_UCX
#include "transport/ucx/ucx_transport.hpp"
#endif

namespace gradcomm::transport {

#if GRADCOMM_HAVE_UCX
std::unique_ptr<Transport> makeUcxTransport(Bootstrap& boot, size_t shmChunkBytes,
                                            std::chrono::milliseconds connectTimeout, HostLayout* hosts) {
  auto t = std::make_unique<UcxTransport>(boot, shmChunkBytes, connectTimeout);
  *hosts = t->hostLayout();
  return t;
}
bool haveUcx() { return true; }
std::string ucxVersionText() { return ucxVersion(); }
std::string ucxTransportsText() { return ucxTransportsFound(); }
#else
std::unique_ptr<Transport> makeUcxTransport(Bootstrap& boot, size_t, std::chrono::milliseconds, HostLayout*) {
  // Between processes without UCX only MPI can move bytes, and only for a
  // communicator formed from MPI: say what to install, or how to launch.
  const std::string why =
      "this gradcomm was built without UCX, so GRADCOMM_TRANSPORT=ucx and communicators of several processes "
      "formed through a store (communicatorFromStore, communicatorFromEnvironment) cannot connect: install UCX "
      "(pip install libucx-cu13, or apt-get install libucx-dev) and rebuild" +
      std::string(GRADCOMM_HAVE_MPI ? ", or launch with mpirun and form the communicator from MPI "
                                      "(Communicator() or communicatorFromMpi)"
                                    : ", or rebuild with MPI (apt-get install libopenmpi-dev) and launch with mpirun");
  boot.fail(why);
  throw UnsupportedError(why);
}
bool haveUcx() { return false; }
std::string ucxVersionText() { return "no"; }
std::string ucxTransportsText() { return "none (built without UCX)"; }
#endif

}  // namespace gradcomm::transport
