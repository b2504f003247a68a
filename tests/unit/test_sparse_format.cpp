// The sparse wire format: round trips for both index widths,
// and every kind of corruption is a clean InvalidArgument that leaves the
// destination untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compression/sparse_format.hpp"
#include "gradcomm/error.hpp"
#include "support/compression_reference.hpp"

using namespace gradcomm;
using namespace gradcomm::compression;

namespace {

SparseTensor sample(size_t denseCount, size_t nnz, uint64_t seed) {
  std::mt19937_64 rng(seed);
  SparseTensor s;
  s.denseCount = denseCount;
  // Evenly spread, strictly increasing indices with a random jitter.
  const size_t step = nnz ? denseCount / nnz : 0;
  for (size_t i = 0; i < nnz; ++i) {
    const uint64_t index = i * step + (step > 1 ? rng() % step : 0);
    if (s.wideIndices()) s.indices64.push_back(index);
    else s.indices32.push_back(static_cast<uint32_t>(index));
    s.values.push_back(std::normal_distribution<float>(0.0f, 10.0f)(rng));
  }
  return s;
}

void putU64(std::vector<uint8_t>& b, size_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

// decodeAdd must throw InvalidArgument mentioning `needle` and leave dense
// exactly as it was.
void expectRejected(const std::vector<uint8_t>& payload, size_t denseCount, const std::string& needle) {
  std::vector<float> dense(denseCount, 1.25f);
  try {
    decodeAdd(payload.data(), payload.size(), dense.data(), dense.size());
    ADD_FAILURE() << "accepted a payload that should fail with '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (float v : dense) ASSERT_EQ(v, 1.25f) << "dense was modified";
}

}  // namespace

TEST(SparseFormat, RoundTripsFloat32Values) {
  const SparseTensor s = sample(10007, 101, 5);
  const std::vector<uint8_t> payload = encode(s);
  ASSERT_EQ(payload.size(), encodedBytes(s.denseCount, s.nnz()));
  ASSERT_EQ(payload.size(), 32 + 101 * (4 + 4u));
  const SparseHeader h = decodeHeader(payload.data(), payload.size());
  EXPECT_EQ(h.version, kSparseVersion);
  EXPECT_EQ(h.indexWidth, 4);
  EXPECT_EQ(h.denseCount, 10007u);
  EXPECT_EQ(h.nnz, 101u);

  std::vector<float> dense(s.denseCount, 1.0f);
  decodeAdd(payload.data(), payload.size(), dense.data(), dense.size());
  const SparseTensor back = decode(payload.data(), payload.size());
  EXPECT_EQ(back.indices32, s.indices32);
  EXPECT_EQ(back.values, s.values);
  for (size_t i = 0; i < s.nnz(); ++i) EXPECT_EQ(dense[s.indices32[i]], 1.0f + s.values[i]);
  // The encoding is canonical: re-encoding the decoded tensor gives the same bytes.
  EXPECT_EQ(encode(back), payload);
}

TEST(SparseFormat, RoundTripsEmptyAndFullTensors) {
  SparseTensor empty;
  empty.denseCount = 5;
  const auto payload = encode(empty);
  EXPECT_EQ(payload.size(), kSparseHeaderBytes);
  std::vector<float> dense(5, 2.0f);
  decodeAdd(payload.data(), payload.size(), dense.data(), dense.size());
  EXPECT_EQ(dense, std::vector<float>(5, 2.0f));
  SparseTensor none;  // zero elements at all
  const auto nothing = encode(none);
  decodeAdd(nothing.data(), nothing.size(), nullptr, 0);

  SparseTensor full;
  full.denseCount = 4;
  full.indices32 = {0, 1, 2, 3};
  full.values = {1, 2, 3, 4};
  const auto all = encode(full);
  decodeAdd(all.data(), all.size(), dense.data(), 4);
  EXPECT_EQ(dense, std::vector<float>({3, 4, 5, 6, 2}));
}

TEST(SparseFormat, UsesWideIndicesFromTwoToTheThirtyTwoElements) {
  SparseTensor s;
  s.denseCount = (size_t{1} << 32) + 5;
  s.indices64 = {0, 7, (uint64_t{1} << 32) + 4};
  s.values = {1.0f, -2.0f, 3.5f};
  const auto payload = encode(s);
  EXPECT_EQ(payload.size(), 32 + 3 * 12u);
  EXPECT_EQ(decodeHeader(payload.data(), payload.size()).indexWidth, 8);
  const SparseTensor back = decode(payload.data(), payload.size());
  EXPECT_EQ(back.indices64, s.indices64);
  EXPECT_EQ(back.values, s.values);
  EXPECT_TRUE(back.indices32.empty());
}

TEST(SparseFormat, LayoutIsLittleEndianAsDocumented) {
  SparseTensor s;
  s.denseCount = 0x0102;
  s.indices32 = {0x0101};
  s.values = {1.0f};
  const auto p = encode(s);
  const std::vector<uint8_t> head = {'G', 'C', 'S', 'P', 1, 0, 1, 4, 0x02, 0x01, 0, 0, 0, 0, 0, 0,
                                     1,   0,   0,   0,   0, 0, 0, 0, 0,    0,    0, 0, 0, 0, 0, 0,
                                     0x01, 0x01, 0, 0, 0, 0, 0x80, 0x3F};
  EXPECT_EQ(p, head);
}

TEST(SparseFormat, RejectsEveryKindOfCorruptionCleanly) {
  const SparseTensor s = sample(1000, 10, 9);
  const std::vector<uint8_t> good = encode(s);
  const size_t n = s.denseCount;

  auto bad = good;
  bad[0] = 'X';
  expectRejected(bad, n, "magic");
  bad = good;
  bad[4] = 2;
  expectRejected(bad, n, "version");
  for (uint8_t type : {0, 2, 3, 255}) {  // 2 and 3: half-precision values, which no version writes
    bad = good;
    bad[6] = type;
    expectRejected(bad, n, "value type");
  }
  bad = good;
  bad[7] = 8;
  expectRejected(bad, n, "index width");
  bad = good;
  bad[7] = 3;
  expectRejected(bad, n, "index width");
  bad = good;
  bad[30] = 1;
  expectRejected(bad, n, "reserved");

  for (size_t len = 0; len < kSparseHeaderBytes; ++len) {
    expectRejected(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)), n, "truncated");
  }
  expectRejected(std::vector<uint8_t>(good.begin(), good.end() - 1), n, "truncated");
  auto longer = good;
  longer.push_back(0);
  expectRejected(longer, n, "trailing");

