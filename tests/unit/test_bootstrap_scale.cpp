// StoreBootstrap over one TcpStore with hundreds and thousands of ranks (as
// threads, each with its own client connection, as separate processes would
// have): every rank gets every value, each rank makes a bounded number of
// store requests whatever the world size, and the total keys the store looks
// at grows linearly with it.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/error.hpp"
#include "gradcomm/store.hpp"
#include "transport/bootstrap.hpp"

using namespace gradcomm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// Counts the requests one rank makes and the keys they name (what the
/// server has to look at), forwarding everything to `base`.
class CountingStore : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  void set(const std::string& key, const Bytes& value) override {
    note(1);
    base_->set(key, value);
  }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    note(1);
    return base_->get(key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    note(1);
    return base_->add(key, delta);
  }
  bool check(const std::vector<std::string>& keys) override {
    note(keys.size());
    return base_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    note(keys.size());
    base_->wait(keys, timeout);
  }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    // TcpStore sends at most kKeysPerRequest keys per request.
    constexpr size_t kKeysPerRequest = 4096;
    requests += (keys.size() + kKeysPerRequest - 1) / kKeysPerRequest;
    keysNamed += keys.size();
    return base_->multiGet(keys, timeout);
  }
  std::string describe() const override { return base_->describe(); }

  size_t requests = 0;
  size_t keysNamed = 0;

 private:
  void note(size_t keys) {
    ++requests;
    keysNamed += keys;
  }
  std::shared_ptr<Store> base_;
};

/// Raises the soft descriptor limit to the hard one; false when even that
/// is below `needed`.
bool allowDescriptors(rlim_t needed) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  if (lim.rlim_cur < needed && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur >= needed;
}

struct RankOutcome {
  std::vector<std::vector<std::string>> rounds;
  std::string error;
  ErrorCode code = ErrorCode::kInternal;
  size_t requests = 0;
  size_t keysNamed = 0;
  double seconds = 0;
};

std::string valueOf(int rank, int round) { return "r" + std::to_string(rank) + "/" + std::to_string(round); }

