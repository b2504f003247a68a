#pragma once
#include <optional>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace gradcomm::algorithms {

/// Size thresholds of the default rule (the cost model will replace it).
struct DefaultRule {
  size_t smallMessageBytes = 16 * 1024;
  size_t treeMaxBytes = 0;
};

/// Chooses the algorithm of each call: a forced per-call name first, then
/// the first matching GRADCOMM_ALGO rule, then the default size rule. An
/// unusable forced choice falls back to the default, with a warning.
class Selector {
 public:
  /// Parses the GRADCOMM_ALGO syntax ("auto", "NAME", or comma-separated
  /// "[COLL:][LO-HI:]NAME" rules); throws ConfigError naming the bad entry
  /// and listing valid names.
  Selector(const std::string& spec, DefaultRule rule);

  struct Choice {
    const Algorithm* algorithm;
    std::string note;  ///< non-empty when a forced choice fell back
    std::string why;   ///< what decided: the per-call option, a GRADCOMM_ALGO rule or the default rule
  };
  Choice select(const CollectiveCall& call, const transport::Transport& t, const std::string& forced) const;

  /// The bytes a rule's range is compared with: the whole buffer, as
  /// nccl-tests' "size" column (allgather: size * count elements).
  static size_t callBytes(const CollectiveCall& call, int size);

 private:
  struct Rule {
    std::optional<Collective> collective;
    size_t lo = 0;
    size_t hi = SIZE_MAX;
    std::string name;
  };
  const Algorithm& byDefault(const CollectiveCall& call, const transport::Transport& t,
                             std::string* why = nullptr) const;
  std::vector<Rule> rules_;
  DefaultRule default_;
};

}  // namespace gradcomm::algorithms
