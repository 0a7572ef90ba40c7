#include "nn/kv_cache.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"
#include "core/try.h"

namespace tessera {

namespace {

bool same_shape(const GPTConfig& a, const GPTConfig& b) { return a == b; }

}  // namespace

int64_t PagedKVCache::bytes_per_block(const GPT& model, int block_size) {
  const ModelShard& s = model.shard();
  const int64_t layers = s.layers(model.config());
  return 2 * layers * block_size * (model.config().kv_dim() / s.tp) * static_cast<int64_t>(sizeof(float));
}

PagedKVCache::PagedKVCache(Uninitialised, const GPT& model, int num_blocks, int block_size, int max_seqs)
    : config_(model.config()),
      shard_(model.shard()),
      layers_(model.shard().layers(model.config())),
      channels_(model.config().kv_dim() / model.shard().tp),
      num_blocks_(num_blocks),
      block_size_(block_size),
      max_seqs_(max_seqs) {}

PagedKVCache::PagedKVCache(const GPT& model, int num_blocks, int block_size, int max_seqs)
    : PagedKVCache(Uninitialised{}, model, num_blocks, block_size, max_seqs) {
  CHECK_OK(init(model.device()));
}

Result<std::unique_ptr<PagedKVCache>> PagedKVCache::create(const GPT& model, int num_blocks, int block_size,
                                                           int max_seqs) {
  std::unique_ptr<PagedKVCache> cache(new PagedKVCache(Uninitialised{}, model, num_blocks, block_size, max_seqs));
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
  pool_.reserve("keys", DType::kF32, {layers_, rows, channels_});
  pool_.reserve("values", DType::kF32, {layers_, rows, channels_});
  RETURN_IF_ERROR(pool_.try_allocate().With(fmt::format("the KV cache ({} blocks of {})", num_blocks_, block_size_)));
  live_.assign(max_seqs_, false);
  length_.assign(max_seqs_, 0);
  table_.assign(max_seqs_, {});
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
    table_[seq].push_back(free_.back());
    free_.pop_back();
  }
  length_[seq] = want;
  return Status::OK();
}

void PagedKVCache::release(int seq) {
  if (!live(seq)) return;
  // Back in reverse, so a sequence that is re-added gets the same blocks.
  for (auto it = table_[seq].rbegin(); it != table_[seq].rend(); ++it) free_.push_back(*it);
  table_[seq].clear();
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