/// Runs `size` ranks as threads, each with its own client of one server,
/// through `rounds` allgathers. A rank listed in `absent` never starts; the
/// rank `failing` calls fail() instead of its first allgather.
std::vector<RankOutcome> runRanks(int size, int rounds, std::chrono::milliseconds timeout,
                                  std::vector<int> absent = {}, int failing = -1) {
  TcpStore::Options so;
  so.isServer = true;
  so.connectTimeout = 30s;
  auto server = std::make_shared<TcpStore>("127.0.0.1", 0, so);
  const uint16_t port = server->port();
  std::vector<RankOutcome> out(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back([&, r] {
      RankOutcome& o = out[static_cast<size_t>(r)];
      try {
        TcpStore::Options co;
        co.connectTimeout = 30s;
        auto counted = std::make_shared<CountingStore>(std::make_shared<TcpStore>("127.0.0.1", port, co));
        transport::StoreBootstrap boot(counted, r, size, timeout);
        const auto t0 = Clock::now();
        try {
          if (r == failing) {
            boot.fail("rank " + std::to_string(r) + " gives up on purpose");
          } else {
            for (int k = 0; k < rounds; ++k) o.rounds.push_back(boot.allgather(valueOf(r, k)));
          }
        } catch (const Error& e) {
          o.error = e.what();
          o.code = e.code();
        }
        o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        o.requests = counted->requests;
        o.keysNamed = counted->keysNamed;
      } catch (const std::exception& e) {
        o.error = std::string("setup: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void expectEveryRankGotEveryValue(const std::vector<RankOutcome>& out, int rounds) {
  const int size = static_cast<int>(out.size());
  int bad = 0;
  for (int r = 0; r < size && bad < 5; ++r) {
    const RankOutcome& o = out[static_cast<size_t>(r)];
    if (!o.error.empty()) {
      ADD_FAILURE() << "rank " << r << ": " << o.error;
      ++bad;
      continue;
    }
    ASSERT_EQ(o.rounds.size(), static_cast<size_t>(rounds)) << "rank " << r;
    for (int k = 0; k < rounds; ++k) {
      const auto& got = o.rounds[static_cast<size_t>(k)];
      ASSERT_EQ(got.size(), static_cast<size_t>(size)) << "rank " << r << " round " << k;
      for (int q = 0; q < size; ++q) {
        if (got[static_cast<size_t>(q)] != valueOf(q, k)) {
          ADD_FAILURE() << "rank " << r << " round " << k << ": rank " << q << "'s value is '"
                        << got[static_cast<size_t>(q)] << "'";
          ++bad;
          break;
        }
      }
    }
  }
}

}  // namespace

TEST(StoreBootstrap, ThreeHundredRanksEachMakeAFewRequestsAndTheStoreSeesLinearlyManyKeys) {
  constexpr int kRanks = 300, kRounds = 2;
  ASSERT_TRUE(allowDescriptors(4 * kRanks)) << "needs " << 4 * kRanks << " descriptors";
  auto out = runRanks(kRanks, kRounds, 60s);
  expectEveryRankGotEveryValue(out, kRounds);
  size_t maxRequests = 0, totalKeys = 0;
  for (const auto& o : out) {
    maxRequests = std::max(maxRequests, o.requests);
    totalKeys += o.keysNamed;
  }
  // Per round a rank sets its value, counts itself in and reads one
  // combined value; rank 0 also waits for the count and fetches the values
  // in one batch, and publishes the result.
  EXPECT_LE(maxRequests, static_cast<size_t>(6 * kRounds)) << "requests of the busiest rank";
  // The store looks at each rank's key a bounded number of times: linear in p.
  EXPECT_LE(totalKeys, static_cast<size_t>(6 * kRounds * kRanks)) << "keys named in all requests";
}

TEST(StoreBootstrap, MoreThanFourThousandNinetySixRanksFormThroughOneTcpStore) {
  // 4,200 ranks: above TcpStore's 4,096 keys per request, which a rank
  // checking every key at once could not get past. Each rank has its own
  // connection: about 2 descriptors per rank in this process (both ends).
  constexpr int kRanks = 4200;
  if (!allowDescriptors(2 * kRanks + 200)) {
    GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below " << 2 * kRanks + 200 << ", which " << kRanks
                 << " connections to an in-process store need";
  }
  const auto t0 = Clock::now();
  auto out = runRanks(kRanks, 1, 120s);
  expectEveryRankGotEveryValue(out, 1);
  size_t maxRequests = 0;
  for (const auto& o : out) maxRequests = std::max(maxRequests, o.requests);
  // Rank 0 fetches the 4,200 values in two requests of at most 4,096 keys.
  EXPECT_LE(maxRequests, 7u);
  std::printf("%d ranks formed in %.2f s (threads started and connected included)\n", kRanks,
              std::chrono::duration<double>(Clock::now() - t0).count());
}

TEST(StoreBootstrap, ARankThatFailsStopsEveryOtherRankWithItsReasonPromptly) {
  auto out = runRanks(5, 2, 30s, {}, 3);
  for (int r : {0, 1, 2, 4}) {
    const RankOutcome& o = out[static_cast<size_t>(r)];
    EXPECT_EQ(o.code, ErrorCode::kRemote) << "rank " << r << ": " << o.error;
    EXPECT_NE(o.error.find("rank 3 gives up on purpose"), std::string::npos) << "rank " << r << ": " << o.error;
    EXPECT_LT(o.seconds, 10.0) << "rank " << r;
  }
}

TEST(StoreBootstrap, ARankThatNeverArrivesIsATimeoutNamingItOnEveryRank) {
  const auto t0 = Clock::now();
  auto out = runRanks(4, 1, 1000ms, {2});
  for (int r : {0, 1, 3}) {
    const RankOutcome& o = out[static_cast<size_t>(r)];
    EXPECT_EQ(o.code, ErrorCode::kTimeout) << "rank " << r << ": " << o.error;
    EXPECT_NE(o.error.find("rank 2 did not arrive"), std::string::npos) << "rank " << r << ": " << o.error;
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 8.0);
}
