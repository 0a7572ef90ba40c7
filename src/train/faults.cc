#include "train/faults.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tessera {

void maybe_inject_fault(int rank, int step) {
  const char* f = std::getenv("TESSERA_FAULT");
  if (!f) return;
  char kind[16] = {};
  int fr = -1, fs = -1;
  if (std::sscanf(f, "%15[a-z]@%d:%d", kind, &fr, &fs) != 3 || fr != rank || fs != step) return;
  if (std::strcmp(kind, "stall") == 0) std::this_thread::sleep_for(std::chrono::hours(1));
  if (std::strcmp(kind, "exit") == 0) std::_Exit(3);
}

}  // namespace tessera
