// gradcomm-info: the build configuration and every parameter with its
// effective value and where the value came from.
#include <cstdio>
#include <cstring>
#include <string>

#include "gradcomm/gradcomm.hpp"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: gradcomm-info\n\nPrints gradcomm's build configuration and every GRADCOMM_* parameter:\n"
                  "its effective value, its origin (default or environment), its default, units and meaning.\n");
      return 0;
    }
    std::fprintf(stderr, "gradcomm-info: unknown argument '%s' (try --help)\n", argv[i]);
    return 2;
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
