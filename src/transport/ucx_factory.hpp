#pragma once
// The UCX transport where this build has it, and a clear error where not.
#include <chrono>
#include <memory>
#include <string>

#include "transport/bootstrap.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {

/// A UcxTransport over `boot` (collective), and in `*hosts` the host layout
/// its host keys gave; UnsupportedError in a build without UCX.
std::unique_ptr<Transport> makeUcxTransport(Bootstrap& boot, size_t shmChunkBytes,
                                            std::chrono::milliseconds connectTimeout, HostLayout* hosts);
/// True when this build has the UCX transport.
bool haveUcx();
/// UCX's version, and the transport/device pairs UCX finds here (or why not).
std::string ucxVersionText();
std::string ucxTransportsText();

}  // namespace gradcomm::transport
