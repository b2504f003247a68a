// Compressed allreduce through the communicator: error feedback loses
// nothing over steps, feedback memory kept by the caller (never by buffer
// address), errors, the GRADCOMM_COMPRESSION default, and convergence of a
// small model trained with each compressor (with and without error feedback).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "support/inproc.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

std::vector<float> randomVector(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(Compression, ErrorFeedbackLosesNothingOverSteps) {
  for (const char* spec : {"topk:0.05", "topk:0.05:exact", "fp16:ef=1", "bf16:ef=1"}) {
    const int p = 3, steps = 40;
    const size_t n = 2000;
    std::vector<double> sent(n, 0.0), given(n, 0.0), carried(n, 0.0);
    std::mutex mu;
    runRanks(p, [&](RankContext& ctx) {
      ErrorFeedback ef;
      std::vector<float> out(n);
      std::vector<double> localSent(n, 0.0), localGiven(n, 0.0);
      for (int t = 0; t < steps; ++t) {
        auto g = randomVector(n, static_cast<unsigned>(ctx.rank * 1000 + t));
        CollectiveOptions o;
        o.compression = spec;
        o.errorFeedback = &ef;
        ctx.comm.allreduce(g.data(), out.data(), n, DataType::kFloat32, ReduceOp::kSum, o).wait();
        for (size_t i = 0; i < n; ++i) localGiven[i] += g[i];
        if (ctx.rank == 0) {
          for (size_t i = 0; i < n; ++i) localSent[i] += out[i];
        }
      }
      ASSERT_EQ(ef.size(), n);
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < n; ++i) {
        given[i] += localGiven[i];
        sent[i] += localSent[i];
        carried[i] += ef.data()[i];
      }
    });
    // Everything given was either sent or is still carried.
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(sent[i] + carried[i] - given[i]));
      scale = std::max(scale, std::fabs(given[i]));
    }
    // top-k sums float32 payloads: rounding only. fp16/bf16 payloads are
    // also rounded when partial sums are formed on the wire (that error is
    // not fed back): about one half-precision ulp per step.
    const bool half = spec[0] != 't';
    const double tolerance = half ? steps * scale * (spec[0] == 'b' ? 8e-3 : 1e-3) : 1e-4 * scale;
    EXPECT_LT(worst, tolerance) << spec;
  }
}

TEST(Compression, WithoutErrorFeedbackTopKDropsWhatItDoesNotSend) {
  runRanks(2, [&](RankContext& ctx) {
    const size_t n = 100;
    std::vector<float> g(n, 0.0f), out(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i + 1);  // the largest are the last
    CollectiveOptions o;
    o.compression = "topk:10:exact:ef=0";
    for (int step = 0; step < 3; ++step) {
      ctx.comm.allreduce(g.data(), out.data(), n, DataType::kFloat32, ReduceOp::kSum, o).wait();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i >= 90 ? 2.0f * (i + 1) : 0.0f) << "step " << step << " i " << i;
    }
  });
}

