#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "gradcomm/error.hpp"
#include "transport/bootstrap.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::transport {

std::unique_ptr<ShmGroup> setUpSharedMemory(Bootstrap& boot, const std::vector<int>& localRanks, size_t chunkBytes) {
  const int me = boot.rank();
  const int localSize = static_cast<int>(localRanks.size());
  const int localRank =
      static_cast<int>(std::find(localRanks.begin(), localRanks.end(), me) - localRanks.begin());
  const bool share = localSize > 1 && chunkBytes > 0;
  const size_t bufferBytes = chunkBytes * static_cast<size_t>(localSize);
  const size_t total = ShmGroup::strideFor(bufferBytes) * static_cast<size_t>(localSize);

  // Round 1: each host's first rank creates the segment and publishes its
  // name (empty: it failed, and the host goes on without shared memory).
  std::shared_ptr<ShmSegment> seg;
  std::string why;
  std::string name;
  if (share && localRank == 0) {
    try {
      seg = ShmSegment::create(total);
      name = seg->name();
    } catch (const Error& e) {
      why = e.what();
    }
  }
  const auto names = boot.allgather(name);
  bool ok = false;
  if (share) {
    name = names[static_cast<size_t>(localRanks.front())];
    ok = !name.empty();
    if (ok && localRank != 0) {
      try {
        seg = ShmSegment::open(name, total);
      } catch (const Error& e) {
        why = e.what();
        ok = false;
      }
    }
  }
  // Round 2: did every rank of this host map it?
  const auto oks = boot.allgather(ok ? "1" : "0");
  bool allOk = share;
  for (int r : localRanks) allOk = allOk && oks[static_cast<size_t>(r)] == "1";
  std::unique_ptr<ShmGroup> group;
  if (allOk) {
    group = std::make_unique<ShmGroup>(localRanks, localRank, bufferBytes, seg->data(), seg);
    group->registerSelf(seg);
  } else if (!why.empty()) {
    std::fprintf(stderr, "gradcomm[rank %d] warn: no shared memory, the point-to-point algorithms run instead: %s\n",
                 me, why.c_str());
  }
  // Round 3: once every rank has mapped it, the name can go: nothing is
  // left in /dev/shm even if processes die later.
  boot.barrier();
  if (seg && localRank == 0) seg->unlink();
  return group;
}

}  // namespace gradcomm::transport
