#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcomm/types.hpp"
#include "topology/topology_view.hpp"

namespace gradcomm::topology {

/// One measured choice: calls of `collective` with LO <= bytes < HI run `algorithm`.
struct TuningEntry {
  Collective collective = Collective::kAllreduce;
  size_t lo = 0;
  size_t hi = SIZE_MAX;
  std::string algorithm;
  int line = 0;  ///< in the file, for error messages
};

/// A tuning file (GRADCOMM_TUNING_FILE), written by `gradcomm-bench --tune`:
///
///     # comments and blank lines are ignored
///     layout 2x2                  (hosts x ranks per host it was measured on;
///                                  uneven hosts as their sizes: 1+3, 2+1+3)
///     allreduce 0-16K rd          (COLLECTIVE LO-HI ALGORITHM; HI exclusive, 'inf' open)
///     allreduce 16K-inf ring
///
/// The selector prefers its entries over the cost model when the layout
/// matches the communicator's.
struct TuningTable {
  std::string origin;  ///< the path, for messages
  std::string layout;  ///< layoutName() as written ("HxL" or "1+3"), or empty (applies to any layout)
  std::vector<TuningEntry> entries;

  /// Parses `text`; throws ConfigError "ORIGIN line N: ..." naming what is wrong.
  static TuningTable parse(const std::string& text, const std::string& origin);
  /// The file's text (parse(format()) gives back the same table).
  std::string format() const;
  /// The first entry covering (collective, bytes), or null.
  const TuningEntry* find(Collective collective, size_t bytes) const;
};

/// "HxL" for hosts x ranksPerHost.
std::string layoutName(int hosts, int ranksPerHost);
/// The layout as calibration and tuning files name it, one word: "HxL"
/// when every host holds L ranks, else the hosts' sizes ("1+3", "2+1+3").
std::string layoutName(const TopologyView& view);
/// Whether `word` is a layout as layoutName() writes it.
bool isLayoutName(const std::string& word);

}  // namespace gradcomm::topology
