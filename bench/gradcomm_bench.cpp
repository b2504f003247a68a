// gradcomm-bench: mpirun sweeps in the format of nccl-tests' *_perf tools.
//
//   mpirun -np 2 gradcomm-bench -b 8 -e 128M -f 2 --algo all --baseline mpi,memcpy
//
// For every algorithm (and baseline) it prints one nccl-tests table: size,
// count, type, redop, root, then time(us), algbw and busbw (GB/s, 1e9) and
// #wrong for out-of-place and in-place runs, and the "Avg bus bandwidth"
// footer. Buffers rotate between iterations so caches are not what is
// measured; #wrong counts elements that differ from the exact expected result.
#if GRADCOMM_HAVE_MPI
#include <mpi.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gradcomm/gradcomm.hpp"
#if GRADCOMM_HAVE_MPI
#include "gradcomm/mpi.hpp"
#endif
#include "device_memory.hpp"
#include "launch.hpp"

using namespace gradcomm;

namespace {

struct Args {
  size_t minBytes = 32 * 1024 * 1024;
  size_t maxBytes = 32 * 1024 * 1024;
  double factor = 2;
  size_t increment = 0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::vector<DataType> types = {DataType::kFloat32};
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  int root = 0;
  Collective collective = Collective::kAllreduce;
  std::vector<std::string> algos = {"default"};
  std::vector<std::string> baselines;
  std::string json;
  std::string csv;
  std::string tune;  // --tune FILE: write the fastest algorithm per size as a tuning file
  std::string calibrate;  // --calibrate FILE: measure the links at creation, write the costs
  std::vector<std::string> compressions;  // empty: GRADCOMM_COMPRESSION's value (allreduce), else none
  std::vector<std::string> transports;  // empty: the default of the launch
  bool noMpi = false;
  bool quiet = false;
  bool median = false;  ///< --median: each rank's median call time, not the mean
  /// --interleave: every configuration at one size before the next size,
  /// so the times compared at a size are taken close together.
  bool interleave = false;
  bool digest = false;  ///< --digest: a hash of one call's result on random floats
  bool device = false;  ///< --memory device: CUDA buffers and a stream
};

struct Row {
  std::string algorithm;  // "default", an algorithm name, or "baseline:<name>"
  std::string executed;   // what actually ran (the selector's choice for "default")
  std::string compression;
  std::string transport;
  DataType type;
  ReduceOp op;
  size_t bytes;
  size_t count;
  int root;
  bool inPlace;
  double timeUs;
  double algbw;
  double busbw;
  long long wrong;
  /// The cost model's prediction for the algorithm that ran, from the
  /// calibration this communicator made (gradcomm's uncompressed rows; < 0:
  /// none, as for baselines, compression, or GRADCOMM_SELECT=rule).
  double predictedUs = -1;
  /// --digest: the ranks' summed FNV-1a hashes of one call's output; 0: none.
  uint64_t digest = 0;
};

int gRank = 0, gSize = 1;
bool gUseMpi = true;  // false: launched without MPI (rendezvous from the environment)

Communicator* gEnvComm = nullptr;  // MPI-free runs: the communicator formed from the environment

/// Rank 0's `text` on every rank (over MPI, or the MPI-free communicator).
std::string fromRankZero(std::string text) {
  int64_t len = static_cast<int64_t>(text.size());
#if GRADCOMM_HAVE_MPI
  if (gUseMpi) {
    MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  } else
#endif
  {
    gEnvComm->broadcast(&len, &len, 1, DataType::kInt64, 0).wait();
  }
  text.resize(static_cast<size_t>(len));
  if (len == 0) return text;
#if GRADCOMM_HAVE_MPI
  if (gUseMpi) {
    MPI_Bcast(&text[0], static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  } else
#endif
  {
    gEnvComm->broadcast(&text[0], &text[0], static_cast<size_t>(len), DataType::kUInt8, 0).wait();
  }
  return text;
}

[[noreturn]] void die(const std::string& msg) {
  if (gRank == 0) std::fprintf(stderr, "gradcomm-bench: %s\n", msg.c_str());
  bench::finalizeMpiIfUp();
  std::exit(2);
}


size_t parseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suffix = end ? std::string(end) : "";
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) die("bad size '" + s + "' (use 8, 64K, 128M, 1G)");
  if (end == s.c_str() || !std::isfinite(v) || v < 0 || v * mult > 1e18) die("bad size '" + s + "'");
  return static_cast<size_t>(v * mult);
}

int parseInt(const std::string& text, const std::string& option, long lo, long hi) {
  const auto v = bench::wholeNumber(text, lo, hi);
  if (!v) {
    die(option + " takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + text +
        "'");
  }
  return static_cast<int>(*v);
}

double parseNumber(const std::string& text, const std::string& option) {
  const auto v = bench::realNumber(text);
  if (!v) die(option + " takes a number, got '" + text + "'");
  return *v;
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

const char* ncclTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kFloat16: return "half";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "?";
}

