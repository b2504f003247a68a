#include "core/communicator_impl.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "base/hash.hpp"
#include "algorithms/catalog.hpp"
#include "algorithms/compressed.hpp"
#include "base/log.hpp"
#include "base/units.hpp"
#include "core/device_staging.hpp"
#include "gradcomm/version.hpp"
#include "kernels/reduce.hpp"
#include "topology/calibration.hpp"
#include "topology/tuning_file.hpp"
#include "transport/group_transport.hpp"
#include "transport/shm_group.hpp"
#include "transport/ucx_factory.hpp"

namespace gradcomm::detail {

using algorithms::CollectiveCall;
using transport::isReduction;

namespace {

bool rangesOverlap(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes && bBytes && x < y + bBytes && y < x + aBytes;
}

// Calls up to this size take their first progress step inside submit (see
// ProgressEngine::submit): for them latency is everything, and one step is
// short. Larger calls return at once and overlap with the caller's work.
constexpr size_t kEagerMaxBytes = 64 * 1024;

/// "1M-2M bytes": the power-of-two range holding `bytes`, so that one info
/// line covers every count of a size class.
std::string sizeClass(size_t bytes) {
  if (bytes == 0) return "0 bytes";
  size_t lo = 1;
  while (lo <= bytes / 2) lo *= 2;
  return core::formatBytes(lo) + "-" + (lo > SIZE_MAX / 2 ? std::string("max") : core::formatBytes(lo * 2)) +
         " bytes";
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) out += ",...";
  return out;
}

}  // namespace

transport::CallSignature callSignature(const CollectiveCall& call, const std::string& algorithm,
                                       const std::string& compression) {
  return transport::CallSignature::make(0, call.collective, call.type, call.op, call.count, call.root, algorithm,
                                        compression);
}

CommunicatorImpl::CommunicatorImpl(std::unique_ptr<transport::Transport> transport,
                                   const transport::HostLayout& hosts, core::Config config,
                                   std::function<void(const std::string&)> onPeerFailure)
    : config_(std::move(config)),
      rank_(transport->rank()),
      size_(transport->size()),
      simd_(kernels::resolveSimd(config_.simd)),
      view_(topology::detect(hosts)),
      selector_(config_.algo, algorithms::DefaultRule{config_.smallMessageBytes, config_.treeMaxBytes}),
      defaultCompression_(compression::Spec::parse(config_.compression)) {
  core::setLogLevel(config_.logLevel);
  core::EngineSettings settings;
  settings.timeout = config_.timeout;
  settings.pollSpins = config_.pollSpins;
  settings.pollMaxSleep = config_.pollMaxSleep;
  settings.linger = config_.pollLinger;
  settings.onPeerFailure = std::move(onPeerFailure);
  wait_ = topology::decideWait(config_.wait, static_cast<int>(view_.hostLocalRanks(rank_).size()),
                               topology::cpusAvailable());
  settings.yieldWhenIdle = wait_.yield;
  auto aborts = std::make_unique<core::AbortChannel>(*transport);
  setUpSelection(*transport, *aborts);
  transport_ = transport.get();
  contextRanks_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) contextRanks_[static_cast<size_t>(r)] = r;
  engine_ = std::make_shared<core::ProgressEngine>(std::move(transport), std::move(aborts), settings);
  context_ = std::make_shared<Context>();
  context_->engine = engine_;
  context_->view = std::make_shared<topology::TopologyView>(view_);
  context_->idInUse[0] = 1;
  context_->idInUse[Context::kFormingGroup] = 1;
  context_->alive = 1;
  engine_->start();
  logStartup();
}

namespace {

/// The whole file, or nullopt when it cannot be opened.
std::optional<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

transport::Tag setupTag() {
  transport::Tag tag;
  tag.seq = 0;
  tag.fingerprint = kCalibrationFingerprint;
  return tag;
}

/// Drives the creation-time exchange on this thread, before the progress
/// engine exists. Abort notices are left for the engine (a faster peer's
/// notice is about a later operation, and this rank's last message may
/// already have arrived) unless nothing moved for a second: then a peer
/// may have failed during creation, and its reason is the error here.
void runSetup(core::AbortChannel& aborts, std::unique_ptr<topology::SetupExchange> schedule,
              std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  auto lastProgress = Clock::now();
  while (!schedule->done()) {
    bool moved = false;
    try {
      moved = schedule->advance();
    } catch (const Error& e) {
      aborts.broadcast("communicator creation failed: " + std::string(e.what()));
      throw;
    }
    if (moved) {
      lastProgress = Clock::now();
      continue;
    }
    if (schedule->done()) break;
    const auto idle = Clock::now() - lastProgress;
    if (idle > std::chrono::seconds(1)) {
      if (auto notice = aborts.poll()) {
        throw RemoteError("communicator creation failed because " + *notice);
      }
    }
    if (timeout.count() > 0 && idle > timeout) {
      const std::string why = "communicator creation: the calibration exchange made no progress for " +
                              core::formatDuration(timeout) + " (GRADCOMM_TIMEOUT); waiting for " +
                              schedule->waitingFor();
      aborts.broadcast("[timeout] " + why);
      throw TimeoutError(why);
    }
    std::this_thread::yield();
  }
}

}  // namespace

