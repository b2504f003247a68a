#pragma once
#include <chrono>

#include "base/params.hpp"
#include "gradcomm/config.hpp"
#include "transport/bootstrap.hpp"

namespace gradcomm::core {

/// Resolves this rank's configuration and agrees on it with every other
/// rank of `boot` (collective): when any rank's configuration is invalid,
/// or a parameter that must agree differs between ranks, every rank throws
/// ConfigError naming the rank and the parameter.
Config agreeOnConfiguration(const Options& options, transport::Bootstrap& boot);

/// How long transports may take to connect: GRADCOMM_TIMEOUT (0: none).
std::chrono::milliseconds connectTimeout(const Config& config);

}  // namespace gradcomm::core