void usage() {
  if (gRank != 0) return;
  std::printf(
      "usage: mpirun -np N gradcomm-bench [options]\n"
      "   or: GRADCOMM_RANK=R GRADCOMM_WORLD_SIZE=N GRADCOMM_RENDEZVOUS=host:port gradcomm-bench [options]\n"
      "  -b, --minbytes SIZE     smallest size (default 32M; K/M/G suffixes)\n"
      "  -e, --maxbytes SIZE     largest size (default 32M)\n"
      "  -f, --stepfactor F      multiply the size by F each step (default 2)\n"
      "  -i, --stepbytes SIZE    add SIZE each step instead of multiplying\n"
      "  -n, --iters N           timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N    untimed iterations first (default 5)\n"
      "  -c, --check 0|1         check results and count #wrong (default 1)\n"
      "  -d, --datatype T        float, half, bfloat16, double, int8, uint8, int32, int64, all\n"
      "  -o, --op OP             sum, prod, min, max, avg, all\n"
      "  -r, --root R            root of broadcast (default 0)\n"
      "  --collective C          allreduce (default), allgather, reducescatter, broadcast\n"
      "  --algo NAME|LIST|all    gradcomm algorithm(s); 'default' = the selector's choice\n"
      "  --baseline LIST         any of mpi (MPI's own collective), memcpy (each rank copies\n"
      "                          the same bytes), p2p (one-way stream rank 0 -> rank 1)\n"
      "  --compression LIST      none, fp16, bf16, topk:RATIO (e.g. topk:0.01); each a separate table;\n"
      "                          default: GRADCOMM_COMPRESSION's value (none when unset)\n"
      "                          #wrong is checked for none/fp16/bf16 (exact on the test data), not for top-k\n"
      "  --transport LIST        mpi, ucx: a table per transport (under mpirun, ucx is bootstrapped\n"
      "                          through MPI); default mpi under mpirun, ucx without MPI\n"
      "  --no-mpi                never initialise MPI, even under mpirun (rank and size from\n"
      "                          OMPI_COMM_WORLD_*, rendezvous as in communicatorFromEnvironment)\n"
      "  --json FILE, --csv FILE write every row (rank 0)\n"
      "  --tune FILE             measure every algorithm (implies --algo all) and write, per size, the\n"
      "                          fastest (out-of-place time) as a GRADCOMM_TUNING_FILE for this layout;\n"
      "                          under Open MPI prefer gradcomm-tune [options] FILE (mpirun takes\n"
      "                          --tune FILE for its own parameter file)\n"
      "  --calibrate FILE        create the communicators with GRADCOMM_CALIBRATE=1 (latency and\n"
      "                          bandwidth of each link class measured at creation) and write the\n"
      "                          first one's costs to FILE, which GRADCOMM_CALIBRATE=FILE loads in\n"
      "                          later jobs of this layout (the sizes asked for are measured too)\n"
      "  -q, --quiet             no progress on stderr\n"
      "  --median                time each call and report the median (the slowest rank's), not the\n"
      "                          mean of the whole run: robust to a rare long stall on a busy host\n"
      "  --digest                after timing each size, run one call on random values of mixed\n"
      "                          magnitudes and report a hash of every rank's result (the JSON's\n"
      "                          \"digest\"): equal hashes across runs = bitwise-identical results\n"
      "  --memory host|device    where the buffers live (default host). device: CUDA buffers on\n"
      "                          GPU (local rank mod GPUs), each call on a stream of the bench's\n"
      "                          and waited for; baselines: memcpy (device to device); mpi and p2p\n"
      "                          are host-only. Needs a build with CUDA and a GPU (exits 77 without)\n"
      "  --interleave            measure every configuration (algorithms, baselines) at a size before\n"
      "                          the next size, instead of one configuration's whole sweep after the\n"
      "                          other: on a machine whose speed drifts, the ratios at a size compare\n"
      "                          times taken moments apart (the tables print as usual)\n"
      "Sizes are bytes of the whole buffer as in nccl-tests (allgather: the output,\n"
      "reducescatter: the input). busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n\n"
      "(allgather, reducescatter), 1 (broadcast, baselines memcpy and p2p).\n");
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (bench::ArgWalk w(argc, argv, die); w.next();) {
    const std::string& k = w.key();
    auto next = [&] { return w.value(); };
    if (k == "-h" || k == "--help") {
      usage();
      bench::finalizeMpiIfUp();
      std::exit(0);
    } else if (k == "-b" || k == "--minbytes") {
      a.minBytes = parseSize(next());
    } else if (k == "-e" || k == "--maxbytes") {
      a.maxBytes = parseSize(next());
    } else if (k == "-f" || k == "--stepfactor") {
      a.factor = parseNumber(next(), k);
    } else if (k == "-i" || k == "--stepbytes") {
      a.increment = parseSize(next());
    } else if (k == "-n" || k == "--iters") {
      a.iters = parseInt(next(), k, 1, 1000000000);
    } else if (k == "-w" || k == "--warmup_iters") {
      a.warmup = parseInt(next(), k, 0, 1000000000);
    } else if (k == "-c" || k == "--check") {
      a.check = parseInt(next(), k, 0, 1) != 0;
    } else if (k == "-d" || k == "--datatype") {
      std::string v = next();
      a.types.clear();
      if (v == "all") {
        for (int t = 0; t < kNumDataTypes; ++t) a.types.push_back(static_cast<DataType>(t));
      } else {
        for (const auto& s : splitList(v)) {
          try {
            a.types.push_back(parseDataType(s));
          } catch (const Error& e) {
            die(e.what());
          }
        }
      }
    } else if (k == "-o" || k == "--op") {
      std::string v = next();
      a.ops.clear();
      if (v == "all") {
        for (int o = 0; o < kNumReduceOps; ++o) a.ops.push_back(static_cast<ReduceOp>(o));
      } else {
        for (const auto& s : splitList(v)) {
          try {
            a.ops.push_back(parseReduceOp(s));
          } catch (const Error& e) {
            die(e.what());
          }
        }
      }
    } else if (k == "-r" || k == "--root") {
      a.root = parseInt(next(), k + " (a rank)", 0, gSize - 1);
    } else if (k == "--collective") {
      try {
        a.collective = parseCollective(next());
      } catch (const Error& e) {
        die(e.what());
      }
    } else if (k == "--algo") {
      a.algos = splitList(next());
    } else if (k == "--baseline") {
      a.baselines = splitList(next());
    } else if (k == "--transport") {
      a.transports = splitList(next());
      for (const auto& t : a.transports) {
        if (t != "mpi" && t != "ucx") die("unknown transport '" + t + "'; valid: mpi, ucx");
      }
    } else if (k == "--no-mpi") {
      a.noMpi = true;
    } else if (k == "--compression") {
      a.compressions = splitList(next());
    } else if (k == "--json") {
      a.json = next();
    } else if (k == "--csv") {
      a.csv = next();
    } else if (k == "--tune") {
      a.tune = next();
    } else if (k == "--calibrate") {
      a.calibrate = next();
    } else if (k == "-q" || k == "--quiet") {
      a.quiet = true;
    } else if (k == "--median") {
      a.median = true;
    } else if (k == "--interleave") {
      a.interleave = true;
    } else if (k == "--digest") {
      a.digest = true;
    } else if (k == "--memory") {
      const std::string v = next();
      if (v != "host" && v != "device") die("--memory must be host or device, not '" + v + "'");
      a.device = v == "device";
    } else {
      usage();
      die("unknown option '" + k + "'");
    }
  }
  if (a.minBytes > a.maxBytes) die("-b is larger than -e");
  if (a.factor <= 1 && a.increment == 0) die("-f must be above 1 (or use -i)");
  if (a.iters < 1 || a.warmup < 0) die("-n must be at least 1 and -w at least 0");
  if (a.collective == Collective::kReduce || a.collective == Collective::kBarrier) {
    die("--collective must be allreduce, allgather, reducescatter or broadcast");
  }
  if (!a.tune.empty()) {
    if (a.algos.size() == 1 && a.algos[0] == "default") a.algos = {"all"};
    if (a.types.size() != 1 || a.ops.size() != 1) die("--tune measures one data type and one op (-d, -o)");
    if (!a.compressions.empty() && (a.compressions.size() != 1 || a.compressions[0] != "none")) {
      die("--tune measures uncompressed calls (leave --compression out)");
    }
    a.compressions = {"none"};
  }
  if (a.compressions.empty()) {
    // Without --compression, measure what the library would run: the
    // environment's default compression (it applies to allreduce only).
    const char* env = std::getenv("GRADCOMM_COMPRESSION");
    std::string fromEnv = env && a.collective == Collective::kAllreduce ? env : "";
    fromEnv.erase(0, fromEnv.find_first_not_of(" \t"));
    fromEnv.erase(fromEnv.find_last_not_of(" \t") + 1);
    a.compressions = {fromEnv.empty() ? std::string("none") : fromEnv};
  }
  for (const auto& b : a.baselines) {
    if (b != "mpi" && b != "memcpy" && b != "p2p") die("unknown baseline '" + b + "'; valid: mpi, memcpy, p2p");
    if (!gUseMpi && b != "memcpy") die(bench::needsMpi("--baseline " + b));
  }
  for (const auto& t : a.transports) {
    if (!gUseMpi && t == "mpi") die(bench::needsMpi("--transport mpi"));
  }
  // Only rank 0 writes the files: it checks them, and every rank leaves with its verdict.
  std::string why;
  if (gRank == 0) {
    for (const auto& [option, path] :
         {std::pair<std::string, std::string>{"--json", a.json}, {"--csv", a.csv}, {"--tune", a.tune},
          {"--calibrate", a.calibrate}}) {
      if (!path.empty() && why.empty() && !bench::unwritable(path).empty()) why = option + ": " + bench::unwritable(path);
    }
  }
  why = fromRankZero(why);
  if (!why.empty()) die(why);
  return a;
}