void CommunicatorImpl::setUpSelection(transport::Transport& t, core::AbortChannel& aborts) {
  if (config_.select == "rule") return;  // the size rule needs nothing measured
  using topology::CalibrationMode;
  const CalibrationMode mode = CalibrationMode::parse(config_.calibrate);
  const std::string layout = topology::layoutName(view_);
  topology::SetupInput in;
  // The static model: constants from rank 0's host (its ranks, the CPUs
  // they share, its NIC's speed), which the setup exchange hands to every
  // rank, so the choice for a call is a function of the layout and these
  // numbers alone, and the same job chooses alike on every run.
  in.costs = topology::MachineCosts::forHardware(
      static_cast<int>(view_.hostLocalRanks(0).size()), topology::hostCpus(view_.hardware()),
      config_.netBitsPerSecond > 0 ? config_.netBitsPerSecond : view_.hardware().nicBitsPerSecond);
  in.budget = config_.calibrateBudget;
  if (rank_ == 0) {
    // Only rank 0 reads files: other hosts may not see them, and every rank
    // must use the same numbers. A file is only read: a job never measures
    // unless asked (GRADCOMM_CALIBRATE=1), so a missing file is an error and
    // one of another layout leaves the static model in place.
    if (mode.kind == CalibrationMode::Kind::kFile) {
      if (auto text = readFile(mode.path)) {
        try {
          std::string fileLayout;
          topology::MachineCosts loaded = topology::parseCalibration(*text, "GRADCOMM_CALIBRATE file " + mode.path,
                                                                     &fileLayout);
          if (fileLayout == layout) {
            in.costs = loaded;
          } else {
            core::log(core::LogLevel::kWarn, rank_,
                      "GRADCOMM_CALIBRATE file " + mode.path + " was measured on layout " + fileLayout +
                          ", this job is " + layout + ": using the static model (write a file for this layout " +
                          "with gradcomm-bench --calibrate FILE)");
          }
        } catch (const ConfigError& e) {
          in.tuning.error = e.what();
        }
      } else {
        in.tuning.error = "GRADCOMM_CALIBRATE: cannot read '" + mode.path + "' on rank 0: " + std::strerror(errno) +
                          " (write it with gradcomm-bench --calibrate FILE, or set GRADCOMM_CALIBRATE=0)";
      }
    }
    if (mode.kind == CalibrationMode::Kind::kRun) {
      in.costs = topology::measureLocalCosts();
      in.runPingPong = size_ > 1;
      // Alone, there are no links to probe: the local costs are all there is.
      if (size_ == 1) in.costs.source = "calibrated";
    }
    if (!config_.tuningFile.empty()) {
      if (auto text = readFile(config_.tuningFile)) {
        in.tuning.tuningPresent = true;
        in.tuning.tuningText = *text;
      } else if (in.tuning.error.empty()) {
        in.tuning.error = "GRADCOMM_TUNING_FILE: cannot read '" + config_.tuningFile + "' on rank 0: " +
                          std::strerror(errno);
      }
    }
  }
  auto result = std::make_shared<topology::SetupResult>();
  // Always one exchange: rank 0's costs (and host layout, and tuning file)
  // reach every rank, whose own hardware may differ.
  if (size_ == 1) {
    result->costs = in.costs;
    result->tuningPresent = in.tuning.tuningPresent;
    result->tuningText = in.tuning.tuningText;
    result->error = in.tuning.error;
  } else {
    runSetup(aborts, topology::setupExchange(t, setupTag(), view_, in, result), config_.timeout);
    // Every rank takes rank 0's host layout, so the ranks cannot choose
    // differently even if a transport answered differently on some rank.
    if (!result->hostLeaders.empty()) {
      topology::TopologyView agreed(result->hostLeaders);
      if (agreed.describe() != view_.describe() || agreed.hostOf(rank_) != view_.hostOf(rank_)) {
        core::log(core::LogLevel::kWarn, rank_,
                  "topology: this rank's transport reported " + view_.describe() + ", rank 0's " +
                      agreed.describe() + "; using rank 0's");
      }
      agreed.setHardware(view_.hardware());
      agreed.setHostLabel(view_.hostLabel());
      view_ = std::move(agreed);
    }
  }
  if (!result->error.empty()) throw ConfigError(result->error);
  if (result->costs.source == "file") result->costs.source = "file " + mode.path;
  std::shared_ptr<topology::TuningTable> tuning;
  if (result->tuningPresent) {
    tuning = std::make_shared<topology::TuningTable>(
        topology::TuningTable::parse(result->tuningText, "GRADCOMM_TUNING_FILE " + config_.tuningFile));
  }
  useModel(result->costs, std::move(tuning), "GRADCOMM_TUNING_FILE " + config_.tuningFile);
}

