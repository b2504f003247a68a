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
  const std::string why = "this gradcomm was built without UCX (install libucx-dev and rebuild), so "
                          "GRADCOMM_TRANSPORT=ucx and communicators formed without MPI are unavailable";
  boot.fail(why);
  throw UnsupportedError(why);
}
bool haveUcx() { return false; }
std::string ucxVersionText() { return "no"; }
std::string ucxTransportsText() { return "none (built without UCX)"; }
#endif

}  // namespace gradcomm::transport
