// gradcomm-gpu-compression: the CUDA compression kernels against the
// device's own copy bandwidth, on one GPU (issue 13's GPU goal).
//
//   gradcomm-gpu-compression [--floats N (default 100M)] [--ratio 0.01] [--iters 20] [--json FILE]
//
// Rows: cudaMemcpyAsync device-to-device of the float32 input (read 4 B +
// write 4 B per element); the fp16 and bf16 casts (read 4 B + write 2 B),
// plain and with error feedback (read 8 B + write 6 B); exact and
// approximate top-k of ratio x N by magnitude. Bandwidth is the bytes a
// kernel must move over its median time, so a cast at the copy's bandwidth
// runs as fast as the memory lets it. Times are medians of --iters runs,
// each timed with CUDA events on one stream after a warm-up. Exits 77 when
// no GPU is usable (so scripts can tell "not run" from "failed").
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "compression/cuda/compression_cuda.hpp"
#include "gradcomm/error.hpp"
#include "args.hpp"

namespace {

namespace cc = gradcomm::compression::cuda;
using gradcomm::DataType;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "gradcomm-gpu-compression: %s\n", m.c_str());
  std::exit(2);
}

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// Device memory, freed on scope exit.
class Device {
 public:
  explicit Device(size_t bytes) {
    if (bytes) ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

/// Median milliseconds of `iters` timed runs of `fn` on `stream` (after one warm-up).
template <typename Fn>
double medianMs(cudaStream_t stream, int iters, Fn fn) {
  cudaEvent_t start, stop;
  ok(cudaEventCreate(&start), "cudaEventCreate");
  ok(cudaEventCreate(&stop), "cudaEventCreate");
  fn();
  ok(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    ok(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    ok(cudaEventRecord(stop, stream), "cudaEventRecord");
    ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    ok(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string name;
  double ms;
  double bytes;  // moved per run (0: not a bandwidth row)
};

}  // namespace

int main(int argc, char** argv) {
  size_t n = 100'000'000;
  double ratio = 0.01;
  int iters = 20;
  std::string json;
  for (gradcomm::bench::ArgWalk w(argc, argv, die); w.next();) {
    const std::string& k = w.key();
    if (k == "--floats") n = static_cast<size_t>(gradcomm::bench::wholeNumberOr(w.value(), "--floats", 1, 1LL << 31, die));
    else if (k == "--iters") iters = static_cast<int>(gradcomm::bench::wholeNumberOr(w.value(), "--iters", 1, 10000, die));
    else if (k == "--ratio") {
      const auto v = gradcomm::bench::realNumber(w.value());
      if (!v || *v <= 0 || *v > 1) die("--ratio must be a number in (0, 1]");
      ratio = *v;
    } else if (k == "--json") json = w.value();
    else if (k == "-h" || k == "--help") {
      std::printf("usage: gradcomm-gpu-compression [--floats N] [--ratio R] [--iters I] [--json FILE]\n");
      return 0;
    } else {
      die("unknown option '" + k + "' (try --help)");
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gradcomm-gpu-compression: no usable GPU; nothing measured\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream;
  ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  void* s = stream;

  std::vector<float> host(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : host) v = normal(rng);
  Device in(n * sizeof(float)), copy(n * sizeof(float)), residual(n * sizeof(float)), half(n * sizeof(uint16_t));
  ok(cudaMemcpy(in.as<float>(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
  ok(cudaMemset(residual.as<float>(), 0, n * sizeof(float)), "cudaMemset");

  std::vector<Row> rows;
  rows.push_back({"memcpy d2d float32", medianMs(stream, iters, [&] {
                    ok(cudaMemcpyAsync(copy.as<float>(), in.as<float>(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                                       stream), "cudaMemcpyAsync");
                  }), 8.0 * n});
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    const std::string name = t == DataType::kFloat16 ? "fp16" : "bf16";
    rows.push_back({"cast " + name, medianMs(stream, iters, [&] {
                      cc::castToHalf(in.as<float>(), half.as<uint16_t>(), n, t, 1.0f, s);
                    }), 6.0 * n});
    rows.push_back({"cast " + name + " + error feedback", medianMs(stream, iters, [&] {
                      cc::castWithResidual(in.as<float>(), residual.as<float>(), half.as<uint16_t>(), n, t, 1.0f, s);
                    }), 14.0 * n});
  }
  const size_t k = std::max<size_t>(1, static_cast<size_t>(ratio * static_cast<double>(n)));
  const bool wide = n >= (size_t{1} << 32);
  for (bool approximate : {false, true}) {
    const size_t capacity = cc::topkCapacity(n, k, approximate);
    const size_t workBytes = cc::topkWorkspaceBytes(n);
    Device indices(capacity * (wide ? 8 : 4)), values(capacity * sizeof(float)), nnz(sizeof(uint64_t)),
        work(workBytes);
    rows.push_back({std::string("top-k ") + (approximate ? "approximate" : "exact"), medianMs(stream, iters, [&] {
                      cc::topk(in.as<float>(), nullptr, n, k, approximate, indices.as<void>(), wide,
                               values.as<float>(), capacity, nnz.as<uint64_t>(), work.as<void>(), workBytes, s);
                    }), 0});
  }
  cudaStreamDestroy(stream);

  const double copyGBs = rows[0].bytes / (rows[0].ms * 1e6);
  std::printf("# %s, %zu floats, top-k %zu (ratio %g), median of %d\n", prop.name, n, k, ratio, iters);
  std::printf("%-34s %10s %10s %12s\n", "kernel", "ms", "GB/s", "vs memcpy");
  std::ostringstream out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double gbs = r.bytes > 0 ? r.bytes / (r.ms * 1e6) : 0;
    if (r.bytes > 0) {
      std::printf("%-34s %10.3f %10.1f %12.3f\n", r.name.c_str(), r.ms, gbs, gbs / copyGBs);
    } else {
      std::printf("%-34s %10.3f %10s %12s\n", r.name.c_str(), r.ms, "-", "-");
    }
    out << (i ? ",\n" : "") << "  {\"kernel\": \"" << r.name << "\", \"floats\": " << n << ", \"ms\": " << r.ms
        << ", \"gb_per_s\": " << gbs << ", \"vs_memcpy\": " << (r.bytes > 0 ? gbs / copyGBs : 0)
        << ", \"device\": \"" << prop.name << "\"}";
  }
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\"results\": [\n" << out.str() << "\n]}\n";
    if (!f) die("could not write '" + json + "'");
  }
  return 0;
}