void CommunicatorImpl::useModel(const topology::MachineCosts& costs, std::shared_ptr<topology::TuningTable> tuning,
                                const std::string& tuningName) {
  tuning_ = tuning;
  tuningName_ = tuningName;
  const std::string layout = topology::layoutName(view_);
  if (tuning && !tuning->layout.empty() && tuning->layout != layout) {
    if (rank_ == 0) {
      core::log(core::LogLevel::kWarn, rank_,
                tuningName + " was measured on layout " + tuning->layout + ", this communicator is " + layout +
                    ": ignoring it (the cost model decides)");
    }
    tuning.reset();
  }
  topology::ModelSettings settings;
  settings.segmentBytes = config_.segmentBytes;
  settings.shmChunkBytes = config_.shmChunkBytes;
  settings.hierRdSliceBytes = config_.hierRdSliceBytes;
  settings.hierSliceMinBytes = config_.hierSliceMinBytes;
  selector_.useModel(std::make_shared<topology::CostModel>(view_, costs, settings), tuning);
  // The view is final here (rank 0's layout): hd's order follows from it once.
  hdSameHostDistances_ = topology::hdSameHostDistances(view_);
}

void CommunicatorImpl::logStartup() const {
  if (!core::logEnabled(core::LogLevel::kInfo)) return;
  auto& t = *transport_;
  if (rank_ == 0) {
    std::string build;
    for (const auto& [key, value] : buildInfo()) build += (build.empty() ? "" : "; ") + key + " " + value;
    core::log(core::LogLevel::kInfo, rank_, "build: " + build);
    core::log(core::LogLevel::kInfo, rank_,
              "communicator: " + std::to_string(size_) + " ranks, transport " + t.name() + ", cpu kernels " +
                  kernels::toString(simd_) + ", GRADCOMM_ALGO=" + (config_.algo.empty() ? "auto" : config_.algo) +
                  ", timeout " + core::formatDuration(config_.timeout));
  }
  // One line per host, from its lowest rank: hosts may differ.
  const std::vector<int>& local = view_.hostLocalRanks(rank_);
  if (local.empty() || local.front() != rank_) return;
  std::string shm;
  if (auto* group = t.sharedMemory()) {
    shm = "yes (" + std::to_string(group->localSize()) + " ranks, chunk " + core::formatBytes(config_.shmChunkBytes) +
          ")";
  } else if (!config_.shm) {
    shm = "no (GRADCOMM_SHM=0)";
  } else if (local.size() < 2) {
    shm = "no (one rank on this host)";
  } else {
    shm = "no (this transport has none)";
  }
  std::string line = "topology: host " + view_.hostLabel() + " has ranks " + joinRanks(local) + " (" +
                     std::to_string(local.size()) + " of " + std::to_string(size_) + "); shared memory: " + shm;
  if (t.name().find("ucx") != std::string::npos) line += "; UCX transports: " + transport::ucxTransportsText();
  core::log(core::LogLevel::kInfo, rank_, line);
  core::log(core::LogLevel::kInfo, rank_, "topology: " + view_.describe() + "; " + view_.hardware().describe());
  core::log(core::LogLevel::kInfo, rank_, "waiting: " + wait_.why);
  if (const auto* model = selector_.model()) {
    core::log(core::LogLevel::kInfo, rank_, "cost model: " + model->costs().describe());
  }
}

void CommunicatorImpl::logChoice(const CollectiveCall& call, uint64_t seq, const std::string& algorithm,
                                 const std::string& why) const {
  const bool debug = core::logEnabled(core::LogLevel::kDebug);
  if (!debug && (rank_ != 0 || !core::logEnabled(core::LogLevel::kInfo))) return;
  const size_t bytes = algorithms::Selector::callBytes(call, size_);
  std::string what = std::string(toString(call.collective));
  if (call.collective != Collective::kBarrier) what += std::string(" ") + toString(call.type);
  if (isReduction(call.collective)) what += std::string(" ") + toString(call.op);
  if (rank_ == 0) {
    core::logOnce(core::LogLevel::kInfo, rank_,
                  "algorithm: " + what + " of " + sizeClass(bytes) + ": " + algorithm + (why.empty() ? "" : " (" + why + ")"));
  }
  if (debug) {
    core::log(core::LogLevel::kDebug, rank_,
              "operation " + std::to_string(seq) + ": " + what + " of " + std::to_string(bytes) + " bytes" +
                  (call.collective == Collective::kBroadcast || call.collective == Collective::kReduce
                       ? ", root " + std::to_string(call.root)
                       : std::string()) +
                  ": " + algorithm);
  }
}

