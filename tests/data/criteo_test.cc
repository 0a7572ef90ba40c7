// Criteo-layout parsing, the click shard format, prepare's bad-line handling,
// the synthetic generator and the exact AUC (data/criteo.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/criteo.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tessera_criteo_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::vector<int64_t> kHash = {100, 7};

TEST(CriteoParse, GoodLineLogTransformsAndHashes) {
  ClickRecord r;
  ASSERT_TRUE(parse_click_line("1\t0\t-5\t\t3\tff\t", 4, kHash, r).ok());
  EXPECT_EQ(r.label, 1.0f);
  EXPECT_EQ(r.dense, (std::vector<float>{0.0f, 0.0f, 0.0f, std::log1p(3.0f)}));  // negative clamped, missing 0
  EXPECT_EQ(r.cats, (std::vector<int>{255 % 100, 0}));                          // missing category -> 0
  ASSERT_TRUE(parse_click_line("0\t1\t2\t3\t4\t0a\t1B\r", 4, kHash, r).ok()) << "CRLF line";
  EXPECT_EQ(r.cats, (std::vector<int>{10, 27 % 7}));
}

TEST(CriteoParse, EachKindOfBadLineNamesItsProblem) {
  ClickRecord r;
  auto msg = [&](const char* line) {
    const Status s = parse_click_line(line, 2, kHash, r);
    EXPECT_FALSE(s.ok()) << line;
    return s.message();
  };
  EXPECT_NE(msg("1\t2\t3\tab").find("wrong field count (got 4, want 5)"), std::string::npos);
  EXPECT_NE(msg("").find("wrong field count"), std::string::npos);
  EXPECT_NE(msg("2\t1\t1\ta\tb").find("label '2'"), std::string::npos);
  EXPECT_NE(msg("1\t1.5\t1\ta\tb").find("I1 '1.5'"), std::string::npos);
  EXPECT_NE(msg("1\t1\tabc\ta\tb").find("I2 'abc'"), std::string::npos);
  EXPECT_NE(msg("1\t1\t1\tzz\tb").find("C1 'zz'"), std::string::npos);
  EXPECT_NE(msg("1\t1\t1\ta\t0x1").find("C2 '0x1'"), std::string::npos);
  EXPECT_NE(msg("1\t1\t99999999999999999999999\ta\tb").find("I2"), std::string::npos) << "overflow";
}

TEST(ClickShard, RoundTripsAndRejectsCorruption) {
  const fs::path d = temp_dir("shard");
  ClickShard s;
  s.num_dense = 2;
  s.num_cat = 1;
  s.hash_sizes = {5};
  s.labels = {1, 0, 1};
  s.dense = {0.5f, 1, 2, 3, 4, 5};
  s.cats = {0, 4, 2};
  const std::string p = (d / "a.bin").string();
  ASSERT_TRUE(write_click_shard(p, s).ok());
  auto r = read_click_shard(p);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->labels, s.labels);
  EXPECT_EQ(r->dense, s.dense);
  EXPECT_EQ(r->cats, s.cats);
  EXPECT_EQ(r->hash_sizes, s.hash_sizes);
  fs::resize_file(p, fs::file_size(p) - 4);
  EXPECT_FALSE(read_click_shard(p).ok()) << "truncated";
  s.cats[1] = 5;  // out of its table
  ASSERT_TRUE(write_click_shard(p, s).ok());
  EXPECT_FALSE(read_click_shard(p).ok());
  std::ofstream(p) << "not a shard";
  const auto bad = read_click_shard(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad magic"), std::string::npos);
  // A row count whose byte size wraps around to the file's (2^62 rows of 4
  // bytes: 0 mod 2^64) is refused, not allocated.
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    const uint32_t head[4] = {1, 0, 0, 0};
    const uint64_t rows = uint64_t{1} << 62;
    f.write("TSCLICK1", 8);
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.write(reinterpret_cast<const char*>(&rows), 8);
  }
  const auto wrapped = read_click_shard(p);
  ASSERT_FALSE(wrapped.ok());
  EXPECT_NE(wrapped.status().message().find("does not match its header"), std::string::npos)
      << wrapped.status().message();
  fs::remove_all(d);
}

