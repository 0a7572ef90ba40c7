#include "obs/op_timer.h"

namespace tessera {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kMatmul: return "matmul";
    case OpKind::kAttention: return "attention";
    case OpKind::kLayernorm: return "layernorm";
    case OpKind::kElementwise: return "elementwise";
    case OpKind::kCrossEntropy: return "crossentropy";
    case OpKind::kEncoder: return "encoder";
    case OpKind::kAdamW: return "adamw";
    case OpKind::kCount: break;
  }
  return "?";
}

OpTimes& op_times() {
  static OpTimes t;
  return t;
}

}  // namespace tessera