CommunicatorImpl::~CommunicatorImpl() { destroy(); }

void CommunicatorImpl::destroy() {
  if (destroyed_.exchange(true)) return;
  {
    // The NCCL group goes with the last call that still uses it.
    std::lock_guard<std::mutex> lock(deviceEngineMu_);
    deviceComm_.reset();
  }
  if (own_) {
    // A group's transport must outlive its queued operations.
    std::shared_ptr<OperationState> last;
    {
      std::lock_guard<std::mutex> lock(submitMu_);
      last = std::move(lastOp_);
    }
    if (last && !last->finished()) engine_->retain(own_);
    own_.reset();
  }
  bool lastOne = false;
  {
    std::lock_guard<std::mutex> lock(context_->mu);
    lastOne = --context_->alive == 0;
  }
  // The engine is the context's: it stops with the last communicator.
  if (lastOne) engine_->shutdown("the communicator was destroyed");
}

void CommunicatorImpl::noteQueued(const std::shared_ptr<OperationState>& op) {
  if (!own_ || !op) return;
  std::lock_guard<std::mutex> lock(submitMu_);
  lastOp_ = op;
}

Work CommunicatorImpl::enqueue(const std::shared_ptr<OperationState>& op, bool eager) {
  noteQueued(op);
  engine_->submit(op, eager);
  return Work(op);
}

// ---- groups ------------------------------------------------------------------------

CommunicatorImpl::CommunicatorImpl(Member, CommunicatorImpl& parent, std::shared_ptr<transport::Transport> transport,
                                   std::vector<int> contextRanks, topology::TopologyView view)
    : context_(parent.context_),
      transport_(transport.get()),
      own_(std::move(transport)),
      contextRanks_(std::move(contextRanks)),
      config_(parent.config_),
      rank_(transport_->rank()),
      size_(transport_->size()),
      simd_(parent.simd_),
      view_(std::move(view)),
      wait_(parent.wait_),
      selector_(config_.algo, algorithms::DefaultRule{config_.smallMessageBytes, config_.treeMaxBytes}),
      engine_(parent.engine_),
      defaultCompression_(parent.defaultCompression_) {
  if (const auto* model = parent.selector_.model()) useModel(model->costs(), parent.tuning_, parent.tuningName_);
  std::lock_guard<std::mutex> lock(context_->mu);
  ++context_->alive;
}

namespace {

constexpr size_t kIdBytes = Context::kMaxGroups / 8;
constexpr size_t kRecordBytes = kIdBytes + 8;  ///< the ids a member uses, and a hash of its list

}  // namespace

uint32_t CommunicatorImpl::agreeOnGroupId(const std::vector<int>& members) {
  std::vector<uint8_t> mine(kIdBytes, 0);
  {
    std::lock_guard<std::mutex> lock(context_->mu);
    for (uint32_t id = 0; id < Context::kMaxGroups; ++id) {
      if (context_->idInUse[id]) mine[id / 8] |= static_cast<uint8_t>(1u << (id % 8));
    }
  }
  // The list itself rides along: members that listed the group differently
  // fail (their messages' fingerprints differ, and the lists are compared).
  const uint64_t listHash = core::fnv1a64(core::kFnv64Basis, members.data(), members.size() * sizeof(int));
  mine.resize(kRecordBytes);
  std::memcpy(mine.data() + kIdBytes, &listHash, sizeof listHash);
  const size_t n = members.size();
  std::vector<uint8_t> all(kRecordBytes * n, 0);
  if (n > 1) {
    // An allgather among the members alone, over the context's transport in
    // the group-forming id. Every exchange of it has the same tags, so
    // exchanges between two ranks pair up in the order both issue them.
    auto forming = std::make_shared<transport::GroupTransport>(engine_->transport(), members, Context::kFormingGroup);
    closePointToPoint();  // a collective of the members: later transfers run after it
    CollectiveCall call;
    call.collective = Collective::kAllgather;
    call.type = DataType::kUInt8;
    call.count = kRecordBytes;
    const transport::CallSignature signature = callSignature(call, "ring", {});
    transport::Tag tag;
    tag.fingerprint = signature.fingerprint() ^ static_cast<uint32_t>(listHash ^ (listHash >> 32));
    internalAllgather(mine.data(), all.data(), kRecordBytes, signature, tag, forming.get());
    for (size_t m = 0; m < n; ++m) {
      if (std::memcmp(all.data() + m * kRecordBytes + kIdBytes, &listHash, sizeof listHash) != 0) {
        throw InvalidArgument("the members passed different lists of ranks (group rank " + std::to_string(m) +
                              "'s differs from this rank's)");
      }
    }
  } else {
    all = mine;
  }
  for (uint32_t id = 1; id < Context::kFormingGroup; ++id) {
    bool used = false;
    for (size_t m = 0; m < n && !used; ++m) used = (all[m * kRecordBytes + id / 8] >> (id % 8)) & 1u;
    if (!used) {
      std::lock_guard<std::mutex> lock(context_->mu);
      if (context_->idInUse[id]) {
        throw InvalidUsage("communicator groups were formed from two threads at once over one context; form them "
                           "one at a time");
      }
      context_->idInUse[id] = 1;
      return id;
    }
  }
  throw UnsupportedError("a group cannot be formed: some member already has " +
                         std::to_string(Context::kMaxGroups - 2) +
                         " communicators split from its first one (destroy some first)");
}