TEST(CriteoPrepare, SkipsCountsAndReportsBadLinesByNumber) {
  const fs::path d = temp_dir("prepare");
  const std::string in = (d / "in.tsv").string();
  std::ofstream(in) << "1\t3\t0a\n0\tx\t0b\n1\t4\n0\t5\tzz\n1\t\t\n0\t6\t10\n";
  CriteoPrepareOptions o;
  o.inputs = {in};
  o.out_dir = (d / "out").string();
  o.num_dense = 1;
  o.num_cat = 1;
  o.hash_size = 8;
  o.val_fraction = 0.5;  // every 2nd line (by line number) to val
  auto s = prepare_criteo(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->lines, 6);
  EXPECT_EQ(s->bad_lines, 3);
  ASSERT_EQ(s->bad_examples.size(), 3u);
  EXPECT_NE(s->bad_examples[0].find("in.tsv:2: dense feature I1 'x'"), std::string::npos) << s->bad_examples[0];
  EXPECT_NE(s->bad_examples[1].find("in.tsv:3: wrong field count"), std::string::npos);
  EXPECT_NE(s->bad_examples[2].find("in.tsv:4: categorical feature C1 'zz'"), std::string::npos);
  EXPECT_EQ(s->train_rows, 2);  // lines 1, 5
  EXPECT_EQ(s->val_rows, 1);    // line 6
  auto train = read_click_shard((d / "out" / "train.bin").string());
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(train->cats, (std::vector<int>{10 % 8, 0}));
  EXPECT_EQ(train->labels, (std::vector<float>{1, 1}));

  std::ofstream(in) << "garbage\n\n";
  auto none = prepare_criteo(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no valid Criteo line"), std::string::npos);
  o.inputs = {(d / "missing.tsv").string()};
  EXPECT_FALSE(prepare_criteo(o).ok());
  fs::remove_all(d);
}

TEST(ExactAuc, KnownValuesAndTies) {
  EXPECT_DOUBLE_EQ(exact_auc({0.1f, 0.9f}, {0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(exact_auc({0.9f, 0.1f}, {0, 1}), 0.0);
  EXPECT_DOUBLE_EQ(exact_auc({0.5f, 0.5f}, {0, 1}), 0.5);
  // pos {0.8, 0.4}, neg {0.6, 0.4, 0.2}: pairs won 2+1+0.5+0+... = (3 + 1.5) / 6
  EXPECT_DOUBLE_EQ(exact_auc({0.8f, 0.4f, 0.6f, 0.4f, 0.2f}, {1, 1, 0, 0, 0}), 4.5 / 6.0);
  EXPECT_DOUBLE_EQ(exact_auc({0.3f, 0.7f}, {1, 1}), 0.5) << "one class only";
}

TEST(SynthClicks, DeterministicCriteoLayoutWithTruth) {
  const fs::path d = temp_dir("synth");
  SynthClicksOptions o;
  o.rows = 3000;
  o.tables = 4;
  o.out = (d / "c.tsv").string();
  auto s = synth_clicks(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->truth_path, (d / "c.truth.json").string());
  EXPECT_EQ(s->heldout_rows, 300);
  EXPECT_GT(s->heldout_auc, 0.7) << "the planted model is informative";
  EXPECT_GT(s->ctr, 0.05);
  EXPECT_LT(s->ctr, 0.6);
  const auto truth = nlohmann::json::parse(std::ifstream(s->truth_path));
  EXPECT_DOUBLE_EQ(truth["heldout_auc"].get<double>(), s->heldout_auc);
  // Every line parses in the Criteo layout with 4 tables.
  std::ifstream f(o.out);
  std::string line, first;
  ClickRecord r;
  int n = 0;
  while (std::getline(f, line)) {
    if (n == 0) first = line;
    ASSERT_TRUE(parse_click_line(line, 13, std::vector<int64_t>(4, 1000), r).ok()) << line;
    n++;
  }
  EXPECT_EQ(n, 3000);
  // Same seed, same file.
  o.out = (d / "again.tsv").string();
  ASSERT_TRUE(synth_clicks(o).ok());
  std::string again;
  std::getline(std::ifstream(o.out) >> std::ws, again);
  EXPECT_EQ(again, first);
  o.tables = 27;
  EXPECT_FALSE(synth_clicks(o).ok());
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera::data
