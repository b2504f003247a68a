// The Reducer with ranks as threads: averaging in every ready order, copy
// and view modes, bucket rebuild, accumulation, unused gradients,
// partitions, the timeline, and misuse that must fail on every rank.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "gradcomm/reducer.hpp"
#include "support/inproc.hpp"
#include "support/json_check.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

// A "model": gradient sizes, as a list of counts.
std::vector<size_t> modelSizes() { return {3000, 17, 1, 40000, 250, 5000, 64, 100000, 3, 777}; }

float valueOf(int rank, size_t grad, size_t i, int step) {
  return static_cast<float>(static_cast<int>((grad * 31 + i * 7 + static_cast<size_t>(step) * 3) % 13) - 6 + rank);
}

Options smallBuckets() {
  Options o;
  o.set("BUCKET_CAP", "64K");
  o.set("FIRST_BUCKET", "16K");
  o.set("TIMEOUT", "30s");
  return o;
}

// One training step: fill gradients (copy mode) or their views, mark them
// ready in a rank-specific random order, finalize, check the average.
void runStep(RankContext& ctx, Reducer& red, std::vector<std::vector<float>>& grads, bool view, int step,
             std::mt19937& rng) {
  const size_t n = grads.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t g : order) {
    float* dst = view ? static_cast<float*>(red.gradient(g)) : grads[g].data();
    for (size_t i = 0; i < grads[g].size(); ++i) dst[i] = valueOf(ctx.rank, g, i, step);
    red.markReady(g);
  }
  red.finalize();
  const float meanRank = (ctx.size - 1) / 2.0f;
  for (size_t g = 0; g < n; ++g) {
    const float* got = view ? static_cast<const float*>(red.gradient(g)) : grads[g].data();
    for (size_t i = 0; i < grads[g].size(); ++i) {
      const float want = valueOf(0, g, i, step) + meanRank;
      ASSERT_FLOAT_EQ(got[i], want) << "rank " << ctx.rank << " step " << step << " gradient " << g << " element " << i;
    }
  }
}

std::vector<GradientSpec> specs(std::vector<std::vector<float>>& grads, bool view) {
  std::vector<GradientSpec> s;
  for (auto& g : grads) s.push_back({g.size(), DataType::kFloat32, view ? nullptr : g.data()});
  return s;
}

}  // namespace

TEST(Reducer, AveragesGradientsWhateverOrderEachRankProducesThem) {
  for (int p : {1, 2, 3, 4}) {
    for (bool view : {false, true}) {
      runRanks(
          p,
          [&](RankContext& ctx) {
            std::vector<std::vector<float>> grads;
            for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
            ReducerOptions o;
            o.gradientAsBucketView = view;
            Reducer red(ctx.comm, specs(grads, view), o);
            std::mt19937 rng(static_cast<unsigned>(ctx.rank * 101 + 7));
            for (int step = 0; step < 4; ++step) runStep(ctx, red, grads, view, step, rng);
            EXPECT_GT(red.buckets().size(), 2u);
            auto st = red.lastStepStats();
            EXPECT_EQ(st.step, 3u);
            const auto sizes = modelSizes();
            EXPECT_EQ(st.bytes, std::accumulate(sizes.begin(), sizes.end(), size_t{0}) * 4);
            EXPECT_GT(st.stepMs, 0.0);
            EXPECT_GE(st.utilization, 0.0);
            EXPECT_LE(st.utilization, 1.0);
          },
          smallBuckets());
    }
  }
}

