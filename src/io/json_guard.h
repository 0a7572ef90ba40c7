// A pass over JSON text before a DOM parser sees it (issue #18 item 1: a
// safetensors header of 50 MB of '[' took nlohmann-json 3.8 GB and 15 s to
// refuse: every '[' became a nested array).
//
// check_json_nesting() walks the bytes once, allocating nothing, and refuses
// text that nests deeper, or has a longer array, than the format allows. It
// checks only the structure it counts (brackets outside strings); the
// parser still validates the syntax. Thread-safe (pure).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace tessera::io {

struct JsonLimits {
  int max_depth = 16;                   // objects and arrays open at once
  int64_t max_array = INT64_MAX;        // elements of one array
};

// Corruption "JSON nests deeper than 3 levels at byte 4" or "an array at
// byte 120 has more than 64 elements"; OK otherwise (also for text that is
// not valid JSON: the parser's error is the better one there).
Status check_json_nesting(std::string_view text, const JsonLimits& limits);

}  // namespace tessera::io
