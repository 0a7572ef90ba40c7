#include "ckpt/manifest.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <xxhash.h>

#include "io/checksum.h"
#include "io/json_guard.h"

namespace tessera::ckpt {
namespace {

using nlohmann::json;

json shape_json(const Shape& s) {
  json a = json::array();
  for (int i = 0; i < s.rank; i++) a.push_back(s[i]);
  return a;
}

// Field readers: each failure is a Corruption naming `where` and the key.
struct Fields {
  const json& obj;
  std::string where;

  Status missing_or_bad(const char* key, const char* what) const {
    return Status::Corruption(fmt::format("{}: \"{}\" {}", where, key, what));
  }
  const json* find(const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  Result<int64_t> integer(const char* key, int64_t min = 0) const {
    const json* v = find(key);
    if (v == nullptr) return missing_or_bad(key, "is missing");
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX))
      return missing_or_bad(key, "is not an integer");
    if (v->get<int64_t>() < min) return missing_or_bad(key, fmt::format("is below {}", min).c_str());
    return v->get<int64_t>();
  }
  Result<std::string> string(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return missing_or_bad(key, "is missing");
    if (!v->is_string()) return missing_or_bad(key, "is not a string");
    return v->get<std::string>();
  }
  Result<uint64_t> hash(const char* key) const {
    ASSIGN_OR_RETURN(std::string s, string(key));
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
    if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size())
      return missing_or_bad(key, "is not 16 hex digits");
    return v;
  }
  Result<std::vector<int64_t>> ints(const char* key, size_t min_len, size_t max_len) const {
    const json* v = find(key);
    if (v == nullptr) return missing_or_bad(key, "is missing");
    if (!v->is_array() || v->size() < min_len || v->size() > max_len)
      return missing_or_bad(key, fmt::format("is not an array of {} to {} integers", min_len, max_len).c_str());
    std::vector<int64_t> out;
    for (const json& e : *v) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX) ||
          e.get<int64_t>() < 0)
        return missing_or_bad(key, "holds a value that is not a non-negative integer");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  Result<Shape> shape(const char* key, int min_rank) const {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, ints(key, min_rank, Shape::kMaxDims));
    Shape s;
    for (int64_t d : dims) s.dims[s.rank++] = d;
    return s;
  }
};

Result<PieceRecord> piece_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::Corruption(where + ": not a JSON object");
  PieceRecord p;
  ASSIGN_OR_RETURN(p.name, (Fields{j, where}.string("name")));
  Fields f{j, fmt::format("{} '{}'", where, p.name)};
  ASSIGN_OR_RETURN(std::string dtype, f.string("dtype"));
  if (dtype != "F32") return Status::Corruption(fmt::format("{}: dtype '{}' is not F32", f.where, dtype));
  ASSIGN_OR_RETURN(p.slice.global, f.shape("global", 0));
  ASSIGN_OR_RETURN(p.slice.view, f.shape("view", 1));
  ASSIGN_OR_RETURN(p.slice.begin, f.ints("begin", 1, Shape::kMaxDims));
  ASSIGN_OR_RETURN(p.slice.size, f.ints("size", 1, Shape::kMaxDims));
  ASSIGN_OR_RETURN(std::vector<int64_t> flat, f.ints("flat", 2, 2));
  p.slice.flat_begin = flat[0];
  p.slice.flat_end = flat[1];
  if (Status st = check_slice(p.slice); !st.ok()) return Status::Corruption(f.where + ": " + st.message());
  ASSIGN_OR_RETURN(std::vector<int64_t> range, f.ints("data_offsets", 2, 2));
  p.offset = static_cast<uint64_t>(range[0]);
  p.bytes = static_cast<uint64_t>(range[1]) - p.offset;
  if (range[1] < range[0] || p.bytes != static_cast<uint64_t>(p.slice.numel()) * sizeof(float))
    return Status::Corruption(fmt::format("{}: data_offsets [{}, {}] do not span {} floats", f.where, range[0],
                                          range[1], p.slice.numel()));
  ASSIGN_OR_RETURN(p.xxh64, f.hash("xxh64"));
  return p;
}

bool same_shape(const Shape& a, const Shape& b) { return a == b; }

}  // namespace

