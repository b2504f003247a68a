// gradcomm-device-bench: allreduce of device (CUDA) buffers between
// processes sharing one GPU, against the copies that bound it.
//
//   gradcomm-device-bench [--ranks N (2)] [--sizes 8,1M,64M,256M] [--iters 10] [--json FILE]
//
// Forks N ranks (before any CUDA call), which meet through a TcpStore on
// loopback served by the parent and form a communicator from it (UCX, no
// MPI). Each size: float32 sum of --iters out-of-place calls on device 0,
// each waited for (Work::wait: the result is in the device buffer), the
// result checked exactly (small integers); then, while the other ranks
// wait in a barrier, rank 0 times on its own the copies the staged path is
// made of: device-to-device cudaMemcpy of the same bytes, and a
// device-to-host plus host-to-device copy through pinned memory. Ratios:
// call / D2D and (D2H + H2D) / call (the staged path's bound: 1.0 means
// the call runs at the pinned copy rate). With several ranks, host_us is the
// same communicator's allreduce of pinned host buffers of the same bytes:
// the staged path's host part, so call - host_us is what staging adds.
// With one rank (--ranks 1) the
// communicator's device calls run on NCCL (GRADCOMM_DEVICE_ENGINE=auto),
// and, in a build with NCCL, rank 0 also times ncclAllReduce itself on the
// same buffers and stream: the columns nccl_us and call-nccl_us are the
// NCCL engine's cost over NCCL. Exits 77 without a usable GPU.
#include <cuda_runtime.h>
#if GRADCOMM_BENCH_NCCL
#include <nccl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "args.hpp"
#include "gradcomm/gradcomm.hpp"
#include "gradcomm/store.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace gradcomm;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "gradcomm-device-bench: %s\n", m.c_str());
  std::exit(2);
}

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(rc));
}

size_t bytesOf(const std::string& t) {
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  const std::string unit(end);
  double m = 1;
  if (unit == "K") m = 1024.0;
  else if (unit == "M") m = 1024.0 * 1024;
  else if (unit == "G") m = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) die("size '" + t + "': use a number with K, M or G");
  if (end == t.c_str() || v <= 0) die("size '" + t + "' is not a positive size");
  return static_cast<size_t>(v * m);
}

