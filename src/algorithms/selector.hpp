#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/algo_rules.hpp"
#include "topology/cost_model.hpp"
#include "topology/tuning_file.hpp"

namespace gradcomm::algorithms {

/// Size thresholds of the size rule (GRADCOMM_SELECT=rule; also what a
/// Selector without a cost model uses).
struct DefaultRule {
  size_t smallMessageBytes = 16 * 1024;
  size_t treeMaxBytes = 0;
};

/// Chooses the algorithm of each call: a forced per-call name first, then
/// the first matching GRADCOMM_ALGO rule, then the tuning file's entry
/// (measured), then the lowest time the cost model predicts among the
/// registered algorithms that can run the call (or, without a model, the
/// size rule). An unusable forced choice falls back to the default, with a
/// warning. Every input is identical on every rank, so every rank chooses alike.
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
  Choice select(const CollectiveCall& call, const Team& t, const std::string& forced) const;

  /// Decide unforced calls by `tuning` (may be null) and then `model`.
  /// Throws ConfigError naming the file and line of a tuning entry whose
  /// algorithm does not exist for its collective.
  void useModel(std::shared_ptr<const topology::CostModel> model,
                std::shared_ptr<const topology::TuningTable> tuning = nullptr);
  const topology::CostModel* model() const { return model_.get(); }

  /// One algorithm's predicted time for a call.
  struct Prediction {
    const Algorithm* algorithm;
    double seconds;
  };
  /// The model's predictions for every registered algorithm that can run
  /// `call` on `t`, fastest first (ties keep registry order); empty without a model.
  std::vector<Prediction> predictions(const CollectiveCall& call, const Team& t) const;

  /// The bytes a rule's range is compared with: the whole buffer, as
  /// nccl-tests' "size" column (allgather: size * count elements).
  static size_t callBytes(const CollectiveCall& call, int size);

 private:
  using Rule = core::AlgoRule;
  const Algorithm& byDefault(const CollectiveCall& call, const Team& t,
                             std::string* why = nullptr) const;
  const Algorithm& bySizeRule(const CollectiveCall& call, const Team& t, std::string* why) const;
  std::vector<Rule> rules_;
  DefaultRule default_;
  std::shared_ptr<const topology::CostModel> model_;
  std::shared_ptr<const topology::TuningTable> tuning_;
};

}  // namespace gradcomm::algorithms
