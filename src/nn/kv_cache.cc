#include "nn/kv_cache.h"

#include <algorithm>

#include <xxhash.h>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera {

namespace {

bool same_shape(const GPTConfig& a, const GPTConfig& b) { return a == b; }

}  // namespace

Result<KvDtype> parse_kv_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32") return KvDtype::kF32;
  if (name == "f16" || name == "fp16") return KvDtype::kF16;
  return Status::InvalidArgument(fmt::format("KV cache dtype '{}': fp32 or f16", name));
}

const char* kv_dtype_name(KvDtype t) { return t == KvDtype::kF16 ? "f16" : "fp32"; }

int kv_dtype_bytes(KvDtype t) { return t == KvDtype::kF16 ? 2 : 4; }

int64_t PagedKVCache::bytes_per_block(const GPT& model, int block_size, KvDtype dtype) {
  const ModelShard& s = model.shard();
  const int64_t layers = s.layers(model.config());
  return 2 * layers * block_size * (model.config().kv_dim() / s.tp) * int64_t{kv_dtype_bytes(dtype)};
}

PagedKVCache::PagedKVCache(Uninitialised, const GPT& model, int num_blocks, int block_size, int max_seqs,
                           KvDtype dtype)
    : config_(model.config()),
      shard_(model.shard()),
      layers_(model.shard().layers(model.config())),
      channels_(model.config().kv_dim() / model.shard().tp),
      num_blocks_(num_blocks),
      block_size_(block_size),
      max_seqs_(max_seqs),
      dtype_(dtype) {}

Result<std::unique_ptr<PagedKVCache>> PagedKVCache::create(const GPT& model, int num_blocks, int block_size,
                                                           int max_seqs, KvDtype dtype) {
  if (dtype == KvDtype::kF16 && model.device() != Device::kCPU)
    return Status::InvalidArgument(
        "an f16 KV cache runs on the CPU (the CUDA kernels read an fp32 cache): --kv-dtype fp32");
  std::unique_ptr<PagedKVCache> cache(
      new PagedKVCache(Uninitialised{}, model, num_blocks, block_size, max_seqs, dtype));
  RETURN_IF_ERROR(cache->init(model.device()));
  return cache;
}

Status PagedKVCache::init(Device device) {
  if (num_blocks_ < 1 || block_size_ < 1 || max_seqs_ < 1)
    return Status::InvalidArgument(fmt::format(
        "a KV cache needs at least one block, one position a block and one sequence; got {} block(s) of {}, "
        "{} sequence(s)",
        num_blocks_, block_size_, max_seqs_));
  const int64_t rows = int64_t{num_blocks_} * block_size_;
  pool_.set_device(device);
  const DType element = dtype_ == KvDtype::kF16 ? DType::kU16 : DType::kF32;
  pool_.reserve("keys", element, {layers_, rows, channels_});
  pool_.reserve("values", element, {layers_, rows, channels_});
  RETURN_IF_ERROR(pool_.try_allocate().With(fmt::format("the KV cache ({} blocks of {})", num_blocks_, block_size_)));
  live_.assign(max_seqs_, false);
  length_.assign(max_seqs_, 0);
  table_.assign(max_seqs_, {});
  seq_committed_.assign(max_seqs_, 0);
  seq_stopped_.assign(max_seqs_, 0);
  ref_.assign(num_blocks_, 0);
  key_.assign(num_blocks_, BlockKey{});
  lru_pos_.assign(num_blocks_, lru_.end());
  in_lru_.assign(num_blocks_, 0);
  clear();
  return Status::OK();
}

void PagedKVCache::clear() {
  free_.resize(num_blocks_);
  // Popped from the back: block 0 first.
  for (int i = 0; i < num_blocks_; i++) free_[i] = num_blocks_ - 1 - i;
  std::fill(live_.begin(), live_.end(), false);
  std::fill(length_.begin(), length_.end(), 0);
  for (auto& t : table_) t.clear();
  std::fill(seq_committed_.begin(), seq_committed_.end(), 0);
  std::fill(seq_stopped_.begin(), seq_stopped_.end(), 0);
  std::fill(ref_.begin(), ref_.end(), 0);
  for (BlockKey& k : key_) k = BlockKey{};
  by_hash_.clear();
  lru_.clear();
  std::fill(lru_pos_.begin(), lru_pos_.end(), lru_.end());
  std::fill(in_lru_.begin(), in_lru_.end(), 0);
  cached_ = 0;
}

void PagedKVCache::uncommit(int b) {
  BlockKey& k = key_[b];
  if (!k.committed) return;
  auto it = by_hash_.find(k.hash);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  k = BlockKey{};
  cached_--;
}

int PagedKVCache::take_block() {
  if (!free_.empty()) {
    const int b = free_.back();
    free_.pop_back();
    return b;
  }
  CHECK(!lru_.empty());
  const int b = lru_.front();
  lru_.pop_front();
  in_lru_[b] = 0;
  uncommit(b);
  return b;
}

namespace {
// The key of a block: its tokens hashed with the previous block's key as the
// seed (0 for the first block).
uint64_t block_hash(uint64_t parent, std::span<const int> tokens) {
  return XXH64(tokens.data(), tokens.size_bytes(), parent);
}
}  // namespace

