// gradcomm-info: the build configuration and every parameter with its
// effective value and where the value came from; with --tuning, the
// algorithm the selector chooses per size for this job and why.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gradcomm/gradcomm.hpp"

namespace {

int usage(FILE* out, int code) {
  std::fprintf(out,
               "usage: gradcomm-info [--tuning [--collective C] [-b MIN] [-e MAX] [-f FACTOR] [-d TYPE]]\n\n"
               "Prints gradcomm's build configuration and every GRADCOMM_* parameter:\n"
               "its effective value, its origin (default or environment), its default, units and meaning.\n\n"
               "--tuning forms a communicator (MPI_COMM_WORLD: run it under mpirun with the job's layout;\n"
               "from the environment when GRADCOMM_RANK or RANK is set without mpirun, and always in a\n"
               "build without MPI: GRADCOMM_RANK/RANK, GRADCOMM_WORLD_SIZE/WORLD_SIZE, GRADCOMM_RENDEZVOUS\n"
               "or MASTER_ADDR)\n"
               "and prints, on rank 0, the topology, the cost model's inputs, the engine of calls on\n"
               "device buffers (nccl, staged or none, and why; decided on each rank's current CUDA device\n"
               "as the first device call would) and, per size, the time the\n"
               "model predicts for every algorithm that can run the call, the choice and why.\n"
               "  --collective C   allreduce (default), broadcast, reduce, allgather, reducescatter, barrier, all\n"
               "  -b, -e SIZE      smallest and largest size in bytes (default 8 and 64M; K/M/G suffixes)\n"
               "  -f FACTOR        multiply the size by FACTOR each step (default 4)\n"
               "  -d TYPE          float32 (default), float16, bfloat16, float64, int8, uint8, int32, int64\n");
  return code;
}

size_t parseSize(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) throw gradcomm::ConfigError(std::string("bad size '") + text + "'");
  switch (*end) {
    case 'k': case 'K': v *= 1024; ++end; break;
    case 'm': case 'M': v *= 1024.0 * 1024; ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end) throw gradcomm::ConfigError(std::string("bad size '") + text + "'");
  return static_cast<size_t>(v);
}