TEST(Reducer, RebuildsBucketsInRankZerosReadyOrderAndAllRanksAgree) {
  const int p = 3;
  std::vector<std::vector<std::vector<size_t>>> before(p), after(p);
  runRanks(
      p,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        Reducer red(ctx.comm, specs(grads, true), [] { ReducerOptions o; o.gradientAsBucketView = true; return o; }());
        before[static_cast<size_t>(ctx.rank)] = red.buckets();
        // Registration order is ready order here (not the reverse the layout expects).
        for (size_t g = 0; g < grads.size(); ++g) {
          float* v = static_cast<float*>(red.gradient(g));
          for (size_t i = 0; i < grads[g].size(); ++i) v[i] = static_cast<float>(ctx.rank);
          red.markReady(g);
        }
        red.finalize();
        after[static_cast<size_t>(ctx.rank)] = red.buckets();
        // Views moved, and still hold the averaged values.
        for (size_t g = 0; g < grads.size(); ++g) {
          const float* v = static_cast<const float*>(red.gradient(g));
          for (size_t i = 0; i < grads[g].size(); ++i) ASSERT_EQ(v[i], 1.0f);
        }
      },
      smallBuckets());
  EXPECT_NE(before[0], after[0]);
  EXPECT_EQ(after[0].front().front(), 0u) << "rank 0 marked gradient 0 first";
  for (int r = 1; r < p; ++r) EXPECT_EQ(after[static_cast<size_t>(r)], after[0]);
}

TEST(Reducer, AccumulationStepsCommunicateNothingAndTheNextStepCarriesTheSum) {
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        Reducer red(ctx.comm, specs(grads, false));
        red.setSynchronization(false);
        for (int micro = 0; micro < 3; ++micro) {
          for (size_t g = 0; g < grads.size(); ++g) {
            for (auto& v : grads[g]) v += static_cast<float>(ctx.rank + 1);  // accumulate
            red.markReady(g);
          }
          red.finalize();
          EXPECT_FALSE(red.lastStepStats().synchronized);
          EXPECT_EQ(red.lastStepStats().buckets, 0u);
          EXPECT_EQ(grads[0][0], static_cast<float>((micro + 1) * (ctx.rank + 1))) << "no_sync must not touch gradients";
        }
        red.setSynchronization(true);
        for (size_t g = 0; g < grads.size(); ++g) {
          for (auto& v : grads[g]) v += static_cast<float>(ctx.rank + 1);
          red.markReady(g);
        }
        red.finalize();
        // Each rank accumulated 4 * (rank + 1); the average over ranks 0, 1 is 4 * 1.5.
        for (const auto& g : grads) {
          for (float v : g) ASSERT_EQ(v, 6.0f);
        }
      },
      smallBuckets());
}

TEST(Reducer, UnusedGradientsContributeZero) {
  runRanks(
      3,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        Reducer red(ctx.comm, specs(grads, false));
        for (size_t g = 0; g < grads.size(); ++g) {
          if (g == 3 && ctx.rank != 0) {
            red.markUnused(g);  // only rank 0 produces gradient 3
            continue;
          }
          std::fill(grads[g].begin(), grads[g].end(), 3.0f);
          red.markReady(g);
        }
        red.finalize();
        EXPECT_EQ(grads[3][0], 1.0f);  // (3 + 0 + 0) / 3
        EXPECT_EQ(grads[2][0], 3.0f);
      },
      smallBuckets());
}

TEST(Reducer, PartitionedBucketsGiveTheSameResult) {
  runRanks(
      3,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        ReducerOptions o;
        o.partitionBytes = 4096;
        Reducer red(ctx.comm, specs(grads, false), o);
        std::mt19937 rng(static_cast<unsigned>(ctx.rank));
        runStep(ctx, red, grads, false, 0, rng);
        EXPECT_GT(red.lastStepStats().buckets, red.buckets().size());
      },
      smallBuckets());
}

TEST(Reducer, AGradientNeverMarkedReadyFailsFinalizeNamingItOnEveryRank) {
  std::vector<std::string> what(3);
  runRanks(
      3,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 1.0f);
        try {
          // A slow rank may still be constructing (collectively) when rank 1
          // has failed: construction belongs in the try as well.
          Reducer red(ctx.comm, specs(grads, false));
          for (size_t g = 0; g < grads.size(); ++g) {
            if (ctx.rank == 1 && (g == 4 || g == 7)) continue;
            red.markReady(g);
          }
          red.finalize();
        } catch (const Error& e) {
          what[static_cast<size_t>(ctx.rank)] = e.what();
        }
      },
      smallBuckets());
  EXPECT_NE(what[1].find("gradient(s) 4, 7 were never marked ready"), std::string::npos) << what[1];
  EXPECT_FALSE(what[0].empty());
  EXPECT_FALSE(what[2].empty());
}

