#pragma once
// MPI interop: create a Communicator over any MPI communicator. Include
// only where MPI headers are available, with a gradcomm built with MPI.
#include "gradcomm/version.hpp"
#if !GRADCOMM_BUILT_WITH_MPI
#error "gradcomm/mpi.hpp: this gradcomm was built without MPI (GRADCOMM_WITH_MPI=OFF or no MPI found): install an MPI (apt-get install libopenmpi-dev) and rebuild, or form communicators with communicatorFromEnvironment / communicatorFromStore"
#endif
#include <mpi.h>

#include <chrono>
#include <memory>

#include "gradcomm/communicator.hpp"
#include "gradcomm/store.hpp"

namespace gradcomm {

/// Communicator over `comm` (duplicated; the caller keeps ownership of
/// `comm`). Initialises MPI if needed. Collective over `comm`: every rank
/// validates its configuration and all throw ConfigError if any rank's
/// configuration is invalid or differs.
GRADCOMM_API Communicator communicatorFromMpi(MPI_Comm comm, const Options& options = {});

/// A Store shared by the ranks of `comm` (collective): rank 0 serves a
/// TcpStore on a free port of every interface and tells the others through
/// MPI where (loopback for ranks on its host, else its addresses in turn);
/// every rank connects within `timeout` or all throw TransportError. For
/// code that forms communicators through a store (communicatorFromStore) in
/// a job that MPI launched. Rank 0's store is the server: keep it until the
/// other ranks are done with theirs (communicators formed through it keep
/// it alive themselves).
GRADCOMM_API std::shared_ptr<Store> storeFromMpi(MPI_Comm comm,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace gradcomm
