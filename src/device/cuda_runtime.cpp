// The device runtime over CUDA (builds with CUDA).
#include <cuda_runtime_api.h>

#include <atomic>
#include <fstream>
#include <string>
#include <utility>

#include "device/cuda_scope.hpp"
#include "device/runtime.hpp"
#include "gradcomm/error.hpp"
#include "kernels/reduce_cuda.hpp"

namespace gradcomm::device {

bool primaryContextActive(int device) {
  // The driver's own answer, reached through the runtime (no link against
  // the driver library); where the driver offers none, assume active.
  using GetDevice = int (*)(int* dev, int ordinal);
  using GetState = int (*)(int dev, unsigned* flags, int* active);
  static const auto entries = [] {
    void* get = nullptr;
    void* state = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 2000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 7000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return std::pair<GetDevice, GetState>{nullptr, nullptr};
    }
    return std::pair<GetDevice, GetState>{reinterpret_cast<GetDevice>(get), reinterpret_cast<GetState>(state)};
  }();
  if (!entries.first || device < 0) return true;
  int dev = 0, active = 1;
  unsigned flags = 0;
  if (entries.first(&dev, device) != 0 || entries.second(dev, &flags, &active) != 0) return true;
  return active != 0;
}

namespace {

/// A CUDA compressor whose calls make its device current first: the
/// progress thread that drives them serves every device of the process, and
/// a kernel goes only to a stream of the current device.
class CudaDeviceCompressor final : public compression::Compressor {
 public:
  CudaDeviceCompressor(compression::CompressorPtr inner, int device) : inner_(std::move(inner)), device_(device) {}
  compression::Kind kind() const override { return inner_->kind(); }
  compression::MemoryKind memory() const override { return inner_->memory(); }
  bool summable() const override { return inner_->summable(); }
  DataType payloadType() const override { return inner_->payloadType(); }
  size_t payloadBytes(size_t n) const override { return inner_->payloadBytes(n); }
  void compress(const float* in, float* residual, size_t n, void* payload,
                const compression::CompressArgs& args) override {
    DeviceScope scope(device_);
    inner_->compress(in, residual, n, payload, args);
  }
  void decompress(const void* payload, float* out, size_t n) override {
    DeviceScope scope(device_);
    inner_->decompress(payload, out, n);
  }
  void decompressAdd(const void* payload, float* out, size_t n) override {
    DeviceScope scope(device_);
    inner_->decompressAdd(payload, out, n);
  }
  void decompressAll(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n) override {
    DeviceScope scope(device_);
    inner_->decompressAll(payloads, slotBytes, ranks, out, n);
  }
  size_t queuedCheckBytes(int ranks) const override { return inner_->queuedCheckBytes(ranks); }
  std::function<void()> decompressAllQueued(const char* payloads, size_t slotBytes, int ranks, float* out, size_t n,
                                            void* hostCheck) override {
    DeviceScope scope(device_);
    return inner_->decompressAllQueued(payloads, slotBytes, ranks, out, n, hostCheck);
  }

