// Reduction kernel throughput per SIMD level against memcpy of the same
// bytes (float32 sum over 64 MiB: three streams, two reads and one write).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "kernels/reduce.hpp"

using namespace gradcomm;
using namespace gradcomm::kernels;

static void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> a(n, 1.0f), d(n);
  for (auto _ : state) {
    std::memcpy(d.data(), a.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

static void BM_ReduceSum(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto level = static_cast<SimdLevel>(state.range(1));
  if (static_cast<int>(level) > static_cast<int>(detectSimd())) {
    state.SkipWithError("level not supported by this CPU");
    return;
  }
  std::vector<float> a(n, 1.0f), b(n, 2.0f), d(n);
  auto fn = reduceFunction(DataType::kFloat32, ReduceOp::kSum, level);
  for (auto _ : state) {
    fn(d.data(), a.data(), b.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
  state.SetLabel(toString(level));
}

static void BM_ReduceSumBf16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto level = static_cast<SimdLevel>(state.range(1));
  if (static_cast<int>(level) > static_cast<int>(detectSimd())) {
    state.SkipWithError("level not supported by this CPU");
    return;
  }
  std::vector<uint16_t> a(n, 0x3F80), b(n, 0x4000), d(n);
  auto fn = reduceFunction(DataType::kBFloat16, ReduceOp::kSum, level);
  for (auto _ : state) {
    fn(d.data(), a.data(), b.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(uint16_t)));
  state.SetLabel(toString(level));
}

BENCHMARK(BM_Memcpy)->Arg(16 << 20);
BENCHMARK(BM_ReduceSum)->Args({16 << 20, 0})->Args({16 << 20, 1})->Args({16 << 20, 2});
BENCHMARK(BM_ReduceSumBf16)->Args({32 << 20, 0})->Args({32 << 20, 1})->Args({32 << 20, 2});
BENCHMARK_MAIN();
