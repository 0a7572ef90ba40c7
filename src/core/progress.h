// A one-line progress bar for long command-line work (prepare, export,
// quantize, registry add), drawn only on a terminal:
//
//   [###########...................] 2/5 steps, writing model.safetensors
//
// Each update rewrites the line (carriage return); finish() ends it with a
// newline. With a null stream it draws nothing, so a caller writes
// `ProgressBar bar(ProgressBar::tty(stderr), ...)` and stays quiet and
// line-based when the output is a file or a pipe. Redraws are limited to one
// every 50 ms (and the last one), so a hot loop may call update() freely.
//
// Thread safety: one thread draws (prepare updates it from OpenMP thread 0).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera {

class ProgressBar {
 public:
  // total: the count `done` runs up to; unit: what it counts ("documents").
  ProgressBar(std::FILE* out, int64_t total, std::string unit);
  ~ProgressBar();  // interrupt()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `f` when it is a terminal, else null.
  static std::FILE* tty(std::FILE* f);

  void update(int64_t done, const std::string& detail = "");
  // Draws done = total with `detail` and ends the line; idempotent.
  void finish(const std::string& detail = "");
  // Ends the line as it is (before an error message is printed); idempotent.
  void interrupt();
  bool drawing() const { return out_ != nullptr; }

 private:
  void draw(int64_t done, const std::string& detail);

  std::FILE* out_;
  int64_t total_;
  std::string unit_;
  size_t last_width_ = 0;  // characters of the last line, to blank a longer one
  std::chrono::steady_clock::time_point last_draw_{};
  bool finished_ = false;
};

}  // namespace tessera
