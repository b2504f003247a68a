#pragma once
/// Symbol visibility for the shared library: only declarations marked
/// GRADCOMM_API are exported from libgradcomm.so.
#if defined(GRADCOMM_BUILDING_LIBRARY)
#define GRADCOMM_API __attribute__((visibility("default")))
#else
#define GRADCOMM_API
#endif
