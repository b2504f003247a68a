// Collectives on real device memory (the CUDA runtime, not the test
// runtime of tests/inproc/test_device.cpp): ranks are threads of this
// process sharing the one GPU, each with its own communicator.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/require_gpu.hpp"
#include "support/collective_check.hpp"
#include "support/per_rank.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

Options chunked() {
  Options o = quick("60s");
  o.set("DEVICE_CHUNK_SIZE", "64K");
  return o;
}

/// Managed memory: device memory to gradcomm, and readable by the checks.
struct Managed {
  std::vector<void*> blocks;
  void* operator()(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocManaged(&p, bytes ? bytes : 1) != cudaSuccess) throw std::bad_alloc();
    blocks.push_back(p);
    return p;
  }
  ~Managed() {
    for (void* p : blocks) cudaFree(p);
  }
};

}  // namespace

TEST(CudaCollectives, EveryCollectiveTypeAndOpOnDeviceMemoryMatchesTheReference) {
  REQUIRE_GPU();
  for (int p : {1, 2, 4}) {
    runRanks(p, [&](RankContext& ctx) {
      Managed managed;
      int cases = 0;
      const std::string err = checkEveryCollectiveOn(
          ctx.comm, [&](size_t bytes) { return managed(bytes); }, {0, 1, 1000, 100000}, &cases);
      EXPECT_EQ(err, "") << "ranks " << p;
    }, chunked());
  }
}

TEST(CudaCollectives, DeviceBuffersOrderedAfterTheCallersStreamAndReadOnAnother) {
  REQUIRE_GPU();
  runRanks(2, [&](RankContext& ctx) {
    const size_t n = 3 << 20;  // 12 MiB of floats: several chunks
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((i % 1000) + ctx.rank);
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)), cudaSuccess);
    cudaStream_t writer, reader;
    ASSERT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
    // The input is written on `writer` and not waited for: the call must follow it.
    ASSERT_EQ(cudaMemcpyAsync(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, writer), cudaSuccess);
    CollectiveOptions o;
    o.stream = writer;
    Work w = ctx.comm.allreduce(d, d, n, DataType::kFloat32, ReduceOp::kSum, o);
    EXPECT_TRUE(w.onDevice());
    w.synchronize(reader);
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpyAsync(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, reader), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 2.0f * (i % 1000) + 1.0f) << i;
    cudaStreamDestroy(writer);
    cudaStreamDestroy(reader);
    cudaFree(d);
  }, chunked());
}

TEST(CudaCollectives, HostAndDeviceBuffersInOneCallAreRefusedOnEveryRank) {
  REQUIRE_GPU();
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* d = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)) != cudaSuccess) throw InternalError("cudaMalloc");
    std::vector<float> h(64);
    try {
      if (ctx.rank == 0) ctx.comm.allreduce(h.data(), d, 64, DataType::kFloat32, ReduceOp::kSum);
      ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum).wait();
    } catch (...) {
      cudaFree(d);
      throw;
    }
    cudaFree(d);
  });
  EXPECT_EQ(out.code[0], static_cast<int>(ErrorCode::kInvalidArgument)) << out.what[0];
  EXPECT_TRUE(contains(out.what[0], "the input is host memory but the output is device memory (device ")) << out.what[0];
  EXPECT_EQ(out.code[1], static_cast<int>(ErrorCode::kRemote)) << out.what[1];
}

TEST(CudaCollectives, OneRankRunsOnNcclOnTheCallersStreamAndRanksSharingTheGpuAreStaged) {
  REQUIRE_GPU();
  Options nccl = chunked();
  nccl.set("DEVICE_ENGINE", "nccl");
  runRanks(1, [&](RankContext& ctx) {
    const size_t n = 1 << 20;
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000);
    float *in = nullptr, *out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)), cudaSuccess);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
    CollectiveOptions o;
    o.stream = stream;
    Work w = ctx.comm.allreduce(in, out, n, DataType::kFloat32, ReduceOp::kAvg, o);
    EXPECT_EQ(w.algorithm(), "nccl");
    EXPECT_TRUE(w.onDevice());
    w.synchronize(stream);
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpyAsync(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], host[i]) << i;
    // Every collective, type and op on NCCL.
    Managed managed;
    int cases = 0;
    EXPECT_EQ(checkEveryCollectiveOn(ctx.comm, [&](size_t bytes) { return managed(bytes); }, {0, 1, 1000}, &cases,
                                     stream),
              "");
    cudaStreamDestroy(stream);
    cudaFree(in);
    cudaFree(out);
  }, nccl);
  // Two ranks on the one GPU: NCCL refuses them, so auto stages and a
  // forced NCCL fails on both, naming the shared device.
  runRanks(2, [&](RankContext& ctx) {
    Managed managed;
    auto* d = static_cast<float*>(managed(64 * sizeof(float)));
    for (int i = 0; i < 64; ++i) d[i] = 1.0f;
    Work w = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum);
    w.wait();
    EXPECT_NE(w.algorithm(), "nccl");
    EXPECT_EQ(d[63], 2.0f);
  }, chunked());
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    Managed managed;
    auto* d = static_cast<float*>(managed(64 * sizeof(float)));
    ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum).wait();
  }, nccl);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(out.what[r], "ranks 0 and 1 share one device")) << r << ": " << out.what[r];
  }
}