/// Writes, per measured size, the algorithm with the lowest out-of-place
/// time (rows with no wrong element) as a GRADCOMM_TUNING_FILE: one entry
/// per run of sizes with the same winner, from the first size of the run to
/// the first size of the next (the first from 0, the last open). Every row
/// counts for the algorithm it executed, whatever it asked for: the
/// default's row and a forced row that fell back are measurements of that
/// algorithm too, so one stalled row does not hand a size to another.
/// Returns why it failed, or "".
std::string writeTuningFile(const std::string& path, const std::vector<Row>& rows, Collective collective,
                            const std::string& transport, const std::string& layout) {
  std::map<size_t, std::pair<std::string, double>> best;  // bytes -> (algorithm, time)
  const std::vector<std::string> names = algorithmNames(collective);
  for (const Row& r : rows) {
    if (r.inPlace || r.algorithm.rfind("baseline:", 0) == 0) continue;
    if (r.transport != transport || r.wrong > 0) continue;
    // Only what a tuning file may name (a device call's engine, "nccl", is not).
    if (std::find(names.begin(), names.end(), r.executed) == names.end()) continue;
    auto it = best.find(r.bytes);
    if (it == best.end() || r.timeUs < it->second.second) best[r.bytes] = {r.executed, r.timeUs};
  }
  if (best.empty()) return "--tune: no algorithm ran successfully, nothing to write";
  std::ostringstream out;
  out << "# gradcomm tuning file written by gradcomm-tune (" << toString(collective) << ", transport "
      << transport << "): the fastest algorithm per measured size\n";
  if (!layout.empty()) out << "layout " << layout << "\n";  // Communicator::layout(): "2x2", "1+3"
  std::string current;
  size_t from = 0;
  auto emit = [&](size_t to) {
    out << toString(collective) << " " << from << "-" << (to == SIZE_MAX ? std::string("inf") : std::to_string(to))
        << " " << current << "\n";
  };
  for (const auto& [bytes, choice] : best) {
    if (choice.first == current) continue;
    if (!current.empty()) {
      emit(bytes);
      from = bytes;
    }
    current = choice.first;
  }
  emit(SIZE_MAX);
  std::ofstream f(path);
  f << out.str();
  f.close();
  if (!f) return "--tune: could not write '" + path + "'";
  std::printf("# tuning file written to %s\n", path.c_str());
  return "";
}

double busFactor(Collective c, int n) {
  switch (c) {
    case Collective::kAllreduce: return 2.0 * (n - 1) / n;
    case Collective::kAllgather:
    case Collective::kReduceScatter: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

// ---- data and checking -------------------------------------------------------

// Small integers, so that every reduction order is exact in every type:
// value(i, r) in [-4, 3] (prod: in {-1, 1, 2} on few ranks, else {-1, 1}).
int baseValue(size_t i, int rank, ReduceOp op) {
  if (op == ReduceOp::kProd) {
    static const int kVals[] = {1, -1, 2, 1, -1, 1};
    int v = kVals[(i * 7 + static_cast<size_t>(rank) * 3) % 6];
    return (gSize > 8 && v == 2) ? 1 : v;
  }
  return static_cast<int>((i * 13 + static_cast<size_t>(rank) * 7) % 8) - 4;
}

void store(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kFloat16: {
      // Small integers: exact conversion by hand (sign, exponent, mantissa).
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h = static_cast<uint16_t>(((u >> 16) & 0x8000) | (f == 0 ? 0 : ((((u >> 23) & 0xFF) - 112) << 10) | ((u >> 13) & 0x3FF)));
      static_cast<uint16_t*>(p)[i] = h;
      break;
    }
    case DataType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
      break;
    }
    case DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int>(v) & 0xFF); break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

double load(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: {
      uint16_t h = static_cast<const uint16_t*>(p)[i];
      int e = (h >> 10) & 31, m = h & 1023;
      double s = (h & 0x8000) ? -1 : 1;
      if (e == 0) return s * std::ldexp(m, -24);
      if (e == 31) return m ? NAN : s * INFINITY;
      return s * std::ldexp(1024 + m, e - 25);
    }
    case DataType::kBFloat16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

double expectedReduction(size_t i, ReduceOp op, DataType t) {
  double acc = 0;
  for (int r = 0; r < gSize; ++r) {
    double v = baseValue(i, r, op);
    if (t == DataType::kUInt8) v = static_cast<double>(static_cast<int>(v) & 0xFF);
    if (r == 0) acc = v;
    else if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
    else if (op == ReduceOp::kProd) acc *= v;
    else if (op == ReduceOp::kMin) acc = std::min(acc, v);
    else acc = std::max(acc, v);
  }
  if (t == DataType::kUInt8 && (op == ReduceOp::kSum || op == ReduceOp::kProd)) acc = static_cast<int>(acc) & 0xFF;
  if (t == DataType::kInt8 && (op == ReduceOp::kSum || op == ReduceOp::kProd)) acc = static_cast<int8_t>(static_cast<int>(acc));
  if (op == ReduceOp::kAvg) {
    acc = t == DataType::kFloat64 ? acc / gSize : static_cast<double>(static_cast<float>(acc) / static_cast<float>(gSize));
  }
  return acc;
}

bool close(DataType t, double got, double want) {
  if (t == DataType::kFloat16) return std::fabs(got - want) <= std::fabs(want) * 1e-3;
  if (t == DataType::kBFloat16) return std::fabs(got - want) <= std::fabs(want) * 8e-3;
  if (t == DataType::kFloat32) return got == want || std::fabs(got - want) <= std::fabs(want) * 1e-6;
  return got == want;
}

// Rotating buffers: enough sets that the footprint exceeds the caches.
bench::DeviceMemory gMemory;  // --memory device: CUDA buffers and a stream

struct Buffers {
  size_t inBytes = 0, outBytes = 0;
  int sets = 1;
  std::vector<unsigned char*> in, out;
  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() { clear(); }
  void clear() {
    for (unsigned char* p : in) gMemory.release(p);
    for (unsigned char* p : out) gMemory.release(p);
    in.clear();
    out.clear();
  }
  void allocate(size_t inB, size_t outB) {
    inBytes = inB;
    outBytes = outB;
    const size_t footprint = 256u << 20;
    const size_t per = std::max<size_t>(inB + outB, 1);
    sets = static_cast<int>(std::clamp<size_t>((footprint + per - 1) / per, 2, 16));
    clear();
    for (int s = 0; s < sets; ++s) {
      in.push_back(gMemory.allocate(inB));
      out.push_back(gMemory.allocate(outB));
    }
  }
  /// Fills every set's input with the `bytes` that `fill` writes in host memory.
  template <typename F> void fillInputs(size_t bytes, F&& fill) {
    std::vector<unsigned char> host(std::max<size_t>(bytes, 1));
    fill(host.data());
    for (unsigned char* p : in) gMemory.upload(p, host.data(), bytes);
  }
};

// ---- running one configuration ------------------------------------------------

/// The bench's own bookkeeping (barriers, the slowest rank's time, the
/// #wrong sums): over MPI under mpirun, else over a gradcomm communicator.
struct Control {
  bench::MpiComm mpi{};
  Communicator* comm = nullptr;  // MPI-free runs (always, in a build without MPI)
  void barrier() const {
    if (comm) comm->barrier().wait();
#if GRADCOMM_HAVE_MPI
    else MPI_Barrier(mpi);
#endif
  }
  double max(double v) const {
    if (comm) comm->allreduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kMax).wait();
#if GRADCOMM_HAVE_MPI
    else MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, mpi);
#endif
    return v;
  }
  long long sum(long long v) const {
    int64_t x = v;
    if (comm) comm->allreduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum).wait();
#if GRADCOMM_HAVE_MPI
    else MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT64_T, MPI_SUM, mpi);
