#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/calibration_mode.hpp"
#include "topology/cost_model.hpp"
#include "topology/topology_view.hpp"
#include "transport/transport.hpp"

namespace gradcomm::topology {

/// Copy and reduction cost per byte of this core: memcpy and the float32
/// sum kernel over 8 MiB (beyond the caches), best of three passes, a few
/// milliseconds once per process. Other fields are the defaults.
MachineCosts measureLocalCosts();

/// Fits a link class's latency and bandwidth to the least small-message
/// round trip and a bulk round trip of `bulkBytes`. Bounded so that noise
/// cannot make a link look faster than physics: alpha is at most the bulk
/// one-way time, and no link moves a byte faster than one memory copy
/// (`copySecondsPerByte`, this core's memcpy rate).
LinkCost fitLink(double smallRoundTrip, double bulkRoundTrip, size_t bulkBytes, double copySecondsPerByte);

/// A link class's round floor (LinkCost::roundFloorSeconds) once a round
/// of 8-byte messages with every rank sending at once took `roundSeconds`:
/// the model adds its per-round overhead to the floor, so the floor is the
/// difference (0 when the overhead covers it). Where ranks share cores a
/// round takes far longer than a lone ping-pong, but the round's wait for
/// a core overlaps its transfer, so the floor replaces alpha only while
/// alpha plus the transfer is shorter (raising alpha itself would
/// over-price larger messages).
double fitRoundFloor(double roundSeconds, double roundOverheadSeconds);

/// The inter-host link gap (LinkCost::gapSeconds) once a round of 8-byte
/// messages in which `share` ranks of each host sent across at once took
/// `acrossSeconds`, and one in which one rank of each host did took
/// `leadersSeconds`: the difference per further message, at most a round
/// of its own (a further message never costs more than sending it after
/// the round); 0 when the across round was not slower or share < 2.
double fitLinkGap(double acrossSeconds, int share, double leadersSeconds);

/// The typical time of a kind of round from rank 0's consecutive round
/// times: the median of the means of windows of kTypicalRoundWindow rounds
/// (the plain median where there are fewer).
constexpr size_t kTypicalRoundWindow = 4;
double typicalRound(const std::vector<double>& rounds);

/// A link class's beta once a round in which every rank sent `bytes` to
/// the next rank and received as much from the previous, all at once, took
/// `roundSeconds`: what the round took beyond the model's round overhead
/// and the class's alpha, per byte, where that is more than the lone
/// ping-pong's beta (`lone`); else the lone beta. Ranks that share cores or
/// a link while they all move data at once see less than one pair alone.
double fitLoadedBeta(double roundSeconds, double bytes, const LinkCost& lone, double roundOverheadSeconds);

/// Bounds of MachineCosts::shmByteFactor (a fit outside them is clamped,
/// a file's value outside them rejected).
constexpr double kShmByteFactorMin = 0.25, kShmByteFactorMax = 16;
/// MachineCosts::shmByteFactor once a round of the calibration's
/// shared-memory data rounds took `roundSeconds` on a host of `localRanks`
/// ranks, each rank's round `roundBytes` of input: the time beyond the
/// round's three hand-offs (c.shmSyncSeconds each), per byte, over what the
/// model's formula prices a byte of a chunked call at from c's copy and
/// reduce costs (each rank copies (2L - 1) / L of the bytes and reduces
/// (L - 1) / L). Clamped to [kShmByteFactorMin, kShmByteFactorMax]; 1 where
/// nothing can be fitted (one rank, no time, no costs).
double fitShmByteFactor(double roundSeconds, double roundBytes, int localRanks, const MachineCosts& c);

/// The text of a calibration file for `layout` (layoutName(): "HxL", "1+3").
std::string formatCalibration(const MachineCosts& costs, const std::string& layout);
/// Parses a calibration file. Throws ConfigError "ORIGIN line N: ..." for a
/// malformed line; `layout` receives the file's layout line.
MachineCosts parseCalibration(const std::string& text, const std::string& origin, std::string* layout);

/// What rank 0 decides and every rank learns at creation.
struct SetupResult {
  MachineCosts costs;
  /// Rank 0's view of the hosts (every rank's lowest host-mate): every rank
  /// adopts it, so a transport that answered differently on some rank
  /// cannot make the ranks choose differently.
  std::vector<int> hostLeaders;
  bool tuningPresent = false;
  std::string tuningText;   ///< GRADCOMM_TUNING_FILE's text as rank 0 read it
  /// What rank 0 could not read (the tuning file, a calibration file):
  /// every rank throws it as a ConfigError.
  std::string error;
};

/// What rank 0 brings to the setup exchange (other ranks' inputs are ignored).
struct SetupInput {
  MachineCosts costs;        ///< the costs to use, or the local measurements to complete
  bool runPingPong = false;  ///< measure the links (else `costs` is final)
  std::chrono::nanoseconds budget{std::chrono::milliseconds(50)};  ///< ping-pong time bound
  SetupResult tuning;        ///< tuningPresent, tuningText and error only
};

/// A message exchange run once at communicator creation, before the
/// progress engine exists: the creator calls advance() until done().
class SetupExchange {
 public:
  virtual ~SetupExchange() = default;
  /// Advances as far as possible without blocking; true when anything moved.
  virtual bool advance() = 0;
  virtual bool done() const = 0;
  /// What it waits for, for the timeout message.
  virtual std::string waitingFor() const = 0;
};

/// The loaded round's messages: round i of kLoadedRingRounds carries message
/// index kLoadedRingMessageBase + i (tests that disturb one round use it).
constexpr uint32_t kLoadedRingMessageBase = 128;
constexpr int kLoadedRingRounds = 17;
/// The link gap's rounds: round k of kAcrossRounds carries message index
/// kAcrossMessageBase + k; even rounds are "across" (several ranks of each
/// host send across), odd ones "leaders" (the first rank of each host).
constexpr uint32_t kAcrossMessageBase = 160;
constexpr int kAcrossRounds = 33;
/// Hand-offs of the shared-memory phase (each host's ranks at once).
constexpr int kShmHandOffRounds = 17;
/// Then rounds with data of that phase, three hand-offs each.
constexpr int kShmDataRounds = 7;

/// The collective run once at communicator creation: rank 0 sends its
/// decisions (and the tuning file's text) to every rank, then, when asked,
/// ping-pongs with one peer per link class (the next rank of its host; the
/// first rank of the next host) within the budget, times rounds in which
/// every rank sends 8 bytes around a ring at once (the loaded round, which
/// can raise the slowest class's alpha), and, where there are several hosts
/// of several ranks, rounds in which more ranks of each host send across at
/// once (the link gap), times shared-memory hand-offs with
/// the ranks of every host at once (rank 0's host's median is the
/// hand-off's price), and sends the resulting costs to
/// every rank. Every rank ends with rank 0's numbers, so every
/// rank's selector decides alike; `result` is filled when the exchange is done.
std::unique_ptr<SetupExchange> setupExchange(transport::Transport& t, const transport::Tag& tag, const TopologyView& view,
                                             const SetupInput& input, std::shared_ptr<SetupResult> result);

/// The topology of the ranks of `t` (host of each rank from the transport,
/// hardware of this host from hwloc).
TopologyView detect(const transport::HostLayout& layout);

}  // namespace gradcomm::topology
