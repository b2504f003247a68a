#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "transport/transport.hpp"

namespace gradcomm::transport {

/// Ranks as threads of one process: the shared mailbox of an in-process
/// "world". Data moves when either side of a matched pair is tested, never
/// at post time, so a send's buffer is read late and a receive's buffer is
/// written late, exactly as a real network may do. With `chaos` set, each
/// transfer additionally waits a random number of tests, shaking out
/// missing dependencies in algorithms.
class InProcWorld : public std::enable_shared_from_this<InProcWorld> {
 public:
  struct Settings {
    int ranksPerHost = 0;   ///< 0: every rank on one host
    /// Explicit layout, consecutive ranks per host: {2, 3} puts ranks 0-1 on
    /// one host and 2-4 on another. Overrides ranksPerHost; must sum to size.
    std::vector<int> hostSizes;
    /// Explicit placement, a host number per rank ({0, 1, 0, 1}: round
    /// robin). Overrides hostSizes; one entry per rank.
    std::vector<int> hostOfRank;
    bool chaos = false;     ///< random completion delays
    uint64_t seed = 1;      ///< seed of the chaos delays
    size_t shmChunkBytes = 4096;  ///< shared-memory buffer per rank and host peer; 0: none
  };

  static std::shared_ptr<InProcWorld> create(int size, Settings settings);
  static std::shared_ptr<InProcWorld> create(int size) { return create(size, Settings{}); }
  int size() const { return size_; }
  /// Every host's ranks, in host order.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  /// Index of the host of `rank`.
  int hostOf(int rank) const { return hostOf_[static_cast<size_t>(rank)]; }
  /// What a communicator over `transport(rank)` is told about the hosts.
  HostLayout hostLayout(int rank) const { return {size_, hosts_, "inproc-host" + std::to_string(hostOf(rank))}; }
  /// The transport of one rank (call once per rank).
  std::unique_ptr<Transport> transport(int rank);

 private:
  friend class InProcTransport;
  friend class InProcRequest;
  struct Transfer;

  InProcWorld(int size, Settings settings);
  std::shared_ptr<Transfer> post(int src, int dst, bool isSend, void* data, size_t bytes, const Tag& tag);
  bool test(const std::shared_ptr<Transfer>& t);
  void cancel(const std::shared_ptr<Transfer>& t, bool isSend);

  int size_;
  Settings settings_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> hostOf_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  // Unmatched posts, per destination rank.
  std::vector<std::deque<std::shared_ptr<Transfer>>> unmatchedSends_;
  std::vector<std::deque<std::shared_ptr<Transfer>>> unmatchedRecvs_;
  // Shared memory per host, created on first use; memory lives in `shmMemory_`.
  std::vector<std::shared_ptr<char>> shmMemory_;
};

}  // namespace gradcomm::transport