TEST(Compression, TwoTensorsAtOneAddressNeverShareAResidual) {
  // A caching allocator hands a freed tensor's memory to the next tensor of
  // that size: the second must not receive what compression kept of the first.
  runRanks(2, [&](RankContext& ctx) {
    const std::vector<float> zeros(4, 0.0f);
    std::vector<float> memory{10, 1, 1, 1};  // tensor A, then tensor B, at one address
    CollectiveOptions o;
    o.compression = "topk:1:exact";  // error feedback on by default for top-k
    ctx.comm.allreduce(memory.data(), memory.data(), 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(memory, (std::vector<float>{20, 0, 0, 0}));  // only A's largest value went
    std::fill(memory.begin(), memory.end(), 0.0f);  // tensor B: all zeros, so its sum is zero
    ctx.comm.allreduce(memory.data(), memory.data(), 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(memory, zeros) << "tensor B received tensor A's residual";
  });
}

TEST(Compression, EachErrorFeedbackCarriesItsOwnTensorsResidualWhateverTheAddress) {
  runRanks(2, [&](RankContext& ctx) {
    ErrorFeedback forA, forB;
    std::vector<float> memory{10, 1, 1, 1};
    CollectiveOptions o;
    o.compression = "topk:1:exact";
    o.errorFeedback = &forA;
    ctx.comm.allreduce(memory.data(), memory.data(), 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(memory, (std::vector<float>{20, 0, 0, 0}));
    ASSERT_EQ(forA.size(), 4u);
    EXPECT_EQ(std::vector<float>(forA.data(), forA.data() + 4), (std::vector<float>{0, 1, 1, 1}));
    // Tensor B at the same address, with its own feedback: nothing of A's.
    std::fill(memory.begin(), memory.end(), 0.0f);
    o.errorFeedback = &forB;
    ctx.comm.allreduce(memory.data(), memory.data(), 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(memory, std::vector<float>(4, 0.0f));
    // A again (a zero gradient): one of its carried ones goes now.
    o.errorFeedback = &forA;
    ctx.comm.allreduce(memory.data(), memory.data(), 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(std::accumulate(memory.begin(), memory.end(), 0.0f), 2.0f);
    EXPECT_EQ(std::accumulate(forA.data(), forA.data() + 4, 0.0f), 2.0f);
  });
}

TEST(Compression, IntegerOrMaxCallsAreRejectedOnEveryRank) {
  std::vector<std::string> what(2);
  runRanks(2, [&](RankContext& ctx) {
    std::vector<int32_t> buf(10, 1);
    CollectiveOptions o;
    o.compression = "fp16";
    try {
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kInt32, ReduceOp::kSum, o).wait();
    } catch (const Error& e) {
      what[static_cast<size_t>(ctx.rank)] = e.what();
    }
  });
  for (const auto& w : what) EXPECT_NE(w.find("applies to float32 sum or avg allreduces"), std::string::npos) << w;
}

TEST(Compression, MalformedSpecIsAnInvalidArgument) {
  runRanks(2, [&](RankContext& ctx) {
    std::vector<float> buf(10, 1.0f);
    CollectiveOptions o;
    o.compression = "topk:lots";
    EXPECT_THROW(ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait(),
                 Error);
  });
}

TEST(Compression, TheEnvironmentDefaultAppliesToFloatSumAndAvgOnly) {
  Options opts;
  opts.set("COMPRESSION", "bf16");
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<float> f(64, 1.5f);
        Work w = ctx.comm.allreduce(f.data(), f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum);
        w.wait();
        EXPECT_EQ(w.algorithm().rfind("bf16+", 0), 0u) << w.algorithm();
        EXPECT_EQ(f[0], 3.0f);
        bool sawCompress = false;
        for (const auto& ph : w.phases()) sawCompress = sawCompress || ph.name == "compress";
        EXPECT_TRUE(sawCompress);
        std::vector<int32_t> i(64, 2);
        Work wi = ctx.comm.allreduce(i.data(), i.data(), i.size(), DataType::kInt32, ReduceOp::kMax);
        wi.wait();
        EXPECT_EQ(wi.algorithm().find('+'), std::string::npos) << wi.algorithm();
        EXPECT_EQ(i[0], 2);
      },
      opts);
}

// ---- convergence ---------------------------------------------------------------

namespace {

// L2-regularised logistic regression on synthetic data: 4 ranks, each with
// its own shard; full-batch gradient descent with the averaged gradient.
constexpr double kLambda = 1e-2;  // enough regularisation that every run reaches its plateau

struct Problem {
  static constexpr size_t kDim = 1000;
  static constexpr size_t kSamples = 200;  // per rank
  std::vector<std::vector<float>> x;       // per rank, kSamples * kDim
  std::vector<std::vector<float>> y;       // per rank, +-1
};

Problem makeProblem(int ranks) {
  Problem pr;
  std::mt19937 rng(2024);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> truth(Problem::kDim, 0.0f);
  for (size_t j = 0; j < Problem::kDim; j += 7) truth[j] = n01(rng);
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> x(Problem::kSamples * Problem::kDim), y(Problem::kSamples);
    for (size_t s = 0; s < Problem::kSamples; ++s) {
      float dot = 0;
      for (size_t j = 0; j < Problem::kDim; ++j) {
        float v = n01(rng) * (j % 10 == 0 ? 2.0f : 0.5f);
        x[s * Problem::kDim + j] = v;
        dot += v * truth[j];
      }
      y[s] = dot + 0.5f * n01(rng) > 0 ? 1.0f : -1.0f;
    }
    pr.x.push_back(std::move(x));
    pr.y.push_back(std::move(y));
  }
  return pr;
}

double localLoss(const Problem& pr, int r, const std::vector<float>& w, std::vector<float>* grad) {
  double loss = 0;
  if (grad) std::fill(grad->begin(), grad->end(), 0.0f);
  for (size_t s = 0; s < Problem::kSamples; ++s) {
    const float* xs = pr.x[static_cast<size_t>(r)].data() + s * Problem::kDim;
    double dot = 0;
    for (size_t j = 0; j < Problem::kDim; ++j) dot += static_cast<double>(w[j]) * xs[j];
    const double m = pr.y[static_cast<size_t>(r)][s] * dot;
    loss += m > 30 ? std::exp(-m) : std::log1p(std::exp(-m));
    if (grad) {
      const double coef = -pr.y[static_cast<size_t>(r)][s] / (1.0 + std::exp(m)) / Problem::kSamples;
      for (size_t j = 0; j < Problem::kDim; ++j) (*grad)[j] += static_cast<float>(coef * xs[j]);
    }
  }
  double reg = 0;
  for (size_t j = 0; j < Problem::kDim; ++j) {
    reg += 0.5 * kLambda * w[j] * w[j];
    if (grad) (*grad)[j] += static_cast<float>(kLambda) * w[j];
  }
  return loss / Problem::kSamples + reg;
}

// Trains with `compression` and returns the final global loss.
double train(const Problem& pr, const std::string& compression, int steps, float lr) {
  const int p = static_cast<int>(pr.x.size());
  std::vector<double> losses(static_cast<size_t>(p));
  runRanks(p, [&](RankContext& ctx) {
    std::vector<float> w(Problem::kDim, 0.0f), g(Problem::kDim), avg(Problem::kDim);
    ErrorFeedback ef;
    CollectiveOptions o;
    o.compression = compression;
    o.errorFeedback = &ef;
    for (int t = 0; t < steps; ++t) {
      localLoss(pr, ctx.rank, w, &g);
      ctx.comm.allreduce(g.data(), avg.data(), g.size(), DataType::kFloat32, ReduceOp::kAvg, o).wait();
      // A decaying step: with a constant one, error feedback settles a
      // little above the optimum (the carried residual is a stale step).
      const float step = lr / (1.0f + static_cast<float>(t) / 100.0f);
      for (size_t j = 0; j < w.size(); ++j) w[j] -= step * avg[j];
    }
    losses[static_cast<size_t>(ctx.rank)] = localLoss(pr, ctx.rank, w, nullptr);
  });
  return std::accumulate(losses.begin(), losses.end(), 0.0) / p;
}

}  // namespace

TEST(Compression, TrainingConvergesToTheUncompressedLossWithErrorFeedback) {
  const Problem pr = makeProblem(4);
  const int steps = 400;
  const float lr = 0.5f;
  const double base = train(pr, "none", steps, lr);
  const double initial = std::log(2.0);
  struct Run {
    const char* spec;
    bool mustMatch;
  };
  const Run runs[] = {{"fp16", true}, {"bf16", true}, {"topk:0.01", true}, {"fp16:ef=1", true},
                      {"topk:0.01:ef=0", false}};
  std::printf("convergence, %d steps: none %.5f (from %.5f)\n", steps, base, initial);
  double topkEf = 0, topkNoEf = 0;
  for (const auto& r : runs) {
    const double loss = train(pr, r.spec, steps, lr);
    std::printf("  %-16s %.5f (%+.2f%% vs none)\n", r.spec, loss, 100.0 * (loss - base) / base);
    if (r.mustMatch) EXPECT_LE(std::fabs(loss - base) / base, 0.02) << r.spec;
    if (std::string(r.spec) == "topk:0.01") topkEf = loss;
    if (std::string(r.spec) == "topk:0.01:ef=0") topkNoEf = loss;
  }
  EXPECT_LT(base, 0.6 * initial) << "the uncompressed run must actually learn";
  // Without error feedback, top-k 1% throws away 99% of every gradient and
  // ends clearly worse.
  EXPECT_GT(topkNoEf, topkEf * 1.02);
}
