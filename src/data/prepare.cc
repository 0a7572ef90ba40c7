#include "data/prepare.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "data/shard.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {
constexpr uint16_t kByteEndOfText = 0;

Result<std::vector<std::string>> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_regular_file()) found.push_back(it->path().string());
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
}  // namespace

Result<PrepareSummary> prepare_shards(const PrepareOptions& o) {
  if (o.tokenizer != "byte")
    return Status::InvalidArgument(
        fmt::format("tokenizer '{}' is not available yet; use --tokenizer byte", o.tokenizer));
  if (o.val_fraction < 0.0 || o.val_fraction >= 1.0)
    return Status::InvalidArgument(fmt::format("--val-fraction {} must be in [0, 1)", o.val_fraction));
  ASSIGN_OR_RETURN(std::vector<std::string> files, list_inputs(o.inputs));

  int64_t docs = static_cast<int64_t>(files.size());
  int64_t val_docs = docs >= 2 ? std::max<int64_t>(1, static_cast<int64_t>(docs * o.val_fraction)) : 0;
  if (o.val_fraction == 0.0) val_docs = 0;
  std::vector<uint16_t> train, val;
  for (int64_t d = 0; d < docs; d++) {
    std::ifstream in(files[d], std::ios::binary);
    if (!in) return Status::IOError(fmt::format("{}: cannot read", files[d]));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<uint16_t>& dst = d < docs - val_docs ? train : val;
    dst.push_back(kByteEndOfText);  // every document starts after an end-of-text, as GPT-2 data does
    for (unsigned char ch : text) dst.push_back(ch == 0 ? ' ' : ch);
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot create: {}", o.out_dir, ec.message()));
  PrepareSummary s;
  s.documents = docs;
  s.train_tokens = static_cast<int64_t>(train.size());
  s.val_tokens = static_cast<int64_t>(val.size());
  std::string train_path = (fs::path(o.out_dir) / "train_000000.bin").string();
  RETURN_IF_ERROR(write_shard(train_path, train));
  s.shards.push_back(train_path);
  if (!val.empty()) {
    std::string val_path = (fs::path(o.out_dir) / "val_000000.bin").string();
    RETURN_IF_ERROR(write_shard(val_path, val));
    s.shards.push_back(val_path);
  }
  return s;
}

}  // namespace tessera::data
