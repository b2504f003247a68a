#pragma once
// Runs N ranks as threads of this process, each with its own Communicator
// over a shared in-process world, and rethrows the first rank's failure.
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/communicator_impl.hpp"
#include "base/params.hpp"
#include "gradcomm/communicator.hpp"
#include "transport/inproc_transport.hpp"

namespace gradcomm::testing {

/// A reusable barrier for the rank threads of one test.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    int gen = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen != generation_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int waiting_ = 0;
  int generation_ = 0;
};

inline Communicator makeInProcCommunicator(const std::shared_ptr<transport::InProcWorld>& world, int rank,
                                           const Options& options) {
  auto impl = std::make_shared<detail::CommunicatorImpl>(world->transport(rank), world->hostLayout(rank),
                                                         core::Config::resolve(options));
  return Communicator(impl);
}

struct RankContext {
  Communicator comm;
  int rank;
  int size;
  ThreadBarrier* barrier;
};

/// Runs fn on `size` rank threads. Exceptions are collected per rank; the
/// lowest rank's is rethrown after all threads joined.
inline void runRanks(int size, const std::function<void(RankContext&)>& fn, const Options& options = {},
                     transport::InProcWorld::Settings settings = {}) {
  auto world = transport::InProcWorld::create(size, settings);
  ThreadBarrier barrier(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Communicator comm{std::shared_ptr<detail::CommunicatorImpl>()};  // empty until created
      try {
        comm = makeInProcCommunicator(world, r, options);
        RankContext ctx{comm, r, size, &barrier};
        fn(ctx);
        comm.destroy();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        // Let the other ranks fail fast instead of waiting for this one.
        if (comm.impl()) comm.impl()->engine().abort(ErrorCode::kRemote, "rank " + std::to_string(r) + " failed", true);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace gradcomm::testing