Status check_slice(const TensorSlice& s) {
  const int r = s.view.rank;
  if (r < 1) return Status::InvalidArgument("view has no dimensions");
  if (static_cast<int>(s.begin.size()) != r || static_cast<int>(s.size.size()) != r)
    return Status::InvalidArgument(fmt::format("view {} has rank {} but begin/size have {}/{} entries", s.view.str(),
                                               r, s.begin.size(), s.size.size()));
  for (int d = 0; d < s.view.rank; d++)
    if (s.view[d] < 0) return Status::InvalidArgument(fmt::format("view {} has a negative dimension", s.view.str()));
  for (int d = 0; d < s.global.rank; d++)
    if (s.global[d] < 0)
      return Status::InvalidArgument(fmt::format("global {} has a negative dimension", s.global.str()));
  if (s.global.numel() != s.view.numel())
    return Status::InvalidArgument(
        fmt::format("view {} does not hold the {} elements of global {}", s.view.str(), s.global.numel(), s.global.str()));
  for (int d = 0; d < r; d++)
    if (s.begin[d] < 0 || s.size[d] < 0 || s.begin[d] + s.size[d] > s.view[d])
      return Status::InvalidArgument(fmt::format("block [{}, {}) in dimension {} lies outside view {}", s.begin[d],
                                                 s.begin[d] + s.size[d], d, s.view.str()));
  const int64_t end = s.flat_end < 0 ? s.block_numel() : s.flat_end;
  if (s.flat_begin < 0 || s.flat_begin > end || end > s.block_numel())
    return Status::InvalidArgument(fmt::format("flat range [{}, {}) lies outside the block of {} elements",
                                               s.flat_begin, s.flat_end, s.block_numel()));
  return Status::OK();
}

json shard_to_json(const ShardRecord& s) {
  json pieces = json::array();
  for (const PieceRecord& p : s.pieces) {
    const TensorSlice& t = p.slice;
    pieces.push_back({{"name", p.name},
                      {"dtype", "F32"},
                      {"global", shape_json(t.global)},
                      {"view", shape_json(t.view)},
                      {"begin", t.begin},
                      {"size", t.size},
                      {"flat", {t.flat_begin, t.flat_end < 0 ? t.block_numel() : t.flat_end}},
                      {"data_offsets", {p.offset, p.offset + p.bytes}},
                      {"xxh64", hex64(p.xxh64)}});
  }
  return {{"file", s.file},     {"rank", s.rank},   {"bytes", s.bytes}, {"xxh64", hex64(s.xxh64)},
          {"state_xxh64", hex64(s.state_xxh64)}, {"pieces", std::move(pieces)}};
}

json manifest_to_json(const Manifest& m) {
  json shards = json::array();
  for (const ShardRecord& s : m.shards) shards.push_back(shard_to_json(s));
  json j = {{"format", kFormatName}, {"version", kFormatVersion}, {"step", m.step}, {"world_size", m.world_size},
            {"config", m.config},    {"layout", m.layout},        {"shards", std::move(shards)}};
  j["manifest_xxh64"] = hex64(manifest_content_xxh64(j));
  return j;
}

uint64_t manifest_content_xxh64(json j) {
  j.erase("manifest_xxh64");
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return XXH64(text.data(), text.size(), 0);
}

Status check_manifest_checksum(std::string_view text) {
  RETURN_IF_ERROR(io::check_json_nesting(text, io::JsonLimits{}));
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("not a JSON object");
  auto it = j.find("manifest_xxh64");
  if (it == j.end()) return Status::OK();
  Fields f{j, "manifest"};
  ASSIGN_OR_RETURN(uint64_t want, f.hash("manifest_xxh64"));
  const uint64_t got = manifest_content_xxh64(j);
  if (got != want)
    return Status::Corruption(fmt::format(
        "its contents hash to {} but \"manifest_xxh64\" says {}: the manifest was edited or corrupted", hex64(got),
        hex64(want)));
  return Status::OK();
}

