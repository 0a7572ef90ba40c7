#include "core/progress.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace tessera {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}

TEST(ProgressBar, NotATerminalDrawsNothing) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(ProgressBar::tty(f), nullptr);
  {
    ProgressBar bar(ProgressBar::tty(f), 10, "steps");
    EXPECT_FALSE(bar.drawing());
    bar.update(5, "halfway");
    bar.finish();
  }
  EXPECT_EQ(contents(f), "");
  std::fclose(f);
}

TEST(ProgressBar, DrawsOneRewrittenLineEndedByFinish) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(f, 4, "steps");
    bar.update(0, "reading a much longer detail");
    bar.update(4, "x");  // the last one is always drawn
    bar.finish("done");
    bar.finish("again");  // idempotent
  }
  const std::string s = contents(f);
  EXPECT_EQ(s.front(), '\r');
  EXPECT_NE(s.find("[..............................] 0/4 steps, reading a much longer detail"), std::string::npos);
  EXPECT_NE(s.find("[##############################] 4/4 steps, done"), std::string::npos);
  EXPECT_EQ(s.back(), '\n');
  EXPECT_EQ(s.find("again"), std::string::npos);
  std::fclose(f);
}

TEST(ProgressBar, InterruptEndsTheLineForAnErrorMessage) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressBar bar(f, 3, "steps");
  bar.update(1, "working");
  bar.interrupt();
  bar.update(2, "ignored");
  const std::string s = contents(f);
  EXPECT_EQ(s.back(), '\n');
  EXPECT_EQ(s.find("ignored"), std::string::npos);
  std::fclose(f);
}

}  // namespace
}  // namespace tessera
