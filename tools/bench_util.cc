#include "tools/bench_util.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "tools/commands.h"

namespace tessera::tools {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int usage_error(const std::string& msg) {
  if (launcher_rank() == 0) std::fprintf(stderr, "tessera: error: %s\n", msg.c_str());
  return kExitUsage;
}

Result<int64_t> parse_size(const std::string& flag, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') digits++;
  int64_t unit = 1;
  const std::string suffix = text.substr(digits);
  if (suffix == "K" || suffix == "k") unit = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "m") unit = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "g") unit = int64_t{1} << 30;
  else if (!suffix.empty()) digits = 0;
  if (digits == 0 || digits > 12)
    return Status::InvalidArgument(
        fmt::format("{}: bad size '{}' (a whole number of bytes, optionally with a K, M or G suffix)", flag, text));
  return std::stoll(text.substr(0, digits)) * unit;
}

}  // namespace tessera::tools