Result<ShardRecord> shard_from_json(const json& j) {
  if (!j.is_object()) return Status::Corruption("shard entry is not a JSON object");
  ShardRecord s;
  ASSIGN_OR_RETURN(int64_t rank, (Fields{j, "shard"}.integer("rank")));
  if (rank > INT32_MAX) return Status::Corruption("shard: \"rank\" is too large");
  s.rank = static_cast<int>(rank);
  Fields f{j, fmt::format("shard of rank {}", s.rank)};
  ASSIGN_OR_RETURN(s.file, f.string("file"));
  // A bare file name: a manifest must not point outside its folder.
  if (s.file.empty() || s.file.find('/') != std::string::npos || s.file == "." || s.file == "..")
    return Status::Corruption(fmt::format("{}: file name '{}' is not a plain file name", f.where, s.file));
  ASSIGN_OR_RETURN(int64_t bytes, f.integer("bytes"));
  s.bytes = static_cast<uint64_t>(bytes);
  ASSIGN_OR_RETURN(s.xxh64, f.hash("xxh64"));
  ASSIGN_OR_RETURN(s.state_xxh64, f.hash("state_xxh64"));
  const json* pieces = f.find("pieces");
  if (pieces == nullptr || !pieces->is_array()) return f.missing_or_bad("pieces", "is not an array");
  std::set<std::string> names;
  for (size_t i = 0; i < pieces->size(); i++) {
    ASSIGN_OR_RETURN(PieceRecord p, piece_from_json((*pieces)[i], fmt::format("{}: piece {}", f.where, i)));
    if (p.offset + p.bytes > s.bytes || p.offset + p.bytes < p.offset)
      return Status::Corruption(fmt::format("{}: piece '{}' bytes [{}, {}) lie past the file's {} bytes", f.where,
                                            p.name, p.offset, p.offset + p.bytes, s.bytes));
    if (!names.insert(p.name).second)
      return Status::Corruption(fmt::format("{}: two pieces named '{}'", f.where, p.name));
    s.pieces.push_back(std::move(p));
  }
  return s;
}

Result<Manifest> parse_manifest(std::string_view text) {
  // Deep nesting is refused before the DOM parser spends memory on it.
  RETURN_IF_ERROR(io::check_json_nesting(text, io::JsonLimits{}));
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption("not valid JSON");
  if (!j.is_object()) return Status::Corruption("not a JSON object");
  try {
    Fields f{j, "manifest"};
    ASSIGN_OR_RETURN(std::string format, f.string("format"));
    if (format != kFormatName)
      return Status::Corruption(fmt::format("\"format\" is '{}', not '{}'", format, kFormatName));
    ASSIGN_OR_RETURN(int64_t version, f.integer("version"));
    if (version != kFormatVersion)
      return Status::Corruption(fmt::format("format version {} is not supported (this build reads {})", version,
                                            kFormatVersion));
    Manifest m;
    ASSIGN_OR_RETURN(m.step, f.integer("step"));
    ASSIGN_OR_RETURN(int64_t world, f.integer("world_size", 1));
    if (world > INT32_MAX) return Status::Corruption("\"world_size\" is too large");
    m.world_size = static_cast<int>(world);
    if (const json* c = f.find("config")) m.config = *c;
    if (const json* l = f.find("layout")) m.layout = *l;
    const json* shards = f.find("shards");
    if (shards == nullptr || !shards->is_array()) return f.missing_or_bad("shards", "is not an array");
    if (shards->size() != static_cast<size_t>(m.world_size))
      return Status::Corruption(
          fmt::format("{} shards listed for a world of {} ranks", shards->size(), m.world_size));
    for (const json& sj : *shards) {
      ASSIGN_OR_RETURN(ShardRecord s, shard_from_json(sj));
      m.shards.push_back(std::move(s));
    }
    std::sort(m.shards.begin(), m.shards.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    std::set<std::string> files;
    for (int r = 0; r < m.world_size; r++) {
      if (m.shards[r].rank != r) return Status::Corruption(fmt::format("no shard for rank {}", r));
      if (!files.insert(m.shards[r].file).second)
        return Status::Corruption(fmt::format("two shards in file '{}'", m.shards[r].file));
    }
    // Pieces of one tensor must agree on its global shape and view.
    std::map<std::string, const TensorSlice*> first;
    for (const ShardRecord& s : m.shards)
      for (const PieceRecord& p : s.pieces) {
        auto [it, fresh] = first.emplace(p.name, &p.slice);
        if (!fresh && (!same_shape(it->second->global, p.slice.global) || !same_shape(it->second->view, p.slice.view)))
          return Status::Corruption(fmt::format("tensor '{}': rank {} stores it as global {} view {}, another rank "
                                                "as global {} view {}",
                                                p.name, s.rank, p.slice.global.str(), p.slice.view.str(),
                                                it->second->global.str(), it->second->view.str()));
      }
    return m;
  } catch (const json::exception& e) {  // not expected: every access is type-checked first
    return Status::Corruption(fmt::format("bad manifest: {}", e.what()));
  }
}

std::string step_dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string shard_file_name(int rank) { return fmt::format("shard-{:05d}.safetensors", rank); }

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view digits = name.substr(kPrefix.size());
  int64_t step = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0 || digits[0] == '+')
    return std::nullopt;
  return step;
}

std::string hex64(uint64_t v) { return io::hex64(v); }

}  // namespace tessera::ckpt
