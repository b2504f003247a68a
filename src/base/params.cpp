#include "base/params.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>

#include <unistd.h>

#include "base/algo_rules.hpp"
#include "base/calibration_mode.hpp"
#include "base/compression_spec.hpp"
#include "base/log.hpp"
#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::core {
namespace {

using Apply = std::function<void(Config&, const std::string& value, const std::string& name)>;
using Show = std::function<std::string(const Config&)>;

struct ParamDef {
  const char* name;
  const char* defaultValue;
  const char* units;
  const char* doc;
  Apply apply;
  Show show;
};

/// A parameter kept in `field`: parse(value, name) reads it, format(field) shows it.
template <typename T, typename Parse, typename Format>
ParamDef fieldParam(const char* name, const char* def, const char* units, T Config::*field, const char* doc,
                    Parse parse, Format format) {
  return ParamDef{name, def, units, doc,
                  [field, parse](Config& c, const std::string& v, const std::string& n) { c.*field = parse(v, n); },
                  [field, format](const Config& c) { return std::string(format(c.*field)); }};
}

ParamDef bytesParam(const char* name, const char* def, size_t Config::*field, size_t minimum, const char* doc) {
  auto parse = [minimum](const std::string& v, const std::string& n) {
    const size_t b = parseBytes(v, n);
    if (b < minimum) throw ConfigError(n + "='" + v + "' is too small: the minimum is " + formatBytes(minimum));
    return b;
  };
  return fieldParam(name, def, "bytes (K/M/G suffix)", field, doc, parse, formatBytes);
}

ParamDef durationParam(const char* name, const char* def, std::chrono::nanoseconds Config::*field, const char* doc) {
  return fieldParam(name, def, "duration (s/ms/us/m/h)", field, doc, parseDuration, formatDuration);
}

ParamDef intParam(const char* name, const char* def, int Config::*field, int lo, int hi, const char* doc) {
  auto parse = [lo, hi](const std::string& v, const std::string& n) {
    return static_cast<int>(parseInteger(v, n, lo, hi));
  };
  return fieldParam(name, def, "integer", field, doc, parse, [](int v) { return std::to_string(v); });
}

ParamDef boolParam(const char* name, const char* def, bool Config::*field, const char* doc) {
  return fieldParam(name, def, "boolean (1/0)", field, doc, parseBool, [](bool v) { return v ? "1" : "0"; });
}

ParamDef stringParam(const char* name, const char* def, const char* units, std::string Config::*field,
                     const char* doc) {
  auto parse = [](const std::string& v, const std::string&) { return std::string(trim(v)); };
  return fieldParam(name, def, units, field, doc, parse, [](const std::string& v) { return v; });
}

ParamDef choiceParam(const char* name, const char* def, std::string Config::*field,
                     std::vector<std::string> choices, const char* doc) {
  std::string units = "one of ";
  for (size_t i = 0; i < choices.size(); ++i) units += (i ? "|" : "") + choices[i];
  static std::deque<std::string> keepAlive;  // ParamDef holds const char*; a deque never moves its elements
  keepAlive.push_back(units);
  auto parse = [choices, units](const std::string& v, const std::string& n) {
    std::string s = toLower(trim(v));
    if (std::find(choices.begin(), choices.end(), s) == choices.end()) {
      throw ConfigError(n + "='" + v + "' is not valid: expected " + units);
    }
    return s;
  };
  return fieldParam(name, def, keepAlive.back().c_str(), field, doc, parse, [](const std::string& v) { return v; });
}

const std::vector<ParamDef>& registry() {
  static const std::vector<ParamDef> defs = [] {
    std::vector<ParamDef> d;
    d.push_back(ParamDef{
        "GRADCOMM_ALGO", "auto", "auto | NAME | rules [COLL:][LO-HI:]NAME,...",
        "Force algorithms: 'ring' everywhere it exists, or rules such as "
        "'allreduce:0-64K:rd,allreduce:ring' (first match wins; unmatched calls use the default rule)",
        [](Config& c, const std::string& v, const std::string&) {
          // Parsed here as the communicator will parse it, so gradcomm-info
          // and every early reader reject a bad rule with the same message.
          parseAlgoRules(v);
          c.algo = std::string(trim(v));
        },
        [](const Config& c) { return c.algo; }});
    d.push_back(durationParam("GRADCOMM_TIMEOUT", "300s", &Config::timeout,
                              "Fail an operation (on every rank) when it makes no progress for this long "
                              "(0: never; must be equal on every rank)"));
    d.push_back(bytesParam("GRADCOMM_SEGMENT_SIZE", "256K", &Config::segmentBytes, 64,
                                   "Pipeline segment: largest single message of ring, tree and "
                                   "halving-doubling, so transfer of one segment overlaps reduction of the last"));
    d.push_back(bytesParam("GRADCOMM_DEVICE_CHUNK_SIZE", "4M", &Config::deviceChunkBytes, 4096,
                           "Device buffers: a call moves through pinned host memory in chunks of this "
                           "size, so copying one chunk to the host overlaps reducing the last and copying "
                           "the one before back (allreduce, broadcast, reduce; equal on every rank)"));
    d.push_back(choiceParam("GRADCOMM_DEVICE_ENGINE", "auto", &Config::deviceEngine, {"auto", "nccl", "staged"},
                            "Device buffers: 'nccl' runs a communicator's device calls on NCCL (opened at run "
                            "time; every rank on a device of its own), 'staged' moves them through pinned host "
                            "memory into gradcomm's host algorithms, 'auto' takes NCCL where it can serve every "
                            "rank (compressed allreduce too: fp16/bf16 payloads summed, top-k slots gathered on NCCL; "
                            "equal on every rank)"));
    d.push_back(bytesParam("GRADCOMM_NET_SEGMENT_SIZE", "4M", &Config::netSegmentBytes, 64,
                           "Pipeline segment of ring and halving-doubling (allreduce, reduce-scatter, "
                           "allgather) when the communicator spans hosts: fewer, larger messages between "
                           "hosts (tree and the hierarchy's waves keep GRADCOMM_SEGMENT_SIZE)"));
    d.push_back(fieldParam("GRADCOMM_NET_RATE", "0", "link rate (bit/kbit/mbit/gbit/tbit)",
                           &Config::netBitsPerSecond,
                           "The link rate between hosts the static cost model prices: 0 takes the fastest speed "
                           "a NIC of rank 0's host reports in /sys/class/net (10gbit where none does: virtual "
                           "interfaces); set it where that is not the rate a rank gets (shaped, shared or "
                           "virtual links). Rank 0's value counts",
                           [](const std::string& v, const std::string& n) { return parseBitRate(trim(v), n); },
                           formatBitRate));
    d.push_back(bytesParam("GRADCOMM_HIER_RD_SIZE", "16K", &Config::hierRdSliceBytes, 0,
                           "Hierarchical allreduce: slices (the call's bytes / ranks per host) of at most "
                           "this size are summed between hosts by recursive doubling (log2 of the hosts "
                           "rounds), larger ones by a ring; 0: always a ring"));
    d.push_back(bytesParam("GRADCOMM_HIER_SLICE_MIN", "32K", &Config::hierSliceMinBytes, 0,
                           "Hierarchical allreduce: the smallest slice a call is cut into. A call of fewer "
                           "bytes than ranks per host x this size uses fewer slices (so fewer local ranks "
                           "exchange between hosts; one slice, on each host's first rank, below twice this "
                           "size); "
                           "0: always one slice per rank of the largest host"));
    d.push_back(intParam("GRADCOMM_PIPELINE_DEPTH", "4", &Config::pipelineDepth, 1, 64,
                         "Segments in flight per peer (receive slots) in pipelined algorithms"));
    d.push_back(choiceParam("GRADCOMM_SELECT", "model", &Config::select, {"model", "rule"},
                            "How unforced calls choose their algorithm: 'model' (tuning file, then the lowest "
                            "time the cost model predicts) or 'rule' (the size rule of SMALL_MESSAGE/TREE_MAX)"));
    d.push_back(bytesParam("GRADCOMM_SMALL_MESSAGE", "16K", &Config::smallMessageBytes, 0,
                                   "Size rule (GRADCOMM_SELECT=rule): allreduce up to this size uses recursive "
                                   "doubling (latency-bound)"));
    d.push_back(bytesParam("GRADCOMM_TREE_MAX", "0", &Config::treeMaxBytes, 0,
                                   "Size rule (GRADCOMM_SELECT=rule): allreduce above SMALL_MESSAGE and up to this "
                                   "size uses the pipelined tree (0 disables)"));
    d.push_back(ParamDef{
        "GRADCOMM_CALIBRATE", "0", "0 | 1 | path",
        "Cost model inputs: 0 uses static constants from rank 0's hardware (ranks per host against CPUs, NIC "
        "speed), the same on every run; 1 measures latency and bandwidth per link class with a few ping-pongs "
        "at communicator creation; a path loads that file (rank 0 reads it; gradcomm-bench --calibrate FILE "
        "writes one): an unreadable file is an error, one of another layout leaves the static model",
        [](Config& c, const std::string& v, const std::string&) {
          topology::CalibrationMode::parse(v);  // validates
          c.calibrate = std::string(trim(v));
        },
        [](const Config& c) { return c.calibrate; }});
    d.push_back(durationParam("GRADCOMM_CALIBRATE_BUDGET", "50ms", &Config::calibrateBudget,
                              "Upper bound on the calibration ping-pongs (larger messages are skipped to stay "
                              "within it)"));
    d.push_back(stringParam("GRADCOMM_TUNING_FILE", "", "path", &Config::tuningFile,
                            "Measured choices ('gradcomm-tune' writes them) that the selector prefers "
                            "over the cost model; read by rank 0 (empty: none)"));
    d.push_back(intParam("GRADCOMM_POLL_SPINS", "200", &Config::pollSpins, 0, 1000000,
                         "Idle polls of the progress loop before it starts to yield and then sleep"));
    d.push_back(choiceParam("GRADCOMM_WAIT", "auto", &Config::wait, {"auto", "spin", "yield"},
                            "How a rank waits for its peers: spin polls with pause instructions between polls "
                            "(fastest with a core per rank), yield hands the core to other threads between "
                            "polls (needed when ranks outnumber cores: a spinning rank takes the core its peer "
                            "needs), auto yields when this host has more ranks than cores this process may run "
                            "on"));
    d.push_back(durationParam("GRADCOMM_POLL_MAX_SLEEP", "200us", &Config::pollMaxSleep,
                              "Longest sleep between polls while an operation waits on the network"));
    d.push_back(durationParam("GRADCOMM_POLL_LINGER", "5ms", &Config::pollLinger,
                              "How long an idle progress thread keeps polling before it blocks (submissions "
                              "meanwhile need no wake-up system call)"));
    d.push_back(ParamDef{
        "GRADCOMM_LOG_LEVEL", "warn", "one of error|warn|info|debug",
        "Messages printed to stderr, prefixed with the rank",
        [](Config& c, const std::string& v, const std::string& n) {
          std::string s = toLower(trim(v));
          if (s == "error") c.logLevel = LogLevel::kError;
          else if (s == "warn" || s == "warning") c.logLevel = LogLevel::kWarn;
          else if (s == "info") c.logLevel = LogLevel::kInfo;
          else if (s == "debug") c.logLevel = LogLevel::kDebug;
          else throw ConfigError(n + "='" + v + "' is not valid: expected one of error|warn|info|debug");
        },
        [](const Config& c) {
          switch (c.logLevel) {
            case LogLevel::kError: return std::string("error");
            case LogLevel::kWarn: return std::string("warn");
            case LogLevel::kInfo: return std::string("info");
            case LogLevel::kDebug: return std::string("debug");
          }
          return std::string("warn");
        }});
    d.push_back(choiceParam("GRADCOMM_SIMD", "auto", &Config::simd, {"auto", "avx512bf16", "avx512", "avx2", "scalar"},
                            "Highest SIMD level the CPU reduction and compression kernels may use (auto: the best this CPU has)"));
    d.push_back(boolParam("GRADCOMM_SHM", "1", &Config::shm,
                          "Allow the shared-memory algorithm between ranks on the same host"));
    d.push_back(bytesParam("GRADCOMM_SHM_CHUNK", "128K", &Config::shmChunkBytes, 4096,
                                   "Shared-memory algorithm: bytes per rank per pipeline chunk"));
    d.push_back(ParamDef{
        "GRADCOMM_COMPRESSION", "none", "none | fp16 | bf16 | topk:RATIO|COUNT [:ef=0|1][:exact][:prescale]",
        "Compression of float32 sum/avg allreduces (and Reducer buckets) when the call names none",
        [](Config& c, const std::string& v, const std::string&) {
          c.compression = compression::Spec::parse(v).toString();  // validates
        },
        [](const Config& c) { return c.compression; }});
    d.push_back(bytesParam("GRADCOMM_BUCKET_CAP", "25M", &Config::bucketCapBytes, 1,
                           "Reducer: largest bucket of gradients"));
    d.push_back(bytesParam("GRADCOMM_FIRST_BUCKET", "1M", &Config::firstBucketBytes, 1,
                           "Reducer: cap of the first bucket (the last gradients of backward, launched first)"));
    d.push_back(bytesParam("GRADCOMM_PARTITION_SIZE", "4M", &Config::partitionBytes, 0,
                           "Reducer: send each bucket as allreduces of at most this size, each launched as soon as "
                           "its own gradients are ready (0: whole buckets)"));
    d.push_back(stringParam("GRADCOMM_TIMELINE", "", "path", &Config::timelinePath,
                            "Reducer: write a Chrome trace (Perfetto) per rank to PATH with the rank inserted "
                            "before .json (empty: off)"));
    d.push_back(choiceParam("GRADCOMM_TRANSPORT", "auto", &Config::transport, {"auto", "mpi", "ucx"},
                            "What moves the bytes: 'mpi' (needs a communicator made from MPI), 'ucx', or 'auto' "
                            "(MPI when the communicator came from MPI, else UCX)"));
    d.push_back(choiceParam("GRADCOMM_TORCH_GROUPS", "shared", &Config::torchGroups, {"shared", "separate"},
                            "PyTorch backend only, read at each dist.new_group: 'shared' makes the group a subgroup "
                            "of the default group (its connections and threads), 'separate' a communicator of its own"));
    d.push_back(intParam("GRADCOMM_GOSSIP_MAX_STALENESS", "16", &Config::gossipMaxStaleness, 1, 1000,
                         "Gossip: mix a push at most this many steps behind the receiver's clock; later ones are "
                         "dropped (counted), and a rank that received nothing for this many steps is reported"));
    d.push_back(durationParam("GRADCOMM_GOSSIP_PEER_TIMEOUT", "10s", &Config::gossipPeerTimeout,
                              "Gossip: a peer more than MAX_STALENESS steps behind that sent no push for this long (or "
                              "whose transfer failed) is removed from the gossip graph; the others keep going"));
    d.push_back(intParam("GRADCOMM_GOSSIP_PEERS", "1", &Config::gossipPeers, 1, 64,
                         "Gossip: peers each rank pushes to per step (distances 2^i of the exponential graph)"));
    d.push_back(ParamDef{
        "GRADCOMM_STATS", "0", "integer N (steps), or 1/0",
        "Reducer: print communication statistics to stderr every N steps (1: every step; 0: off), on rank 0 "
        "unless GRADCOMM_STATS_ALL_RANKS=1",
        [](Config& c, const std::string& v, const std::string& n) {
          const std::string s = toLower(trim(v));
          if (s == "true" || s == "on" || s == "yes") c.statsEvery = 1;
          else if (s == "false" || s == "off" || s == "no") c.statsEvery = 0;
          else c.statsEvery = static_cast<int>(parseInteger(v, n, 0, 1000000000));
        },
        [](const Config& c) { return std::to_string(c.statsEvery); }});
    d.push_back(boolParam("GRADCOMM_STATS_ALL_RANKS", "0", &Config::statsAllRanks,
                          "GRADCOMM_STATS prints on every rank instead of rank 0 only"));
    return d;
  }();
  return defs;
}

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// GRADCOMM_* variables that are not parameters but are read elsewhere:
/// the launch variables, and those of the project's scripts and build
/// (a test run or a pip build exports them to every process it starts).
bool readElsewhere(const std::string& name) {
  static const char* const kExact[] = {"GRADCOMM_RANK",          "GRADCOMM_WORLD_SIZE",   "GRADCOMM_RENDEZVOUS",
                                      "GRADCOMM_LOCAL_RANK",    "GRADCOMM_SKIP_SANITIZERS", "GRADCOMM_REQUIRE_CUDA",
                                      "GRADCOMM_VENV",          "GRADCOMM_BASE_PYTHON",  "GRADCOMM_MPIRUN_ARGS",
                                      "GRADCOMM_UCX_WHEEL",     "GRADCOMM_WITH_CUDA",    "GRADCOMM_WITH_NCCL"};
  static const char* const kPrefixes[] = {"GRADCOMM_NCCL_", "GRADCOMM_TEST_", "GRADCOMM_NETNS_"};
  for (const char* e : kExact) {
    if (name == e) return true;
  }
  for (const char* p : kPrefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

/// Warns once per process about each GRADCOMM_* variable that nothing reads.
void warnAboutUnknownEnvironment(LogLevel level) {
  if (level < LogLevel::kWarn) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("GRADCOMM_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    std::string warning = unknownEnvironmentWarning(name);
    if (warning.empty()) continue;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!warned.insert(name).second) continue;
    }
    core::log(LogLevel::kWarn, -1, warning);
  }
}

}  // namespace

