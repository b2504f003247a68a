// gradcomm-stepsim: replays a model's gradient profile to measure how much
// communication a training step still exposes.
//
//   mpirun -np 2 gradcomm-stepsim --model resnet50 --mode all --steps 6 --compute-ms 400
//
// Backward compute: each layer's gradient is written (the memory traffic a
// backward pass makes), then, with --compute busy (the default), the core is
// kept busy until the layer's share of --compute-ms has passed, as CPU
// training would; with --compute sleep the thread sleeps until then, as the
// host thread of GPU training waits while the GPU computes (the CPU is free
// for communication). Shares are proportional to the layer's parameter count. Layers produce gradients last-to-first, as
// backward does. Three ways to synchronise them:
//   noverlap   one allreduce of all gradients after the whole backward
//   pertensor  an allreduce per gradient as soon as it exists, no buckets
//   reducer    gradcomm's Reducer (buckets launched while backward continues)
// With --memory device the gradients are CUDA memory (the Reducer's buckets
// on the GPU, every call on one stream): each layer's gradient is written by
// a copy queued on the stream, and the host thread then waits out the
// layer's compute time (as --compute sleep). The GPU itself runs only those
// writes and the communication: what backward kernels would take from it
// (SMs, memory bandwidth) is not modelled.
// The first step of each mode is a warm-up (and the Reducer's bucket
// rebuild) and is not reported.
#if GRADCOMM_HAVE_MPI
#include <mpi.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/gradcomm.hpp"
#if GRADCOMM_HAVE_MPI
#include "gradcomm/mpi.hpp"
#endif
#include "gradcomm/reducer.hpp"
#include "device_memory.hpp"
#include "launch.hpp"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

int gRank = 0;
bool gUseMpi = true;
// The measured communicator; also carries the tool's own agreements once it
// exists (MPI-free runs have nothing else).
Communicator* gComm = nullptr;

// Errors in the arguments: every rank sees the same, rank 0 says it.
[[noreturn]] void die(const std::string& m) {
  if (gRank == 0) std::fprintf(stderr, "gradcomm-stepsim: %s\n", m.c_str());
  bench::finalizeMpiIfUp();
  std::exit(2);
}

// Every rank reaches this point with `error` empty or not; if any rank has
// one, every rank prints its own (or that another rank failed) and all
// leave cleanly with exit code 2.
void agreeOrDie(const std::string& error) {
  int32_t ok = error.empty() ? 1 : 0, allOk = 0;
  if (gComm) {
    gComm->allreduce(&ok, &allOk, 1, DataType::kInt32, ReduceOp::kMin).wait();
  } else {
#if GRADCOMM_HAVE_MPI
    MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#else
    allOk = ok;  // no communicator yet and no MPI: only this rank's verdict
#endif
  }
  if (allOk) return;
  std::fprintf(stderr, "gradcomm-stepsim: rank %d: %s\n", gRank,
               error.empty() ? "stopped: another rank failed (see its message)" : error.c_str());
  bench::finalizeMpiIfUp();
  std::exit(2);
}

