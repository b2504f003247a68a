#if GRADCOMM_HAVE_MPI
#include <mpi.h>
#endif

#include <string>
#include <utility>
#include <vector>

#include "core/build_config.hpp"
#include "device/collective_library.hpp"
#include "gradcomm/config.hpp"
#include "gradcomm/version.hpp"
#include "kernels/reduce.hpp"
#include "transport/ucx_factory.hpp"

#if GRADCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if GRADCOMM_HAVE_NCCL
#include <nccl.h>
#endif
#if GRADCOMM_HAVE_UCX
#include <ucp/api/ucp_version.h>
#endif

namespace gradcomm {

std::vector<std::pair<std::string, std::string>> buildInfo() {
  std::vector<std::pair<std::string, std::string>> info;
  info.emplace_back("gradcomm", GRADCOMM_VERSION_STRING);
  info.emplace_back("compiler", __VERSION__);
  // avx512bf16 adds only the bf16 compression casts (kernels/simd.hpp).
  info.emplace_back("cpu kernels", std::string("scalar, avx2, avx512, avx512bf16 (this CPU: ") +
                                       kernels::toString(kernels::detectSimd()) + ")");
  // Every optional dependency and whether this build has it (the same list
  // as CMake's summary line; GTest, benchmark and Torch are the build
  // tree's test suites, microbenchmarks and PyTorch backend).
  const std::pair<const char*, bool> builtIn[] = {
      {"MPI", GRADCOMM_BUILT_IN_MPI},     {"UCX", GRADCOMM_BUILT_IN_UCX},
      {"hwloc", GRADCOMM_BUILT_IN_HWLOC}, {"CUDA", GRADCOMM_BUILT_IN_CUDA},
      {"NCCL", GRADCOMM_BUILT_IN_NCCL},   {"GTest", GRADCOMM_BUILT_IN_GTEST},
      {"benchmark", GRADCOMM_BUILT_IN_BENCHMARK}, {"Torch", GRADCOMM_BUILT_IN_TORCH}};
  std::string with, without;
  for (const auto& [name, have] : builtIn) {
    std::string& list = have ? with : without;
    list += (list.empty() ? "" : ", ") + std::string(name);
  }
  info.emplace_back("built in", with.empty() ? "none" : with);
  info.emplace_back("not built in", without.empty() ? "none" : without);
#if GRADCOMM_HAVE_MPI
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string mpi(version, static_cast<size_t>(len));
  if (auto nl = mpi.find_first_of("\n,"); nl != std::string::npos) mpi.resize(nl);
  info.emplace_back("mpi", mpi + " (MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION) + ")");
#else
  info.emplace_back("mpi", "not built in (install an MPI, e.g. apt-get install libopenmpi-dev, and rebuild)");
#endif
#if GRADCOMM_HAVE_CUDA
  info.emplace_back("cuda", "yes, runtime API " + std::to_string(CUDART_VERSION / 1000) + "." +
                                std::to_string((CUDART_VERSION % 1000) / 10) + ", kernels for " GRADCOMM_CUDA_ARCHS);
  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);
  info.emplace_back("cuda devices", rc == cudaSuccess ? std::to_string(devices)
                                                      : std::string("none usable (cudaGetDeviceCount: ") +
                                                            cudaGetErrorString(rc) + ")");
#else
  info.emplace_back("cuda", "no");
#endif
#if GRADCOMM_HAVE_NCCL
  info.emplace_back("nccl", "yes, " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                                std::to_string(NCCL_PATCH));
#else
  info.emplace_back("nccl", "no");
#endif
  // What serves device buffers (GRADCOMM_DEVICE_ENGINE=auto decides per
  // communicator, with the other ranks, at its first device call).
  if (!device::runtime().canMoveDeviceMemory()) {
    info.emplace_back("device engine", "none: built without CUDA (device buffers are refused)");
  } else if (auto lib = device::collectiveLibrary(); lib && lib->unavailable().empty()) {
    info.emplace_back("device engine", lib->name() + " where every rank has a device of its own, else staged "
                                                     "through pinned host memory");
  } else {
    info.emplace_back("device engine", "staged through pinned host memory (no NCCL engine: " +
                                           (lib ? lib->unavailable() : std::string("built without NCCL")) + ")");
  }
#if GRADCOMM_HAVE_UCX
  info.emplace_back("ucx", "yes, built against " + std::to_string(UCP_API_MAJOR) + "." + std::to_string(UCP_API_MINOR) +
                               ", running " + transport::ucxVersionText());
  info.emplace_back("ucx transports", transport::ucxTransportsText());
#else
  info.emplace_back("ucx", "no");
#endif
  return info;
}

}  // namespace gradcomm