TEST(Reducer, MarkingAGradientTwiceFailsOnEveryRank) {
  std::vector<std::string> what(2);
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 1.0f);
        try {
          Reducer red(ctx.comm, specs(grads, false));  // in the try: see above
          for (size_t g = 0; g < grads.size(); ++g) {
            red.markReady(g);
            if (ctx.rank == 0 && g == 2) red.markReady(g);
          }
          red.finalize();
        } catch (const Error& e) {
          what[static_cast<size_t>(ctx.rank)] = e.what();
        }
      },
      smallBuckets());
  EXPECT_NE(what[0].find("gradient 2 was marked ready twice in one step"), std::string::npos) << what[0];
  EXPECT_NE(what[1].find("gradient 2 was marked ready twice"), std::string::npos) << what[1];
}

TEST(Reducer, GradientsThatDifferBetweenRanksAreRejectedEverywhere) {
  std::vector<std::string> what(3);
  runRanks(3, [&](RankContext& ctx) {
    std::vector<std::vector<float>> grads;
    for (size_t c : modelSizes()) grads.emplace_back(c + (ctx.rank == 2 && c == 250 ? 1 : 0), 1.0f);
    try {
      Reducer red(ctx.comm, specs(grads, false));
    } catch (const InvalidArgument& e) {
      what[static_cast<size_t>(ctx.rank)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(what[static_cast<size_t>(r)].find("gradient 4 has"), std::string::npos) << what[static_cast<size_t>(r)];
  }
}

TEST(Reducer, TimelineIsValidJsonWithTheExpectedEvents) {
  char dir[] = "/tmp/gradcomm-timeline-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/trace.json";
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 1.0f);
        ReducerOptions o;
        o.timelinePath = base;
        o.compression = "fp16";
        Reducer red(ctx.comm, specs(grads, false), o);
        std::mt19937 rng(1);
        for (int step = 0; step < 3; ++step) runStep(ctx, red, grads, false, step, rng);
      },
      smallBuckets());
  for (int r = 0; r < 2; ++r) {
    const std::string path = std::string(dir) + "/trace.rank" + std::to_string(r) + ".json";
    std::ifstream f(path);
    ASSERT_TRUE(f.good()) << path;
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(JsonChecker(text.str()).check(), "") << path;
    for (const char* needle : {"\"traceEvents\"", "ready 7", "queue bucket 0", "allreduce bucket", "finalize (blocked)",
                               "\"algorithm\": \"fp16+", "compress bucket", "decompress bucket", "\"ph\": \"X\""}) {
      EXPECT_NE(text.str().find(needle), std::string::npos) << needle << " missing from " << path;
    }
    std::remove(path.c_str());
  }
  rmdir(dir);
}

TEST(Reducer, TimelineIsValidJsonAfterEveryStepAndHoldsEveryStep) {
  // Streamed: the file is complete JSON after each finalize (a process that
  // dies keeps a readable trace) and holds the events of every step, with
  // the ranks' time axes starting together.
  char dir[] = "/tmp/gradcomm-timeline-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/trace.json";
  const int steps = 40;
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 1.0f);
        ReducerOptions o;
        o.timelinePath = base;
        Reducer red(ctx.comm, specs(grads, false), o);
        std::mt19937 rng(2);
        const std::string mine = std::string(dir) + "/trace.rank" + std::to_string(ctx.rank) + ".json";
        for (int step = 0; step < steps; ++step) {
          runStep(ctx, red, grads, false, step, rng);
          std::ifstream f(mine);
          std::stringstream text;
          text << f.rdbuf();
          EXPECT_EQ(JsonChecker(text.str()).check(), "") << mine << " after step " << step;
        }
      },
      smallBuckets());
  for (int r = 0; r < 2; ++r) {
    const std::string path = std::string(dir) + "/trace.rank" + std::to_string(r) + ".json";
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    const std::string t = text.str();
    size_t finalizes = 0;
    for (size_t pos = t.find("finalize (blocked)"); pos != std::string::npos; pos = t.find("finalize (blocked)", pos + 1)) {
      ++finalizes;
    }
    EXPECT_EQ(finalizes, static_cast<size_t>(steps)) << path;
    // Times start at the Reducer's creation: no event more than a minute out.
    EXPECT_EQ(t.find("\"ts\": -"), std::string::npos) << path;
    std::remove(path.c_str());
  }
  rmdir(dir);
}

