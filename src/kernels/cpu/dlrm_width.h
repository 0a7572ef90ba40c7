// The dot interaction (ops.inc interaction_forward/backward) at a given
// vector width, 16 floats (wide) or 8, whatever the machine: the ops take
// 16 where AVX-512F is there and 8 elsewhere (dlrm.cc), and the tests check
// that the two give the same bits. Either width runs on any x86-64 (16 is
// slow without AVX-512: GCC splits its vectors). D not a multiple of 16
// takes the plain loops at either width.
#pragma once

namespace tessera::cpu {

void interaction_forward_width(float* out, const float* feat, int B, int F, int D, bool wide);
void interaction_backward_width(float* dfeat, const float* dout, const float* feat, int B, int F, int D, bool wide);

}  // namespace tessera::cpu
