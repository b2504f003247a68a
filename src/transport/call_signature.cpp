#include "transport/call_signature.hpp"

#include <algorithm>
#include <cstring>

#include "base/hash.hpp"

namespace gradcomm::transport {
namespace {

void copyText(char (&dst)[16], const std::string& src) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, src.data(), std::min(src.size(), sizeof dst - 1));
}

std::string text(const char (&field)[16]) { return std::string(field, strnlen(field, sizeof field)); }

bool isRooted(Collective c) { return c == Collective::kBroadcast || c == Collective::kReduce; }

// Enum values from a peer are data: name them only when they are valid.
std::string collectiveName(uint8_t v) {
  return v < kNumCollectives ? toString(static_cast<Collective>(v)) : "collective " + std::to_string(v);
}
std::string typeName(uint8_t v) {
  return v < kNumDataTypes ? toString(static_cast<DataType>(v)) : "data type " + std::to_string(v);
}
std::string opName(uint8_t v) {
  return v <= static_cast<uint8_t>(ReduceOp::kAvg) ? toString(static_cast<ReduceOp>(v)) : "op " + std::to_string(v);
}

}  // namespace

CallSignature CallSignature::make(uint64_t seq, Collective collective, DataType type, ReduceOp op, size_t count,
                                  int root, const std::string& algorithm, const std::string& compression,
                                  uint32_t custom) {
  CallSignature s;
  s.seq = seq;
  s.count = count;
  s.root = isRooted(collective) ? root : 0;
  s.collective = static_cast<uint8_t>(collective);
  s.type = static_cast<uint8_t>(type);
  s.op = static_cast<uint8_t>(isReduction(collective) ? op : ReduceOp::kSum);
  s.custom = custom;
  uint32_t h = core::fnv1a32(core::kFnv32Basis, algorithm.data(), algorithm.size());
  h = core::fnv1a32(h, "/", 1);
  s.namesHash = core::fnv1a32(h, compression.data(), compression.size());
  copyText(s.algorithm, algorithm);
  copyText(s.compression, compression);
  return s;
}

uint32_t CallSignature::fingerprint() const {
  return core::fnv1a32(core::kFnv32Basis, reinterpret_cast<const char*>(this) + sizeof seq,
                       sizeof(CallSignature) - sizeof seq);
}

bool CallSignature::sameCall(const CallSignature& o) const {
  return std::memcmp(reinterpret_cast<const char*>(this) + sizeof seq, reinterpret_cast<const char*>(&o) + sizeof seq,
                     sizeof(CallSignature) - sizeof seq) == 0;
}

std::string describeDifference(const CallSignature& mine, int myRank, const CallSignature& theirs, int theirRank) {
  const std::string me = "this rank " + std::to_string(myRank), them = "rank " + std::to_string(theirRank);
  std::string out;
  auto add = [&](const std::string& field, const std::string& verb, const std::string& a, const std::string& b) {
    if (!out.empty()) out += "; ";
    out += field + " differs: " + me + " " + verb + " " + a + ", " + them + " " + verb + " " + b;
  };
  if (mine.collective != theirs.collective) {
    add("collective", "called", collectiveName(mine.collective), collectiveName(theirs.collective));
  }
  if (mine.type != theirs.type) add("data type", "passed", typeName(mine.type), typeName(theirs.type));
  if (mine.op != theirs.op) add("op", "passed", opName(mine.op), opName(theirs.op));
  if (mine.count != theirs.count) {
    add("count", "passed", "count " + std::to_string(mine.count), "count " + std::to_string(theirs.count));
  }
  if (mine.root != theirs.root) {
    add("root", "passed", "root " + std::to_string(mine.root), "root " + std::to_string(theirs.root));
  }
  if (mine.memory != theirs.memory) {
    auto where = [](uint8_t m) { return std::string(m ? "device (CUDA) buffers" : "host buffers"); };
    add("memory", "passed", where(mine.memory), where(theirs.memory));
  }
  const std::string algoA = text(mine.algorithm), algoB = text(theirs.algorithm);
  const std::string compA = text(mine.compression), compB = text(theirs.compression);
  if (algoA != algoB) add("algorithm", "runs", algoA, algoB);
  if (compA != compB) add("compression", "uses", compA.empty() ? "none" : compA, compB.empty() ? "none" : compB);
  if (mine.custom != theirs.custom) {
    add("operation", "runs", "signature " + std::to_string(mine.custom), "signature " + std::to_string(theirs.custom));
  }
  if (out.empty() && mine.namesHash != theirs.namesHash) {
    add("algorithm or compression", "uses", algoA + "/" + compA + "...", algoB + "/" + compB + "...");
  }
  if (out.empty() && mine.seq != theirs.seq) {
    add("call number", "is at", "#" + std::to_string(mine.seq), "#" + std::to_string(theirs.seq));
  }
  return out;
}

std::string mismatchMessage(int myRank, const std::string& what, const CallSignature& mine, int theirRank,
                            const CallSignature* theirs) {
  std::string out = "rank " + std::to_string(myRank) + ": " + what + " does not match rank " +
                    std::to_string(theirRank) + "'s call #" + std::to_string(mine.seq);
  const std::string diff = theirs ? describeDifference(mine, myRank, *theirs, theirRank) : std::string();
  if (!diff.empty()) {
    out += ": " + diff + ". Every rank must issue the same collectives in the same order";
  } else {
    out += " (a different collective, data type, op, count, root, algorithm or compression): every rank must issue "
           "the same collectives in the same order";
  }
  return out;
}

}  // namespace gradcomm::transport
