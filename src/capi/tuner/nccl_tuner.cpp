// libgradcomm-nccl-tuner.so: a tuner plugin the real NCCL loads through
// NCCL_TUNER_PLUGIN. It applies gradcomm-style per-size rules to NCCL's cost
// table: GRADCOMM_NCCL_ALGO="[COLL:][LO-HI:]ALGO[/PROTO],..." (first match
// wins; sizes are bytes with K/M/G, HI exclusive), and the same rules one per
// line in the file GRADCOMM_NCCL_TUNER_FILE (after the variable's). A match
// makes its algorithm (and protocol, or every protocol NCCL allows) the
// cheapest; without a match NCCL's own costs stand. gradcomm's cost model
// does not price NCCL's algorithms, so nothing else is changed.
//
// Self-contained (no gradcomm objects): NCCL dlopens it, and gradcomm's
// thread-locals use the initial-exec TLS model, which a dlopened library
// cannot always get.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "capi/tuner/tuner_abi.h"

namespace {

struct Rule {
  int coll = -1;  ///< -1: every collective
  size_t lo = 0, hi = SIZE_MAX;
  int algo = 0;
  int proto = -1;  ///< -1: every protocol
};

struct Context {
  std::vector<Rule> rules;
  size_t nRanks = 0, nNodes = 0;
};

int indexOf(const std::string& s, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == s) return static_cast<int>(i);
  }
  return -1;
}

bool parseSize(const std::string& s, size_t* out) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string unit(end);
  if (unit == "K" || unit == "k") v <<= 10;
  else if (unit == "M" || unit == "m") v <<= 20;
  else if (unit == "G" || unit == "g") v <<= 30;
  else if (!unit.empty()) return false;
  *out = v;
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// One rule; false (with `why`) when it does not parse.
bool parseRule(std::string text, Rule* r, std::string* why) {
  static const std::vector<std::string> colls = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
  static const std::vector<std::string> algos = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
  static const std::vector<std::string> protos = {"ll", "ll128", "simple"};
  text = lower(text);
  std::vector<std::string> parts;
  for (size_t p = 0;;) {
    size_t q = text.find(':', p);
    parts.push_back(text.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  size_t i = 0;
  if (parts.size() > 1 && indexOf(parts[0], colls) >= 0) r->coll = indexOf(parts[i++], colls);
  if (parts.size() - i == 2) {
    const std::string& range = parts[i++];
    const size_t dash = range.find('-');
    if (dash == std::string::npos || !parseSize(range.substr(0, dash), &r->lo) ||
        !parseSize(range.substr(dash + 1), &r->hi)) {
      *why = "bad size range '" + range + "' (want LO-HI, e.g. 0-64K)";
      return false;
    }
  }
  if (parts.size() - i != 1) {
    *why = "want [COLL:][LO-HI:]ALGO[/PROTO]";
    return false;
  }
  std::string algo = parts[i], proto;
  const size_t slash = algo.find('/');
  if (slash != std::string::npos) {
    proto = algo.substr(slash + 1);
    algo = algo.substr(0, slash);
    r->proto = indexOf(proto, protos);
    if (r->proto < 0) {
      *why = "unknown protocol '" + proto + "' (ll, ll128, simple)";
      return false;
    }
  }
  r->algo = indexOf(algo, algos);
  if (r->algo < 0) {
    *why = "unknown algorithm '" + algo + "' (tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat)";
    return false;
  }
  return true;
}

bool addRules(const std::string& list, const std::string& from, Context* ctx, gcDebugLogger_t log) {
  for (size_t p = 0; p <= list.size();) {
    size_t q = list.find(',', p);
    if (q == std::string::npos) q = list.size();
    std::string item = list.substr(p, q - p);
    p = q + 1;
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
    if (item.empty() || item[0] == '#') continue;
    Rule r;
    std::string why;
    if (!parseRule(item, &r, &why)) {
      // NCCL_LOG_WARN is 2 in NCCL's ncclDebugLogLevel.
      if (log) log(2, ~0ul, __FILE__, __LINE__, "gradcomm tuner: %s: rule '%s': %s", from.c_str(), item.c_str(), why.c_str());
      return false;
    }
    ctx->rules.push_back(r);
  }
  return true;
}

ncclResult_t tunerInit(void** context, uint64_t, size_t nRanks, size_t nNodes, gcDebugLogger_t log,
                       gcNvlDomainInfo_v5_t*, gcTunerConstants_v5_t*) {
  if (!context) return ncclInvalidArgument;
  auto* ctx = new (std::nothrow) Context();
  if (!ctx) return ncclSystemError;
  ctx->nRanks = nRanks;
  ctx->nNodes = nNodes;
  bool ok = true;
  if (const char* env = std::getenv("GRADCOMM_NCCL_ALGO")) ok = addRules(env, "GRADCOMM_NCCL_ALGO", ctx, log);
  if (const char* path = std::getenv("GRADCOMM_NCCL_TUNER_FILE"); ok && path && *path) {
    std::ifstream in(path);
    if (!in) {
      if (log) log(2, ~0ul, __FILE__, __LINE__, "gradcomm tuner: cannot read tuning file %s", path);
      ok = false;
    }
    for (std::string line; ok && std::getline(in, line);) ok = addRules(line, path, ctx, log);
  }
  if (!ok) {
    delete ctx;
    return ncclInvalidArgument;  // NCCL then runs without this plugin
  }
  *context = ctx;
  return ncclSuccess;
}

ncclResult_t tunerGetCollInfo(void* context, int collType, size_t nBytes, int, float** collCostTable, int numAlgo,
                              int numProto, int, int*) {
  const auto* ctx = static_cast<const Context*>(context);
  if (!ctx || !collCostTable || numAlgo < 0 || numProto < 1) return ncclInvalidArgument;
  // NCCL passes its float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS] array
  // cast to float**: one contiguous block of numAlgo rows of numProto
  // costs, not an array of row pointers. Entry (a, p) is at a * numProto + p.
  float* table = reinterpret_cast<float*>(collCostTable);
  for (const Rule& r : ctx->rules) {
    if ((r.coll >= 0 && r.coll != collType) || nBytes < r.lo || nBytes >= r.hi || r.algo >= numAlgo) continue;
    bool applied = false;
    for (int p = 0; p < numProto; ++p) {
      float& cost = table[static_cast<size_t>(r.algo) * static_cast<size_t>(numProto) + static_cast<size_t>(p)];
      if ((r.proto >= 0 && p != r.proto) || cost == GC_ALGO_PROTO_IGNORE) continue;
      cost = 0.0f;  // the cheapest: NCCL picks the lowest cost
      applied = true;
    }
    if (applied) return ncclSuccess;  // else the rule's choice cannot run here: try the next rule
  }
  return ncclSuccess;
}

ncclResult_t tunerFinalize(void* context) {
  delete static_cast<Context*>(context);
  return ncclSuccess;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const gcTuner_v5_t ncclTunerPlugin_v5 = {
    "gradcomm", tunerInit, tunerGetCollInfo, tunerFinalize};