#endif
    return x;
  }
};

struct Context {
  Args args;
  Communicator* comm;
  bench::MpiComm mpi;
  int hosts;
  Control control;
  std::string transport;
};

struct Geometry {
  size_t count;    // elements per rank argument of the call
  size_t inElems;  // elements in the input buffer
  size_t outElems;
};

Geometry geometry(Collective c, size_t bytes, size_t elem) {
  Geometry g{};
  size_t total = bytes / elem;
  switch (c) {
    case Collective::kAllgather:
      g.count = total / static_cast<size_t>(gSize);
      g.inElems = g.count;
      g.outElems = g.count * static_cast<size_t>(gSize);
      break;
    case Collective::kReduceScatter:
      g.count = total / static_cast<size_t>(gSize);
      g.inElems = g.count * static_cast<size_t>(gSize);
      g.outElems = g.count;
      break;
    default:
      g.count = total;
      g.inElems = total;
      g.outElems = total;
  }
  return g;
}

void fillInput(const Context& ctx, DataType t, ReduceOp op, const Geometry& g, void* in) {
  for (size_t i = 0; i < g.inElems; ++i) {
    size_t idx = ctx.args.collective == Collective::kReduceScatter ? i : i;
    store(t, in, i, baseValue(idx, gRank, op));
  }
}

long long countWrong(const Context& ctx, DataType t, ReduceOp op, const Geometry& g, const void* out) {
  long long wrong = 0;
  switch (ctx.args.collective) {
    case Collective::kAllreduce:
      for (size_t i = 0; i < g.outElems; ++i) wrong += !close(t, load(t, out, i), expectedReduction(i, op, t));
      break;
    case Collective::kReduceScatter:
      for (size_t i = 0; i < g.count; ++i) {
        wrong += !close(t, load(t, out, i), expectedReduction(static_cast<size_t>(gRank) * g.count + i, op, t));
      }
      break;
    case Collective::kAllgather:
      for (int r = 0; r < gSize; ++r) {
        for (size_t i = 0; i < g.count; ++i) {
          double want = baseValue(i, r, op);
          if (t == DataType::kUInt8) want = static_cast<int>(want) & 0xFF;
          wrong += !close(t, load(t, out, static_cast<size_t>(r) * g.count + i), want);
        }
      }
      break;
    case Collective::kBroadcast:
      for (size_t i = 0; i < g.count; ++i) {
        double want = baseValue(i, ctx.args.root, op);
        if (t == DataType::kUInt8) want = static_cast<int>(want) & 0xFF;
        wrong += !close(t, load(t, out, i), want);
      }
      break;
    default: break;
  }
  return wrong;
}

// Pointers of set `s` for a call, honouring the in-place layouts.
std::pair<void*, void*> callBuffers(const Context& ctx, Buffers& b, int s, bool inPlace, const Geometry& g, size_t elem) {
  unsigned char* in = b.in[static_cast<size_t>(s)];
  unsigned char* out = b.out[static_cast<size_t>(s)];
  if (!inPlace) return {in, out};
  switch (ctx.args.collective) {
    case Collective::kAllgather: return {out + static_cast<size_t>(gRank) * g.count * elem, out};
    case Collective::kReduceScatter: return {out, out + static_cast<size_t>(gRank) * g.count * elem};
    default: return {out, out};
  }
}

#if GRADCOMM_HAVE_MPI
MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    default: return MPI_SUM;
  }
}
#endif

// One call. Nothing else is timed with it: what ran is read once afterwards.
using CallFn = std::function<void(int set, void* in, void* out)>;

