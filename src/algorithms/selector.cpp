#include "algorithms/selector.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "algorithms/catalog.hpp"
#include "base/algo_rules.hpp"
#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {
namespace {

std::string formatSeconds(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1fus", s * 1e6);
  else if (s < 1) std::snprintf(buf, sizeof buf, "%.3fms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3fs", s);
  return buf;
}

}  // namespace

Selector::Selector(const std::string& spec, DefaultRule rule)
    : rules_(core::parseAlgoRules(spec)), default_(rule) {}

size_t Selector::callBytes(const CollectiveCall& call, int size) {
  size_t bytes = call.count * dataTypeSize(call.type);
  if (call.collective == Collective::kAllgather || call.collective == Collective::kReduceScatter) {
    bytes *= static_cast<size_t>(size);
  }
  return bytes;
}

void Selector::useModel(std::shared_ptr<const topology::CostModel> model,
                        std::shared_ptr<const topology::TuningTable> tuning) {
  if (tuning) {
    for (const auto& e : tuning->entries) {
      if (!findAlgorithm(e.collective, e.algorithm)) {
        throw ConfigError(tuning->origin + " line " + std::to_string(e.line) + ": '" + e.algorithm + "' is not a " +
                          toString(e.collective) + " algorithm; valid: " + core::algorithmNameList(e.collective));
      }
    }
  }
  model_ = std::move(model);
  tuning_ = std::move(tuning);
}

std::vector<Selector::Prediction> Selector::predictions(const CollectiveCall& call,
                                                        const Team& t) const {
  std::vector<Prediction> out;
  if (!model_) return out;
  const size_t bytes = callBytes(call, t.size());
  for (const Algorithm* a : allAlgorithms()) {
    if (a->collective() != call.collective || !a->canRun(call, t)) continue;
    if (auto seconds = model_->predict(call.collective, a->name(), bytes)) out.push_back({a, *seconds});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Prediction& x, const Prediction& y) { return x.seconds < y.seconds; });
  return out;
}

const Algorithm& Selector::byDefault(const CollectiveCall& call, const Team& t,
                                    std::string* why) const {
  auto because = [why](std::string text) {
    if (why) *why = std::move(text);
  };
  const size_t bytes = callBytes(call, t.size());
  std::string tuningNote;
  if (tuning_) {
    if (const topology::TuningEntry* e = tuning_->find(call.collective, bytes)) {
      const Algorithm* a = findAlgorithm(call.collective, e->algorithm);
      if (a && a->canRun(call, t)) {
        because("tuning file " + tuning_->origin + " line " + std::to_string(e->line) + ": '" + e->algorithm +
                "' measured fastest for this size");
        return *a;
      }
      tuningNote = "; the tuning file's '" + e->algorithm + "' (line " + std::to_string(e->line) +
                   ") cannot run this call";
    }
  }
  const auto ranked = predictions(call, t);
  if (!ranked.empty()) {
    if (why) {
      std::string text = "cost model (" + model_->costs().source + "): " + ranked.front().algorithm->name() + " " +
                         formatSeconds(ranked.front().seconds);
      for (size_t i = 1; i < ranked.size() && i < 3; ++i) {
        text += std::string(i == 1 ? " < " : ", ") + ranked[i].algorithm->name() + " " +
                formatSeconds(ranked[i].seconds);
      }
      *why = text + tuningNote;
    }
    return *ranked.front().algorithm;
  }
  return bySizeRule(call, t, why);
}

const Algorithm& Selector::bySizeRule(const CollectiveCall& call, const Team& t,
                                      std::string* why) const {
  auto because = [why](std::string text) {
    if (why) *why = std::move(text);
  };
  switch (call.collective) {
    case Collective::kAllreduce: {
      const size_t bytes = callBytes(call, t.size());
      // All ranks on one host: shared memory beats point-to-point at every size.
      if (shmAllreduce().canRun(call, t)) {
        because("default rule: all ranks share this host's memory");
        return shmAllreduce();
      }
      if (bytes <= default_.smallMessageBytes) {
        because("default rule: up to GRADCOMM_SMALL_MESSAGE=" + core::formatBytes(default_.smallMessageBytes));
        return recursiveDoublingAllreduce();
      }
      if (bytes <= default_.treeMaxBytes) {
        because("default rule: up to GRADCOMM_TREE_MAX=" + core::formatBytes(default_.treeMaxBytes));
        return treeAllreduce();
      }
      because("default rule: above GRADCOMM_SMALL_MESSAGE and GRADCOMM_TREE_MAX");
      return ringAllreduce();
    }
    case Collective::kBroadcast: because("default rule"); return treeBroadcast();
    case Collective::kReduce: because("default rule"); return treeReduce();
    case Collective::kAllgather: because("default rule"); return ringAllgather();
    case Collective::kReduceScatter: because("default rule"); return ringReduceScatter();
    case Collective::kBarrier: because("default rule"); return disseminationBarrier();
  }
  return ringAllreduce();
}

Selector::Choice Selector::select(const CollectiveCall& call, const Team& t,
                                  const std::string& forced) const {
  if (!forced.empty()) {
    const Algorithm* a = findAlgorithm(call.collective, core::toLower(forced));
    if (!a) {
      throw InvalidArgument("unknown " + std::string(toString(call.collective)) + " algorithm '" + forced +
                            "'; valid: " + core::algorithmNameList(call.collective));
    }
    if (a->canRun(call, t)) return {a, {}, "forced by the call's options"};
    const std::string why = a->unsupportedReason(call, t);
    const Algorithm& d = byDefault(call, t);
    return {&d, "algorithm '" + forced + "' cannot run this call (" + why + "); using '" + d.name() + "'",
            "fallback from the call's '" + forced + "': " + why};
  }
  const size_t bytes = callBytes(call, t.size());
  for (const Rule& r : rules_) {
    if (r.collective && *r.collective != call.collective) continue;
    if (bytes < r.lo || bytes >= r.hi) continue;
    const Algorithm* a = findAlgorithm(call.collective, r.name);
    if (!a) continue;  // a bare name that this collective lacks
    if (a->canRun(call, t)) return {a, {}, "GRADCOMM_ALGO rule for '" + r.name + "'"};
    const std::string why = a->unsupportedReason(call, t);
    const Algorithm& d = byDefault(call, t);
    return {&d, "GRADCOMM_ALGO chose '" + r.name + "' but it cannot run this call (" + why + "); using '" +
                    d.name() + "'",
            "fallback from GRADCOMM_ALGO's '" + r.name + "': " + why};
  }
  std::string why;
  const Algorithm& d = byDefault(call, t, &why);
  return {&d, {}, why};
}

}  // namespace gradcomm::algorithms
