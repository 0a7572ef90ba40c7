// host_name() (core/host.h): TESSERA_HOST when set and not empty, else the
// kernel's host name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/host.h"

namespace tessera {
namespace {

class HostName : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* h = std::getenv("TESSERA_HOST")) saved_ = h, had_ = true;
  }
  void TearDown() override {
    if (had_) setenv("TESSERA_HOST", saved_.c_str(), 1);
    else unsetenv("TESSERA_HOST");
  }
  std::string saved_;
  bool had_ = false;
};

TEST_F(HostName, TesseraHostWins) {
  setenv("TESSERA_HOST", "node-7", 1);
  EXPECT_EQ(host_name(), "node-7");
}

TEST_F(HostName, UnsetOrEmptyIsTheKernelsName) {
  char buf[256] = {};
  ASSERT_EQ(gethostname(buf, sizeof(buf) - 1), 0);
  unsetenv("TESSERA_HOST");
  EXPECT_EQ(host_name(), buf);
  setenv("TESSERA_HOST", "", 1);
  EXPECT_EQ(host_name(), buf);
}

}  // namespace
}  // namespace tessera
