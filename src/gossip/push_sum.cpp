#include "gossip/push_sum.hpp"

#include <cmath>

namespace gradcomm::gossip {

double PushSum::splitWeight(double& w, size_t outPeers) {
  const double pushed = w * share(outPeers);
  w -= static_cast<double>(outPeers) * pushed;
  return pushed;
}

void PushSum::mix(float* z, double& w, const float* yz, double yw, size_t count) {
  const double total = w + yw;
  if (!(total > 0)) return;  // two empty weights: nothing to mix
  // z + f (y - z) with f the pushed share of the total: one rounding per
  // element, exact when y == z, and no x = z·w that could underflow.
  const float f = static_cast<float>(yw / total);
  for (size_t i = 0; i < count; ++i) z[i] += f * (yz[i] - z[i]);
  w = total;
}

bool PushSum::renormalize(double& w) {
  static const double kLow = std::ldexp(1.0, -600), kHigh = std::ldexp(1.0, 600);
  if (w > 0 && w < kLow) {
    w = std::ldexp(w, 600);
    return true;
  }
  if (w > kHigh) {
    w = std::ldexp(w, -600);
    return true;
  }
  return false;
}

}  // namespace gradcomm::gossip
