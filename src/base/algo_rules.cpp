#include "base/algo_rules.hpp"

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::core {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(std::string(trim(cur)));
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(std::string(trim(cur)));
  return parts;
}

std::string allNames() {
  std::string out;
  for (int c = 0; c < kNumCollectives; ++c) {
    out += std::string(c ? "; " : "") + toString(static_cast<Collective>(c)) + ": " +
           algorithmNameList(static_cast<Collective>(c));
  }
  return out;
}

}  // namespace

const std::vector<std::string>& algorithmNamesOf(Collective collective) {
  // Indexed by Collective; registry order within each. "native" is MPI's
  // own collective: a build without MPI cannot run it, so it is no name
  // GRADCOMM_ALGO accepts there.
#if GRADCOMM_HAVE_MPI
#define GRADCOMM_NATIVE , "native"
#else
#define GRADCOMM_NATIVE
#endif
  static const std::vector<std::string> kNames[kNumCollectives] = {
      {"ring", "rd", "hd", "tree", "shm", "hier" GRADCOMM_NATIVE},  // allreduce
      {"tree", "hier" GRADCOMM_NATIVE},                            // broadcast
      {"tree" GRADCOMM_NATIVE},                                    // reduce
      {"ring", "hier" GRADCOMM_NATIVE},                            // allgather
      {"ring" GRADCOMM_NATIVE},                                    // reduce-scatter
      {"dissemination" GRADCOMM_NATIVE},                           // barrier
  };
#undef GRADCOMM_NATIVE
  const int c = static_cast<int>(collective);
  if (c < 0 || c >= kNumCollectives) throw InvalidArgument("algorithmNamesOf: not a collective");
  return kNames[c];
}

std::string algorithmNameList(Collective collective) {
  std::string out;
  for (const auto& name : algorithmNamesOf(collective)) out += (out.empty() ? "" : ", ") + name;
  return out;
}

bool isAlgorithmName(Collective collective, const std::string& name) {
  for (const auto& n : algorithmNamesOf(collective)) {
    if (n == name) return true;
  }
  return false;
}

std::vector<AlgoRule> parseAlgoRules(const std::string& spec) {
  std::vector<AlgoRule> rules;
  std::string s = toLower(trim(spec));
  if (s.empty() || s == "auto" || s == "default") return rules;
  for (const std::string& entry : split(s, ',')) {
    if (entry.empty()) continue;
    auto parts = split(entry, ':');
    AlgoRule r;
    r.name = parts.back();
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const std::string& part = parts[i];
      auto dash = part.find('-');
      if (dash != std::string::npos && part.find_first_of("0123456789") != std::string::npos) {
        std::string lo = part.substr(0, dash), hi = part.substr(dash + 1);
        r.lo = lo.empty() ? 0 : parseBytes(lo, "GRADCOMM_ALGO range start");
        r.hi = (hi.empty() || hi == "inf") ? SIZE_MAX : parseBytes(hi, "GRADCOMM_ALGO range end");
        if (r.hi <= r.lo) {
          throw ConfigError("GRADCOMM_ALGO entry '" + entry + "': empty size range (the end is exclusive)");
        }
      } else {
        try {
          r.collective = parseCollective(part);
        } catch (const InvalidArgument&) {
          throw ConfigError("GRADCOMM_ALGO entry '" + entry + "': '" + part +
                            "' is neither a collective nor a size range LO-HI; expected [COLL:][LO-HI:]NAME");
        }
      }
    }
    bool known = false;
    for (int c = 0; c < kNumCollectives; ++c) {
      auto coll = static_cast<Collective>(c);
      if (r.collective && *r.collective != coll) continue;
      known = known || isAlgorithmName(coll, r.name);
    }
    if (!known) {
#if !GRADCOMM_HAVE_MPI
      if (r.name == "native") {
        throw ConfigError("GRADCOMM_ALGO entry '" + entry + "': 'native' runs MPI's own collectives, and this "
                          "gradcomm was built without MPI (install an MPI, e.g. apt-get install libopenmpi-dev, "
                          "and rebuild)");
      }
#endif
      if (r.collective) {
        throw ConfigError("GRADCOMM_ALGO entry '" + entry + "': '" + r.name + "' is not a " +
                          toString(*r.collective) + " algorithm; valid: " + algorithmNameList(*r.collective));
      }
      throw ConfigError("GRADCOMM_ALGO entry '" + entry + "': unknown algorithm '" + r.name + "'; valid: " +
                        allNames());
    }
    rules.push_back(r);
  }
  return rules;
}

}  // namespace gradcomm::core