std::string unknownEnvironmentWarning(const std::string& name) {
  if (name.rfind("GRADCOMM_", 0) != 0 || readElsewhere(name)) return {};
  const std::string shortName = name.substr(9);
  const ParamDef* best = nullptr;
  size_t bestDistance = SIZE_MAX;
  for (const auto& def : registry()) {
    if (name == def.name) return {};
    const size_t d = editDistance(shortName, std::string(def.name).substr(9));
    if (d < bestDistance) {
      bestDistance = d;
      best = &def;
    }
  }
  std::string out = "the environment sets " + name + ", which is not a gradcomm parameter and is ignored";
  // A suggestion only when it is plausibly the same word: at most a third of it differs.
  if (best && bestDistance <= std::max<size_t>(2, shortName.size() / 3)) {
    out += "; did you mean " + std::string(best->name) + "?";
  } else {
    out += " (gradcomm-info lists every parameter)";
  }
  return out;
}

std::string canonicalParamName(const std::string& name) {
  std::string upper;
  for (char ch : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::string full = upper.rfind("GRADCOMM_", 0) == 0 ? upper : "GRADCOMM_" + upper;
  for (const auto& def : registry()) {
    if (full == def.name) return full;
  }
  return {};
}

std::vector<ParamDescription> describeConfig(const Config& c) {
  std::vector<ParamDescription> out;
  for (const auto& def : registry()) {
    out.push_back(ParamDescription{def.name, def.show(c), def.defaultValue, def.units, def.doc, c.origins.at(def.name)});
  }
  return out;
}

std::string knownParamNames() {
  std::string out;
  for (const auto& def : registry()) out += (out.empty() ? "" : ", ") + std::string(def.name);
  return out;
}

Config Config::resolve(const Options& explicitOptions) {
  Config c;
  for (const auto& def : registry()) {
    def.apply(c, def.defaultValue, def.name);
    ParamOrigin origin = ParamOrigin::kDefault;
    std::string value;
    auto it = explicitOptions.values().find(def.name);
    if (it != explicitOptions.values().end()) {
      value = it->second;
      origin = ParamOrigin::kExplicit;
    } else if (const char* env = std::getenv(def.name)) {
      value = env;
      origin = ParamOrigin::kEnvironment;
    }
    if (origin != ParamOrigin::kDefault) def.apply(c, value, def.name);
    c.origins[def.name] = origin;
  }
  warnAboutUnknownEnvironment(c.logLevel);
  return c;
}

}  // namespace gradcomm::core

