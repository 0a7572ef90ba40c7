// The paged key/value cache that GPT::forward_tokens reads and writes
// (vLLM's PagedAttention layout). Letters as in gpt.h: L layers of the
// model (its shard's), Cl = C/tp channels of this rank, bs positions a block.
//
// Keys and values of every layer live in one pool of blocks,
// (L, num_blocks, bs, Cl) each. A sequence owns a list of blocks (its block
// table) in position order: position p of the sequence is row p % bs of
// block table[p / bs]. Sequences of different lengths share the pool, grow
// one block at a time, and give their blocks back when they end, so the
// memory follows the tokens actually cached instead of max_seqs x context.
//
// Use: add_sequence() gives an id; before a forward feeds n new positions of
// it, extend(id, n) makes room for them (allocating blocks as needed; a
// ResourceExhausted status when the pool is short, changing nothing, so the
// caller can wait or preempt); release(id) frees the blocks and the id.
//
// Ownership: a PagedKVCache owns its pool (on the device of the model it was
// made for) and its bookkeeping (host). It remembers the model's shape and
// GPT::forward_tokens refuses a cache made for another. Not thread-safe:
// one scheduler thread drives the cache and the forward.
//
// Prefix caching (vLLM's automatic prefix caching): commit() keys each full
// block of a sequence by its tokens and the block before it (a hash chain of
// every token up to the block's end, xxh64, with the tokens kept to check a
// match). A committed block outlives its sequence: release() leaves it
// cached (evictable, least recently released first) instead of free, and
// match_prefix() hands a new sequence the committed blocks of its longest
// cached prefix. A block is only allocated anew when no free one is left,
// evicting the least recently used cached block. Committed blocks are full
// and never written again, so sequences share them read-only.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "nn/gpt.h"
#include "tensor/arena.h"

namespace tessera {

// The cache's element type: fp32, or fp16 (IEEE half, rounded to nearest
// even as it is written; llama.cpp's default cache) at half the memory and
// half the bytes a decode step reads. fp16 on the CPU only.
enum class KvDtype { kF32, kF16 };
// "fp32" / "f16" (the --kv-dtype spellings); InvalidArgument otherwise.
Result<KvDtype> parse_kv_dtype(const std::string& name);
const char* kv_dtype_name(KvDtype t);
int kv_dtype_bytes(KvDtype t);

class PagedKVCache {
 public:
  static constexpr int kDefaultBlockSize = 16;

  // num_blocks >= 1 blocks of block_size >= 1 positions for model's shard,
  // on its device; at most max_seqs >= 1 sequences at once (callers size
  // the pool from bytes_per_block()). InvalidArgument for a size below 1;
  // the pool's allocation error (out of host or device memory) otherwise;
  // InvalidArgument for an fp16 cache of a model on CUDA.
  static Result<std::unique_ptr<PagedKVCache>> create(const GPT& model, int num_blocks,
                                                      int block_size = kDefaultBlockSize, int max_seqs = 256,
                                                      KvDtype dtype = KvDtype::kF32);
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;

  // Bytes one block takes for a model shard (keys and values, every layer).
  static int64_t bytes_per_block(const GPT& model, int block_size = kDefaultBlockSize,
                                 KvDtype dtype = KvDtype::kF32);

  // A new sequence with no positions; ResourceExhausted when max_seqs are live.
  Result<int> add_sequence();
  // Room for n more positions of seq (length grows by n). InvalidArgument for
  // a dead seq, n < 0, or a length past the model's context;
  // ResourceExhausted when the pool lacks the blocks. Nothing changes on error.
  Status extend(int seq, int n);
  // Gives seq's blocks back to the pool and ends it. A dead seq is ignored.
  void release(int seq);
  // Forgets every sequence (all blocks free).
  void clear();

