#pragma once
// The rendezvous port a job launched by mpirun derives from its job id when
// all its ranks share one host (communicatorFromEnvironment).
#include <cstdint>
#include <string>

namespace gradcomm::core {

/// A closed range of TCP ports.
struct PortRange {
  int lo = 0;
  int hi = 0;
};

/// Linux's ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range), the
/// kernel's default 32768-60999 where that cannot be read.
PortRange ephemeralPortRange();

/// The port every rank of the job `jobId` computes alike, outside
/// `ephemeral` (below it where there is room, else above). Throws
/// ConfigError, naming GRADCOMM_RENDEZVOUS, where fewer than 1024
/// unprivileged ports lie outside it.
uint16_t mpirunRendezvousPort(const std::string& jobId, PortRange ephemeral);

}  // namespace gradcomm::core
