#pragma once
// The Chrome-trace writer is public (gradcomm/timeline.hpp); the library's
// own code names it core::Timeline.
#include "gradcomm/timeline.hpp"

namespace gradcomm::core {
using Timeline = ::gradcomm::Timeline;
}  // namespace gradcomm::core