#include "gradcomm/reducer.hpp"

TEST(CudaCollectives, TheReducerAveragesDeviceGradientsOnTheCallersStream) {
  REQUIRE_GPU();
  runRanks(2, [&](RankContext& ctx) {
    const std::vector<size_t> counts{1 << 20, 17, 300000};
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::vector<GradientSpec> specs;
    for (size_t c : counts) {
      float* d = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), c * sizeof(float)), cudaSuccess);
      specs.push_back({c, DataType::kFloat32, d});
    }
    ReducerOptions o;
    o.stream = stream;
    o.bucketCapBytes = 1 << 20;
    o.partitionBytes = 256 << 10;
    {
      Reducer reducer(ctx.comm, specs, o);
      for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> host(counts.size());
        for (size_t g = counts.size(); g-- > 0;) {
          host[g].resize(counts[g]);
          for (size_t i = 0; i < counts[g]; ++i) host[g][i] = static_cast<float>(ctx.rank * 10 + step + (i % 5));
          ASSERT_EQ(cudaMemcpyAsync(specs[g].data, host[g].data(), counts[g] * sizeof(float), cudaMemcpyHostToDevice,
                                    stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the host vector is reused below
          reducer.markReady(g);
        }
        reducer.finalize();
        for (size_t g = 0; g < counts.size(); ++g) {
          ASSERT_EQ(cudaMemcpyAsync(host[g].data(), specs[g].data, counts[g] * sizeof(float), cudaMemcpyDeviceToHost,
                                    stream), cudaSuccess);
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        for (size_t g = 0; g < counts.size(); ++g) {
          for (size_t i = 0; i < counts[g]; ++i) {
            ASSERT_EQ(host[g][i], 5.0f + step + (i % 5)) << "step " << step << " gradient " << g << " element " << i;
          }
        }
      }
    }
    for (auto& s : specs) cudaFree(s.data);
    cudaStreamDestroy(stream);
  }, chunked());
}

// ---- compressed allreduce on the device (the CUDA compressors) -------------

#include <random>

TEST(CudaCollectives, DeviceCompressedAllreduceEqualsTheHostOneBitForBit) {
  REQUIRE_GPU();
  for (int p : {2, 3}) {
    runRanks(p, [&](RankContext& ctx) {
      for (const char* compression : {"fp16", "bf16", "fp16:ef=1:prescale", "bf16:ef=1", "topk:0.01:exact",
                                      "topk:100:exact:ef=0"}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          SCOPED_TRACE(std::string(compression) + " " + toString(op) + ", ranks " + std::to_string(p));
          const size_t n = 300000;
          ErrorFeedback hostEf, deviceEf;
          CollectiveOptions ho, dopt;
          ho.compression = dopt.compression = compression;
          ho.errorFeedback = &hostEf;
          dopt.errorFeedback = &deviceEf;
          float* d = nullptr;
          ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)), cudaSuccess);
          cudaStream_t stream;
          ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
          dopt.stream = stream;
          std::mt19937 gen(static_cast<uint32_t>(7 + ctx.rank));
          std::normal_distribution<float> dist(0.0f, 3.0f);
          for (int step = 0; step < 3; ++step) {
            std::vector<float> g(n), hout(n), dout(n);
            for (float& x : g) x = dist(gen);
            ASSERT_EQ(cudaMemcpyAsync(d, g.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
            Work w = ctx.comm.allreduce(d, d, n, DataType::kFloat32, op, dopt);
            ctx.comm.allreduce(g.data(), hout.data(), n, DataType::kFloat32, op, ho).wait();
            w.synchronize(stream);
            ASSERT_EQ(cudaMemcpyAsync(dout.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            ASSERT_EQ(std::memcmp(dout.data(), hout.data(), n * sizeof(float)), 0) << "step " << step;
          }
          ASSERT_EQ(hostEf.size(), deviceEf.size());
          if (deviceEf.size()) {
            EXPECT_EQ(deviceEf.device(), 0);
            std::vector<float> residual(n);
            ASSERT_EQ(cudaMemcpy(residual.data(), deviceEf.data(), n * sizeof(float), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            EXPECT_EQ(std::memcmp(residual.data(), hostEf.data(), n * sizeof(float)), 0);
          }
          cudaStreamDestroy(stream);
          cudaFree(d);
        }
      }
    }, chunked());
  }
}
