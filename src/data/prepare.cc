#include "data/prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include <fmt/format.h>
#include <omp.h>

#include "core/progress.h"

#include "data/shard.h"
#include "data/tokenizer.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

Result<std::vector<std::string>> list_inputs(const std::vector<std::string>& inputs, const std::string& format) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (!it->is_regular_file()) continue;
        std::string name = it->path().filename().string();
        if (name.empty() || name[0] == '.') continue;
        // The Brown package ships README, CONTENTS, cats.txt beside the texts
        // ca01 ... cr09: take only those.
        if (format == "brown" && !(name.size() == 4 && name[0] == 'c' && std::isalpha(name[1]) &&
                                   std::isdigit(name[2]) && std::isdigit(name[3])))
          continue;
        found.push_back(it->path().string());
      }
      if (ec) return Status::IOError(fmt::format("{}: {}", in, ec.message()));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      return Status::NotFound(fmt::format("{}: no such file or folder", in));
    }
  }
  if (files.empty()) return Status::NotFound("no input files");
  return files;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(fmt::format("{}: cannot read", path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// "1.2M tokens, 340k tokens/s": the progress bar's detail.
std::string token_rate(int64_t tokens, double seconds) {
  return fmt::format("{:.1f}M tokens, {:.0f}k tokens/s", tokens / 1e6, tokens / std::max(seconds, 1e-9) / 1e3);
}

// Writes tokens as shards of at most shard_tokens: prefix_000000.bin, ...
Status write_shards(const std::string& dir, const std::string& prefix, const std::vector<uint32_t>& tokens,
                    int64_t shard_tokens, int id_bits, std::vector<std::string>& paths) {
  int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t start = 0, index = 0; start < n; start += shard_tokens, index++) {
    int64_t count = std::min(shard_tokens, n - start);
    std::string path = (fs::path(dir) / fmt::format("{}_{:06d}.bin", prefix, index)).string();
    RETURN_IF_ERROR(write_shard(path, std::span<const uint32_t>(tokens.data() + start, count), id_bits));
    paths.push_back(path);
  }
  return Status::OK();
}

}  // namespace

std::string brown_to_text(std::string_view tagged) {
  std::string out;
  bool no_space_next = true;  // at the start, and after an opening bracket or quote
  bool paragraph_break = false;
  size_t pos = 0;
  while (pos < tagged.size()) {
    size_t eol = tagged.find('\n', pos);
    if (eol == std::string_view::npos) eol = tagged.size();
    std::string_view line = tagged.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      if (!out.empty()) paragraph_break = true;
      continue;
    }
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') j++;
      if (j == i) break;
      std::string_view tok = line.substr(i, j - i);
      i = j;
      size_t slash = tok.rfind('/');
      std::string_view word = slash == std::string_view::npos || slash == 0 ? tok : tok.substr(0, slash);
      bool opening = word == "``" || word == "(" || word == "[";
      bool closing = word == "''" || word == "," || word == "." || word == ";" || word == ":" || word == "?" ||
                     word == "!" || word == ")" || word == "]" || word == "'s" || word == "n't";
      if (word == "``" || word == "''") word = "\"";
      if (paragraph_break) {
        out += "\n\n";
        paragraph_break = false;
        no_space_next = true;
      }
      if (!out.empty() && !no_space_next && !closing) out += ' ';
      out += word;
      no_space_next = opening;
    }
  }
  if (!out.empty()) out += '\n';
  return out;
}

Result<PrepareSummary> prepare_shards(const PrepareOptions& o) {
  if (o.format != "text" && o.format != "brown")
    return Status::InvalidArgument(fmt::format("--format '{}': expected text or brown", o.format));
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return Status::InvalidArgument(fmt::format("--val-fraction {} must be in [0, 1)", o.val_fraction));
  if (o.shard_tokens <= 0) return Status::InvalidArgument("--shard-tokens must be positive");
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, make_tokenizer(o.tokenizer, o.vocab_dir));
  ASSIGN_OR_RETURN(std::vector<std::string> files, list_inputs(o.inputs, o.format));

  const int64_t docs = static_cast<int64_t>(files.size());
  const int64_t every = o.val_fraction > 0 ? std::max<int64_t>(2, std::llround(1.0 / o.val_fraction)) : 0;
  auto is_val = [&](int64_t d) { return every > 0 && docs >= 2 && d % every == every - 1; };

  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<std::vector<uint32_t>> encoded(docs);
  std::vector<Status> errors(docs);
  std::atomic<int64_t> done{0}, tokens_done{0};
  ProgressBar bar(o.progress, docs, "documents");
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t d = 0; d < docs; d++) {
    auto text = read_text(files[d]);
    if (!text.ok()) {
      errors[d] = text.status();
    } else {
      std::string plain = o.format == "brown" ? brown_to_text(text.value()) : std::move(text.value());
      encoded[d].push_back(tok->eot());
      std::vector<uint32_t> ids = tok->encode(plain);
      encoded[d].insert(encoded[d].end(), ids.begin(), ids.end());
    }
    tokens_done += static_cast<int64_t>(encoded[d].size());
    int64_t k = ++done;
    if (bar.drawing() && omp_get_thread_num() == 0) bar.update(k, token_rate(tokens_done, elapsed()));
  }
  bar.finish(token_rate(tokens_done, elapsed()));
  for (const Status& st : errors) RETURN_IF_ERROR(st);

  std::vector<uint32_t> train, val;
  for (int64_t d = 0; d < docs; d++) {
    std::vector<uint32_t>& dst = is_val(d) ? val : train;
    dst.insert(dst.end(), encoded[d].begin(), encoded[d].end());
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot create: {}", o.out_dir, ec.message()));
  PrepareSummary s;
  s.documents = docs;
  s.train_tokens = static_cast<int64_t>(train.size());
  s.val_tokens = static_cast<int64_t>(val.size());
  s.id_bits = shard_id_bits(tok->vocab_size());
  RETURN_IF_ERROR(write_shards(o.out_dir, "train", train, o.shard_tokens, s.id_bits, s.shards));
  RETURN_IF_ERROR(write_shards(o.out_dir, "val", val, o.shard_tokens, s.id_bits, s.shards));
  s.seconds = elapsed();
  return s;
}

}  // namespace tessera::data
