#include "core/host.h"

#include <unistd.h>

#include <cstdlib>

namespace tessera {

std::string host_name() {
  if (const char* h = std::getenv("TESSERA_HOST"); h && *h) return h;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace tessera
