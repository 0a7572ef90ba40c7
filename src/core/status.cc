#include "core/status.h"

namespace tessera {

std::string Status::ToString() const {
  const char* name = "ok";
  switch (code_) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: name = "invalid argument"; break;
    case StatusCode::kNotFound: name = "not found"; break;
    case StatusCode::kCorruption: name = "corruption"; break;
    case StatusCode::kIOError: name = "I/O error"; break;
    case StatusCode::kUnavailable: name = "unavailable"; break;
    case StatusCode::kInternal: name = "internal"; break;
    case StatusCode::kResourceExhausted: name = "resource exhausted"; break;
  }
  return std::string(name) + ": " + msg_;
}

}  // namespace tessera
