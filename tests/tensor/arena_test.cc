#include "tensor/arena.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

#include "tensor/dtype.h"

namespace tessera {
namespace {

TEST(Arena, EveryTensorIs64ByteAlignedAndZeroed) {
  Arena a;
  a.reserve("odd", DType::kF32, {3});
  a.reserve("bf", DType::kBF16, {5, 7});
  a.reserve("big", DType::kF32, {100, 3});
  ASSERT_TRUE(a.try_allocate().ok());
  for (int i = 0; i < a.count(); i++) {
    Tensor t = a.tensor(i);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % Arena::kAlign, 0u) << a.name(i);
    for (size_t b = 0; b < t.nbytes(); b++) ASSERT_EQ(static_cast<char*>(t.data)[b], 0);
  }
  EXPECT_EQ(a.tensor(1).shape, (Shape{5, 7}));
  EXPECT_EQ(a.tensor(1).nbytes(), 70u);
}

TEST(Arena, CloneLayoutHasTheSameOffsets) {
  Arena a;
  a.reserve("x", DType::kF32, {10});
  a.reserve("y", DType::kF32, {33});
  ASSERT_TRUE(a.try_allocate().ok());
  a.tensor(1).f32()[0] = 5.0f;
  Result<Arena> cloned = a.try_clone_layout(a.device());
  ASSERT_TRUE(cloned.ok()) << cloned.status().message();
  const Arena& b = *cloned;
  ASSERT_EQ(b.count(), 2);
  EXPECT_EQ(b.bytes(), a.bytes());
  EXPECT_EQ(b.offset(1), a.offset(1));
  EXPECT_EQ(b.tensor(1).f32()[0], 0.0f);  // zeroed, not copied
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties go to even (1+2^-6).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace tessera