// An error only rank 0 can see (its output file): every rank leaves with it.
void dieIfRankZeroFailed(std::string error) {
  int64_t len = static_cast<int64_t>(error.size());
  if (gComm) {
    gComm->broadcast(&len, &len, 1, DataType::kInt64, 0).wait();
  } else {
#if GRADCOMM_HAVE_MPI
    MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
#endif
  }
  if (len == 0) return;
  error.resize(static_cast<size_t>(len));
  if (gComm) {
    gComm->broadcast(&error[0], &error[0], static_cast<size_t>(len), DataType::kUInt8, 0).wait();
  } else {
#if GRADCOMM_HAVE_MPI
    MPI_Bcast(&error[0], static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
#endif
  }
  die(error);
}

// An error in the middle of the steps: the other ranks may be blocked in an
// MPI call waiting for this one, so the job is aborted (exit code 2).
[[noreturn]] void abortJob(const std::string& error) {
  std::fprintf(stderr, "gradcomm-stepsim: rank %d: %s\n", gRank, error.c_str());
  std::fflush(stderr);
#if GRADCOMM_HAVE_MPI
  if (gUseMpi) MPI_Abort(MPI_COMM_WORLD, 2);
#endif
  std::exit(2);
}

long long parseInteger(const std::string& text, const std::string& what, long long lo, long long hi) {
  return bench::wholeNumberOr(text, what, lo, hi, die);
}

double parseNumber(const std::string& text, const std::string& what) {
  const auto v = bench::realNumber(text);
  if (!v) die(what + " must be a number, got '" + text + "'");
  return *v;
}

struct Layer {
  std::string name;
  size_t params;
};

// ResNet-50 (He et al. 2016, torchvision layout): conv weights (no bias)
// and BatchNorm weight + bias per conv, bottleneck stages of 3, 4, 6, 3
// blocks, the final 2048 x 1000 classifier. 161 tensors, 25,557,032 values.
std::vector<Layer> resnet50() {
  std::vector<Layer> l;
  auto conv = [&](const std::string& n, size_t in, size_t out, size_t k) {
    l.push_back({n + ".weight", in * out * k * k});
    l.push_back({n + ".bn.weight", out});
    l.push_back({n + ".bn.bias", out});
  };
  conv("conv1", 3, 64, 7);
  const size_t blocks[4] = {3, 4, 6, 3}, mids[4] = {64, 128, 256, 512};
  size_t in = 64;
  for (int s = 0; s < 4; ++s) {
    const size_t mid = mids[s], out = mid * 4;
    for (size_t b = 0; b < blocks[s]; ++b) {
      const std::string n = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      conv(n + ".conv1", in, mid, 1);
      conv(n + ".conv2", mid, mid, 3);
      conv(n + ".conv3", mid, out, 1);
      if (b == 0) conv(n + ".downsample", in, out, 1);
      in = out;
    }
  }
  l.push_back({"fc.weight", 2048 * 1000});
  l.push_back({"fc.bias", 1000});
  return l;
}

// BERT-base (Devlin et al. 2019): vocabulary 30522, hidden 768, 12 layers,
// 12 heads, intermediate 3072, 512 positions, 2 token types, pooler.
// 199 tensors, 109,482,240 values.
std::vector<Layer> bertBase() {
  const size_t h = 768, ff = 3072;
  std::vector<Layer> l = {{"embeddings.word", 30522 * h},  {"embeddings.position", 512 * h},
                          {"embeddings.token_type", 2 * h}, {"embeddings.ln.weight", h},
                          {"embeddings.ln.bias", h}};
  for (int i = 0; i < 12; ++i) {
    const std::string n = "layer" + std::to_string(i);
    for (const char* m : {".query", ".key", ".value", ".attention.output"}) {
      l.push_back({n + m + ".weight", h * h});
      l.push_back({n + m + ".bias", h});
    }
    l.push_back({n + ".attention.ln.weight", h});
    l.push_back({n + ".attention.ln.bias", h});
    l.push_back({n + ".intermediate.weight", h * ff});
    l.push_back({n + ".intermediate.bias", ff});
    l.push_back({n + ".output.weight", ff * h});
    l.push_back({n + ".output.bias", h});
    l.push_back({n + ".output.ln.weight", h});
    l.push_back({n + ".output.ln.bias", h});
  }
  l.push_back({"pooler.weight", h * h});
  l.push_back({"pooler.bias", h});
  return l;
}

// "uniform:160x64K": N tensors of the given bytes (float32).
std::vector<Layer> uniform(const std::string& spec) {
  const std::string usage = "--model uniform:NxBYTES takes N tensors (1 to 1000000) of BYTES each, a positive "
                            "multiple of 4 (float32) with an optional K, M or G suffix (binary), e.g. uniform:160x64K";
  auto x = spec.find('x');
  if (x == std::string::npos) die(usage + "; got 'uniform:" + spec + "'");
  const size_t n = static_cast<size_t>(parseInteger(spec.substr(0, x), "N of --model uniform:NxBYTES", 1, 1000000));
  std::string b = spec.substr(x + 1);
  double mult = 1;
  if (!b.empty() && (b.back() == 'K' || b.back() == 'M' || b.back() == 'G')) {
    mult = b.back() == 'K' ? 1024.0 : b.back() == 'M' ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
    b.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(b.c_str(), &end);
  const double bytes = v * mult;
  if (b.empty() || *end != '\0' || !std::isfinite(v) || bytes < 4 || bytes > 1e15 || std::fmod(bytes, 4) != 0) {
    die(usage + "; got 'uniform:" + spec + "'");
  }
  std::vector<Layer> l;
  for (size_t i = 0; i < n; ++i) l.push_back({"t" + std::to_string(i), static_cast<size_t>(bytes / 4)});
  return l;
}

// Bytes of memory this host can still give (MemAvailable), or 0 if unknown.
double availableMemoryBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

struct Args {
  std::string model = "resnet50";
  std::string mode = "all";
  int steps = 6;
  double computeMs = 200;
  bool computeSleep = false;  ///< --compute sleep: GPU-like compute that leaves the CPU free
  bool device = false;        ///< --memory device: gradients in CUDA memory
  std::string json;
  std::string algorithm;
  std::string transport;  // empty: mpi under mpirun, ucx without MPI
};

struct Result {
  std::string mode;
  double stepMs = 0, computeMs = 0, exposedMs = 0, utilization = 0, commMs = 0;
  double lastMs = 0;  // the last bucket's allreduce (noverlap: the one allreduce; pertensor: the last tensor's)
};

bench::DeviceMemory gMemory;

/// The value every gradient of `rank` holds at `step`.
float gradientValue(int rank, int step) { return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(step); }

// Busy work (or, with `sleep`, a wait) that also writes the gradient: returns
// when `until` is reached. Device runs always sleep (main sets --compute sleep).
// Device gradients are written on the stream from `pattern` (n values of
// this step's gradientValue, in host memory).
void backwardLayer(float* grad, size_t n, int rank, int step, Clock::time_point until, bool sleep,
                   const std::vector<float>& pattern) {
  if (gMemory.device()) {
    gMemory.copyAsync(grad, pattern.data(), n * sizeof(float));
  } else {
    const float v = gradientValue(rank, step);
    for (size_t i = 0; i < n; ++i) grad[i] = v;
  }
  if (sleep) {
    std::this_thread::sleep_until(until);
    return;
  }
  volatile double sink = 0;
  while (Clock::now() < until) {
    for (int k = 0; k < 64; ++k) sink = sink + std::sqrt(static_cast<double>(k) + sink);
  }
}

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

Result steps(Communicator& comm, const std::vector<Layer>& layers, const std::string& mode, const Args& a,
             const std::vector<size_t>& offset, const std::vector<double>& layerMs, float* flat, size_t total,
             Reducer* reducer);

Result run(Communicator& comm, const std::vector<Layer>& layers, const std::string& mode, const Args& a) {
  const size_t n = layers.size();
  size_t total = 0;
  for (const auto& l : layers) total += l.params;
  std::vector<size_t> offset(n);
  for (size_t i = 0, o = 0; i < n; ++i) offset[i] = o, o += layers[i].params;
  // Per-layer compute time, proportional to parameters.
  std::vector<double> layerMs(n);
  for (size_t i = 0; i < n; ++i) layerMs[i] = a.computeMs * static_cast<double>(layers[i].params) / total;

  // noverlap and pertensor gradients, host or device memory
  std::unique_ptr<unsigned char, std::function<void(unsigned char*)>> flat(
      gMemory.allocate(total * sizeof(float)), [](unsigned char* p) { gMemory.release(p); });
  std::unique_ptr<Reducer> reducer;
  if (mode == "reducer") {
    // Construction is collective and fails on every rank alike (bad
    // configuration, an unwritable GRADCOMM_TIMELINE): agree, then leave.
    std::string error;
    try {
      std::vector<GradientSpec> specs;
      for (size_t i = 0; i < n; ++i) specs.push_back({layers[i].params, DataType::kFloat32, nullptr});
      ReducerOptions o;
      o.gradientAsBucketView = true;
      o.algorithm = a.algorithm;
      o.device = gMemory.ordinal();
      o.stream = gMemory.stream();
      reducer = std::make_unique<Reducer>(comm, specs, o);
    } catch (const Error& e) {
      error = e.what();
    }
    agreeOrDie(error);
  }
  try {
    return steps(comm, layers, mode, a, offset, layerMs, reinterpret_cast<float*>(flat.get()), total, reducer.get());
  } catch (const Error& e) {
    abortJob(std::string(toString(e.code())) + " in mode " + mode + ": " + e.what());
  }
}

Result steps(Communicator& comm, const std::vector<Layer>& layers, const std::string& mode, const Args& a,
             const std::vector<size_t>& offset, const std::vector<double>& layerMs, float* flat, size_t total,
             Reducer* reducer) {
  const size_t n = layers.size();
  size_t largest = 0;
  for (const auto& l : layers) largest = std::max(largest, l.params);
  std::vector<float> pattern(gMemory.device() ? largest : 0);
  CollectiveOptions co;
  co.algorithm = a.algorithm;
  co.stream = gMemory.stream();
  Result r;
  r.mode = mode;
  int measured = 0;
  for (int step = 0; step < a.steps; ++step) {
    // Device gradients: the copies of the last step read the pattern until
    // the check below waited for the stream.
    std::fill(pattern.begin(), pattern.end(), gradientValue(comm.rank(), step));
    comm.barrier().wait();
    const auto start = Clock::now();
    auto until = start;
    std::vector<Work> works;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = n - 1 - k;  // backward: last layer first
      until += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(layerMs[i]));
      float* g = reducer ? static_cast<float*>(reducer->gradient(i)) : flat + offset[i];
      backwardLayer(g, layers[i].params, comm.rank(), step, until, a.computeSleep, pattern);
      if (reducer) reducer->markReady(i);
      if (mode == "pertensor") {
        works.push_back(comm.allreduce(g, g, layers[i].params, DataType::kFloat32, ReduceOp::kAvg, co));
      }
    }
    const double computeMs = msSince(start);
    const auto blocked = Clock::now();
    double commMs = 0, lastMs = 0;
    if (mode == "noverlap") {
      Work w = comm.allreduce(flat, flat, total, DataType::kFloat32, ReduceOp::kAvg, co);
      w.wait();
      commMs = std::chrono::duration<double, std::milli>(w.endTime() - w.startTime()).count();
      lastMs = commMs;
    } else if (mode == "pertensor") {
      for (auto& w : works) {
        w.wait();
        lastMs = std::chrono::duration<double, std::milli>(w.endTime() - w.startTime()).count();
        commMs += lastMs;
      }
    } else {
      reducer->finalize();
      commMs = reducer->lastStepStats().commMs;
      lastMs = reducer->lastStepStats().lastBucketMs;
    }
    // Device gradients: the step ends when the stream has the results.
    gMemory.synchronize();
    const double exposed = msSince(blocked);
    const double stepMs = msSince(start);
    // Check one value per step: the average of (rank + 1) * 0.5 + step.
    const float* g0 = reducer ? static_cast<const float*>(reducer->gradient(0)) : flat;
    float got = 0;
    gMemory.download(&got, g0, sizeof got);
    const float want = static_cast<float>(comm.size() + 1) * 0.25f + static_cast<float>(step);
    if (std::fabs(got - want) > 1e-3f) abortJob("wrong average in mode " + mode);
    if (step == 0) continue;  // warm-up
    r.stepMs += stepMs;
    r.computeMs += computeMs;
    r.exposedMs += exposed;
    r.commMs += commMs;
    r.lastMs += lastMs;
    ++measured;
  }
  // The slowest rank defines the step.
  double v[5] = {r.stepMs / measured, r.computeMs / measured, r.exposedMs / measured, r.commMs / measured,
                 r.lastMs / measured};
  comm.allreduce(v, v, 5, DataType::kFloat64, ReduceOp::kMax).wait();
  r.lastMs = v[4];
  r.stepMs = v[0];
  r.computeMs = v[1];
  r.exposedMs = v[2];
  r.commMs = v[3];
  r.utilization = r.computeMs / r.stepMs;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool useMpi = bench::startMpiUnlessLaunchedWithout(argc, argv, &gRank);
  gUseMpi = useMpi;
  Args a;
  for (bench::ArgWalk w(argc, argv, die); w.next();) {
    const std::string& k = w.key();
    auto next = [&] { return w.value(); };
    if (k == "--model") a.model = next();
    else if (k == "--mode") a.mode = next();
    else if (k == "--steps") a.steps = static_cast<int>(parseInteger(next(), "--steps", 2, 1000000));
    else if (k == "--compute-ms") a.computeMs = parseNumber(next(), "--compute-ms");
    else if (k == "--compute") {
      const std::string v = next();
      if (v != "busy" && v != "sleep") die("--compute must be busy or sleep, not '" + v + "'");
      a.computeSleep = v == "sleep";
    } else if (k == "--memory") {
      const std::string v = next();
      if (v != "host" && v != "device") die("--memory must be host or device, not '" + v + "'");
      a.device = v == "device";
    } else if (k == "--json") a.json = next();
    else if (k == "--algo") a.algorithm = next();
    else if (k == "--transport") a.transport = next();
    else if (k == "--no-mpi") continue;
    else if (k == "-h" || k == "--help") {
      if (gRank == 0) {
        std::printf("usage: mpirun -np N gradcomm-stepsim [--model resnet50|bert-base|uniform:NxBYTES]\n"
                    "         [--mode noverlap|pertensor|reducer|all] [--steps N] [--compute-ms MS] [--compute busy|sleep]\n"
                    "         [--algo NAME] [--transport mpi|ucx] [--no-mpi] [--memory host|device] [--json FILE]\n"
                    "--memory device: gradients in CUDA memory (GPU = local rank mod the GPUs), the\n"
                    "host waiting out each layer's compute; exit 77 without CUDA or a GPU.\n"
                    "Without MPI (GRADCOMM_RANK or torchrun's RANK set, or --no-mpi under mpirun) the\n"
                    "communicator is formed from the environment and bytes move through UCX.\n");
      }
      bench::finalizeMpiIfUp();
      return 0;
    } else {
      die("unknown option '" + k + "' (try --help)");
    }
  }
  if (a.steps < 2) die("--steps must be at least 2 (the first is a warm-up)");
  if (a.computeMs < 0) die("--compute-ms must not be negative");
  if (!a.algorithm.empty()) {
    bool known = false;
    std::string valid;
    for (const auto& name : algorithmNames(Collective::kAllreduce)) {
      known = known || name == a.algorithm;
      valid += (valid.empty() ? "" : ", ") + name;
    }
    if (!known) die("unknown --algo '" + a.algorithm + "'; valid: " + valid);
  }
  if (!a.transport.empty() && a.transport != "mpi" && a.transport != "ucx") {
    die("unknown --transport '" + a.transport + "'; valid: mpi, ucx");
  }
  if (!useMpi && a.transport == "mpi") die(bench::needsMpi("--transport mpi"));
  // Formation is collective and fails on every rank alike.
  std::unique_ptr<Communicator> commHolder;
  try {
    commHolder = std::make_unique<Communicator>(bench::makeCommunicator(useMpi, a.transport));
  } catch (const Error& e) {
    std::fprintf(stderr, "gradcomm-stepsim: rank %d: %s\n", gRank, e.what());
    bench::finalizeMpiIfUp();
    return 2;
  }
  gComm = commHolder.get();
  gRank = gComm->rank();
  if (a.device) {
    gMemory.useDevice("gradcomm-stepsim", gRank);
    a.computeSleep = true;  // the host of GPU training waits while the GPU computes
  }
  dieIfRankZeroFailed(gRank == 0 && !a.json.empty() && !bench::unwritable(a.json).empty() ? "--json: " + bench::unwritable(a.json)
                                                                                     : std::string());
  std::vector<Layer> layers;
  if (a.model == "resnet50") layers = resnet50();
  else if (a.model == "bert-base") layers = bertBase();
  else if (a.model.rfind("uniform:", 0) == 0) layers = uniform(a.model.substr(8));
  else die("unknown --model '" + a.model + "'; valid: resnet50, bert-base, uniform:NxBYTES");
  std::vector<std::string> modes;
  if (a.mode == "all") modes = {"noverlap", "pertensor", "reducer"};
  else if (a.mode == "noverlap" || a.mode == "pertensor" || a.mode == "reducer") modes = {a.mode};
  else die("unknown --mode '" + a.mode + "'; valid: noverlap, pertensor, reducer, all");

  size_t params = 0;
  for (const auto& l : layers) params += l.params;
  {
    // Each rank holds the gradients twice (flat and the Reducer's buckets).
    const int onHost = bench::ranksOnThisHost(*gComm);
    const double perRank = 2.0 * static_cast<double>(params) * 4, available = availableMemoryBytes();
    std::string error;
    if (!a.device && available > 0 && perRank * onHost > available) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "--model %s needs about %.1f GiB per rank (%.1f GiB for the %d ranks on this host), more than "
                    "the %.1f GiB of memory available",
                    a.model.c_str(), perRank / (1 << 30), perRank * onHost / (1 << 30), onHost,
                    available / (1 << 30));
      error = text;
    }
    agreeOrDie(error);  // hosts differ
  }
  std::vector<Result> results;
  int size = 1, hosts = 1;
  std::string transportName;
  {
    Communicator& comm = *gComm;
    size = comm.size();
    hosts = bench::countHosts(comm);
    transportName = comm.transportName();
    if (gRank == 0) {
      std::printf("# gradcomm-stepsim: %s, %zu gradients, %.1f MB float32, %d ranks on %d host%s over %s, compute %.0f "
                  "ms/step (%s), %d steps (first is warm-up), %s memory\n",
                  a.model.c_str(), layers.size(), params * 4 / 1e6, size, hosts, hosts == 1 ? "" : "s",
                  transportName.c_str(), a.computeMs, a.computeSleep ? "sleep" : "busy", a.steps,
                  a.device ? "device" : "host");
      std::printf("# %-10s %10s %11s %13s %11s %11s %9s %12s\n", "mode", "step_ms", "compute_ms", "exposed_ms", "comm_ms",
                  "utilization", "last_ms", "step/(c+last)");
      std::printf("# last_ms: the allreduce of the last bucket (pertensor: last tensor; noverlap: everything)\n");
      std::fflush(stdout);
    }
    for (const auto& m : modes) {
      Result r;
      try {
        r = run(comm, layers, m, a);
      } catch (const std::bad_alloc&) {
        abortJob("out of memory in mode " + m + " (--model " + a.model + ")");
      }
      results.push_back(r);
      if (gRank == 0) {
        std::printf("  %-10s %10.1f %11.1f %13.1f %11.1f %11.3f %9.1f %12.3f\n", m.c_str(), r.stepMs, r.computeMs,
                    r.exposedMs, r.commMs, r.utilization, r.lastMs, r.stepMs / (r.computeMs + r.lastMs));
        std::fflush(stdout);
      }
    }
  }
  int written = 1;
  if (gRank == 0 && !a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"model\": \"" << a.model << "\", \"transport\": \"" << transportName << "\", \"ranks\": " << size
      << ", \"hosts\": " << hosts
      << ", \"gradients\": " << layers.size() << ", \"bytes\": " << params * 4 << ", \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << "  {\"model\": \"" << a.model << "\", \"mode\": \"" << r.mode << "\", \"transport\": \"" << transportName
        << "\", \"ranks\": " << size
        << ", \"hosts\": " << hosts << ", \"memory\": \"" << (a.device ? "device" : "host")
        << "\", \"compute\": \"" << (a.computeSleep ? "sleep" : "busy")
        << "\", \"step_ms\": " << r.stepMs << ", \"compute_ms\": " << r.computeMs
        << ", \"exposed_comm_ms\": " << r.exposedMs << ", \"comm_ms\": " << r.commMs
        << ", \"last_bucket_ms\": " << r.lastMs
        << ", \"utilization\": " << r.utilization << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "]}\n";
    f.close();
    if (!f) {
      std::fprintf(stderr, "gradcomm-stepsim: could not write the results to '%s'\n", a.json.c_str());
      written = 0;
    }
  }
  gComm = nullptr;
  commHolder.reset();
  bench::finalizeMpiIfUp();
  return written ? 0 : 2;
}