void CommunicatorImpl::internalAllgather(const void* mine, void* all, size_t bytes,
                                         const transport::CallSignature& signature, const transport::Tag& tag,
                                         transport::Transport* over) {
  transport::Transport* t = over ? over : transport_;
  CollectiveCall call;
  call.collective = Collective::kAllgather;
  call.type = DataType::kUInt8;
  call.count = bytes;
  call.input = mine;
  call.output = all;
  call.inPlace = mine == static_cast<const char*>(all) + bytes * static_cast<size_t>(t->rank());
  algorithms::RunContext ctx = runContext(call, tag);
  ctx.transport = t;
  if (over) ctx.announcements = nullptr;
  auto op = OperationState::forCall(algorithms::findAlgorithm(Collective::kAllgather, "ring"), call, ctx, signature,
                                    bytes * static_cast<size_t>(t->size()));
  if (!over) noteQueued(op);
  engine_->submit(op);
  Work(op).wait();
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::subgroup(const std::vector<int>& ranks) {
  checkUsable("subgroup");
  try {
    if (ranks.empty()) throw InvalidArgument("the list of ranks is empty");
    std::vector<uint8_t> seen(static_cast<size_t>(size_), 0);
    for (int r : ranks) {
      if (r < 0 || r >= size_) {
        throw InvalidArgument("rank " + std::to_string(r) + " is not a rank of this communicator (size " +
                              std::to_string(size_) + ")");
      }
      if (seen[static_cast<size_t>(r)]++) throw InvalidArgument("rank " + std::to_string(r) + " is listed twice");
    }
    if (!seen[static_cast<size_t>(rank_)]) {
      throw InvalidArgument("this rank (" + std::to_string(rank_) +
                            ") is not in the list; only the members of the new group call it");
    }
    std::vector<int> members(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) members[i] = contextRanks_[static_cast<size_t>(ranks[i])];
    // The group's view of the hosts is this one's, renumbered.
    std::vector<int> leaders(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      size_t j = 0;
      while (view_.hostOf(ranks[j]) != view_.hostOf(ranks[i])) ++j;
      leaders[i] = static_cast<int>(j);
    }
    topology::TopologyView view(leaders);
    view.setHardware(view_.hardware());
    view.setHostLabel(view_.hostLabel());

    std::shared_ptr<transport::Transport> transport = engine_->transport().subgroup(members);
    if (!transport) {
      const uint32_t id = agreeOnGroupId(members);
      std::weak_ptr<Context> context = context_;
      auto group = std::make_shared<transport::GroupTransport>(engine_->transport(), members, id, [context, id] {
        if (auto c = context.lock()) {
          std::lock_guard<std::mutex> lock(c->mu);
          c->idInUse[id] = 0;
        }
      });
      // The context's hosts, as the base transport's shared memory knows them.
      const topology::TopologyView& view = *context_->view;
      std::vector<std::vector<int>> hosts;
      for (int h = 0; h < view.numHosts(); ++h) hosts.push_back(view.ranksOnHost(h));
      transport::Transport& base = engine_->transport();
      size_t chunk = 0;
      auto shm = transport::sharedMemoryForGroup(hosts, base.sharedMemory(), base.sharedMemoryChunkBytes(), members, &chunk);
      group->shareMemory(std::move(shm), chunk);
      transport = std::move(group);
    }
    return std::shared_ptr<CommunicatorImpl>(
        new CommunicatorImpl(Member{}, *this, std::move(transport), std::move(members), std::move(view)));
  } catch (const Error& e) {
    // As for a bad collective call: the other members would wait for this
    // rank, so the context fails on every rank with the reason.
    engine_->abort(e.code(), "rank " + std::to_string(rank_) + " could not form a subgroup: " + e.what(), true);
    rethrowAs(e.code(), "subgroup: " + std::string(e.what()));
  }
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::split(int color, int key) {
  int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  CollectiveCall call;
  call.collective = Collective::kAllgather;
  call.type = DataType::kInt32;
  call.count = 2;
  call.input = mine;
  call.output = all.data();
  submit(call, {}).wait();
  if (color < 0) return nullptr;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) ranks.push_back(r);
  }
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  return subgroup(ranks);
}

