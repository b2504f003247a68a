#pragma once
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "gradcomm/config.hpp"

namespace gradcomm::core {

using gradcomm::LogLevel;

/// Every tunable of the library, resolved once from defaults, the
/// environment and explicit Options (in rising priority). Each field is
/// registered exactly once in params.cpp with its GRADCOMM_* name, default,
/// units and doc line.
struct Config {
  std::string algo;                       // GRADCOMM_ALGO: "auto" or override rules
  std::chrono::nanoseconds timeout{};     // GRADCOMM_TIMEOUT
  size_t segmentBytes = 0;                // GRADCOMM_SEGMENT_SIZE
  size_t deviceChunkBytes = 0;            // GRADCOMM_DEVICE_CHUNK_SIZE
  std::string deviceEngine;               // GRADCOMM_DEVICE_ENGINE: auto, nccl or staged
  size_t netSegmentBytes = 0;             // GRADCOMM_NET_SEGMENT_SIZE
  double netBitsPerSecond = 0;            // GRADCOMM_NET_RATE (0: the NIC's speed)
  size_t hierRdSliceBytes = 0;            // GRADCOMM_HIER_RD_SIZE
  size_t hierSliceMinBytes = 0;           // GRADCOMM_HIER_SLICE_MIN
  int pipelineDepth = 0;                  // GRADCOMM_PIPELINE_DEPTH
  size_t smallMessageBytes = 0;           // GRADCOMM_SMALL_MESSAGE
  size_t treeMaxBytes = 0;                // GRADCOMM_TREE_MAX
  int pollSpins = 0;                      // GRADCOMM_POLL_SPINS
  std::chrono::nanoseconds pollMaxSleep{};  // GRADCOMM_POLL_MAX_SLEEP
  std::chrono::nanoseconds pollLinger{};    // GRADCOMM_POLL_LINGER
  std::string wait;                       // GRADCOMM_WAIT: auto, spin or yield
  LogLevel logLevel = LogLevel::kWarn;    // GRADCOMM_LOG_LEVEL
  std::string simd;                       // GRADCOMM_SIMD
  bool shm = true;                        // GRADCOMM_SHM
  size_t shmChunkBytes = 0;               // GRADCOMM_SHM_CHUNK
  std::string compression;                // GRADCOMM_COMPRESSION
  size_t bucketCapBytes = 0;              // GRADCOMM_BUCKET_CAP
  size_t firstBucketBytes = 0;            // GRADCOMM_FIRST_BUCKET
  size_t partitionBytes = 0;              // GRADCOMM_PARTITION_SIZE
  std::string timelinePath;               // GRADCOMM_TIMELINE
  int statsEvery = 0;                     // GRADCOMM_STATS: print every N steps (0: off)
  bool statsAllRanks = false;             // GRADCOMM_STATS_ALL_RANKS
  std::string transport;                  // GRADCOMM_TRANSPORT: auto, mpi or ucx
  std::string torchGroups;                // GRADCOMM_TORCH_GROUPS: shared or separate (PyTorch backend)
  int gossipMaxStaleness = 0;             // GRADCOMM_GOSSIP_MAX_STALENESS (steps)
  std::chrono::nanoseconds gossipPeerTimeout{};  // GRADCOMM_GOSSIP_PEER_TIMEOUT
  int gossipPeers = 0;                    // GRADCOMM_GOSSIP_PEERS: out-peers per step
  std::string select;                     // GRADCOMM_SELECT: model or rule
  std::string calibrate;                  // GRADCOMM_CALIBRATE: 0, 1 or a path
  std::chrono::nanoseconds calibrateBudget{};  // GRADCOMM_CALIBRATE_BUDGET
  std::string tuningFile;                 // GRADCOMM_TUNING_FILE

  std::map<std::string, ParamOrigin> origins;

  /// Resolves every parameter; throws ConfigError on a malformed value or an
  /// unknown explicit option name.
  static Config resolve(const Options& explicitOptions = {});
};

/// Every parameter of `config`, as describeParameters() lists them.
std::vector<ParamDescription> describeConfig(const Config& config);

/// Canonical "GRADCOMM_X" form of "X" or "GRADCOMM_X"; empty when unknown.
std::string canonicalParamName(const std::string& name);
/// Comma-separated list of every parameter name, for error messages.
std::string knownParamNames();
/// The warning for an unknown GRADCOMM_* environment variable (a typo such
/// as GRADCOMM_TIMEOUTT), naming the closest parameter; empty for a known
/// name and for the variables read elsewhere (launch, NCCL shim, tests).
std::string unknownEnvironmentWarning(const std::string& name);

}  // namespace gradcomm::core
