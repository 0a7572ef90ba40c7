// The merge loop of byte-pair encoding, shared by the GPT-2 tokenizer
// (tokenizer.h) and Hugging Face's BPE (hf_tokenizer.h): the lowest-ranked
// adjacent pair is merged first, and among equal ranks the leftmost (the
// tokenizers crate's Word::merge_all; OpenAI's bpe() merges a pair at every
// place left to right, which is the same order since a merge only makes
// pairs of higher rank). A min-heap of (rank, position) over a linked list
// of symbols: O(n log n) for a word of n symbols.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace tessera::data {

// Working buffers, reused from word to word.
struct BpeScratch {
  std::vector<uint32_t> token;  // (n) the initial symbols in, the current one at each live position
  std::vector<int32_t> next;    // (n) next live position, n at the end; -1 once merged away
  std::vector<int32_t> prev;    // (n) previous live position, -1 at the start
  std::vector<uint64_t> heap;   // min-heap of (rank << 32) | left position
};

// Merges s.token (the word's initial symbols) and appends the result to
// out. find(left, right) returns a pointer to the pair's merge, with
// members `rank` and `merged`, or nullptr when the pair does not merge.
// Entries made stale by a neighbouring merge are skipped when popped.
template <typename Find>
void bpe_merge(BpeScratch& s, const Find& find, std::vector<uint32_t>& out) {
  const int32_t n = static_cast<int32_t>(s.token.size());
  s.next.resize(n);
  s.prev.resize(n);
  s.heap.clear();
  const auto push = [&](int32_t i) {
    if (const auto* m = find(s.token[i], s.token[s.next[i]])) {
      s.heap.push_back((static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(i));
      std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i < n; i++) {
    s.next[i] = i + 1;
    s.prev[i] = i - 1;
  }
  for (int32_t i = 0; i + 1 < n; i++) push(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const uint64_t top = s.heap.back();
    s.heap.pop_back();
    const uint64_t rank = top >> 32;
    const int32_t i = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t j = s.next[i];
    if (j < 0 || j >= n) continue;  // i was merged away, or is now last
    const auto* m = find(s.token[i], s.token[j]);
    if (m == nullptr || static_cast<uint64_t>(m->rank) != rank) continue;  // the pair at i changed
    s.token[i] = m->merged;
    s.next[i] = s.next[j];
    if (s.next[j] < n) s.prev[s.next[j]] = i;
    s.next[j] = -1;
    if (s.prev[i] >= 0) push(s.prev[i]);
    if (s.next[i] < n) push(i);
  }
  for (int32_t i = 0; i < n; i = s.next[i]) out.push_back(s.token[i]);  // position 0 is never merged away
}

}  // namespace tessera::data