struct Args {
  int ranks = 2;
  std::vector<size_t> sizes{8, 1 << 20, 64 << 20, 256 << 20};
  int iters = 10;
  std::string json;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median seconds of `iters` runs of `f` after one warm-up.
template <typename F>
double timeIt(int iters, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

int runRank(const Args& a, int rank, uint16_t port) {
  ok(cudaSetDevice(0), "cudaSetDevice");
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, TcpStore::Options{});
  Communicator comm = communicatorFromStore(store, rank, a.ranks);
  cudaStream_t stream;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::string rows;
  // ncclAllReduce itself, where it can run (one rank).
  bool withNccl = false;
#if GRADCOMM_BENCH_NCCL
  ncclComm_t nccl = nullptr;
  if (a.ranks == 1) {
    int dev = 0;
    withNccl = ncclCommInitAll(&nccl, 1, &dev) == ncclSuccess;
    if (!withNccl) std::fprintf(stderr, "gradcomm-device-bench: ncclCommInitAll failed; no NCCL baseline\n");
  }
#endif
  if (rank == 0) {
    std::printf("# gradcomm-device-bench: %d processes sharing one GPU, float32 sum, out of place\n", a.ranks);
    std::printf("%12s %12s %10s %10s %12s %14s %10s %12s %10s %13s  %s\n", "bytes", "call_us", "algbw_GB/s",
                "host_us", "d2d_us", "d2h+h2d_us", "call/d2d", "copies/call", "nccl_us", "call-nccl_us", "engine");
  }
  for (size_t bytes : a.sizes) {
    const size_t n = std::max<size_t>(1, bytes / 4);
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((i % 100) + rank);
    float *in = nullptr, *out = nullptr;
    ok(cudaMalloc(reinterpret_cast<void**>(&in), n * 4), "cudaMalloc");
    ok(cudaMalloc(reinterpret_cast<void**>(&out), n * 4), "cudaMalloc");
    ok(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    CollectiveOptions o;
    o.stream = stream;
    std::string engine;
    comm.barrier().wait();
    const double call = timeIt(a.iters, [&] {
      Work w = comm.allreduce(in, out, n, DataType::kFloat32, ReduceOp::kSum, o);
      w.wait();
      engine = w.algorithm() == "nccl" ? "nccl" : "staged:" + w.algorithm();
    });
    ok(cudaMemcpy(host.data(), out, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    const float base = static_cast<float>(a.ranks * (a.ranks - 1) / 2);
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(a.ranks) * static_cast<float>(i % 100) + base;
      if (host[i] != want) {
        std::fprintf(stderr, "rank %d: %zu bytes: element %zu is %g, expected %g\n", rank, bytes, i, host[i], want);
        return 1;
      }
    }
    // The host part of the staged path: the same call on pinned host memory.
    double hostCall = -1;
    if (a.ranks > 1) {
      float *hin = nullptr, *hout = nullptr;
      ok(cudaMallocHost(reinterpret_cast<void**>(&hin), n * 4), "cudaMallocHost");
      ok(cudaMallocHost(reinterpret_cast<void**>(&hout), n * 4), "cudaMallocHost");
      std::copy(host.begin(), host.end(), hin);
      comm.barrier().wait();
      hostCall = timeIt(a.iters, [&] { comm.allreduce(hin, hout, n, DataType::kFloat32, ReduceOp::kSum).wait(); });
      cudaFreeHost(hin);
      cudaFreeHost(hout);
    }
    // The bounds, timed by rank 0 alone (the others wait in the barrier).
    double d2d = 0, staged = 0;
    comm.barrier().wait();
    if (rank == 0) {
      float* pinned = nullptr;
      ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * 4), "cudaMallocHost");
      d2d = timeIt(a.iters, [&] {
        ok(cudaMemcpyAsync(out, in, n * 4, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
        ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      staged = timeIt(a.iters, [&] {
        ok(cudaMemcpyAsync(pinned, in, n * 4, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
        ok(cudaMemcpyAsync(out, pinned, n * 4, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
        ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      cudaFreeHost(pinned);
      double ncclCall = -1;
#if GRADCOMM_BENCH_NCCL
      if (withNccl) {
        ncclCall = timeIt(a.iters, [&] {
          if (ncclAllReduce(in, out, n, ncclFloat32, ncclSum, nccl, stream) != ncclSuccess) die("ncclAllReduce failed");
          ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        });
      }
#endif
      char ncclText[32] = "-", overText[32] = "-", hostText[32] = "-";
      if (hostCall >= 0) std::snprintf(hostText, sizeof hostText, "%.1f", hostCall * 1e6);
      if (ncclCall >= 0) {
        std::snprintf(ncclText, sizeof ncclText, "%.1f", ncclCall * 1e6);
        std::snprintf(overText, sizeof overText, "%.1f", (call - ncclCall) * 1e6);
      }
      std::printf("%12zu %12.1f %10.2f %10s %12.1f %14.1f %10.2f %12.2f %10s %13s  %s\n", n * 4, call * 1e6,
                  n * 4 / call / 1e9, hostText, d2d * 1e6, staged * 1e6, call / d2d, staged / call, ncclText,
                  overText, engine.c_str());
      std::fflush(stdout);
      char row[320];
      std::snprintf(row, sizeof row,
                    "%s{\"bytes\": %zu, \"call_us\": %.2f, \"host_us\": %s, \"d2d_us\": %.2f, "
                    "\"d2h_h2d_us\": %.2f, \"nccl_us\": %s, \"engine\": \"%s\"}",
                    rows.empty() ? "" : ", ", n * 4, call * 1e6, hostCall >= 0 ? hostText : "null", d2d * 1e6,
                    staged * 1e6, ncclCall >= 0 ? ncclText : "null", engine.c_str());
      rows += row;
    }
    comm.barrier().wait();
    cudaFree(in);
    cudaFree(out);
  }
  if (rank == 0 && !a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"tool\": \"gradcomm-device-bench\", \"ranks\": " << a.ranks << ", \"rows\": [" << rows << "]}\n";
  }
  comm.destroy();
#if GRADCOMM_BENCH_NCCL
  if (withNccl) ncclCommDestroy(nccl);
#endif
  (void)withNccl;
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (bench::ArgWalk w(argc, argv, die); w.next();) {
    if (w.key() == "--ranks") {
      a.ranks = static_cast<int>(bench::wholeNumberOr(w.value(), "--ranks", 1, 64, die));
    } else if (w.key() == "--sizes") {
      a.sizes.clear();
      std::string list = w.value();
      for (size_t s = 0; s <= list.size();) {
        const size_t e = std::min(list.find(',', s), list.size());
        a.sizes.push_back(bytesOf(list.substr(s, e - s)));
        s = e + 1;
      }
    } else if (w.key() == "--iters") {
      a.iters = static_cast<int>(bench::wholeNumberOr(w.value(), "--iters", 1, 100000, die));
    } else if (w.key() == "--json") {
      a.json = w.value();
    } else if (w.key() == "-h" || w.key() == "--help") {
      std::printf("usage: gradcomm-device-bench [--ranks N] [--sizes 8,1M,64M,256M] [--iters 10] [--json FILE]\n");
      return 0;
    } else {
      die("unknown option '" + w.key() + "' (see --help)");
    }
  }
  // Whether a GPU works is asked in a child: CUDA must not be initialised
  // in the process that forks the ranks.
  const pid_t probe = fork();
  if (probe == 0) {
    int count = 0;
    _exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 77);
  }
  int st = 0;
  waitpid(probe, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "gradcomm-device-bench: no usable GPU; nothing measured\n");
    return 77;
  }
  TcpStore::Options server;
  server.isServer = true;
  TcpStore store("127.0.0.1", 0, server);
  std::vector<pid_t> kids;
  for (int r = 0; r < a.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = runRank(a, r, store.port());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int s = 0;
    waitpid(k, &s, 0);
    failed += !WIFEXITED(s) || WEXITSTATUS(s) != 0;
  }
  if (failed) std::fprintf(stderr, "gradcomm-device-bench: %d of %d ranks failed\n", failed, a.ranks);
  return failed ? 1 : 0;
}