void CommunicatorImpl::validate(const CollectiveCall& c) const {
  const size_t elem = dataTypeSize(c.type);  // throws for an invalid enum
  if (isReduction(c.collective)) kernels::checkSupported(c.type, c.op);
  if ((c.collective == Collective::kBroadcast || c.collective == Collective::kReduce) &&
      (c.root < 0 || c.root >= size_)) {
    throw InvalidArgument(std::string(toString(c.collective)) + ": root " + std::to_string(c.root) +
                          " is not a rank of this communicator (size " + std::to_string(size_) + ")");
  }
  const bool perRank = c.collective == Collective::kAllgather || c.collective == Collective::kReduceScatter;
  const size_t factor = perRank ? static_cast<size_t>(size_) : 1;
  if (c.count > SIZE_MAX / 2 / elem / factor) {
    throw InvalidArgument(std::string(toString(c.collective)) + ": count " + std::to_string(c.count) +
                          " is too large to address");
  }
  validateBuffers(c, elem);
}

BufferUses buffersUsed(const CollectiveCall& c, int rank) {
  const bool root = c.root == rank;
  return {c.collective != Collective::kBroadcast || root, c.collective != Collective::kReduce || root};
}

void CommunicatorImpl::validateBuffers(const CollectiveCall& c, size_t elem) const {
  if (c.count == 0 || c.collective == Collective::kBarrier) return;
  const bool perRank = c.collective == Collective::kAllgather || c.collective == Collective::kReduceScatter;
  const size_t factor = perRank ? static_cast<size_t>(size_) : 1;
  const auto [needIn, needOut] = buffersUsed(c, rank_);
  auto what = [&](const char* which) {
    return std::string(toString(c.collective)) + ": " + which + " buffer is null but count is " +
           std::to_string(c.count) + " (pass a valid host pointer, or count 0)";
  };
  if (needIn && !c.input) throw InvalidArgument(what("input"));
  if (needOut && !c.output) throw InvalidArgument(what("output"));
  const size_t bytes = c.count * elem;
  size_t inBytes = bytes, outBytes = bytes;
  if (c.collective == Collective::kAllgather) outBytes = bytes * factor;
  if (c.collective == Collective::kReduceScatter) inBytes = bytes * factor;
  if (needIn && needOut && !c.inPlace && rangesOverlap(c.input, inBytes, c.output, outBytes)) {
    throw InvalidArgument(std::string(toString(c.collective)) +
                          ": input and output overlap without being the in-place layout (use separate buffers, "
                          "or the exact in-place pointer)");
  }
}

void CommunicatorImpl::reject(const Error& e, const CollectiveCall& call) {
  abortAndThrow(e, std::string("rejected its ") + toString(call.collective) + " call");
}

void CommunicatorImpl::abortAndThrow(const Error& e, const std::string& what) {
  engine_->abort(e.code(), "rank " + std::to_string(rank_) + " " + what + ": " + e.what(), true);
  rethrowAs(e.code(), e.what());
}

algorithms::RunContext CommunicatorImpl::runContext(const CollectiveCall& call, const transport::Tag& tag) const {
  algorithms::RunContext ctx;
  ctx.transport = transport_;
  ctx.announcements = transport_ == &engine_->transport() ? engine_->hostAnnouncements() : nullptr;
  ctx.topology = &view_;
  ctx.tag = tag;
  ctx.simd = simd_;
  if (isReduction(call.collective)) {
    ctx.reduce = kernels::reduceFunction(call.type, call.op, simd_);
    if (call.op == ReduceOp::kAvg) ctx.divide = kernels::divideFunction(call.type, simd_);
  }
  ctx.tuning.segmentBytes = config_.segmentBytes;
  ctx.tuning.exchangeSegmentBytes = view_.numHosts() > 1 ? config_.netSegmentBytes : config_.segmentBytes;
  ctx.tuning.pipelineDepth = config_.pipelineDepth;
  ctx.tuning.shmChunkBytes = config_.shmChunkBytes;
  ctx.tuning.hierRdSliceBytes = config_.hierRdSliceBytes;
  ctx.tuning.hierSliceMinBytes = config_.hierSliceMinBytes;
  ctx.tuning.hdSameHostDistances = hdSameHostDistances_;
  return ctx;
}

