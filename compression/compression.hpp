#pragma once
// Gradient compression: what to compress to (Spec) and the error-feedback
// memory that makes lossy compression converge (Residual). The kernels live
// in cpu/ and cuda/; the sparse wire format in sparse_format.hpp.
#include <cstddef>
#include <string>
#include <vector>

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

/// Error-feedback memory of one tensor: the part of past gradients that
/// compression has not sent yet, in gradient units (before any pre-scaling).
class Residual {
 public:
  /// The buffer for a tensor of `count` floats, zero-filled on first use.
  /// Throws InvalidArgument when `count` differs from the size in use.
  float* data(size_t count);
  /// The buffer as it is (null when empty).
  const float* data() const { return buffer_.empty() ? nullptr : buffer_.data(); }
  /// Elements held; 0 before first use and after clear().
  size_t size() const { return buffer_.size(); }
  bool empty() const { return buffer_.empty(); }
  /// Forgets the carried error and the size (after a skipped step or a
  /// change of model); the next data() call sizes the buffer afresh.
  void clear();

 private:
  std::vector<float> buffer_;
};

}  // namespace gradcomm::compression
