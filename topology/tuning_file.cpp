#include "topology/tuning_file.hpp"

#include <sstream>

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::topology {
namespace {

std::string formatBound(size_t b) { return b == SIZE_MAX ? "inf" : core::formatBytes(b); }

}  // namespace

std::string layoutName(int hosts, int ranksPerHost) {
  return std::to_string(hosts) + "x" + std::to_string(ranksPerHost);
}

std::string layoutName(const TopologyView& view) {
  if (view.uniformHosts()) return layoutName(view.numHosts(), view.maxRanksPerHost());
  std::string out;
  for (int h = 0; h < view.numHosts(); ++h) out += (h ? "+" : "") + std::to_string(view.ranksOnHost(h).size());
  return out;
}

bool isLayoutName(const std::string& word) {
  // HxL, or N+N+... (at least two hosts): positive numbers only.
  auto number = [](const std::string& w) {
    return !w.empty() && w.find_first_not_of("0123456789") == std::string::npos && w.find_first_not_of('0') != std::string::npos;
  };
  const auto x = word.find('x');
  if (x != std::string::npos) return number(word.substr(0, x)) && number(word.substr(x + 1));
  size_t parts = 0, from = 0;
  for (;;) {
    const auto plus = word.find('+', from);
    if (!number(word.substr(from, plus == std::string::npos ? std::string::npos : plus - from))) return false;
    ++parts;
    if (plus == std::string::npos) break;
    from = plus + 1;
  }
  return parts >= 2;
}

TuningTable TuningTable::parse(const std::string& text, const std::string& origin) {
  TuningTable table;
  table.origin = origin;
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  while (std::getline(in, raw)) {
    ++lineNo;
    const std::string where = origin + " line " + std::to_string(lineNo) + ": ";
    std::string line = raw.substr(0, raw.find('#'));
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty()) continue;
    if (core::toLower(w[0]) == "layout") {
      if (w.size() != 2) {
        throw ConfigError(where + "expected 'layout HxL' (hosts x ranks per host) or 'layout N+N+...' (ranks on each "
                          "host), got '" + std::string(core::trim(line)) + "'");
      }
      if (!isLayoutName(w[1])) {
        throw ConfigError(where + "layout '" + w[1] + "' is not HxL (for example 2x4) or the ranks on each host "
                          "(for example 1+3)");
      }
      table.layout = w[1];
      continue;
    }
    if (w.size() != 3) {
      throw ConfigError(where + "expected 'COLLECTIVE LO-HI ALGORITHM' (for example 'allreduce 0-16K rd'), got '" +
                        std::string(core::trim(line)) + "'");
    }
    TuningEntry e;
    e.line = lineNo;
    try {
      e.collective = parseCollective(w[0]);
    } catch (const Error&) {
      throw ConfigError(where + "'" + w[0] + "' is not a collective (allreduce, broadcast, reduce, allgather, "
                        "reduce_scatter, barrier)");
    }
    const auto dash = w[1].find('-');
    if (dash == std::string::npos) throw ConfigError(where + "size range '" + w[1] + "' is not LO-HI (for example 0-16K)");
    const std::string lo = w[1].substr(0, dash), hi = w[1].substr(dash + 1);
    try {
      e.lo = lo.empty() ? 0 : core::parseBytes(lo, "range start");
      e.hi = (hi.empty() || core::toLower(hi) == "inf") ? SIZE_MAX : core::parseBytes(hi, "range end");
    } catch (const Error& err) {
      throw ConfigError(where + "size range '" + w[1] + "': " + err.what());
    }
    if (e.hi <= e.lo) throw ConfigError(where + "size range '" + w[1] + "' is empty (the end is exclusive)");
    e.algorithm = core::toLower(w[2]);
    table.entries.push_back(e);
  }
  return table;
}

std::string TuningTable::format() const {
  std::string out = "# gradcomm tuning file: COLLECTIVE LO-HI ALGORITHM (HI exclusive)\n";
  if (!layout.empty()) out += "layout " + layout + "\n";
  for (const auto& e : entries) {
    out += std::string(toString(e.collective)) + " " + formatBound(e.lo) + "-" + formatBound(e.hi) + " " +
           e.algorithm + "\n";
  }
  return out;
}

const TuningEntry* TuningTable::find(Collective collective, size_t bytes) const {
  for (const auto& e : entries) {
    if (e.collective == collective && bytes >= e.lo && bytes < e.hi) return &e;
  }
  return nullptr;
}

}  // namespace gradcomm::topology
