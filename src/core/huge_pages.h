// Transparent huge pages for memory that is streamed whole, again and again:
// a decode step reads every weight once, so 2 MiB pages in place of 4 KiB
// ones take the TLB misses (one a page) and the hardware prefetchers' stops
// at page boundaries off its path. On this project's Zen 4 host, paired
// against 4 KiB copies of the same matrix in the same second
// (BM_MatmulDecodeHuge, docs/performance.md "Huge pages for the weights"):
// see there for the figures.
// Thread safety: may be called from any thread, on memory no other thread
// is writing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// Marks the whole 2 MiB pages inside [p, p + bytes) for huge pages
// (MADV_HUGEPAGE) and collapses the 4 KiB pages already there into them
// (MADV_COLLAPSE, Linux 6.1: the kernel copies them; 0.1-1.5 s for
// TinyLlama's 0.6-1 GB of 4-bit or INT8 matrices on the Zen 4 host, nothing
// for memory already in huge pages; pages not yet present are filled, so
// call it on memory that is all written). Best
// effort: returns the bytes now in huge pages, 0 where the kernel cannot
// (older than 6.1, THP "never", no huge page free) or set_huge_pages(false)
// asked not to. The values in the range do not change.
int64_t collapse_to_huge_pages(const void* p, int64_t bytes);

// The same for several blocks (a model's matrices), blocks less than a huge
// page apart taken as one range: matrices smaller than a huge page (TinyLlama's
// 4-bit attention ones, 0.3-2.4 MB) are never whole huge pages on their own
// (alone, 394 of its 582 MB of int4 weights moved; together, 577). What lies
// between two of them (allocator headers and page tails, another
// allocation, a freed stretch under 2 MiB) is collapsed with them, and a
// page of it not yet present becomes resident. Returns the blocks' own
// bytes now in huge pages (at most their sum).
int64_t collapse_to_huge_pages(const std::vector<std::span<const uint8_t>>& blocks);

// Whether the process puts its large streamed memory in huge pages (this
// function, Arena's host arenas, the read roof): true unless
// set_huge_pages(false), which the CLI calls for TESSERA_HUGE_PAGES=0
// (4 KiB pages, as before). Process-wide; set it before allocating.
bool huge_pages_wanted();
void set_huge_pages(bool on);

}  // namespace tessera
