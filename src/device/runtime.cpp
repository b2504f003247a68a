#include "device/runtime.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "gradcomm/error.hpp"

namespace gradcomm::device {
namespace {

/// Builds without CUDA: no stream, event or copy can be made. Device
/// pointers can still reach the library (a framework's CUDA tensor); the
/// driver, where one is installed, tells them apart so that the caller gets
/// a clear refusal instead of a host algorithm reading device memory.
class HostOnlyRuntime final : public Runtime {
 public:
  std::string name() const override { return "none (built without CUDA)"; }
  bool canMoveDeviceMemory() const override { return false; }
  bool devicesPresent() override {
    std::call_once(once_, [this] { load(); });
    return getAttribute_ != nullptr;
  }
  Memory classify(const void* p) override {
    if (!p || !devicesPresent()) return {};
    // CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2): CU_MEMORYTYPE_DEVICE (2);
    // CU_POINTER_ATTRIBUTE_IS_MANAGED (8); CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9).
    unsigned type = 0;
    if (getAttribute_(&type, 2, reinterpret_cast<unsigned long long>(p)) != 0 || type != 2) return {};
    int ordinal = -1;
    if (getAttribute_(&ordinal, 9, reinterpret_cast<unsigned long long>(p)) != 0) ordinal = -1;
    return {true, ordinal};
  }
  std::string identity(int) override { refuse(); }
  int streamDevice(Stream) override { refuse(); }
  Stream createStream(int) override { refuse(); }
  void destroyStream(Stream) override {}
  Event createEvent(int) override { refuse(); }
  void destroyEvent(Event) override {}
  void record(Event, Stream) override { refuse(); }
  void streamWait(Stream, Event) override { refuse(); }
  bool done(Event) override { refuse(); }
  void synchronize(Event) override { refuse(); }
  void copy(void*, const void*, size_t, Stream) override { refuse(); }
  void* allocateDevice(int, size_t) override { refuse(); }
  void freeDevice(void*) override {}
  void zero(void*, size_t, Stream) override { refuse(); }
  void* allocatePinned(size_t) override { refuse(); }
  void freePinned(void*) override {}

 private:
  [[noreturn]] static void refuse() {
    throw UnsupportedError("this gradcomm was built without CUDA: it cannot use device memory");
  }
  void load() {
    // Only an initialised driver knows pointers; a process that made a
    // device allocation has initialised it, so cuInit here is cheap.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib) return;  // the driver is not in this process: no device memory exists here
    using Init = int (*)(unsigned);
    auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
    auto get = reinterpret_cast<GetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
    if (init && get && init(0) == 0) getAttribute_ = get;
  }
  using GetAttribute = int (*)(void*, int, unsigned long long);
  std::once_flag once_;
  GetAttribute getAttribute_ = nullptr;
};

std::mutex& installedMu() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<Runtime>& installed() {
  static std::shared_ptr<Runtime> r;
  return r;
}
std::atomic<Runtime*> current{nullptr};

}  // namespace

compression::CompressorPtr Runtime::makeCompressor(const compression::Spec& spec, int, Stream) {
  throw UnsupportedError("the device runtime '" + name() + "' runs no " + spec.toString() +
                         " compressor on its device; compress host buffers instead");
}

void Runtime::divide(float*, size_t, float, Stream) {
  throw UnsupportedError("the device runtime '" + name() + "' cannot scale device memory");
}

void Runtime::multiply(float*, size_t, float, Stream) {
  throw UnsupportedError("the device runtime '" + name() + "' cannot scale device memory");
}

std::shared_ptr<Runtime> makeHostOnlyRuntime() { return std::make_shared<HostOnlyRuntime>(); }

Runtime& runtime() {
  Runtime* r = current.load(std::memory_order_acquire);
  if (r) return *r;
  std::lock_guard<std::mutex> lock(installedMu());
  if (!installed()) {
    installed() = makeCudaRuntime();
    if (!installed()) installed() = makeHostOnlyRuntime();
  }
  current.store(installed().get(), std::memory_order_release);
  return *installed();
}

std::shared_ptr<Runtime> sharedRuntime() {
  runtime();
  std::lock_guard<std::mutex> lock(installedMu());
  return installed();
}

std::shared_ptr<void> allocateOwned(std::shared_ptr<Runtime> rt, int device, size_t bytes) {
  void* p = rt->allocateDevice(device, bytes);
  return std::shared_ptr<void>(p, [rt](void* q) { rt->freeDevice(q); });
}

std::shared_ptr<Runtime> installRuntime(std::shared_ptr<Runtime> r) {
  std::lock_guard<std::mutex> lock(installedMu());
  std::shared_ptr<Runtime> previous = std::move(installed());
  installed() = std::move(r);
  current.store(installed().get(), std::memory_order_release);
  return previous;
}

}  // namespace gradcomm::device
