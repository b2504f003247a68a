// Compression kernels against memcpy of the same input bytes, measured in
// one run: float32 -> fp16/bf16 casts of 64 MiB at every ISA level (goal:
// at least 0.8x memcpy throughput on input bytes), the fused error-feedback
// cast, and top-k at 1% of 16M floats (goal for approximate: at most 3x the
// time of a memcpy of the 16M floats). The ratios are printed at the end;
// on a shared machine run with --benchmark_repetitions=5 (the table keeps
// the fastest repetition) and read the CPU-time column.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compression/cpu/cast.hpp"
#include "compression/cpu/isa.hpp"
#include "compression/cpu/topk.hpp"

using namespace gradcomm;
using namespace gradcomm::compression;

namespace {

constexpr size_t kCastFloats = size_t{16} << 20;  // 64 MiB of float32
constexpr size_t kTopKFloats = size_t{16} << 20;

// Gradient-like input: normal, with a tail of larger values.
const std::vector<float>& gradient() {
  static const std::vector<float> data = [] {
    std::vector<float> v(kTopKFloats);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (float& x : v) x = normal(rng) * (rng() % 100 == 0 ? 10.0f : 1.0f);
    return v;
  }();
  return data;
}

bool skipUnsupported(benchmark::State& state, Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detectIsa())) {
    state.SkipWithError("ISA level not supported by this CPU");
    return true;
  }
  state.SetLabel(toString(isa));
  return false;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float>& src = gradient();
  std::vector<float> dst(n, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_Cast(benchmark::State& state) {
  const auto isa = static_cast<Isa>(state.range(0));
  const DataType type = state.range(1) == 0 ? DataType::kFloat16 : DataType::kBFloat16;
  if (skipUnsupported(state, isa)) return;
  const std::vector<float>& src = gradient();
  std::vector<uint16_t> dst(kCastFloats, 0);
  for (auto _ : state) {
    castToHalf(src.data(), dst.data(), kCastFloats, type, 0.125f, isa);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kCastFloats * sizeof(float)));
}

void BM_CastWithResidual(benchmark::State& state) {
  const auto isa = static_cast<Isa>(state.range(0));
  const DataType type = state.range(1) == 0 ? DataType::kFloat16 : DataType::kBFloat16;
  if (skipUnsupported(state, isa)) return;
  const std::vector<float>& src = gradient();
  std::vector<float> residual(kCastFloats, 0.0f);
  std::vector<uint16_t> dst(kCastFloats, 0);
  for (auto _ : state) {
    castWithResidual(src.data(), residual.data(), dst.data(), kCastFloats, type, 0.125f, isa);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kCastFloats * sizeof(float)));
}

void BM_TopK(benchmark::State& state) {
  const auto isa = static_cast<Isa>(state.range(0));
  const bool approximate = state.range(1) != 0;
  const bool errorFeedback = state.range(2) != 0;
  if (skipUnsupported(state, isa)) return;
  const std::vector<float>& src = gradient();
  std::vector<float> residual(errorFeedback ? kTopKFloats : 0, 0.0f);
  TopKOptions options;
  options.k = kTopKFloats / 100;
  options.approximate = approximate;
  options.isa = isa;
  SparseTensor out;
  TopKStats stats;
  size_t fellBack = 0, cut = 0;
  for (auto _ : state) {
    options.seed += 1;
    topk(src.data(), errorFeedback ? residual.data() : nullptr, kTopKFloats, options, out, &stats);
    benchmark::DoNotOptimize(out.values.data());
    fellBack += stats.fellBack ? 1 : 0;
    cut += stats.candidates > options.k + options.k / 10 ? 1 : 0;
  }
  state.counters["nnz/k"] = static_cast<double>(out.nnz()) / static_cast<double>(options.k);
  state.counters["fellBack"] = static_cast<double>(fellBack);
  state.counters["cutToK"] = static_cast<double>(cut);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kTopKFloats * sizeof(float)));
  state.SetLabel(std::string(toString(isa)) + (approximate ? " approximate" : " exact") +
                 (errorFeedback ? " +ef" : ""));
}

// Console output as usual, plus every run's real and CPU time per iteration
// by name for the ratio table. On a shared machine the CPU-time ratio is the
// steadier one: real time also counts the time other processes ran.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (!run.error_occurred && run.run_type == Run::RT_Iteration) {
        // With --benchmark_repetitions, keep the fastest repetition.
        const double unit = benchmark::GetTimeUnitMultiplier(run.time_unit);
        const std::pair<double, double> t{run.GetAdjustedRealTime() / unit, run.GetAdjustedCPUTime() / unit};
        auto [it, fresh] = times_.emplace(run.benchmark_name(), t);
        if (!fresh) it->second = {std::min(it->second.first, t.first), std::min(it->second.second, t.second)};
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void printRatios() const {
    const auto reference = times_.find("BM_Memcpy/16777216/real_time");
    if (reference == times_.end()) return;
    const auto [realRef, cpuRef] = reference->second;
    std::printf("\nAgainst memcpy of the same 64 MiB of float32 input (real %.3f ms, CPU %.3f ms):\n", realRef * 1e3,
                cpuRef * 1e3);
    std::printf("  %-46s %9s %9s %12s %12s\n", "benchmark", "real ms", "CPU ms", "speed(real)", "speed(CPU)");
    for (const auto& [name, t] : times_) {
      std::printf("  %-46s %9.3f %9.3f %11.2fx %11.2fx\n", name.c_str(), t.first * 1e3, t.second * 1e3,
                  realRef / t.first, cpuRef / t.second);
    }
    std::printf("(speed = memcpy time / time. Goals: casts >= 0.80x; approximate top-k >= 0.33x, i.e. at most 3x\n"
                " the memcpy time.)\n");
  }

 private:
  std::map<std::string, std::pair<double, double>> times_;  // seconds: real, CPU
};

}  // namespace

BENCHMARK(BM_Memcpy)->Arg(static_cast<int64_t>(kCastFloats))->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cast)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"isa", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CastWithResidual)
    ->ArgsProduct({{0, 2, 3}, {0, 1}})
    ->ArgNames({"isa", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopK)
    ->ArgsProduct({{0, 1, 2}, {1, 0}, {0, 1}})
    ->ArgNames({"isa", "approx", "ef"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printRatios();
  benchmark::Shutdown();
  return 0;
}
