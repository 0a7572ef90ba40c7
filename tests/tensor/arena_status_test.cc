// Errors the world causes come back as a Status from the low layers (out of
// memory, a failed device copy, a CUDA arena without CUDA); CHECK_OK is the
// bug channel and aborts.
#include <gtest/gtest.h>

#include <vector>

#include "core/try.h"
#include "runtime/cuda_device.h"
#include "tensor/arena.h"
#include "tensor/device_memory.h"

namespace tessera {
namespace {

TEST(ArenaStatus, HostOutOfMemoryIsAStatusNamingTheSize) {
  Arena a;
  a.reserve("huge", DType::kF32, Shape{int64_t{1} << 40, int64_t{1} << 20});  // 4 EiB
  Status st = a.try_allocate();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("host arena"), std::string::npos) << st.message();
  EXPECT_FALSE(a.allocated());
}

TEST(ArenaStatus, HostArenaAllocatesZeroed) {
  Arena a;
  const int i = a.reserve("x", DType::kF32, Shape{16});
  ASSERT_TRUE(a.try_allocate().ok());
  const float* x = static_cast<const float*>(a.tensor(i).data);
  for (int k = 0; k < 16; k++) EXPECT_EQ(x[k], 0.0f);
  Result<Arena> b = a.try_clone_layout(Device::kCPU);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->try_copy_from(a).ok());
}

TEST(ArenaStatus, DeviceArenaWithoutADeviceIsAStatus) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  Arena a;
  a.reserve("x", DType::kF32, Shape{16});
  a.set_device(Device::kCUDA);
  Status st = a.try_allocate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device arena"), std::string::npos) << st.message();
  EXPECT_FALSE(a.allocated());
}

TEST(ArenaStatus, DeviceCopyWithoutADeviceIsAStatus) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::vector<float> host(4, 1.0f), other(4);
  EXPECT_FALSE(try_copy_to_device(Device::kCUDA, other.data(), host.data(), 16).ok());
  EXPECT_FALSE(try_copy_to_host(Device::kCUDA, other.data(), host.data(), 16).ok());
  EXPECT_FALSE(try_zero_on_device(Device::kCUDA, other.data(), 16).ok());
  EXPECT_TRUE(try_copy_to_host(Device::kCPU, other.data(), host.data(), 16).ok());
  EXPECT_EQ(other[3], 1.0f);
}

Status fails() { return Status::Internal("broken invariant"); }
Status passes_through() {
  RETURN_IF_ERROR(fails());
  return Status::OK();
}

TEST(TryFamily, ReturnIfErrorReturnsAndCheckOkAborts) {
  EXPECT_EQ(passes_through().message(), "broken invariant");
  CHECK_OK(Status::OK());
  EXPECT_DEATH(CHECK_OK(fails()), "CHECK_OK failed: fails\\(\\): .*broken invariant");
}

}  // namespace
}  // namespace tessera
