#include "comm/communicator.h"

#include <fmt/format.h>

#include "core/check.h"

namespace tessera::comm {

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

std::string format_rank_runs(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) j++;
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string format_peer_list(const std::vector<int>& peers) {
  constexpr size_t kMaxNamed = 16;
  std::string out = "[";
  for (size_t i = 0; i < peers.size() && i < kMaxNamed; i++) out += fmt::format("{}{}", i ? ", " : "", peers[i]);
  if (peers.size() > kMaxNamed) out += fmt::format(", ... and {} more", peers.size() - kMaxNamed);
  return out + "]";
}

}  // namespace tessera::comm
