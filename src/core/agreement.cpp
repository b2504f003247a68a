#include "core/agreement.hpp"

#include "algorithms/selector.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::core {
namespace {

constexpr const char* kAgreedParams[] = {
    "GRADCOMM_ALGO",        "GRADCOMM_SEGMENT_SIZE", "GRADCOMM_PIPELINE_DEPTH", "GRADCOMM_SMALL_MESSAGE",
    "GRADCOMM_TREE_MAX",    "GRADCOMM_SHM",          "GRADCOMM_SHM_CHUNK",      "GRADCOMM_BUCKET_CAP",
    "GRADCOMM_COMPRESSION", "GRADCOMM_FIRST_BUCKET", "GRADCOMM_PARTITION_SIZE", "GRADCOMM_TRANSPORT",
    "GRADCOMM_NET_SEGMENT_SIZE", "GRADCOMM_HIER_RD_SIZE", "GRADCOMM_HIER_SLICE_MIN", "GRADCOMM_DEVICE_CHUNK_SIZE",
    "GRADCOMM_DEVICE_ENGINE",
    // Ranks with different timeouts would give up at different times: one
    // fails while its peers still wait (or never do, with 0).
    "GRADCOMM_TIMEOUT",
    // Every rank takes part in the calibration and must read the same
    // tuning choices (rank 0's file), or ranks would choose differently.
    "GRADCOMM_SELECT", "GRADCOMM_CALIBRATE", "GRADCOMM_TUNING_FILE",
};

std::string agreedParams(const Options& options) {
  std::string out;
  for (const auto& p : describeParameters(options)) {
    for (const char* name : kAgreedParams) {
      if (p.name == name) out += p.name + "=" + p.value + ";";
    }
  }
  return out;
}

std::string field(const std::string& params, const std::string& name) {
  auto pos = params.find(name + "=");
  if (pos == std::string::npos) return {};
  auto end = params.find(';', pos);
  return params.substr(pos + name.size() + 1, end - pos - name.size() - 1);
}

}  // namespace

std::chrono::milliseconds connectTimeout(const Config& config) {
  if (config.timeout.count() <= 0) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<std::chrono::milliseconds>(config.timeout);
}

Config agreeOnConfiguration(const Options& options, transport::Bootstrap& boot) {
  // Validate locally, then agree: a rank whose configuration is bad must
  // not leave the others blocked in the setup that follows. Each rank sends
  // "1" + its agreed parameters, or "0" + what is wrong.
  Config config;
  std::string mine;
  try {
    config = Config::resolve(options);  // parses GRADCOMM_ALGO as the selector will
    mine = "1" + agreedParams(options);
  } catch (const Error& e) {
    mine = "0" + std::string(e.what());
  }
  const auto all = boot.allgather(mine);
  if (mine[0] != '1') throw ConfigError(mine.substr(1));
  const int rank = boot.rank();
  for (int r = 0; r < boot.size(); ++r) {
    const std::string& a = all[static_cast<size_t>(r)];
    if (a.empty() || a[0] != '1') {
      throw ConfigError("rank " + std::to_string(r) + " has an invalid configuration: " +
                        (a.empty() ? std::string("(none sent)") : a.substr(1)));
    }
  }
  for (int r = 0; r < boot.size(); ++r) {
    const std::string theirs = all[static_cast<size_t>(r)].substr(1);
    if (theirs == mine.substr(1)) continue;
    for (const char* name : kAgreedParams) {
      std::string a = field(mine.substr(1), name), b = field(theirs, name);
      if (a != b) {
        throw ConfigError(std::string(name) + " differs between ranks: rank " + std::to_string(rank) + " has '" + a +
                          "', rank " + std::to_string(r) + " has '" + b + "'; every rank must use the same value");
      }
    }
  }
  return config;
}

}  // namespace gradcomm::core
