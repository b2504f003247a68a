#pragma once
// What a compression request says (Spec): the value type of
// GRADCOMM_COMPRESSION and CollectiveOptions::compression. It lives in the
// ground floor so the parameter registry can parse it; the compressors that
// act on it are in compression/.
#include <cstddef>
#include <string>

namespace gradcomm::compression {

/// The compression schemes.
enum class Kind { kNone, kFp16, kBf16, kTopK };

/// A parsed compression request such as "topk:0.01:ef=1" or "fp16:prescale".
///
/// Grammar (case-insensitive): `none | fp16 | bf16 | topk:<amount>`, then any
/// of `:ef=0|1`, `:exact` (topk only), `:prescale` (not with none). An amount
/// with a '.' or an exponent is a fraction in (0,1] ("topk:0.01",
/// "topk:1.0"); a plain integer is an element count ("topk:1000", "topk:1").
struct Spec {
  Kind kind = Kind::kNone;
  double ratio = 0;           ///< topk: fraction of the elements to send; 0 when `count` is used
  size_t count = 0;           ///< topk: elements to send; 0 when `ratio` is used
  bool errorFeedback = false; ///< keep what was not sent and add it to the next step (default: on for topk)
  bool prescale = false;      ///< multiply by 1/ranks before compressing, so fp16 sums do not overflow
  bool approximate = false;   ///< topk: sample-based threshold (count within 10% of k); off with ":exact"

  /// Parses `text`; throws ConfigError naming the valid forms when malformed.
  static Spec parse(const std::string& text);
  /// Canonical text; parse(toString()) gives back an equal Spec.
  std::string toString() const;
  /// Elements top-k sends from a tensor of n: count, or ceil(ratio * n); always
  /// in [1, n] when n > 0, and 0 when n == 0.
  /// Throws InvalidUsage when kind is not kTopK.
  size_t topkCount(size_t n) const;

  bool operator==(const Spec& other) const;
  bool operator!=(const Spec& other) const { return !(*this == other); }
};

/// Lower-case name of a kind ("none", "fp16", "bf16", "topk").
const char* toString(Kind kind);

}  // namespace gradcomm::compression
