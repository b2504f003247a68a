#pragma once
// The device runtime as the library sees it: which memory a pointer is,
// streams, events, asynchronous copies and pinned host memory. One
// implementation drives CUDA (cuda_runtime.cpp, in builds with CUDA); the
// other (runtime.cpp) serves builds without CUDA, where it only recognises
// device pointers in order to refuse them. Tests install their own
// (tests/support/fake_device.hpp) to run the staging pipeline on host
// memory. Declared without CUDA headers: streams and events are opaque.
#include <cstddef>
#include <memory>
#include <string>

#include "compression/compressor.hpp"

namespace gradcomm::device {

using Stream = void*;  ///< a cudaStream_t; null is the legacy default stream
using Event = void*;   ///< a cudaEvent_t

/// Where a buffer lives.
struct Memory {
  bool device = false;  ///< device or managed memory
  int ordinal = -1;     ///< its device, where device
};

/// Every call throws gradcomm::DeviceError with the runtime's reason when
/// the device reports an error (an asynchronous error of an earlier kernel
/// included).
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual std::string name() const = 0;
  /// True when this build can run collectives on device memory.
  virtual bool canMoveDeviceMemory() const = 0;
  /// False when no device memory can exist in this process (no driver, no
  /// device): pointers are then host memory without asking. Cheap after the
  /// first call.
  virtual bool devicesPresent() = 0;
  /// What `p` is; host memory where the runtime does not know it.
  virtual Memory classify(const void* p) = 0;
  /// What tells `device` apart from every other device, across processes
  /// and hosts (CUDA: its PCI bus id and the host's boot id, as NCCL tells
  /// them apart, so MIG instances of one GPU match): processes that share a device give equal
  /// identities.
  virtual std::string identity(int device) = 0;
  /// The device `s` belongs to (null: the calling thread's current device).
  virtual int streamDevice(Stream s) = 0;
  /// The calling thread's current device (whose legacy default stream a
  /// null Stream is), or -1 when there is none worth going back to (CUDA:
  /// its primary context is not active, and making it current again would
  /// create one: on a node of several GPUs, memory on a GPU the process
  /// never used). Default: -1.
  virtual int currentDevice() { return -1; }
  /// Makes `device` current on the calling thread. Default: nothing.
  virtual void setCurrentDevice(int device) { (void)device; }
  /// A non-blocking stream of `device` (does not wait for the legacy default stream).
  virtual Stream createStream(int device) = 0;
  virtual void destroyStream(Stream s) = 0;
  virtual Event createEvent(int device) = 0;
  virtual void destroyEvent(Event e) = 0;
  /// Completes once the work queued on `s` so far has.
  virtual void record(Event e, Stream s) = 0;
  /// Work queued on `s` later runs after `e`'s latest record.
  virtual void streamWait(Stream s, Event e) = 0;
  /// True once `e`'s latest record completed (never blocks).
  virtual bool done(Event e) = 0;
  /// Blocks until `e`'s latest record completed.
  virtual void synchronize(Event e) = 0;
  /// Copies `bytes` from `src` to `dst` (host or device, either way) on `s`.
  virtual void copy(void* dst, const void* src, size_t bytes, Stream s) = 0;
  /// Device memory of `device` (null when bytes is 0).
  virtual void* allocateDevice(int device, size_t bytes) = 0;
  virtual void freeDevice(void* p) = 0;
  /// Sets `bytes` of device memory at `p` to zero on `s`.
  virtual void zero(void* p, size_t bytes, Stream s) = 0;
  /// Page-locked host memory (null when bytes is 0).
  virtual void* allocatePinned(size_t bytes) = 0;
  virtual void freePinned(void* p) = 0;

  /// The compressor of `spec` for memory of `device`, ordered on `s` (a
  /// stream of `device`): compress() and decompress() are queued on `s` and
  /// may return before they ran; decompressing a top-k payload waits for
  /// `s` once a call (it validates payloads that came over the wire). Its
  /// memory() is kDevice.
  /// Default: UnsupportedError (a runtime that cannot compute on its device).
  virtual compression::CompressorPtr makeCompressor(const compression::Spec& spec, int device, Stream s);
  /// data[i] = data[i] / divisor for n float32 values of device memory, on
  /// `s` (the same IEEE division the host kernels do). Default: UnsupportedError.
  virtual void divide(float* data, size_t n, float divisor, Stream s);
  /// data[i] = data[i] * factor for n float32 values of device memory, on
  /// `s`. Default: UnsupportedError.
  virtual void multiply(float* data, size_t n, float factor, Stream s);
};

/// Makes `device` the calling thread's current device for the scope, and
/// the previous one again after (where currentDevice() names one).
class CurrentDevice {
 public:
  CurrentDevice(Runtime& rt, int device) : rt_(rt), previous_(rt.currentDevice()) {
    if (previous_ == device) {
      previous_ = -1;
    } else {
      rt_.setCurrentDevice(device);
    }
  }
  ~CurrentDevice() {
    if (previous_ < 0) return;
    try {
      rt_.setCurrentDevice(previous_);
    } catch (...) {  // an error of the device stays for its next call to report
    }
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  Runtime& rt_;
  int previous_;
};

/// `bytes` of device memory of `device` from `rt`, freed (by `rt`, kept
/// alive until then) when the last owner lets go.
std::shared_ptr<void> allocateOwned(std::shared_ptr<Runtime> rt, int device, size_t bytes);

/// The process's runtime (CUDA where built with it, else the refusing one).
Runtime& runtime();
/// The same, for objects that keep using it (device staging holds it).
std::shared_ptr<Runtime> sharedRuntime();
/// Replaces the process's runtime until the returned one is put back (tests).
std::shared_ptr<Runtime> installRuntime(std::shared_ptr<Runtime> r);
/// The runtime of builds without CUDA: knows device pointers only through
/// the driver, if one is installed, to refuse them.
std::shared_ptr<Runtime> makeHostOnlyRuntime();
/// The CUDA runtime (builds with CUDA only; null elsewhere).
std::shared_ptr<Runtime> makeCudaRuntime();

}  // namespace gradcomm::device
