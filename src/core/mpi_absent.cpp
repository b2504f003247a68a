// A build without MPI: Communicator() and Communicator(options) are over
// MPI_COMM_WORLD, so they can only say what this build lacks and how to
// form a communicator without MPI. (gradcomm/mpi.hpp's functions are not
// declared in such a build: the header stops with #error.)
#include "gradcomm/communicator.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm {
namespace {

[[noreturn]] void noMpi() {
  throw UnsupportedError(
      "Communicator() is over MPI_COMM_WORLD, but this gradcomm was built without MPI: install an MPI "
      "(apt-get install libopenmpi-dev) and rebuild with GRADCOMM_WITH_MPI=ON, or form the communicator with "
      "communicatorFromEnvironment() (RANK/WORLD_SIZE with GRADCOMM_RENDEZVOUS or torchrun's MASTER_ADDR) or "
      "communicatorFromStore()");
}

}  // namespace

Communicator::Communicator() { noMpi(); }

Communicator::Communicator(const Options&) { noMpi(); }

}  // namespace gradcomm