// Times `iters` calls after `warmup` and returns the per-call time in us
// (the slowest rank's).
double timeCalls(const Context& ctx, Buffers& b, bool inPlace, const Geometry& g, size_t elem, const CallFn& call) {
  for (int i = 0; i < ctx.args.warmup; ++i) {
    auto [in, out] = callBuffers(ctx, b, i % b.sets, inPlace, g, elem);
    call(i % b.sets, in, out);
  }
  ctx.control.barrier();
  if (ctx.args.median) {
    std::vector<double> each(static_cast<size_t>(ctx.args.iters));
    for (int i = 0; i < ctx.args.iters; ++i) {
      auto [in, out] = callBuffers(ctx, b, i % b.sets, inPlace, g, elem);
      const auto start = std::chrono::steady_clock::now();
      call(i % b.sets, in, out);
      each[static_cast<size_t>(i)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    }
    auto mid = each.begin() + static_cast<std::ptrdiff_t>(each.size() / 2);
    std::nth_element(each.begin(), mid, each.end());
    return ctx.control.max(*mid);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < ctx.args.iters; ++i) {
    auto [in, out] = callBuffers(ctx, b, i % b.sets, inPlace, g, elem);
    call(i % b.sets, in, out);
  }
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / ctx.args.iters;
  return ctx.control.max(us);
}

// One size of one configuration, out of place and in place.
std::vector<Row> runSize(const Context& ctx, const std::string& algo, const std::string& compression, DataType t,
                         ReduceOp op, size_t bytes, Buffers& b) {
  const size_t elem = dataTypeSize(t);
  const Geometry g = geometry(ctx.args.collective, bytes, elem);
  const size_t realBytes = (ctx.args.collective == Collective::kAllgather || ctx.args.collective == Collective::kReduceScatter)
                               ? g.count * elem * static_cast<size_t>(gSize)
                               : g.count * elem;
  std::vector<Row> rows;
  const bool isBaseline = algo.rfind("baseline:", 0) == 0;
  const std::string base = isBaseline ? algo.substr(9) : "";
  CollectiveOptions opts;
  if (!isBaseline && algo != "default") opts.algorithm = algo;
  opts.compression = compression;
  opts.stream = gMemory.stream();  // device buffers: ordered on the bench's stream
  // The buffer's error feedback, kept as a training loop keeps one per
  // tensor (used when the compression asks for it: top-k's default).
  ErrorFeedback feedback;
  opts.errorFeedback = &feedback;
  const bool lossy = compression.rfind("topk", 0) == 0;
  const Collective coll = ctx.args.collective;

  for (bool inPlace : {false, true}) {
    std::string executed = isBaseline ? base : algo;
    CallFn call;
    Work last;  // the last call's Work: what ran
    bool supported = true;
    if (!isBaseline) {
      call = [&](int, void* in, void* out) {
        Work w;
        switch (coll) {
          case Collective::kAllreduce: w = ctx.comm->allreduce(in, out, g.count, t, op, opts); break;
          case Collective::kAllgather: w = ctx.comm->allgather(in, out, g.count, t, opts); break;
          case Collective::kReduceScatter: w = ctx.comm->reduceScatter(in, out, g.count, t, op, opts); break;
          case Collective::kBroadcast: w = ctx.comm->broadcast(in, out, g.count, t, ctx.args.root, opts); break;
          default: break;
        }
        w.wait();
        last = std::move(w);
      };
#if GRADCOMM_HAVE_MPI
    } else if (base == "mpi") {
      MPI_Datatype mt = mpiType(t);
      // MPI here takes host memory only.
      supported = mt != MPI_DATATYPE_NULL && op != ReduceOp::kAvg && !gMemory.device();
      call = [&, mt](int, void* in, void* out) {
        const int n = static_cast<int>(g.count);
        switch (coll) {
          case Collective::kAllreduce: MPI_Allreduce(inPlace ? MPI_IN_PLACE : in, out, n, mt, mpiOp(op), ctx.mpi); break;
          case Collective::kAllgather: MPI_Allgather(inPlace ? MPI_IN_PLACE : in, n, mt, out, n, mt, ctx.mpi); break;
          case Collective::kReduceScatter:
            // MPI's in-place form reads the whole input from the output buffer.
            MPI_Reduce_scatter_block(inPlace ? MPI_IN_PLACE : in, inPlace ? static_cast<void*>(b.out[0]) : out, n, mt,
                                     mpiOp(op), ctx.mpi);
            break;
          case Collective::kBroadcast:
            if (gRank == ctx.args.root && !inPlace) std::memcpy(out, in, g.count * elem);
            MPI_Bcast(out, n, mt, ctx.args.root, ctx.mpi);
            break;
          default: break;
        }
      };
#endif
    } else if (base == "memcpy") {
      call = [&](int set, void*, void*) {
        // The same bytes between two whole (output-sized) buffers, whatever
        // the collective's in-place layout.
        gMemory.copy(b.out[static_cast<size_t>(set)], b.out[static_cast<size_t>((set + 1) % b.sets)],
                     std::min(realBytes, b.outBytes));
      };
    } else if (base == "p2p") {
      supported = gSize >= 2 && !gMemory.device();
    }
    if (!supported) continue;

    double us = 0;
    std::string ran = executed;
#if GRADCOMM_HAVE_MPI
    if (base == "p2p") {
      // One-way stream: rank 0 sends `iters` messages back to back to rank 1,
      // which acknowledges the last one; time per message.
      // The output-sized buffers hold the whole size for every collective
      // (allgather's input holds only one rank's share).
      const int n = static_cast<int>(std::min<size_t>({realBytes, b.outBytes, size_t{1} << 30}));
      auto stream = [&](int iters) {
        MPI_Barrier(ctx.mpi);
        auto t0 = std::chrono::steady_clock::now();
        std::vector<MPI_Request> reqs;
        for (int i = 0; i < iters; ++i) {
          MPI_Request r;
          unsigned char* buf = b.out[static_cast<size_t>(i % b.sets)];
          if (gRank == 0) MPI_Isend(buf, n, MPI_BYTE, 1, 5, ctx.mpi, &r), reqs.push_back(r);
          if (gRank == 1) MPI_Irecv(b.out[static_cast<size_t>(i % b.sets)], n, MPI_BYTE, 0, 5, ctx.mpi, &r), reqs.push_back(r);
          if (reqs.size() >= 4) {  // a window of 4 messages in flight
            MPI_Wait(&reqs.front(), MPI_STATUS_IGNORE);
            reqs.erase(reqs.begin());
          }
        }
        MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
        if (gRank == 1) MPI_Send(nullptr, 0, MPI_BYTE, 0, 6, ctx.mpi);
        if (gRank == 0) MPI_Recv(nullptr, 0, MPI_BYTE, 1, 6, ctx.mpi, MPI_STATUS_IGNORE);
        double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        MPI_Bcast(&t, 1, MPI_DOUBLE, 0, ctx.mpi);
        return t;
      };
      stream(std::max(1, ctx.args.warmup));
      us = stream(ctx.args.iters);
    } else
#endif
    {
      us = timeCalls(ctx, b, inPlace, g, elem, call);
      if (last.valid()) ran = last.algorithm();
    }

    // One checked call: `fill` writes this rank's g.inElems input values in
    // host memory; they go where the layout reads them, and the result
    // comes back to `host`.
    const size_t resultBytes = (coll == Collective::kReduceScatter ? g.count : g.outElems) * elem;
    std::vector<unsigned char> host;
    auto checkedCall = [&](const std::function<void(void*)>& fill) {
      host.resize(std::max({b.inBytes, b.outBytes, size_t{1}}));
      auto [in, out] = callBuffers(ctx, b, 0, inPlace, g, elem);
      fill(host.data());
      // In place the input is read from the output buffer (an allgather's
      // from this rank's part of it, where callBuffers put `in`).
      const bool fromOutput = inPlace && coll != Collective::kAllgather;
      gMemory.upload(fromOutput ? b.out[0] : in, host.data(), g.inElems * elem);
      call(0, in, out);
      gMemory.download(host.data(), out, resultBytes);
      // Restore plausible data for the next timed runs.
      b.fillInputs(g.inElems * elem, [&](void* h) { fillInput(ctx, t, op, g, h); });
    };
    long long wrong = 0;
    if (ctx.args.check && !isBaseline && lossy) wrong = -1;  // top-k is lossy by design: not checked
    if (ctx.args.check && !isBaseline && !lossy) {
      checkedCall([&](void* h) { fillInput(ctx, t, op, g, h); });
      wrong = ctx.control.sum(countWrong(ctx, t, op, g, host.data()));
    }
    uint64_t digest = 0;
    if (ctx.args.digest && !isBaseline) {
      // Values of mixed magnitudes, so that sums in another order round
      // differently: equal digests mean the same order of operations.
      checkedCall([&](void* h) {
        uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(gRank + 1);
        for (size_t i = 0; i < g.inElems; ++i) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          const double v =
              (static_cast<double>(x >> 11) * 0x1.0p-53 * 2 - 1) * std::ldexp(1.0, static_cast<int>(x & 15) - 8);
          store(t, h, i, op == ReduceOp::kProd ? 1 + v / 512 : v);
        }
      });
      uint64_t h = 1469598103934665603ull;
      for (size_t i = 0; i < resultBytes; ++i) h = (h ^ host[i]) * 1099511628211ull;
      digest = static_cast<uint64_t>(ctx.control.sum(static_cast<long long>(h >> 1)));
    }
    double predictedUs = -1;
    if (!isBaseline && compression == "none") {
      for (const auto& [name, seconds] : ctx.comm->explainSelection(coll, g.count, t).predictedSeconds) {
        if (name == ran) predictedUs = seconds * 1e6;
      }
    }
    const double algbw = us > 0 ? static_cast<double>(realBytes) / us / 1e3 : 0;
    // MPI's collective moves what ours moves; memcpy and p2p are raw rates.
    const double factor = (!isBaseline || base == "mpi") ? busFactor(coll, gSize) : 1.0;
    rows.push_back(Row{algo, ran, isBaseline ? "none" : compression, isBaseline ? "none" : ctx.transport, t, op, realBytes, realBytes / elem, coll == Collective::kBroadcast ? ctx.args.root : -1,
                       inPlace, us, algbw, algbw * factor, wrong, predictedUs, digest});
  }
  return rows;
}

