#pragma once
// MPI interop: create a Communicator over any MPI communicator. Include
// only where MPI headers are available.
#include <mpi.h>

#include "gradcomm/communicator.hpp"

namespace gradcomm {

/// Communicator over `comm` (duplicated; the caller keeps ownership of
/// `comm`). Initialises MPI if needed. Collective over `comm`: every rank
/// validates its configuration and all throw ConfigError if any rank's
/// configuration is invalid or differs.
GRADCOMM_API Communicator communicatorFromMpi(MPI_Comm comm, const Options& options = {});

}  // namespace gradcomm
