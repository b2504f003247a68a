#pragma once
// One collective call checked against the reference on one rank. Every rank
// derives all ranks' inputs from the same seed, so each can compute the
// expected result alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/catalog.hpp"
#include "core/communicator_impl.hpp"
#include "gradcomm/communicator.hpp"
#include "support/reference.hpp"

namespace gradcomm::testing {

struct CollectiveCase {
  Collective collective = Collective::kAllreduce;
  std::string algorithm;  // "" = selector
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  bool inPlace = false;
  uint64_t seed = 1;
  /// Lossless-on-these-inputs compression only: "fp16", "bf16" (small
  /// integer inputs sum exactly) or "topk:K:exact:ef=0" (each rank sends its
  /// exact top K; the reference keeps the same elements).
  std::string compression;
  /// Where the buffers live: host vectors when empty, else memory from this
  /// (device memory of a test runtime, which the test keeps alive).
  std::function<void*(size_t)> allocate;
  /// CollectiveOptions::stream.
  void* stream = nullptr;

  std::string describe() const {
    std::ostringstream s;
    s << toString(collective) << "/" << (algorithm.empty() ? "default" : algorithm) << " " << toString(type) << " "
      << toString(op) << " count=" << count << " root=" << root << (inPlace ? " in-place" : " out-of-place")
      << (compression.empty() ? "" : " compression=" + compression) << " seed=" << seed;
    return s.str();
  }
};

/// Keeps the k largest magnitudes of float32 `v` (ties: lower index), zeroes the rest.
inline void keepTopK(std::vector<unsigned char>& v, size_t count, size_t k) {
  auto* f = reinterpret_cast<float*>(v.data());
  std::vector<size_t> idx(count);
  for (size_t i = 0; i < count; ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return std::fabs(f[a]) > std::fabs(f[b]); });
  std::vector<bool> keep(count, false);
  for (size_t i = 0; i < k && i < count; ++i) keep[idx[i]] = true;
  for (size_t i = 0; i < count; ++i) {
    if (!keep[i]) f[i] = 0.0f;
  }
}

/// Runs `c` on this rank and returns an empty string or what went wrong.
inline std::string runAndCheck(Communicator& comm, const CollectiveCase& c) {
  const int p = comm.size(), r = comm.rank();
  const size_t e = dataTypeSize(c.type);
  const bool perRankIn = c.collective == Collective::kReduceScatter;
  const bool perRankOut = c.collective == Collective::kAllgather;
  const size_t inCount = perRankIn ? c.count * static_cast<size_t>(p) : c.count;
  const size_t outCount = perRankOut ? c.count * static_cast<size_t>(p) : c.count;
  const ReduceOp genOp = c.collective == Collective::kAllreduce || c.collective == Collective::kReduce ||
                                 c.collective == Collective::kReduceScatter
                             ? c.op
                             : ReduceOp::kSum;
  std::vector<std::vector<unsigned char>> inputs;
  for (int k = 0; k < p; ++k) inputs.push_back(makeInput(c.type, genOp, inCount, c.seed, k));
  const auto& mine = inputs[static_cast<size_t>(r)];

  // Buffers with a guard zone to catch writes past the end.
  const size_t guard = 64;
  const size_t outSize = std::max(outCount, inCount) * e + guard, inSize = mine.size() + guard;
  std::vector<unsigned char> outStore, inStore;
  unsigned char* outBuf;
  unsigned char* inBuf;
  if (c.allocate) {
    outBuf = static_cast<unsigned char*>(c.allocate(outSize));
    inBuf = static_cast<unsigned char*>(c.allocate(inSize));
  } else {
    outStore.resize(outSize);
    inStore.resize(inSize);
    outBuf = outStore.data();
    inBuf = inStore.data();
  }
  std::memset(outBuf, 0xCD, outSize);
  std::memset(inBuf, 0xEE, inSize);
  std::memcpy(inBuf, mine.data(), mine.size());
  void* out = outBuf;
  const void* in = inBuf;
  if (c.inPlace) {
    switch (c.collective) {
      case Collective::kAllgather:
        std::memcpy(outBuf + static_cast<size_t>(r) * c.count * e, mine.data(), mine.size());
        in = outBuf + static_cast<size_t>(r) * c.count * e;
        break;
      case Collective::kReduceScatter:
        std::memcpy(outBuf, mine.data(), mine.size());
        in = outBuf;
        out = outBuf + static_cast<size_t>(r) * c.count * e;
        break;
      default:
        std::memcpy(outBuf, mine.data(), mine.size());
        in = out;
        break;
    }
  }
  CollectiveOptions opts;
  opts.algorithm = c.algorithm;
  opts.compression = c.compression;
  opts.stream = c.stream;
  Work w;
  switch (c.collective) {
    case Collective::kAllreduce: w = comm.allreduce(in, out, c.count, c.type, c.op, opts); break;
    case Collective::kBroadcast: w = comm.broadcast(in, out, c.count, c.type, c.root, opts); break;
    case Collective::kReduce: w = comm.reduce(in, out, c.count, c.type, c.op, c.root, opts); break;
    case Collective::kAllgather: w = comm.allgather(in, out, c.count, c.type, opts); break;
    case Collective::kReduceScatter: w = comm.reduceScatter(in, out, c.count, c.type, c.op, opts); break;
    case Collective::kBarrier: w = comm.barrier(opts); break;
  }
  w.wait();
  if (!c.algorithm.empty() && c.compression.empty() && w.algorithm() != c.algorithm) {
    return c.describe() + ": ran algorithm " + w.algorithm() + " instead";
  }
  if (!c.inPlace && std::memcmp(inBuf, mine.data(), mine.size()) != 0) {
    return c.describe() + ": the input buffer was modified";
  }
  std::vector<unsigned char> want;
  const unsigned char* got = static_cast<const unsigned char*>(out);
  size_t checkCount = outCount;
  if (c.compression.rfind("topk:", 0) == 0) {
    const size_t k = std::strtoull(c.compression.c_str() + 5, nullptr, 10);
    for (auto& in : inputs) keepTopK(in, c.count, k);
  }
  switch (c.collective) {
    case Collective::kAllreduce: want = reduceReference(c.type, c.op, inputs, c.count); break;
    case Collective::kBroadcast: want = inputs[static_cast<size_t>(c.root)]; break;
    case Collective::kReduce:
      if (r != c.root) {
        if (c.inPlace) return {};
        for (size_t i = 0; i < c.count * e; ++i) {
          if (outBuf[i] != 0xCD) return c.describe() + ": a non-root output was written";
        }
        return {};
      }
      want = reduceReference(c.type, c.op, inputs, c.count);
      break;
    case Collective::kAllgather:
      for (int k = 0; k < p; ++k) want.insert(want.end(), inputs[static_cast<size_t>(k)].begin(), inputs[static_cast<size_t>(k)].end());
      break;
    case Collective::kReduceScatter: {
      std::vector<std::vector<unsigned char>> blocks;
      for (int k = 0; k < p; ++k) {
        const auto& src = inputs[static_cast<size_t>(k)];
        blocks.emplace_back(src.begin() + static_cast<long>(static_cast<size_t>(r) * c.count * e),
                            src.begin() + static_cast<long>(static_cast<size_t>(r + 1) * c.count * e));
      }
      want = reduceReference(c.type, c.op, blocks, c.count);
      checkCount = c.count;
      break;
    }
    case Collective::kBarrier: return {};
  }
  long long bad = firstDifference(c.type, got, want.data(), checkCount);
  if (bad >= 0) {
    std::ostringstream s;
    s << c.describe() << ": rank " << r << " element " << bad << " is " << loadElem(c.type, got, static_cast<size_t>(bad))
      << ", expected " << loadElem(c.type, want.data(), static_cast<size_t>(bad));
    return s.str();
  }
  const unsigned char* end = got + checkCount * e;
  const unsigned char* bufEnd = outBuf + outSize;
  const size_t tail = static_cast<size_t>(bufEnd - end) < guard ? static_cast<size_t>(bufEnd - end) : guard;
  if (!(c.inPlace && c.collective == Collective::kReduceScatter)) {
    for (size_t i = 0; i < tail && !c.inPlace; ++i) {
      if (end[i] != 0xCD) return c.describe() + ": wrote past the end of the output";
    }
  }
  return {};
}