TEST(Reducer, ATimelineOneRankCannotWriteFailsEveryRank) {
  char dir[] = "/tmp/gradcomm-timeline-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Rank 1's file name is taken by a directory: only rank 1 cannot write.
  const std::string blocked = std::string(dir) + "/trace.rank1.json";
  ASSERT_EQ(mkdir(blocked.c_str(), 0700), 0);
  std::vector<std::string> errors(3);
  runRanks(3, [&](RankContext& ctx) {
    std::vector<std::vector<float>> grads;
    for (size_t c : modelSizes()) grads.emplace_back(c, 1.0f);
    ReducerOptions o;
    o.timelinePath = std::string(dir) + "/trace.json";
    try {
      Reducer red(ctx.comm, specs(grads, false), o);
    } catch (const ConfigError& e) {
      errors[static_cast<size_t>(ctx.rank)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("timeline"), std::string::npos) << "rank " << r << ": "
                                                                                  << errors[static_cast<size_t>(r)];
  }
  EXPECT_NE(errors[1].find(blocked), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  for (int r : {0, 2}) std::remove((std::string(dir) + "/trace.rank" + std::to_string(r) + ".json").c_str());
  rmdir(blocked.c_str());
  rmdir(dir);
}

TEST(Reducer, Fp16BucketsAreExactForSmallIntegerGradients) {
  runRanks(
      3,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        ReducerOptions o;
        o.compression = "fp16";
        o.average = false;
        Reducer red(ctx.comm, specs(grads, false), o);
        for (int step = 0; step < 3; ++step) {
          for (size_t g = 0; g < grads.size(); ++g) {
            for (size_t i = 0; i < grads[g].size(); ++i) grads[g][i] = valueOf(ctx.rank, g, i, step);
            red.markReady(g);
          }
          red.finalize();
          for (size_t g = 0; g < grads.size(); ++g) {
            for (size_t i = 0; i < grads[g].size(); i += 97) {
              const float want = valueOf(0, g, i, step) * 3 + 3;  // ranks 0, 1, 2 add 0 + 1 + 2
              ASSERT_EQ(grads[g][i], want) << "gradient " << g << " element " << i;
            }
          }
        }
      },
      smallBuckets());
}

TEST(Reducer, TopKBucketsWithErrorFeedbackStarveNoGradientAcrossARebuild) {
  const int steps = 30;
  runRanks(
      2,
      [&](RankContext& ctx) {
        std::vector<std::vector<float>> grads;
        for (size_t c : modelSizes()) grads.emplace_back(c, 0.0f);
        ReducerOptions o;
        o.compression = "topk:0.1";  // error feedback on by default
        Reducer red(ctx.comm, specs(grads, false), o);
        std::vector<std::vector<double>> total(grads.size());
        for (size_t g = 0; g < grads.size(); ++g) total[g].assign(grads[g].size(), 0.0);
        for (int step = 0; step < steps; ++step) {
          // Same constant gradient on every step; marked in registration
          // order, so buckets are rebuilt after the first step.
          for (size_t g = 0; g < grads.size(); ++g) {
            for (size_t i = 0; i < grads[g].size(); ++i) grads[g][i] = 1.0f + static_cast<float>(i % 3);
            red.markReady(g);
          }
          red.finalize();
          for (size_t g = 0; g < grads.size(); ++g) {
            for (size_t i = 0; i < grads[g].size(); ++i) total[g][i] += grads[g][i];
          }
        }
        double sent = 0, given = 0;
        for (size_t g = 0; g < grads.size(); ++g) {
          for (size_t i = 0; i < grads[g].size(); ++i) {
            const double want = steps * (1.0 + static_cast<double>(i % 3));
            ASSERT_GT(total[g][i], 0.0) << "gradient " << g << " element " << i << " was never sent";
            sent += total[g][i];
            given += want;
          }
        }
        // What is not yet sent is what the residuals carry: a few steps' worth.
        EXPECT_GT(sent / given, 0.75);
        EXPECT_LE(sent / given, 1.0 + 1e-6);
      },
      smallBuckets());
}
