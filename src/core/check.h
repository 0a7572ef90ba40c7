// CHECK: the channel for bugs (broken invariants). Prints file:line and aborts.
// Errors a user or the world can cause go through Status/Result (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

#define TESSERA_CHECK(cond)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                    \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

#define CHECK(cond) TESSERA_CHECK(cond)
