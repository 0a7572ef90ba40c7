// The 4-bit matmul's oracle: plain loops over the blocks (ops.inc,
// kernels/q4.h).
#include <cstring>
#include <vector>

#include "kernels/q4.h"
#include "kernels/ref/ops.h"

namespace tessera::ref {

void matmul_q4_forward(float* out, const float* inp, const uint8_t* wq, q4::Type type, const float* bias, int N,
                       int C, int OC) {
  if (q4::interleaved(type)) {
    // The same blocks in their rows again.
    std::vector<uint8_t> rows(static_cast<size_t>(OC) * q4::row_bytes(type, C));
    q4::unpack_x16(type, rows.data(), wq, OC, C);
    return matmul_q4_forward(out, inp, rows.data(), q4::rows_type(type), bias, N, C, OC);
  }
  const int64_t rb = q4::row_bytes(type, C);
  const int nb = C / q4::block_elems(type);
  std::vector<int8_t> a(C);
  std::vector<float> xs(C / q4::act_block(type));
  std::vector<int32_t> sums(C / q4::kSubBlock);
  for (int i = 0; i < N; i++) {
    q4::quantize_activations(type, inp + static_cast<int64_t>(i) * C, C, a.data(), xs.data(), sums.data());
    for (int o = 0; o < OC; o++) {
      const uint8_t* row = wq + o * rb;
      float acc = 0.0f;
      for (int b = 0; b < nb; b++) {
        const uint8_t* y = row + static_cast<int64_t>(b) * q4::block_bytes(type);
        uint16_t dh;
        std::memcpy(&dh, y, 2);
        const float d = q4::fp16_to_f32(dh);
        if (type == q4::Type::kQ4_0) {
          const int8_t* ab = a.data() + b * 32;
          int32_t isum = 0;
          for (int j = 0; j < 16; j++)
            isum += ((y[2 + j] & 0xF) - 8) * ab[j] + ((y[2 + j] >> 4) - 8) * ab[j + 16];
          acc += (d * xs[b]) * static_cast<float>(isum);
          continue;
        }
        uint16_t mh;
        std::memcpy(&mh, y + 2, 2);
        const float dmin = q4::fp16_to_f32(mh);
        const int8_t* ab = a.data() + b * 256;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
          int sc, m;
          q4::scale_min(j, y + 4, &sc, &m);
          const uint8_t* q = y + 16 + 32 * (j / 2);
          int32_t s = 0;
          for (int l = 0; l < 32; l++) s += (j % 2 == 0 ? q[l] & 0xF : q[l] >> 4) * ab[32 * j + l];
          isum += sc * s;
          msum += m * sums[8 * b + j];
        }
        acc += (d * xs[b]) * static_cast<float>(isum) - (dmin * xs[b]) * static_cast<float>(msum);
      }
      out[static_cast<int64_t>(i) * OC + o] = acc + (bias ? bias[o] : 0.0f);
    }
  }
}

}  // namespace tessera::ref
