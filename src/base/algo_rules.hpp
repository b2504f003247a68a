#pragma once
// GRADCOMM_ALGO's grammar and the algorithm names it may use. They live in
// the ground floor so the parameter registry can reject a bad rule when it
// resolves the configuration, without including the algorithms above it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradcomm/types.hpp"

namespace gradcomm::core {

/// The names of `collective`'s algorithms, in the order of the algorithm
/// registry (src/algorithms/registry.cpp; a unit test keeps the two equal).
const std::vector<std::string>& algorithmNamesOf(Collective collective);
/// "ring, rd, hd, ..." for one collective.
std::string algorithmNameList(Collective collective);
/// True when `name` is an algorithm of `collective`.
bool isAlgorithmName(Collective collective, const std::string& name);

/// One GRADCOMM_ALGO entry "[COLL:][LO-HI:]NAME": calls of `collective`
/// (any when unset) with lo <= bytes < hi use the algorithm `name`.
struct AlgoRule {
  std::optional<Collective> collective;
  size_t lo = 0;
  size_t hi = SIZE_MAX;
  std::string name;
};

/// Parses the GRADCOMM_ALGO syntax ("auto", "NAME", or comma-separated
/// "[COLL:][LO-HI:]NAME" rules; empty for "auto"); throws ConfigError
/// naming the bad entry and listing the valid names.
std::vector<AlgoRule> parseAlgoRules(const std::string& spec);

}  // namespace gradcomm::core