std::string jsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gUseMpi = bench::startMpiUnlessLaunchedWithout(argc, argv, &gRank);
  bench::MpiComm mpi{};
  int hosts = 1;
  // MPI-free: one communicator formed from the environment measures and
  // also carries the bench's own bookkeeping.
  std::unique_ptr<Communicator> envComm;
  // Before the arguments are parsed: the environment's communicator
  // measures at its creation.
  bool calibrate = false;
  for (int i = 1; i < argc; ++i) calibrate = calibrate || std::strcmp(argv[i], "--calibrate") == 0;
#if GRADCOMM_HAVE_MPI
  if (gUseMpi) {
    mpi = MPI_COMM_NULL;
    MPI_Comm_size(MPI_COMM_WORLD, &gSize);
  } else
#endif
  {
    try {
      envComm = std::make_unique<Communicator>(bench::makeCommunicator(false, "", calibrate));
    } catch (const Error& e) {
      std::fprintf(stderr, "gradcomm-bench: %s\n", e.what());
      return 2;
    }
    gRank = envComm->rank();
    gSize = envComm->size();
    gEnvComm = envComm.get();
  }
  // gradcomm-tune (a link to this program) [options] FILE is
  // gradcomm-bench --interleave [options] --tune FILE. Under Open MPI the
  // tool's name keeps "--tune" off mpirun's command line, which mpirun
  // scans for an MCA parameter file of that name.
  std::vector<char*> tuneArgs;
  const std::string self = argc > 0 ? argv[0] : "";
  if (self.size() >= 13 && self.compare(self.size() - 13, 13, "gradcomm-tune") == 0) {
    // FILE is the last argument, and no option's value: options that take
    // one would otherwise swallow it (`--json out.json` with FILE left out).
    const std::string last = argc >= 2 ? argv[argc - 1] : "";
    const std::string before = argc >= 3 ? argv[argc - 2] : "";
    static const std::set<std::string> flags = {"-q", "--quiet", "--median", "--interleave", "--digest", "--no-mpi"};
    const bool takesValue = before.size() > 1 && before[0] == '-' && !flags.count(before);
    if (last.empty() || last[0] == '-' || takesValue) {
      die("usage: mpirun -np N gradcomm-tune [gradcomm-bench options] FILE: measures every algorithm, size by size "
          "(--interleave), and writes the fastest per size to FILE, a GRADCOMM_TUNING_FILE for this layout");
    }
    static char interleave[] = "--interleave", tune[] = "--tune";
    tuneArgs.assign(argv, argv + argc - 1);
    tuneArgs.push_back(interleave);
    tuneArgs.push_back(tune);
    tuneArgs.push_back(argv[argc - 1]);
    argc = static_cast<int>(tuneArgs.size());
    tuneArgs.push_back(nullptr);
    argv = tuneArgs.data();
  }
  Args args = parseArgs(argc, argv);
  if (args.device) gMemory.useDevice("gradcomm-bench", gRank);
  // Without MPI: the transport the environment's communicator runs on (ucx,
  // or inproc for one rank in a build without UCX).
  if (args.transports.empty()) args.transports = {gUseMpi ? std::string("mpi") : envComm->transportName()};

#if GRADCOMM_HAVE_MPI
  if (gUseMpi) {
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi);
    MPI_Comm local;
    MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, gRank, MPI_INFO_NULL, &local);
    int localRank = 0;
    MPI_Comm_rank(local, &localRank);
    int leader = localRank == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &hosts, 1, MPI_INT, MPI_SUM, mpi);
    MPI_Comm_free(&local);
  } else
