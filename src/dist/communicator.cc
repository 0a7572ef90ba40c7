#include "dist/communicator.h"

#include "core/check.h"

namespace tessera::dist {

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::kF32: return 4;
    case ElemType::kF64: return 8;
    case ElemType::kI32: return 4;
    case ElemType::kI64: return 8;
    case ElemType::kU64: return 8;
    case ElemType::kU8: return 1;
  }
  CHECK(false && "unknown ElemType");
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::kF32: return "float";
    case ElemType::kF64: return "double";
    case ElemType::kI32: return "int32";
    case ElemType::kI64: return "int64";
    case ElemType::kU64: return "uint64";
    case ElemType::kU8: return "uint8";
  }
  CHECK(false && "unknown ElemType");
  return "";
}

}  // namespace tessera::dist
