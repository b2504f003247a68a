#pragma once
// The MPI transport's graveyard of abandoned requests, shared by its
// point-to-point requests (mpi_transport.cpp) and its native collectives
// (mpi_native.cpp).
#include <mpi.h>

#include <memory>
#include <vector>

#include "transport/mpi_env.hpp"

namespace gradcomm::transport {

/// Requests abandoned while still in flight because their operation failed.
/// Nothing here is ever waited on: a receive already matched with a peer that
/// died never completes (MPI_Cancel cannot take it back, and MPI_Wait would
/// block forever), and MPI forbids cancelling or freeing a nonblocking
/// collective. Each grave is tested now and then and forgotten once
/// complete; what is still pending when the transport goes is leaked, with
/// the memory it writes into, since MPI may still write there.
class Graveyard {
 public:
  Graveyard() = default;
  Graveyard(const Graveyard&) = delete;
  Graveyard& operator=(const Graveyard&) = delete;
  ~Graveyard() {
    sweep();
    for (auto& g : graves_) (void)new Grave(std::move(g));  // leaked on purpose (see above)
  }
  /// Takes pending `requests` and `keepAlive`, memory gradcomm owns that they write into.
  void bury(std::vector<MPI_Request> requests, std::shared_ptr<void> keepAlive = {}) {
    graves_.push_back({std::move(requests), std::move(keepAlive)});
  }
  /// Tests every pending request once, never blocking; drops complete graves.
  void sweep() {
    if (graves_.empty() || !MpiEnvironment::usable()) return;
    for (size_t i = 0; i < graves_.size();) {
      bool pending = false;
      for (auto& r : graves_[i].requests) {
        int flag = 0;
        if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        pending = pending || r != MPI_REQUEST_NULL;
      }
      if (pending) {
        ++i;
      } else {
        graves_[i] = std::move(graves_.back());
        graves_.pop_back();
      }
    }
  }
  bool empty() const { return graves_.empty(); }

 private:
  struct Grave {
    std::vector<MPI_Request> requests;
    std::shared_ptr<void> keepAlive;
  };
  std::vector<Grave> graves_;
};

}  // namespace gradcomm::transport