  bool live(int seq) const { return seq >= 0 && seq < max_seqs_ && live_[seq]; }
  int length(int seq) const;  // positions reserved by extend()
  const std::vector<int>& blocks(int seq) const;
  int blocks_needed(int positions) const { return (positions + block_size_ - 1) / block_size_; }
  int num_blocks() const { return num_blocks_; }
  // Blocks a sequence can get: free, or cached and held by none (evictable).
  int free_blocks() const { return static_cast<int>(free_.size() + lru_.size()); }
  // Blocks held by live sequences.
  int used_blocks() const { return num_blocks_ - free_blocks(); }

  // ---- Prefix caching (see above).
  // For a new sequence (live, no positions yet): takes the committed blocks
  // of the longest cached prefix of tokens, leaving at least one token to
  // compute (its logits are the next token's), and returns the positions
  // they hold (a multiple of block_size(); 0 for none). The sequence's
  // length becomes that.
  int match_prefix(int seq, std::span<const int> tokens);
  // Keys seq's full blocks whose positions [0, computed) hold tokens'
  // keys and values (computed <= length(seq)); blocks already committed are
  // skipped. A block whose key another block already holds stays
  // uncommitted (it is freed with the sequence), as do the ones after it.
  void commit(int seq, std::span<const int> tokens, int computed);
  // Committed blocks, held by sequences or evictable.
  int cached_blocks() const { return cached_; }
  int block_size() const { return block_size_; }
  int max_seqs() const { return max_seqs_; }
  int live_sequences() const;
  int64_t bytes() const { return static_cast<int64_t>(pool_.bytes()); }

  // The pool of local layer l (0-based within the shard): (num_blocks*bs,
  // KV*hs/tp) keys and values (GQA's fewer key/value heads shrink it);
  // device memory on CUDA.
  // keys/values: an fp32 cache's; keys_f16/values_f16: an fp16 cache's.
  float* keys(int layer) const;
  float* values(int layer) const;
  uint16_t* keys_f16(int layer) const;
  uint16_t* values_f16(int layer) const;
  KvDtype dtype() const { return dtype_; }
  // Pool row of position pos of seq (pos < length(seq)).
  int slot(int seq, int pos) const;
  // Whether the cache was made for a model of this shape and shard.
  bool fits(const GPT& model) const;

 private:
  // create()'s one code path: the constructor lays the pool out, init()
  // checks the sizes and allocates.
  struct Uninitialised {};
  PagedKVCache(Uninitialised, const GPT& model, int num_blocks, int block_size, int max_seqs, KvDtype dtype);
  Status init(Device device);

  GPTConfig config_;
  ModelShard shard_;
  int layers_ = 0, channels_ = 0;  // local layers, KV*hs/tp
  int num_blocks_ = 0, block_size_ = 0, max_seqs_ = 0;
  KvDtype dtype_ = KvDtype::kF32;
  Arena pool_;                     // [0] keys, [1] values: (L, num_blocks*bs, KV*hs/tp)
  std::vector<int> free_;          // free block ids, popped from the back
  // Prefix caching, per block: sequences holding it, its key and the block
  // before it when committed (parent -1: the first), its tokens; the key
  // index; evictable blocks (committed, held by none), least recent first;
  // per sequence, its leading blocks already committed (or matched).
  struct BlockKey {
    bool committed = false;
    uint64_t hash = 0;
    int parent = -1;
    std::vector<int> tokens;
  };
  std::vector<int> ref_;
  std::vector<BlockKey> key_;
  std::unordered_map<uint64_t, int> by_hash_;
  std::list<int> lru_;
  std::vector<std::list<int>::iterator> lru_pos_;
  std::vector<char> in_lru_;
  std::vector<int> seq_committed_;
  std::vector<char> seq_stopped_;  // a duplicate key ended this sequence's commits
  int cached_ = 0;
  int take_block();   // a free block, else the least recently used evictable one
  void uncommit(int block);
  std::vector<bool> live_;
  std::vector<int> length_;
  std::vector<std::vector<int>> table_;
};

}  // namespace tessera