 private:
  compression::CompressorPtr inner_;
  int device_;
};

class CudaRuntime final : public Runtime {
 public:
  std::string name() const override { return "cuda"; }
  bool canMoveDeviceMemory() const override { return true; }
  bool devicesPresent() override {
    int s = present_.load(std::memory_order_acquire);
    if (s < 0) {
      int n = 0;
      s = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 1 : 0;
      if (!s) cudaGetLastError();
      devices_.store(n, std::memory_order_relaxed);
      present_.store(s, std::memory_order_release);
    }
    return s == 1;
  }
  Memory classify(const void* p) override {
    if (!p || !devicesPresent() || !anyContext()) return {};
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // unregistered host memory on old runtimes
      return {};
    }
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return {true, attr.device};
    return {};
  }
  std::string identity(int device) override {
    // As NCCL tells GPUs apart: the GPU's PCI bus id (the same for every
    // MIG instance of one GPU, which NCCL refuses to share too) and the
    // host (its kernel's boot id, the same in every container on it).
    char bus[64] = {0};
    checkCuda(cudaDeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId");
    static const std::string boot = [] {
      std::ifstream f("/proc/sys/kernel/random/boot_id");
      std::string id;
      std::getline(f, id);
      return id;
    }();
    return "bus " + std::string(bus) + " of host " + boot;
  }
  int streamDevice(Stream s) override {
    int device = -1;
    if (!s) {
      checkCuda(cudaGetDevice(&device), "cudaGetDevice");
      return device;
    }
    checkCuda(cudaStreamGetDevice(static_cast<cudaStream_t>(s), &device), "cudaStreamGetDevice");
    return device;
  }
  int currentDevice() override {
    int device = -1;
    checkCuda(cudaGetDevice(&device), "cudaGetDevice");
    return primaryContextActive(device) ? device : -1;
  }
  void setCurrentDevice(int device) override { checkCuda(cudaSetDevice(device), "cudaSetDevice"); }
  Stream createStream(int device) override {
    DeviceScope scope(device);
    cudaStream_t s = nullptr;
    checkCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroyStream(Stream s) override {
    if (s) cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  Event createEvent(int device) override {
    DeviceScope scope(device);
    cudaEvent_t e = nullptr;
    checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroyEvent(Event e) override {
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void record(Event e, Stream s) override {
    checkCuda(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)), "cudaEventRecord");
  }
  void streamWait(Stream s, Event e) override {
    checkCuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent");
  }
  bool done(Event e) override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    checkCuda(err, "cudaEventQuery");
    return true;
  }
  void synchronize(Event e) override { checkCuda(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize"); }
  void copy(void* dst, const void* src, size_t bytes, Stream s) override {
    checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }
  void* allocateDevice(int device, size_t bytes) override {
    if (bytes == 0) return nullptr;
    DeviceScope scope(device);
    void* p = nullptr;
    checkCuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void freeDevice(void* p) override {
    if (p) cudaFree(p);
  }
  void zero(void* p, size_t bytes, Stream s) override {
    checkCuda(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(s)), "cudaMemsetAsync");
  }
  void* allocatePinned(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    checkCuda(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void freePinned(void* p) override {
    if (p) cudaFreeHost(p);
  }
  compression::CompressorPtr makeCompressor(const compression::Spec& spec, int device, Stream s) override {
    DeviceScope scope(device);
    return std::make_unique<CudaDeviceCompressor>(
        compression::makeCompressor(spec, compression::MemoryKind::kDevice, compression::detectIsa(), s), device);
  }
  // A kernel goes only to a stream of the current device (these run on the
  // progress thread).
  void divide(float* data, size_t n, float divisor, Stream s) override {
    DeviceScope scope(streamDevice(s));
    kernels::cuda::divide(data, n, divisor, s);
  }
  void multiply(float* data, size_t n, float factor, Stream s) override {
    DeviceScope scope(streamDevice(s));
    kernels::cuda::multiply(data, n, factor, s);
  }

 private:
  /// Whether a device's primary context is active: without one no device
  /// memory can exist in this process (contexts of its own, which PyTorch
  /// and NCCL do not make, aside), and asking CUDA about a pointer would
  /// create one, memory on GPU 0 for every process of a node that passes
  /// only host buffers. Once true, true for good.
  bool anyContext() {
    if (contextSeen_.load(std::memory_order_relaxed)) return true;
    const int n = devices_.load(std::memory_order_relaxed);
    for (int d = 0; d < n; ++d) {
      if (primaryContextActive(d)) {
        contextSeen_.store(true, std::memory_order_relaxed);
        return true;
      }
    }
    return false;
  }
  std::atomic<int> present_{-1};
  std::atomic<int> devices_{0};
  std::atomic<bool> contextSeen_{false};
};

}  // namespace

std::shared_ptr<Runtime> makeCudaRuntime() { return std::make_shared<CudaRuntime>(); }

}  // namespace gradcomm::device
