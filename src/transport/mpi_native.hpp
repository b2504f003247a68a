#pragma once
#include <mpi.h>

#include <memory>

#include "transport/transport.hpp"

namespace gradcomm::transport {

class Graveyard;

/// MPI's nonblocking collectives on `comm` (the "native" algorithm), with
/// gradcomm's kernels as MPI user operations; requests abandoned in flight
/// go to `graveyard`.
std::unique_ptr<NativeCollectives> makeMpiNative(MPI_Comm comm, std::shared_ptr<Graveyard> graveyard);

}  // namespace gradcomm::transport
