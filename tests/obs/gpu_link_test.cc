#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "obs/gpu.h"
#include "obs/link.h"
#include <unistd.h>

namespace tessera::obs {
namespace {

namespace fs = std::filesystem;

// No GPU here: NVML cannot be loaded, and nothing is recorded.
TEST(GpuMonitor, AbsentNvmlIsUnavailableAndRecordsNothing) {
  Result<std::unique_ptr<GpuMonitor>> m = GpuMonitor::open("", 0, "libnvidia-ml-absent.so.1");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(m.status().message().find("NVML is not available"), std::string::npos) << m.status().message();
  EXPECT_EQ(m.status().message().find('\n'), std::string::npos);
}

TEST(GpuMonitor, ALibraryWithoutNvmlsFunctionsIsRefused) {
  Result<std::unique_ptr<GpuMonitor>> m = GpuMonitor::open("", 0, "libm.so.6");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("lacks nvmlInit_v2"), std::string::npos) << m.status().message();
}

TEST(GpuMonitor, TheDefaultLibraryOnThisMachine) {
  // Where NVML exists this opens device 0 or says why not; either way no crash.
  Result<std::unique_ptr<GpuMonitor>> m = GpuMonitor::open("", 0);
  if (!m.ok()) {
    EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
    return;
  }
  Registry r;
  (*m)->sample(r);
  EXPECT_NE(r.render_prometheus().find("tessera_gpu_memory_total_bytes"), std::string::npos);
}

class LinkSpeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera_link_" + std::to_string(::getpid()));
    fs::create_directories(root_ / "proc/net");
    fs::create_directories(root_ / "sys/class/net/lo");
  }
  void TearDown() override { fs::remove_all(root_); }
  void iface(const std::string& name, const std::string& speed) {
    fs::create_directories(root_ / "sys/class/net" / name);
    std::ofstream(root_ / "sys/class/net" / name / "speed") << speed << "\n";
  }
  void route(const std::string& text) { std::ofstream(root_ / "proc/net/route") << text; }
  fs::path root_;
};

TEST_F(LinkSpeedTest, TheConfiguredSpeedWins) {
  iface("eth0", "10000");
  const LinkSpeed s = detect_link_speed(1.0, root_.string());
  EXPECT_DOUBLE_EQ(s.bytes_per_second, 1.25e8);
  EXPECT_EQ(s.source, "log.link_gbps");
}

TEST_F(LinkSpeedTest, TheDefaultRoutesInterface) {
  iface("eth0", "25000");
  iface("eth1", "1000");
  route("Iface\tDestination\tGateway\n"
        "eth1\t000200C0\t00000000\n"
        "eth0\t00000000\t010200C0\n");
  const LinkSpeed s = detect_link_speed(0, root_.string());
  EXPECT_DOUBLE_EQ(s.bytes_per_second, 25000e6 / 8);
  EXPECT_EQ(s.source, "sysfs:eth0");
}

TEST_F(LinkSpeedTest, TheOnlyInterfaceWithoutADefaultRoute) {
  iface("veth3", "10000");
  route("Iface\tDestination\tGateway\n");
  const LinkSpeed s = detect_link_speed(0, root_.string());
  EXPECT_EQ(s.source, "sysfs:veth3");
  EXPECT_DOUBLE_EQ(s.bytes_per_second, 1.25e9);
}

TEST_F(LinkSpeedTest, UnknownSpeedOrSeveralInterfacesIsUnknown) {
  iface("eth0", "-1");  // the driver does not know
  route("Iface\tDestination\tGateway\neth0\t00000000\t010200C0\n");
  EXPECT_FALSE(detect_link_speed(0, root_.string()).known());
  EXPECT_EQ(detect_link_speed(0, root_.string()).source, "unknown");
  route("Iface\tDestination\tGateway\n");
  iface("eth1", "1000");
  EXPECT_FALSE(detect_link_speed(0, root_.string()).known());
}

}  // namespace
}  // namespace tessera::obs