compression::Spec CommunicatorImpl::compressionFor(const CollectiveCall& call, const CollectiveOptions& options) const {
  if (call.collective != Collective::kAllreduce) return {};
  const bool asked = !options.compression.empty();
  compression::Spec spec = defaultCompression_;
  if (asked) {
    // The same text, call after call: parse it once per thread.
    thread_local std::string lastText;
    thread_local compression::Spec lastSpec;
    if (options.compression != lastText) {
      try {
        lastSpec = compression::Spec::parse(options.compression);
      } catch (const ConfigError& e) {
        throw InvalidArgument(std::string("CollectiveOptions::compression: ") + e.what());
      }
      lastText = options.compression;
    }
    spec = lastSpec;
  }
  if (spec.kind == compression::Kind::kNone) return spec;
  const bool applies = call.type == DataType::kFloat32 && (call.op == ReduceOp::kSum || call.op == ReduceOp::kAvg);
  if (applies) return spec;
  if (asked) {
    throw UnsupportedError("compression '" + spec.toString() + "' applies to float32 sum or avg allreduces; "
                           "this call is " + toString(call.type) + " " + toString(call.op) +
                           " (leave compression empty for it)");
  }
  core::logOnce(core::LogLevel::kInfo, rank_,
                "GRADCOMM_COMPRESSION applies only to float32 sum/avg allreduces; other calls run uncompressed");
  return {};
}

void CommunicatorImpl::checkUsable(std::string_view what) const {
  if (destroyed_.load()) {
    throw InvalidUsage(std::string(what) + " called on a destroyed communicator; create a new Communicator");
  }
  engine_->throwIfFailed();
}

Work CommunicatorImpl::submit(const CollectiveCall& call, const CollectiveOptions& options) {
  checkUsable(toString(call.collective));
  if (device::runtime().devicesPresent() && touchesDeviceMemory(call, rank_)) return submitDevice(call, options);
  closePointToPoint();  // transfers issued later run after this call
  // A signature seen before (same collective, type, op, count, root, layout
  // and options) was validated, has no compression and has its algorithm,
  // fingerprint and kernels chosen: only the buffers need checking.
  const size_t slot = (static_cast<size_t>(call.collective) * 31 + static_cast<size_t>(call.type) * 7 +
                       static_cast<size_t>(call.op) + call.count * 131 + static_cast<size_t>(call.root)) %
                      SignatureCache::kSize;
  SignatureCache::Entry e;
  bool hit = false;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    const auto& c = cache_.entries[slot];
    hit = c.valid && c.collective == call.collective && c.type == call.type && c.op == call.op &&
          c.count == call.count && c.root == call.root && c.inPlace == call.inPlace && c.forced == options.algorithm &&
          c.compression == options.compression;
    if (hit) {
      e.algorithm = c.algorithm;
      e.signature = c.signature;
      e.fingerprint = c.fingerprint;
      e.bytes = c.bytes;
      e.ctx = c.ctx;
      e.runsInline = c.runsInline;
      // A rejected call aborts the communicator, so taking the number
      // before the buffer checks cannot put the ranks out of step.
      seq = nextSeq_++;
    }
  }
  if (hit) {
    try {
      validateBuffers(call, dataTypeSize(call.type));
    } catch (const Error& err) {
      reject(err, call);
    }
    if (core::logEnabled(core::LogLevel::kDebug)) logChoice(call, seq, e.algorithm->name(), {});
  } else {
    algorithms::Selector::Choice choice{nullptr, {}, {}};
    try {
      validate(call);
      const compression::Spec spec = compressionFor(call, options);
      if (spec.kind != compression::Kind::kNone) return enqueue(compressedOperation(call, spec, options, false));
      choice = selector_.select(call, {*transport_, view_}, options.algorithm);
    } catch (const Error& err) {
      reject(err, call);
    }
    if (!choice.note.empty()) core::logOnce(core::LogLevel::kWarn, rank_, choice.note);
    const transport::CallSignature signature = callSignature(call, choice.algorithm->name(), {});
    e = {true,
         call.collective,
         call.type,
         call.op,
         call.count,
         call.root,
         call.inPlace,
         options.algorithm,
         options.compression,
         choice.algorithm,
         signature,
         signature.fingerprint(),
         algorithms::Selector::callBytes(call, size_),
         runContext(call, {}),
         false};
    e.runsInline = e.bytes <= kEagerMaxBytes && e.algorithm->runsInline(call, e.ctx);
    {
      std::lock_guard<std::mutex> lock(submitMu_);
      cache_.entries[slot] = e;
      seq = nextSeq_++;
    }
    logChoice(call, seq, e.algorithm->name(), choice.why);
  }
  e.signature.seq = seq;
  e.ctx.tag.seq = seq;
  e.ctx.tag.fingerprint = e.fingerprint;
  if (e.runsInline) {
    // A small call on an idle engine runs here with no operation object;
    // one is made only if it goes on past this call (peers late) or fails.
    auto out = engine_->submitInline(*e.algorithm, call, e.ctx, e.signature, e.bytes);
    if (out.finished) return Work(Work::Done{e.algorithm->name(), seq, e.bytes, out.start, out.end});
    if (out.taken) {
      noteQueued(out.op);
      return Work(std::move(out.op));
    }
  }
  return enqueue(OperationState::forCall(e.algorithm, call, e.ctx, e.signature, e.bytes), e.bytes <= kEagerMaxBytes);
}

