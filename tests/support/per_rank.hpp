#pragma once
// What every rank of an in-process job ended with: the helpers the error,
// public-API and split tests share.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/inproc.hpp"
#include "support/text.hpp"

namespace gradcomm::testing {

/// Options with a short GRADCOMM_TIMEOUT, so a test that goes wrong fails
/// instead of waiting minutes.
inline Options quick(const char* timeout = "20s") {
  Options o;
  o.set("TIMEOUT", timeout);
  return o;
}

/// Every rank's error text (empty: none), its code (-1: none) and how long
/// the rank's function ran.
struct Outcome {
  std::vector<std::string> what;
  std::vector<int> code;
  std::vector<double> seconds;
};

/// Runs fn on `p` ranks and records what each rank threw (a gradcomm Error).
inline Outcome perRank(int p, const std::function<void(RankContext&)>& fn, const Options& o = quick(),
                       transport::InProcWorld::Settings settings = {}) {
  using Clock = std::chrono::steady_clock;
  Outcome out;
  out.what.assign(static_cast<size_t>(p), "");
  out.code.assign(static_cast<size_t>(p), -1);
  out.seconds.assign(static_cast<size_t>(p), 0);
  runRanks(
      p,
      [&](RankContext& ctx) {
        const auto t0 = Clock::now();
        try {
          fn(ctx);
        } catch (const Error& e) {
          out.what[static_cast<size_t>(ctx.rank)] = e.what();
          out.code[static_cast<size_t>(ctx.rank)] = static_cast<int>(e.code());
        }
        out.seconds[static_cast<size_t>(ctx.rank)] = std::chrono::duration<double>(Clock::now() - t0).count();
      },
      o, settings);
  return out;
}

}  // namespace gradcomm::testing
