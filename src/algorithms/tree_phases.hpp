#pragma once
// Per-segment building blocks of the binomial-tree algorithms (allreduce,
// reduce, broadcast). Callers emit segment by segment, so every segment
// flows up (or down) the tree while the next one follows: a pipeline.
#include <vector>

#include "algorithms/patterns/binomial_tree.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {

struct TreeState {
  patterns::BinomialTree tree;
  SlotPool slots;
  Window sends;
  Window recvs;
  TreeState(PlanBuilder& b, const patterns::BinomialTree& t, int depth, size_t seg)
      : tree(t), slots(b, depth, seg), sends(depth), recvs(2 * depth) {}
};

/// Reduces one segment up the tree. `src` is this rank's contribution and
/// `work` where partial sums accumulate (may equal src). Returns the step
/// after which `work` holds the segment's final value at the root, or the
/// send to the parent elsewhere; `sentFrom` is set to the span that send reads.
inline PlanBuilder::Id treeReduceSegment(PlanBuilder& b, TreeState& st, Span src, Span work, uint32_t msg,
                                         PlanBuilder::Id srcReady, Span* sentFrom) {
  using Id = PlanBuilder::Id;
  Span acc = src;
  Id accReady = srcReady;
  for (int child : st.tree.children) {
    auto slot = st.slots.acquire();
    Id rv = b.recv(child, st.slots.span(slot, src.count), msg, {slot.freeAfter, st.recvs.gate()});
    st.recvs.push(rv);
    Id red = b.reduce(work, acc, st.slots.span(slot, src.count), {rv, accReady});
    st.slots.release(slot, red);
    acc = work;
    accReady = red;
  }
  if (st.tree.parent >= 0) {
    Id s = b.send(st.tree.parent, acc, msg, {accReady, st.sends.gate()});
    st.sends.push(s);
    if (sentFrom) *sentFrom = acc;
    return s;
  }
  if (sentFrom) *sentFrom = acc;
  return accReady;
}

/// Broadcasts one segment down the tree into `buf`: non-roots receive it
/// from the parent (after `writable`), then everyone forwards it to the
/// children, largest subtree first. `rootSrc` is what the root sends.
/// Returns the step after which `buf` holds the segment.
inline PlanBuilder::Id treeBroadcastSegment(PlanBuilder& b, TreeState& st, Span buf, Span rootSrc, uint32_t msg,
                                            PlanBuilder::Id ready, PlanBuilder::Id writable) {
  using Id = PlanBuilder::Id;
  Span from = rootSrc;
  Id have = ready;
  if (st.tree.parent >= 0) {
    have = b.recv(st.tree.parent, buf, msg, {writable, st.recvs.gate()});
    st.recvs.push(have);
    from = buf;
  }
  for (auto it = st.tree.children.rbegin(); it != st.tree.children.rend(); ++it) {
    Id s = b.send(*it, from, msg, {have, st.sends.gate()});
    st.sends.push(s);
  }
  return have;
}

}  // namespace gradcomm::algorithms
