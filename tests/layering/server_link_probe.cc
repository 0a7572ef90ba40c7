// What a server links: the model (nn) and the layers below it, nothing else:
// no comm/mpi, no parallel, no train. Linked against tessera_nn alone;
// tests/layering/check_server_link.sh checks that the binary carries no MPI
// and runs it: a tiny GPT-2 forward pass on the CPU must give a finite loss.
#include <cmath>
#include <cstdio>
#include <vector>

#include "nn/gpt.h"

int main() {
  tessera::GPTConfig c;
  c.layers = 1;
  c.heads = 2;
  c.channels = 16;
  c.vocab = 64;
  c.context = 8;
  auto made = tessera::GPT::create(c);
  if (!made.ok()) {
    std::fprintf(stderr, "server_link_probe: %s\n", made.status().ToString().c_str());
    return 1;
  }
  tessera::GPT& model = **made;
  if (!model.init_weights(1).ok()) return 1;
  const int B = 1, T = 8;
  std::vector<int> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    inputs[i] = i % c.vocab;
    targets[i] = (i + 1) % c.vocab;
  }
  if (!model.check_batch(inputs.data(), targets.data(), B, T).ok()) return 1;
  auto forward = model.try_forward(inputs.data(), targets.data(), B, T);
  if (!forward.ok()) {
    std::fprintf(stderr, "server_link_probe: %s\n", forward.status().ToString().c_str());
    return 1;
  }
  const float loss = *forward;
  std::printf("server_link_probe: loss %.4f (about ln 64 = 4.16)\n", loss);
  return std::isfinite(loss) && loss > 0.0f ? 0 : 1;
}