int printTuning(const std::vector<gradcomm::Collective>& collectives, size_t minBytes, size_t maxBytes,
                double factor, gradcomm::DataType type) {
  using namespace gradcomm;
  // Started without mpirun (scripts/netns-cluster --no-mpi, torchrun), or
  // built without MPI: form the communicator from the environment as the
  // job would.
  const bool noMpi = !GRADCOMM_BUILT_WITH_MPI ||
                     ((std::getenv("GRADCOMM_RANK") || std::getenv("RANK")) && !std::getenv("OMPI_COMM_WORLD_SIZE"));
  Communicator comm = noMpi ? communicatorFromEnvironment() : Communicator();
  // Collective: every rank asks, on its current CUDA device. A failure
  // (GRADCOMM_DEVICE_ENGINE=nccl that cannot be served) is printed, not fatal:
  // the selection below needs no other rank.
  Communicator::DeviceEngine device;
  try {
    device = comm.deviceEngine();
  } catch (const Error& e) {
    device = {"unknown", std::string("it could not be decided: ") + e.what()};
  }
  if (comm.rank() != 0) return 0;
  std::printf("%d rank(s), layout %s\n%s\n", comm.size(), comm.layout().c_str(), comm.describeTopology().c_str());
  std::printf("device buffers: engine %s (%s)\n", device.engine.c_str(), device.why.c_str());
  const size_t elem = dataTypeSize(type);
  for (Collective c : collectives) {
    std::printf("\n%s %s: predicted time per algorithm (us), the choice and why\n", toString(c), toString(type));
    // Columns: every algorithm predicted at any size, in registry order.
    std::vector<std::string> names;
    for (const auto& n : algorithmNames(c)) names.push_back(n);
    std::printf("  %10s", "bytes");
    for (const auto& n : names) std::printf(" %12s", n.c_str());
    std::printf("  %-8s %s\n", "choice", "why");
    for (size_t bytes = minBytes; bytes <= maxBytes;) {
      size_t count = elem ? bytes / elem : 0;
      if (c == Collective::kAllgather || c == Collective::kReduceScatter) count /= static_cast<size_t>(comm.size());
      if (c == Collective::kBarrier) count = 0;
      const auto s = comm.explainSelection(c, count, type);
      std::map<std::string, double> predicted(s.predictedSeconds.begin(), s.predictedSeconds.end());
      std::printf("  %10zu", bytes);
      for (const auto& n : names) {
        auto it = predicted.find(n);
        if (it == predicted.end()) std::printf(" %12s", "-");
        else std::printf(" %12.1f", it->second * 1e6);
      }
      std::printf("  %-8s %s\n", s.algorithm.c_str(), s.why.c_str());
      if (c == Collective::kBarrier) break;
      const size_t next = static_cast<size_t>(static_cast<double>(bytes) * factor);
      if (next <= bytes) break;
      bytes = next;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool tuning = false;
  size_t minBytes = 8, maxBytes = 64u << 20;
  double factor = 4;
  std::vector<gradcomm::Collective> collectives = {gradcomm::Collective::kAllreduce};
  gradcomm::DataType type = gradcomm::DataType::kFloat32;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> const char* {
        if (i + 1 >= argc) throw gradcomm::ConfigError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") return usage(stdout, 0);
      if (a == "--tuning") tuning = true;
      else if (a == "-b") minBytes = parseSize(value());
      else if (a == "-e") maxBytes = parseSize(value());
      else if (a == "-f") factor = std::atof(value());
      else if (a == "-d") type = gradcomm::parseDataType(value());
      else if (a == "--collective") {
        const std::string c = value();
        collectives.clear();
        if (c == "all") {
          for (int k = 0; k < gradcomm::kNumCollectives; ++k) collectives.push_back(static_cast<gradcomm::Collective>(k));
        } else {
          collectives.push_back(gradcomm::parseCollective(c));
        }
      } else {
        std::fprintf(stderr, "gradcomm-info: unknown argument '%s' (try --help)\n", argv[i]);
        return 2;
      }
    }
    if (factor <= 1) throw gradcomm::ConfigError("-f must be greater than 1");
    if (minBytes == 0) minBytes = 1;
  } catch (const gradcomm::Error& e) {
    std::fprintf(stderr, "gradcomm-info: %s\n", e.what());
    return 2;
  }
  if (tuning) {
    try {
      return printTuning(collectives, minBytes, maxBytes, factor, type);
    } catch (const gradcomm::Error& e) {
      std::fprintf(stderr, "gradcomm-info: %s\n", e.what());
      return 1;
    }
  }
  // Resolving parses every value as a communicator would (GRADCOMM_ALGO
  // rules included): a value it would reject fails here, with its message.
  std::vector<gradcomm::ParamDescription> params;
  try {
    params = gradcomm::describeParameters();
  } catch (const gradcomm::Error& e) {
    std::fprintf(stderr, "gradcomm-info: %s\n", e.what());
    return 1;
  }
  std::printf("gradcomm build\n");
  for (const auto& [key, value] : gradcomm::buildInfo()) std::printf("  %-14s %s\n", key.c_str(), value.c_str());
  std::printf("\nparameters\n");
  std::printf("  %-24s %-12s %-12s %-10s %s\n", "NAME", "VALUE", "ORIGIN", "DEFAULT", "UNITS / MEANING");
  for (const auto& p : params) {
    std::printf("  %-24s %-12s %-12s %-10s %s\n", p.name.c_str(), p.value.empty() ? "\"\"" : p.value.c_str(),
                gradcomm::toString(p.origin), p.defaultValue.empty() ? "\"\"" : p.defaultValue.c_str(),
                p.units.c_str());
    std::printf("  %-24s %s\n", "", p.doc.c_str());
  }
  return 0;
}
