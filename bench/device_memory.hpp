#pragma once
// Where a benchmark's buffers live (--memory host|device): host memory, or
// CUDA memory with the stream the tool's calls run on. The tools fill and
// check buffers through host copies (upload, download).
#if GRADCOMM_BENCH_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "launch.hpp"

namespace gradcomm::bench {

class DeviceMemory {
 public:
  bool device() const { return device_; }
  /// The CUDA device of the buffers; -1 for host memory.
  int ordinal() const { return device_ ? ordinal_ : -1; }
  /// Selects the GPU of this rank (local rank mod the GPUs: mpirun's,
  /// torchrun's or GRADCOMM_LOCAL_RANK, else `rank`) and makes the stream;
  /// exits 77 (nothing measured) without a build with CUDA or a GPU.
  void useDevice(const char* tool, int rank) {
    tool_ = tool;
#if GRADCOMM_BENCH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::fprintf(stderr, "%s: --memory device: no usable CUDA device here\n", tool);
      finalizeMpiIfUp();
      std::exit(77);
    }
    int local = rank;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "GRADCOMM_LOCAL_RANK"}) {
      if (const char* e = std::getenv(v)) {
        local = std::atoi(e);
        break;
      }
    }
    ordinal_ = local % n;
    ok(cudaSetDevice(ordinal_), "cudaSetDevice");
    ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    device_ = true;
#else
    (void)rank;
    std::fprintf(stderr, "%s: --memory device: this %s was built without CUDA\n", tool, tool);
    finalizeMpiIfUp();
    std::exit(77);
#endif
  }
  /// The stream calls on these buffers run on (null for host memory).
  void* stream() const {
#if GRADCOMM_BENCH_CUDA
    return stream_;
#else
    return nullptr;
#endif
  }
  /// `bytes` (at least 1) of zeroed memory of this kind.
  unsigned char* allocate(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
#if GRADCOMM_BENCH_CUDA
    if (device_) {
      void* p = nullptr;
      ok(cudaMalloc(&p, bytes), "cudaMalloc");
      // On the tool's stream (non-blocking: it does not follow the legacy
      // default stream), done before anything is written to the buffer.
      ok(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
      ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      return static_cast<unsigned char*>(p);
    }
#endif
    auto* p = new unsigned char[bytes];
    std::memset(p, 0, bytes);
    return p;
  }
  void release(unsigned char* p) {
#if GRADCOMM_BENCH_CUDA
    if (device_) {
      cudaFree(p);
      return;
    }
#endif
    delete[] p;
  }
  /// host -> buffer, buffer -> host, buffer -> buffer; done on return.
  void upload(void* dst, const void* host, size_t bytes) { copy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) { copy(host, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) {
    copyAsync(dst, src, bytes);
    synchronize();
  }
  /// The same, ordered on the stream, not waited for: `src` must stay as
  /// it is until synchronize().
  void copyAsync(void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
#if GRADCOMM_BENCH_CUDA
    if (device_) {
      ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  /// Waits for everything queued on the stream.
  void synchronize() {
#if GRADCOMM_BENCH_CUDA
    if (device_) ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
#endif
  }

 private:
#if GRADCOMM_BENCH_CUDA
  void ok(cudaError_t rc, const char* what) {
    if (rc == cudaSuccess) return;
    std::fprintf(stderr, "%s: %s: %s\n", tool_.c_str(), what, cudaGetErrorString(rc));
    std::exit(2);
  }
  cudaStream_t stream_ = nullptr;
#endif
  bool device_ = false;
  int ordinal_ = -1;
  std::string tool_ = "gradcomm";
};

}  // namespace gradcomm::bench
