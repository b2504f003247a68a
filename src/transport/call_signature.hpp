#pragma once
// What a rank tells its peers about the collective it runs, so that ranks
// that issue different calls find out, and can say which field differs.
// Travels as raw bytes (a message, a shared-memory block): fixed layout, no
// padding, no pointers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gradcomm/types.hpp"

namespace gradcomm::transport {

/// Allreduce, reduce and reduce-scatter: the collectives whose op matters.
inline bool isReduction(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

/// One call's signature: every field ranks must agree on. In-place-ness is
/// not part of it: it changes no message (only local copies), and ranks may
/// legitimately differ (a broadcast's non-roots pass no input).
struct CallSignature {
  uint64_t seq = 0;    ///< operation number on the communicator
  uint64_t count = 0;  ///< elements, as the caller passed them
  int32_t root = 0;    ///< broadcast and reduce only, else 0
  uint8_t collective = 0;
  uint8_t type = 0;
  uint8_t op = 0;      ///< reductions only, else sum
  uint8_t memory = 0;  ///< 0: host buffers, 1: device buffers
  uint32_t custom = 0;     ///< signature of a custom operation, else 0
  uint32_t namesHash = 0;  ///< of the full algorithm and compression texts (the fields below may be cut short)
  char algorithm[16] = {};
  char compression[16] = {};  ///< empty: none

  /// Every field but the rooted-only and reduction-only ones normalised.
  static CallSignature make(uint64_t seq, Collective collective, DataType type, ReduceOp op, size_t count, int root,
                            const std::string& algorithm, const std::string& compression, uint32_t custom = 0);
  /// 32-bit FNV-1a of everything but seq: equal on two ranks iff their calls match.
  uint32_t fingerprint() const;
  bool sameCall(const CallSignature& o) const;
};
static_assert(sizeof(CallSignature) == 64, "CallSignature is a wire format of one cache line");

/// The most data a signed message carries after its signature (see
/// Tag::kCallCheck and RunContext::signedMessages): receives on the
/// call-check channel hold this much, so a peer's message always fits.
constexpr size_t kSignedPayloadLimit = 16 * 1024;

/// "root differs: this rank 0 passed root 0, rank 1 passed root 1" (every
/// differing field, "; "-separated), or empty when the calls match.
std::string describeDifference(const CallSignature& mine, int myRank, const CallSignature& theirs, int theirRank);

/// The whole MismatchError text: `what` (this rank's operation) does not
/// match `theirRank`'s call, naming the fields that differ when `theirs`
/// is known.
std::string mismatchMessage(int myRank, const std::string& what, const CallSignature& mine, int theirRank,
                            const CallSignature* theirs);

}  // namespace gradcomm::transport
