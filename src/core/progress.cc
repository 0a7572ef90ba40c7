#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

namespace tessera {

ProgressBar::ProgressBar(std::FILE* out, int64_t total, std::string unit)
    : out_(out), total_(total), unit_(std::move(unit)) {}

ProgressBar::~ProgressBar() { interrupt(); }

void ProgressBar::interrupt() {
  if (out_ && !finished_ && last_width_ > 0) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  finished_ = true;
}

std::FILE* ProgressBar::tty(std::FILE* f) { return f && isatty(fileno(f)) ? f : nullptr; }

void ProgressBar::update(int64_t done, const std::string& detail) {
  if (!out_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && last_width_ > 0 && now - last_draw_ < std::chrono::milliseconds(50)) return;
  last_draw_ = now;
  draw(done, detail);
}

void ProgressBar::finish(const std::string& detail) {
  if (!out_ || finished_) return;
  draw(total_, detail);
  std::fputc('\n', out_);
  std::fflush(out_);
  finished_ = true;
}

void ProgressBar::draw(int64_t done, const std::string& detail) {
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * std::clamp<int64_t>(done, 0, total_) / total_) : kWidth;
  std::string line = "[" + std::string(static_cast<size_t>(filled), '#') +
                     std::string(static_cast<size_t>(kWidth - filled), '.') + "] " + std::to_string(done) + "/" +
                     std::to_string(total_) + " " + unit_;
  if (!detail.empty()) line += ", " + detail;
  const size_t width = line.size();
  if (width < last_width_) line += std::string(last_width_ - width, ' ');
  last_width_ = width;
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
}

}  // namespace tessera