namespace gradcomm {

const char* toString(ParamOrigin origin) {
  switch (origin) {
    case ParamOrigin::kDefault: return "default";
    case ParamOrigin::kEnvironment: return "environment";
    case ParamOrigin::kExplicit: return "explicit";
  }
  return "?";
}

Options& Options::set(const std::string& name, const std::string& value) {
  std::string canonical = core::canonicalParamName(name);
  if (canonical.empty()) {
    throw ConfigError("unknown parameter '" + name + "'; known parameters: " + core::knownParamNames());
  }
  values_[canonical] = value;
  return *this;
}

std::vector<ParamDescription> describeParameters(const Options& explicitOptions) {
  return core::describeConfig(core::Config::resolve(explicitOptions));
}

std::string parameterValue(const std::string& name, const Options& explicitOptions) {
  const std::string canonical = core::canonicalParamName(name);
  if (canonical.empty()) {
    throw ConfigError("unknown parameter '" + name + "'; known parameters: " + core::knownParamNames());
  }
  for (const auto& p : describeParameters(explicitOptions)) {
    if (p.name == canonical) return p.value;
  }
  throw ConfigError("parameter " + canonical + " is registered but has no description");
}

std::chrono::nanoseconds operationTimeout(const Options& explicitOptions) {
  return core::Config::resolve(explicitOptions).timeout;
}

}  // namespace gradcomm
