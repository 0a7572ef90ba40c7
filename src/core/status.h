// Status and Result<T>: errors a user or the world can cause (bad config,
// corrupt file, dead peer). Carried up to the CLI, which prints message() as
// one line and picks the exit code. Cheap to copy; the OK status holds no
// string.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace tessera {

enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kCorruption, kIOError, kUnavailable, kInternal,
                        kResourceExhausted };

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(StatusCode::kCorruption, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  // Out of a bounded resource (KV-cache blocks, queue slots, memory): the
  // caller may wait and retry.
  static Status ResourceExhausted(std::string msg) {
    return Status(StatusCode::kResourceExhausted, std::move(msg));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  // "invalid argument: ..." style, for logs.
  std::string ToString() const;
  // Prefixes context: Status::Corruption("bad magic").With("model.bin") ->
  // "model.bin: bad magic".
  Status With(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + msg_);
  }

 private:
  Status(StatusCode code, std::string msg) : code_(code), msg_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
};

// Result<T>: a value or a non-OK Status.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  // An OK status carries no value: a bug in the caller, made an error that
  // says so rather than a Result that is neither value nor message.
  Result(Status status)
      : v_(status.ok() ? Status::Internal("a Result was made from an OK status and no value (a bug)")
                       : std::move(status)) {}
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// Returns early from a function returning Status or Result<T>.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::tessera::Status _st = (expr);           \
    if (!_st.ok()) return _st;                \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result<T>.
#define ASSIGN_OR_RETURN(lhs, rexpr) ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_res_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                          \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
