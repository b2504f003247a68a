#pragma once
/// Umbrella header of gradcomm's C++ API (MPI-free).
#include "gradcomm/communicator.hpp"
#include "gradcomm/config.hpp"
#include "gradcomm/device.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/types.hpp"
#include "gradcomm/version.hpp"
