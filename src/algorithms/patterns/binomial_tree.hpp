#pragma once
// Binomial tree over `size` ranks rooted at `root`, in terms of virtual
// ranks v = (rank - root) mod size. A node's parent clears its lowest set
// bit; its children add each lower power of two.
#include <vector>

namespace gradcomm::algorithms::patterns {

struct BinomialTree {
  int parent = -1;            ///< real rank, -1 at the root
  std::vector<int> children;  ///< real ranks, smallest subtree first
};

inline BinomialTree binomialTree(int rank, int size, int root) {
  BinomialTree t;
  const int v = ((rank - root) % size + size) % size;
  int mask = 1;
  while (mask < size) {
    if (v & mask) {
      t.parent = ((v - mask) + root) % size;
      break;
    }
    mask <<= 1;
  }
  // Children: v + m for every power of two m below the lowest set bit of v
  // (below `size` for the root), smallest first.
  for (int m = 1; m < mask && v + m < size; m <<= 1) t.children.push_back((v + m + root) % size);
  return t;
}

/// Largest power of two not above n (n >= 1).
inline int floorPowerOfTwo(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/// Folding of a non-power-of-two group onto its largest power of two p2:
/// the first 2 * (size - p2) ranks pair up (even gives to odd); the odd
/// ones and every rank from 2 * (size - p2) on take part with a new rank.
struct Fold {
  int p2 = 1;       ///< ranks in the power-of-two core
  int extra = 0;    ///< size - p2
  int newRank = -1; ///< rank inside the core, -1 for a folded-away even rank
};

inline Fold fold(int rank, int size) {
  Fold f;
  f.p2 = floorPowerOfTwo(size);
  f.extra = size - f.p2;
  if (rank < 2 * f.extra) {
    f.newRank = (rank % 2 == 1) ? rank / 2 : -1;
  } else {
    f.newRank = rank - f.extra;
  }
  return f;
}

/// Real rank of core rank `nr` under a fold.
inline int unfold(int nr, const Fold& f) { return nr < f.extra ? 2 * nr + 1 : nr + f.extra; }

}  // namespace gradcomm::algorithms::patterns