#endif
  {
    hosts = bench::countHosts(*envComm);
  }
  Control control;
  control.mpi = mpi;
  control.comm = envComm.get();

  std::vector<std::string> configs;
  for (const auto& a : args.algos) {
    if (a == "all") {
      configs.push_back("default");
      for (const auto& n : algorithmNames(args.collective)) configs.push_back(n);
    } else {
      configs.push_back(a);
    }
  }
  for (const auto& b : args.baselines) configs.push_back("baseline:" + b);

  std::vector<size_t> sizes;
  for (size_t s = args.minBytes; s <= args.maxBytes;) {
    sizes.push_back(s);
    size_t next = args.increment ? s + args.increment : static_cast<size_t>(std::max<double>(s + 1, s * args.factor));
    if (next <= s) break;
    s = next;
  }

  if (gRank == 0) {
    std::printf("# gradcomm-bench %s: %s, %d ranks on %d host%s, minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d "
                "iters: %d validation: %d memory: %s\n",
                GRADCOMM_VERSION_STRING, toString(args.collective), gSize, hosts, hosts == 1 ? "" : "s", args.minBytes,
                args.maxBytes, args.increment ? static_cast<double>(args.increment) : args.factor,
                args.increment ? "bytes" : "factor", args.warmup, args.iters, args.check ? 1 : 0,
                args.device ? "device" : "host");
  }

  std::vector<Row> all;
  size_t progress = 0;
  const size_t totalSteps =
      args.transports.size() * configs.size() * args.types.size() * args.ops.size() * sizes.size();
  struct Config {
    std::string algo;
    std::string compression;
  };
  std::vector<Config> runs;
  for (const auto& c : args.compressions) {
    for (const auto& cfg : configs) {
      if (cfg.rfind("baseline:", 0) == 0 && c != args.compressions.front()) continue;  // baselines once
      if (c != "none" && args.collective != Collective::kAllreduce) die("--compression applies to allreduce only");
      runs.push_back({cfg, c});
    }
  }
  std::string layout;  // of the first transport's communicator, for --tune
  std::string calibration;  // its costs, for --calibrate
  for (const auto& transport : args.transports) {
  std::unique_ptr<Communicator> owned;
  Communicator* comm = envComm.get();
  if (gUseMpi) {
    try {
      owned = std::make_unique<Communicator>(bench::makeCommunicator(true, transport, calibrate));
    } catch (const Error& e) {
      die(e.what());
    }
    comm = owned.get();
  }
  if (layout.empty()) {
    layout = comm->layout();
    if (!args.calibrate.empty()) {
      try {
        calibration = comm->calibration();
      } catch (const Error& e) {
        die(std::string("--calibrate: ") + e.what());
      }
    }
  }
  Context ctx{args, comm, mpi, hosts, control, transport};
  // Baselines do not depend on gradcomm's transport: once.
  auto baselineAgain = [&](const Config& run) {
    return run.algo.rfind("baseline:", 0) == 0 && transport != args.transports.front();
  };
  auto typeFits = [](DataType t, ReduceOp op) { return op != ReduceOp::kAvg || isFloatingPoint(t); };
  auto compressionFits = [](const Config& run, DataType t, ReduceOp op) {
    return run.compression == "none" || (t == DataType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAvg));
  };
  // Which (configuration, type, op) tables this transport prints.
  auto measured = [&](const Config& run, DataType t, ReduceOp op) {
    return !baselineAgain(run) && typeFits(t, op) && compressionFits(run, t, op);
  };
  // One size of one configuration; a failure that may mean a lost peer ends the job.
  auto measure = [&](const Config& run, DataType t, ReduceOp op, size_t bytes, Buffers& b) {
    const std::string& cfg = run.algo;
    const size_t elem = dataTypeSize(t);
    const Geometry g = geometry(args.collective, bytes, elem);
    b.allocate(g.inElems * elem, std::max(g.outElems, g.inElems) * elem);
    b.fillInputs(g.inElems * elem, [&](void* h) { fillInput(ctx, t, op, g, h); });
    try {
      return runSize(ctx, cfg, cfg.rfind("baseline:", 0) == 0 ? "none" : run.compression, t, op, bytes, b);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kTransport || e.code() == ErrorCode::kRemote) {
        // A peer may be gone, and MPI_Finalize would wait for it
        // forever: end the job (see the README).
        std::fprintf(stderr, "gradcomm-bench: rank %d failed: %s\n", gRank, e.what());
        std::fflush(stderr);
#if GRADCOMM_HAVE_MPI
        if (gUseMpi) MPI_Abort(MPI_COMM_WORLD, 2);
#endif
      }
      die(std::string("failed: ") + e.what());
    }
  };
  // Before anything is timed, every configuration runs its first size once
  // and the rows are dropped: the first measurement of a run was slow
  // whichever configuration it was (4 emulated hosts, 4 B: 159 us for the
  // default, which runs rd, against 85 for rd forced right after).
  {
    Buffers b;
    for (DataType t : args.types) {
      for (ReduceOp op : args.ops) {
        for (size_t i = 0; i < runs.size() && !sizes.empty(); ++i) {
          const Geometry g = geometry(args.collective, sizes.front(), dataTypeSize(t));
          if (!measured(runs[i], t, op) || (g.count == 0 && sizes.front() > 0)) continue;
          measure(runs[i], t, op, sizes.front(), b);
        }
      }
    }
  }
  // --interleave: every table's rows measured first, size by size, every
  // configuration at a size in turn; the tables below print them.
  std::map<std::tuple<size_t, int, int, size_t>, std::vector<Row>> early;
  if (args.interleave) {
    for (DataType t : args.types) {
      for (ReduceOp op : args.ops) {
        Buffers b;
        for (size_t bytes : sizes) {
          const Geometry g = geometry(args.collective, bytes, dataTypeSize(t));
          if (g.count == 0 && bytes > 0) continue;
          for (size_t i = 0; i < runs.size(); ++i) {
            if (!measured(runs[i], t, op)) continue;
            const auto key = std::make_tuple(i, static_cast<int>(t), static_cast<int>(op), bytes);
            if (!args.quiet && gRank == 0) {
              std::fprintf(stderr, "[gradcomm-bench] %zu/%zu %s %s %s %zu B\n", ++progress, totalSteps,
                           runs[i].algo.c_str(), toString(t), toString(op), bytes);
            }
            early[key] = measure(runs[i], t, op, bytes, b);
          }
        }
      }
    }
  }
  for (size_t runIndex = 0; runIndex < runs.size(); ++runIndex) {
    const Config& run = runs[runIndex];
    const std::string& cfg = run.algo;
    if (baselineAgain(run)) continue;
    for (DataType t : args.types) {
      for (ReduceOp op : args.ops) {
        if (!typeFits(t, op)) continue;
        if (!compressionFits(run, t, op)) {
          if (gRank == 0) std::printf("# %s [%s]: compression needs float32 sum/avg\n", cfg.c_str(), run.compression.c_str());
          continue;
        }
        if (gRank == 0) {
          std::printf("#\n# transport: %s\n# algorithm: %s%s\n", cfg.rfind("baseline:", 0) == 0 ? "-" : transport.c_str(),
                      cfg.c_str(),
                      run.compression == "none" || cfg.rfind("baseline:", 0) == 0 ? ""
                                                                                  : (" compression: " + run.compression).c_str());
          std::printf("#                                                              out-of-place                       in-place          \n");
          std::printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  executed\n");
          std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
        }
        double busSum = 0;
        int busN = 0;
        Buffers b;
        for (size_t bytes : sizes) {
          const Geometry g = geometry(args.collective, bytes, dataTypeSize(t));
          if (g.count == 0 && bytes > 0) continue;
          std::vector<Row> rows;
          if (args.interleave) {
            rows = early[std::make_tuple(runIndex, static_cast<int>(t), static_cast<int>(op), bytes)];
          } else {
            ++progress;
            if (!args.quiet && gRank == 0) {
              std::fprintf(stderr, "[gradcomm-bench] %zu/%zu %s %s %s %zu B\n", progress, totalSteps, cfg.c_str(),
                           toString(t), toString(op), bytes);
            }
            rows = measure(run, t, op, bytes, b);
          }
          if (rows.empty()) {
            if (gRank == 0) std::printf("# %s: not available for %s %s\n", cfg.c_str(), toString(t), toString(op));
            break;
          }
          if (gRank == 0) {
            const Row& o = rows[0];
            const Row& ip = rows.size() > 1 ? rows[1] : rows[0];
            auto wrongText = [](long long w) { return w < 0 ? std::string("N/A") : std::to_string(w); };
            // What ran ("default" is the selector's choice; a forced
            // algorithm may fall back): both variants when they differ.
            const std::string executed = o.executed == ip.executed ? o.executed : o.executed + "/" + ip.executed;
            std::printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %5s  %7.2f  %6.2f  %6.2f  %5s  %s\n",
                        o.bytes, o.count, ncclTypeName(t), toString(op), o.root, o.timeUs, o.algbw, o.busbw,
                        wrongText(o.wrong).c_str(), ip.timeUs, ip.algbw, ip.busbw, wrongText(ip.wrong).c_str(),
                        executed.c_str());
            std::fflush(stdout);
          }
          for (const auto& r : rows) {
            busSum += r.busbw;
            ++busN;
          }
          all.insert(all.end(), rows.begin(), rows.end());
        }
        if (gRank == 0) {
          long long wrongTotal = 0;
          for (const auto& r : all) {
            if (r.algorithm == cfg && r.compression == run.compression && r.wrong > 0) wrongTotal += r.wrong;
          }
          std::printf("# Out of bounds values : %lld %s\n", wrongTotal, wrongTotal ? "FAILED" : "OK");
          std::printf("# Avg bus bandwidth    : %g \n", busN ? busSum / busN : 0.0);
        }
      }
    }
  }

  }  // transports

  long long wrongAll = 0;
  for (const auto& r : all) wrongAll += r.wrong > 0 ? r.wrong : 0;
  bool written = true;
  if (gRank == 0) {
    if (!args.json.empty()) {
      std::ofstream f(args.json);
      f << "{\"ranks\": " << gSize << ", \"hosts\": " << hosts << ", \"memory\": \"" << (args.device ? "device" : "host")
        << "\", \"collective\": \"" << toString(args.collective)
        << "\", \"results\": [\n";
      for (size_t i = 0; i < all.size(); ++i) {
        const Row& r = all[i];
        f << "  {\"collective\": \"" << toString(args.collective) << "\", \"algorithm\": \"" << jsonEscape(r.algorithm)
          << "\", \"executed\": \"" << jsonEscape(r.executed) << "\", \"transport\": \"" << jsonEscape(r.transport)
          << "\", \"compression\": \"" << jsonEscape(r.compression)
          << "\", \"dtype\": \""
          << toString(r.type) << "\", \"op\": \"" << toString(r.op) << "\", \"bytes\": " << r.bytes
          << ", \"count\": " << r.count << ", \"root\": " << r.root << ", \"in_place\": " << (r.inPlace ? "true" : "false")
          << ", \"time_us\": " << r.timeUs << ", \"algbw_GBps\": " << r.algbw << ", \"busbw_GBps\": " << r.busbw
          << ", \"wrong\": " << (r.wrong < 0 ? std::string("null") : std::to_string(r.wrong))
          << ", \"predicted_us\": " << (r.predictedUs < 0 ? std::string("null") : std::to_string(r.predictedUs))
          << ", \"digest\": " << (r.digest ? "\"" + std::to_string(r.digest) + "\"" : std::string("null")) << "}"
          << (i + 1 < all.size() ? "," : "") << "\n";
      }
      f << "]}\n";
      f.close();
      if (!f) {
        std::fprintf(stderr, "gradcomm-bench: could not write the results to '%s'\n", args.json.c_str());
        written = false;
      }
    }
    if (!args.csv.empty()) {
      std::ofstream f(args.csv);
      f << "collective,algorithm,executed,transport,compression,dtype,op,bytes,count,root,in_place,time_us,algbw_GBps,busbw_GBps,wrong,predicted_us\n";
      for (const Row& r : all) {
        f << toString(args.collective) << "," << r.algorithm << "," << r.executed << "," << r.transport << ","
          << r.compression << ","
          << toString(r.type) << ","
          << toString(r.op) << "," << r.bytes << "," << r.count << "," << r.root << "," << (r.inPlace ? 1 : 0) << ","
          << r.timeUs << "," << r.algbw << "," << r.busbw << "," << r.wrong << ",";
        if (r.predictedUs >= 0) f << r.predictedUs;
        f << "\n";
      }
      f.close();
      if (!f) {
        std::fprintf(stderr, "gradcomm-bench: could not write the results to '%s'\n", args.csv.c_str());
        written = false;
      }
    }
  }
  if (gRank == 0 && !args.tune.empty()) {
    const std::string why = writeTuningFile(args.tune, all, args.collective, args.transports.front(), layout);
    if (!why.empty()) {
      std::fprintf(stderr, "gradcomm-bench: %s\n", why.c_str());
      written = false;
    }
  }
  if (gRank == 0 && !args.calibrate.empty()) {
    std::ofstream f(args.calibrate, std::ios::trunc);
    f << calibration;
    f.close();
    if (!f) {
      std::fprintf(stderr, "gradcomm-bench: could not write the calibration to '%s'\n", args.calibrate.c_str());
      written = false;
    }
  }
  envComm.reset();
#if GRADCOMM_HAVE_MPI
  if (gUseMpi) {
    MPI_Comm_free(&mpi);
    MPI_Finalize();
  }
#endif
  if (!written) return 2;
  return wrongAll ? 1 : 0;
}