/// Every collective (barrier aside), data type and op, at each of `counts`,
/// in and out of place, with the default algorithm, on buffers from
/// `allocate` (device memory of a test or real runtime); root the last rank.
/// Returns the first failure ("" when all match) and counts the cases.
inline std::string checkEveryCollectiveOn(Communicator& comm, const std::function<void*(size_t)>& allocate,
                                          const std::vector<size_t>& counts, int* cases, void* stream = nullptr) {
  for (Collective coll : {Collective::kAllreduce, Collective::kBroadcast, Collective::kReduce, Collective::kAllgather,
                          Collective::kReduceScatter}) {
    for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                          DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
        if (op == ReduceOp::kAvg && !isFloatingPoint(type)) continue;
        const bool reduces = coll != Collective::kBroadcast && coll != Collective::kAllgather;
        if (!reduces && op != ReduceOp::kSum) continue;
        for (size_t count : counts) {
          for (bool inPlace : {false, true}) {
            CollectiveCase c;
            c.collective = coll;
            c.type = type;
            c.op = op;
            c.count = count;
            c.root = comm.size() - 1;
            c.inPlace = inPlace;
            c.seed = 11 + static_cast<uint64_t>(*cases);
            c.allocate = allocate;
            c.stream = stream;
            ++*cases;
            std::string err = runAndCheck(comm, c);
            if (!err.empty()) return err;
          }
        }
      }
    }
  }
  return {};
}

/// Every algorithm the communicator's layout can run, of every collective,
/// for every type (fewer beyond 4 ranks, to keep oversubscribed runs short),
/// op and edge-case count, in and out of place, against the reference.
/// Returns the first failure ("" when all match) and counts the cases.
inline std::string checkEveryAlgorithm(Communicator& comm, int* cases) {
  const int p = comm.size();
  const std::vector<DataType> types =
      p <= 4 ? allTypes() : std::vector<DataType>{DataType::kFloat32, DataType::kBFloat16, DataType::kInt64};
  uint64_t seed = 100;
  *cases = 0;
  for (const auto* algo : algorithms::allAlgorithms()) {
    const Collective coll = algo->collective();
    // Algorithms this layout cannot run (shm on one rank or across hosts)
    // fall back by design; they are checked where they can run.
    algorithms::CollectiveCall probe;
    probe.collective = coll;
    if (!algo->canRun(probe, {comm.impl()->transport(), comm.impl()->topology()})) continue;
    const bool reduces =
        coll == Collective::kAllreduce || coll == Collective::kReduce || coll == Collective::kReduceScatter;
    for (DataType t : types) {
      for (ReduceOp op : reduces ? allOps() : std::vector<ReduceOp>{ReduceOp::kSum}) {
        if (!supported(t, op)) continue;
        for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(p + 1), size_t{37}, size_t{3001}}) {
          for (bool inPlace : {false, true}) {
            CollectiveCase c{coll, algo->name(), t, op, count, p - 1, inPlace, seed++};
            std::string err = runAndCheck(comm, c);
            if (!err.empty()) return err;
            ++*cases;
          }
        }
      }
    }
  }
  return {};
}

}  // namespace gradcomm::testing