  // An index past the end, and indices that repeat or go backwards.
  bad = good;
  const uint32_t outOfRange = 1000;
  std::memcpy(bad.data() + 32 + 4 * 9, &outOfRange, 4);
  expectRejected(bad, n, "out of range");
  bad = good;
  std::memcpy(bad.data() + 32 + 4 * 3, bad.data() + 32 + 4 * 2, 4);
  expectRejected(bad, n, "strictly increasing");
  bad = good;
  const uint32_t zero = 0;
  std::memcpy(bad.data() + 32 + 4 * 5, &zero, 4);
  expectRejected(bad, n, "strictly increasing");

  // More pairs than elements.
  bad = good;
  putU64(bad, 16, 1001);
  expectRejected(bad, n, "cannot exceed");
  // A payload for another bucket size.
  expectRejected(good, n + 1, "is for 1000 elements");
}

TEST(SparseFormat, RejectsSizesThatOverflowInsteadOfWrapping) {
  // 2^62 pairs of 12 bytes is 3 * 2^64: wrapped, 32 + nnz*12 would be 32,
  // exactly the size of this header-only payload.
  std::vector<uint8_t> p = encode(SparseTensor{});
  putU64(p, 8, uint64_t{1} << 63);  // element count (so 8-byte indices)
  p[7] = 8;
  putU64(p, 16, uint64_t{1} << 62);  // nnz
  expectRejected(p, 0, "more than any buffer");
  // The largest counts.
  putU64(p, 8, ~uint64_t{0});
  putU64(p, 16, ~uint64_t{0});
  expectRejected(p, 0, "more than any buffer");
  // Big but not overflowing: a plain size mismatch.
  putU64(p, 16, uint64_t{1} << 40);
  expectRejected(p, 0, "truncated");
  EXPECT_THROW(encodedBytes(~size_t{0}, ~size_t{0} / 2), InvalidArgument);
}

TEST(SparseFormat, RejectsNullPointersAndBadDestinations) {
  const auto good = encode(sample(100, 5, 1));
  EXPECT_THROW(decodeAdd(nullptr, good.size(), nullptr, 100), InvalidArgument);
  EXPECT_THROW(decodeAdd(good.data(), good.size(), nullptr, 100), InvalidArgument);
  EXPECT_THROW(decodeHeader(nullptr, 0), InvalidArgument);
}

// Any single corrupted byte is either rejected cleanly (dense untouched) or,
// for value bytes, decoded; it never crashes or writes out of bounds.
TEST(SparseFormat, EverySingleByteCorruptionIsHandled) {
  const uint64_t seed = gradcomm::testing::compressionSeed("SparseFormat.EverySingleByteCorruptionIsHandled");
  {
    const SparseTensor s = sample(300, 20, seed);
    const std::vector<uint8_t> good = encode(s);
    const size_t valuesStart = 32 + 4 * s.nnz();
    for (size_t pos = 0; pos < good.size(); ++pos) {
      for (int trial = 0; trial < 8; ++trial) {
        auto bad = good;
        bad[pos] = static_cast<uint8_t>(bad[pos] ^ (1u << trial));
        std::vector<float> dense(300, 0.5f);
        try {
          decodeAdd(bad.data(), bad.size(), dense.data(), dense.size());
          // Accepted: a value byte, or an index byte that stays valid (the
          // format has no checksum; transports detect corruption).
          EXPECT_GE(pos, 32u) << "header byte " << pos << " corrupted yet accepted";
          if (pos >= valuesStart) {
            const SparseTensor back = decode(bad.data(), bad.size());
            EXPECT_EQ(back.indices32, s.indices32);
          }
        } catch (const InvalidArgument&) {
          for (float v : dense) ASSERT_EQ(v, 0.5f) << "rejected payload modified dense (byte " << pos << ")";
        }
      }
    }
  }
}

TEST(SparseFormat, EncodeRejectsInconsistentTensors) {
  SparseTensor s;
  s.denseCount = 10;
  s.indices32 = {1, 5, 5};
  s.values = {1, 2, 3};
  EXPECT_THROW(encode(s), InvalidArgument);  // repeated index
  s.indices32 = {1, 5, 10};
  EXPECT_THROW(encode(s), InvalidArgument);  // out of range
  s.indices32 = {1, 5};
  EXPECT_THROW(encode(s), InvalidArgument);  // counts disagree
  s.indices32 = {1, 5, 7};
  std::vector<uint8_t> small(20);
  EXPECT_THROW(encode(s, small.data(), small.size()), InvalidArgument);
  s.indices64 = {1, 5, 7};  // wrong width for 10 elements
  s.indices32.clear();
  EXPECT_THROW(encode(s), InvalidArgument);
}