transport::Tag CommunicatorImpl::numberCall(transport::CallSignature& signature) {
  {
    std::lock_guard<std::mutex> lock(submitMu_);
    signature.seq = nextSeq_++;
  }
  transport::Tag tag;
  tag.seq = signature.seq;
  tag.fingerprint = signature.fingerprint();
  return tag;
}

compression::Residual* CommunicatorImpl::residualFor(const compression::Spec& spec, const CollectiveOptions& options,
                                                     bool onDevice) const {
  // Error feedback lives only in the caller's ErrorFeedback: the
  // communicator cannot tell one tensor from another at a reused address
  // (caching allocators hand freed memory to the next tensor), so it keeps
  // no memory of its own and a call without one carries nothing.
  if (spec.errorFeedback && options.errorFeedback) {
    compression::Residual* residual = &options.errorFeedback->residual();
    // Device calls check their device when they place the residual.
    if (!onDevice) residual->checkPlace(-1);
    return residual;
  }
  if (spec.errorFeedback) {
    core::logOnce(core::LogLevel::kWarn, rank_,
                  "compression '" + spec.toString() +
                      "' asks for error feedback, but the call passes no CollectiveOptions::errorFeedback: it runs "
                      "without (gradcomm keeps no error per buffer address, which an allocator may reuse for "
                      "another tensor); pass one ErrorFeedback per tensor, or add ':ef=0' to say so");
  }
  return nullptr;
}

std::shared_ptr<OperationState> CommunicatorImpl::compressedOperation(const CollectiveCall& call,
                                                                      const compression::Spec& spec,
                                                                      const CollectiveOptions& options,
                                                                      bool onDevice, CompressedChoice* chosen) {
  const CollectiveCall inner = algorithms::compressedInnerCall(call, spec);
  std::string forced = options.algorithm;
  if (!forced.empty() && !algorithms::findAlgorithm(inner.collective, forced)) {
    core::logOnce(core::LogLevel::kWarn, rank_,
                  "algorithm '" + forced + "' cannot move a " + spec.toString() + " payload (it is not a " +
                      toString(inner.collective) + " algorithm); using the default");
    forced.clear();
  }
  auto choice = selector_.select(inner, {*transport_, view_}, forced);
  if (!choice.note.empty()) core::logOnce(core::LogLevel::kWarn, rank_, choice.note);
  const algorithms::Algorithm* algo = choice.algorithm;
  compression::Residual* residual = residualFor(spec, options, onDevice);
  auto op = OperationState::create();
  op->algorithm = spec.toString() + "+" + algo->name();
  op->signature = callSignature(call, algo->name(), spec.toString());
  op->signature.memory = onDevice ? 1 : 0;
  const transport::Tag tag = numberCall(op->signature);
  op->seq = tag.seq;
  op->fingerprint = tag.fingerprint;
  op->bytes = algorithms::Selector::callBytes(call, size_);
  logChoice(call, op->seq, op->algorithm,
            "GRADCOMM_COMPRESSION or the call's compression; the payload moves by " + choice.why);
  op->ctx = runContext(call, tag);
  op->call = call;
  op->custom = [call, spec, residual, algo](const algorithms::RunContext& ctx) {
    return algorithms::compressedAllreduce(call, ctx, spec, residual, *algo);
  };
  op->customWhat = "allreduce[" + spec.toString() + "]";
  if (chosen) *chosen = {algo, residual};
  return op;
}

}  // namespace gradcomm::detail