int PagedKVCache::match_prefix(int seq, std::span<const int> tokens) {
  CHECK(live(seq) && length_[seq] == 0 && table_[seq].empty());
  if (tokens.empty()) return 0;
  const int full = static_cast<int>((tokens.size() - 1) / block_size_);
  uint64_t h = 0;
  int parent = -1, matched = 0;
  for (int i = 0; i < full; i++) {
    const std::span<const int> part = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    h = block_hash(h, part);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int b = it->second;
    const BlockKey& k = key_[b];
    if (k.parent != parent || !std::equal(part.begin(), part.end(), k.tokens.begin(), k.tokens.end())) break;
    if (ref_[b]++ == 0 && in_lru_[b]) {
      lru_.erase(lru_pos_[b]);
      in_lru_[b] = 0;
    }
    table_[seq].push_back(b);
    parent = b;
    matched++;
  }
  length_[seq] = matched * block_size_;
  seq_committed_[seq] = matched;
  seq_stopped_[seq] = 0;
  return matched * block_size_;
}

void PagedKVCache::commit(int seq, std::span<const int> tokens, int computed) {
  CHECK(live(seq) && computed <= length_[seq] && computed <= static_cast<int>(tokens.size()));
  if (seq_stopped_[seq]) return;
  const int full = computed / block_size_;
  for (int i = seq_committed_[seq]; i < full; i++) {
    const int b = table_[seq][i];
    const int parent = i > 0 ? table_[seq][i - 1] : -1;
    const uint64_t ph = parent >= 0 ? key_[parent].hash : 0;
    const std::span<const int> part = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = block_hash(ph, part);
    if (by_hash_.count(h) || (parent >= 0 && !key_[parent].committed)) {
      seq_stopped_[seq] = 1;  // another block holds this prefix (computed twice at once)
      return;
    }
    BlockKey& k = key_[b];
    k.committed = true;
    k.hash = h;
    k.parent = parent;
    k.tokens.assign(part.begin(), part.end());
    by_hash_[h] = b;
    cached_++;
    seq_committed_[seq] = i + 1;
  }
}

Result<int> PagedKVCache::add_sequence() {
  for (int s = 0; s < max_seqs_; s++) {
    if (!live_[s]) {
      live_[s] = true;
      length_[s] = 0;
      table_[s].clear();
      return s;
    }
  }
  return Status::ResourceExhausted(fmt::format("the KV cache holds its maximum of {} sequences", max_seqs_));
}

Status PagedKVCache::extend(int seq, int n) {
  if (!live(seq)) return Status::InvalidArgument(fmt::format("KV-cache sequence {} is not live", seq));
  if (n < 0) return Status::InvalidArgument(fmt::format("cannot extend a sequence by {} positions", n));
  const int want = length_[seq] + n;
  if (want > config_.context)
    return Status::InvalidArgument(fmt::format("{} positions exceed the model's context of {}", want,
                                               config_.context));
  const int more = blocks_needed(want) - static_cast<int>(table_[seq].size());
  if (more > free_blocks())
    return Status::ResourceExhausted(fmt::format("the KV cache needs {} more blocks and has {} free of {}", more,
                                                 free_blocks(), num_blocks_));
  for (int i = 0; i < more; i++) {
    const int b = take_block();
    ref_[b] = 1;
    table_[seq].push_back(b);
  }
  length_[seq] = want;
  return Status::OK();
}

void PagedKVCache::release(int seq) {
  if (!live(seq)) return;
  // Back in reverse, so a sequence that is re-added gets the same blocks; a
  // committed block nobody holds stays cached (most recently used last).
  for (auto it = table_[seq].rbegin(); it != table_[seq].rend(); ++it) {
    const int b = *it;
    if (--ref_[b] > 0) continue;
    if (key_[b].committed) {
      lru_.push_back(b);
      lru_pos_[b] = std::prev(lru_.end());
      in_lru_[b] = 1;
    } else {
      free_.push_back(b);
    }
  }
  table_[seq].clear();
  seq_committed_[seq] = 0;
  seq_stopped_[seq] = 0;
  length_[seq] = 0;
  live_[seq] = false;
}

int PagedKVCache::length(int seq) const {
  CHECK(live(seq));
  return length_[seq];
}

const std::vector<int>& PagedKVCache::blocks(int seq) const {
  CHECK(live(seq));
  return table_[seq];
}

int PagedKVCache::live_sequences() const { return static_cast<int>(std::count(live_.begin(), live_.end(), true)); }

float* PagedKVCache::keys(int layer) const {
  CHECK(layer >= 0 && layer < layers_);
  return pool_.tensor(0).f32() + int64_t{layer} * num_blocks_ * block_size_ * channels_;
}

float* PagedKVCache::values(int layer) const {
  CHECK(layer >= 0 && layer < layers_);
  return pool_.tensor(1).f32() + int64_t{layer} * num_blocks_ * block_size_ * channels_;
}

uint16_t* PagedKVCache::keys_f16(int layer) const {
  CHECK(layer >= 0 && layer < layers_ && dtype_ == KvDtype::kF16);
  return static_cast<uint16_t*>(pool_.tensor(0).data) + int64_t{layer} * num_blocks_ * block_size_ * channels_;
}

uint16_t* PagedKVCache::values_f16(int layer) const {
  CHECK(layer >= 0 && layer < layers_ && dtype_ == KvDtype::kF16);
  return static_cast<uint16_t*>(pool_.tensor(1).data) + int64_t{layer} * num_blocks_ * block_size_ * channels_;
}

int PagedKVCache::slot(int seq, int pos) const {
  CHECK(live(seq) && pos >= 0 && pos < length_[seq]);
  return table_[seq][pos / block_size_] * block_size_ + pos % block_size_;
}

bool PagedKVCache::fits(const GPT& model) const {
  const ModelShard& s = model.shard();
  return same_shape(config_, model.config()) && s.tp == shard_.tp && s.tp_rank == shard_.tp_rank &&
         s.layer_begin == shard_.layer_begin && s.layers(model.config()) == layers_ &&
         model.device() == pool_.device();
}

}  // namespace tessera
