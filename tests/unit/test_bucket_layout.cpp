// Bucket assignment of the Reducer, and the JSON checker the timeline test uses.
#include <gtest/gtest.h>

#include "reducer/bucket_layout.hpp"
#include "support/json_check.hpp"

using namespace gradcomm;
using namespace gradcomm::reducer;

TEST(BucketLayout, SmallFirstBucketThenCappedBucketsInReadyOrder) {
  // 10 gradients of 1000 floats (4000 bytes); first cap 8000, cap 12000.
  std::vector<GradientInfo> g(10, {1000, DataType::kFloat32});
  auto l = assignBuckets(g, reverseOrder(10), 8000, 12000);
  ASSERT_EQ(l.buckets.size(), 4u);
  EXPECT_EQ(l.buckets[0].gradients, (std::vector<size_t>{9, 8}));
  EXPECT_EQ(l.buckets[1].gradients, (std::vector<size_t>{7, 6, 5}));
  EXPECT_EQ(l.buckets[2].gradients, (std::vector<size_t>{4, 3, 2}));
  EXPECT_EQ(l.buckets[3].gradients, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(l.bucketOf[5], 1u);
  EXPECT_EQ(l.offsetOf[5], 2000u);
  EXPECT_EQ(l.buckets[1].count, 3000u);
}

TEST(BucketLayout, EveryGradientLandsExactlyOnceWithoutOverlap) {
  std::vector<GradientInfo> g;
  for (size_t i = 0; i < 50; ++i) g.push_back({(i * 37) % 500 + 1, i % 7 == 0 ? DataType::kFloat64 : DataType::kFloat32});
  std::vector<size_t> order;
  for (size_t i = 0; i < 50; ++i) order.push_back((i * 13) % 50);
  auto l = assignBuckets(g, order, 1000, 3000);
  std::vector<int> seen(50, 0);
  for (const auto& b : l.buckets) {
    size_t next = 0;
    for (size_t k = 0; k < b.gradients.size(); ++k) {
      const size_t gi = b.gradients[k];
      ++seen[gi];
      EXPECT_EQ(b.type, g[gi].type);
      EXPECT_EQ(b.offsets[k], next);
      next += g[gi].count;
    }
    EXPECT_EQ(b.count, next);
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(BucketLayout, AGradientAboveTheCapGetsABucketOfItsOwn) {
  std::vector<GradientInfo> g = {{10, DataType::kFloat32}, {100000, DataType::kFloat32}, {10, DataType::kFloat32}};
  auto l = assignBuckets(g, reverseOrder(3), 1000, 1000);
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.buckets[1].gradients, (std::vector<size_t>{1}));
}

TEST(JsonChecker, AcceptsValidAndRejectsBrokenJson) {
  using gradcomm::testing::JsonChecker;
  EXPECT_EQ(JsonChecker(R"({"a": [1, 2.5, -3e2, true, null, "x\"y"], "b": {}})").check(), "");
  EXPECT_NE(JsonChecker(R"({"a": [1, 2,]})").check(), "");
  EXPECT_NE(JsonChecker(R"({"a": 1} x)").check(), "");
  EXPECT_NE(JsonChecker(R"({"a" 1})").check(), "");
  EXPECT_NE(JsonChecker("[01]").check(), "");
}
