#include "io/json_guard.h"

#include <vector>

#include <fmt/format.h>

namespace tessera::io {

Status check_json_nesting(std::string_view text, const JsonLimits& limits) {
  // Per open level: is it an array, its element count so far (commas + 1
  // once a value has started) and where it opened. Bounded by max_depth.
  struct Level {
    bool array;
    int64_t elements;
    size_t at;
  };
  std::vector<Level> open;
  open.reserve(static_cast<size_t>(limits.max_depth > 0 ? limits.max_depth : 0) + 1);
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); i++) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    // A value starts inside an array: count it once, at its first byte.
    if (!open.empty() && open.back().array && open.back().elements == 0 && ch != ']' && ch != ' ' && ch != '\n' &&
        ch != '\t' && ch != '\r')
      open.back().elements = 1;
    switch (ch) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (static_cast<int>(open.size()) >= limits.max_depth)
          return Status::Corruption(fmt::format("JSON nests deeper than {} level(s) at byte {}", limits.max_depth, i));
        open.push_back({ch == '[', 0, i});
        break;
      case ']':
      case '}':
        if (!open.empty()) open.pop_back();
        break;
      case ',':
        if (!open.empty() && open.back().array && ++open.back().elements > limits.max_array)
          return Status::Corruption(fmt::format("JSON array at byte {} has more than {} elements", open.back().at,
                                                limits.max_array));
        break;
      default:
        break;
    }
  }
  return Status::OK();
}

}  // namespace tessera::io
