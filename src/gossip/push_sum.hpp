#pragma once
#include <cstddef>

namespace gradcomm::gossip {

/// Push-sum mixing, pure arithmetic, kept in de-biased form: a rank holds
/// its estimate z and a weight w (the push-sum numerator is x = z·w, never
/// formed, so tiny weights cannot underflow float numerators). Each step it
/// keeps one equal share of w and pushes one share, with its z, to each
/// out-peer, then mixes every (z_j, w_j) that arrived:
/// z <- (w z + w_j z_j) / (w + w_j), w <- w + w_j. Weights travel with the
/// estimates, so a dropped or late push changes what is averaged but never
/// biases it: estimates stay convex combinations of the ranks' values, and
/// the total x over ranks and pushes in flight is conserved to rounding.
struct PushSum {
  /// The share kept and pushed to each of `outPeers` peers: 1 / (outPeers + 1).
  static double share(size_t outPeers) { return 1.0 / static_cast<double>(outPeers + 1); }
  /// Splits the weight for a push to `outPeers` peers: returns each peer's
  /// part and leaves the kept one in w (kept + outPeers x pushed == w to one rounding).
  static double splitWeight(double& w, size_t outPeers);
  /// Mixes one arrived push (yz, yw) into (z, w).
  static void mix(float* z, double& w, const float* yz, double yw, size_t count);
  /// Weights of ranks that keep losing pushes (dropped as stale) shrink
  /// geometrically: past 2^-600 (or 2^600) w is rescaled by an exact power of
  /// two, which only shifts this rank's say in later mixes. True if rescaled.
  static bool renormalize(double& w);
};

}  // namespace gradcomm::gossip
