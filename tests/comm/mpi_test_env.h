// Shared by the tests of tessera_mpi_tests (tests/comm/mpi_*.cc), a GoogleTest
// program run under mpirun with 2-4 ranks (see tests/CMakeLists.txt). Every
// rank runs every test in the same order, so collectives inside tests match.
#pragma once

#include <chrono>

#include "comm/communicator.h"

namespace tessera::comm::mpi_test {

// The world communicator of the run (timeout kTestTimeout), made by main().
Communicator& test_world();

// Short, so a test that desynchronises the ranks fails in seconds instead of
// hanging until ctest's timeout.
constexpr std::chrono::milliseconds kTestTimeout{15000};

}  // namespace tessera::comm::mpi_test
