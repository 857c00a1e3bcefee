// C ABI of the radix prefix tree (implementation and design notes in radix_tree.cpp).
//
// The tree owns every node: its tokens (int32), KV locations (int64), children, parent, lock count
// and last-access stamp, plus the LRU heap of evictable leaves and the evictable/protected token
// counters. Every function checks its arguments and returns an RsStatus (prefix.h); results go
// through out-pointers, which are left untouched on error (an output buffer may be partly
// written). No exception crosses the boundary.
//
// Handles name a node as (generation << 32) | slot. Evicting a node bumps its slot's generation,
// so a stale handle yields RS_ERR_HANDLE instead of touching another node. Handle 0 is the root
// (the empty match); lock and unlock on it do nothing.
#ifndef RADIXSERVE_NATIVE_RADIX_TREE_H_
#define RADIXSERVE_NATIVE_RADIX_TREE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum RsStatus {
  RS_OK = 0,
  RS_ERR_NULL = 1,         // a NULL pointer where data or an out-pointer is required
  RS_ERR_LENGTH = 2,       // a negative length or buffer capacity
  RS_ERR_PAGE_SIZE = 5,    // page size outside [1, 2**30]
  RS_ERR_ALIGN = 6,        // insert length not a multiple of the page size
  RS_ERR_HANDLE = 7,       // handle names no live node (stale: evicted since the match)
  RS_ERR_UNLOCK = 8,       // unlock of a node holding no lock of its own
  RS_ERR_CAPACITY = 9,     // output buffer smaller than the documented bound
  RS_ERR_NOMEM = 10,       // allocation failed (std::bad_alloc caught at the boundary)
  RS_ERR_NUM_PAGES = 11,   // negative page count
  // check_integrity: which invariant is broken.
  RS_BROKEN_EDGE = 20,     // an edge empty, unaligned, or keys and locations of unequal length
  RS_BROKEN_REFS = 21,     // a negative lock count, children locked more than their parent, root
  RS_BROKEN_LINKS = 22,    // parent/child links, sibling first pages or the child index disagree
  RS_BROKEN_SIZES = 23,    // evictable/protected counters differ from the tree
  RS_BROKEN_NODES = 24,    // live node count differs from the nodes reachable from the root
};

// Static, human-readable text for a status code (never NULL).
const char* rs_strerror(int status);

typedef struct RsRadixTree RsRadixTree;

// A new empty tree for pages of `page_size` tokens; free it with rs_radix_free (NULL is fine).
int rs_radix_new(int64_t page_size, RsRadixTree** out);
void rs_radix_free(RsRadixTree* tree);

// Longest cached prefix of tokens[:len // P * P], whole pages only. Splits an edge matched
// part-way and stamps every node on the path as just used; does not lock. Writes the matched
// length, the matched tokens' KV locations to out_locations[0:length] (out_cap >= len // P * P;
// NULL allowed when that is 0) and the handle of the deepest matched node.
int rs_radix_match(RsRadixTree* tree, const int32_t* tokens, int64_t len, int64_t* out_locations,
                   int64_t out_cap, int64_t* out_len, uint64_t* out_handle);

// Lock / unlock every node from the handle's node up to the root (ref counts, root-ward).
int rs_radix_lock(RsRadixTree* tree, uint64_t handle);
int rs_radix_unlock(RsRadixTree* tree, uint64_t handle);

// Caches tokens[0:len] with their locations (len a multiple of P); the already-cached prefix keeps
// its locations. Writes that prefix's length (the caller frees its own copies of those pages).
int rs_radix_insert(RsRadixTree* tree, const int32_t* tokens, const int64_t* locations,
                    int64_t len, int64_t* out_cached);

// Evicts least recently used unlocked leaves (whole edges) until at least num_pages pages are
// freed or none is left; writes their page ids (locations[::P] // P). When num_pages > 0, out_cap
// must be at least the evictable page count, which bounds what one call can free.
int rs_radix_evict(RsRadixTree* tree, int64_t num_pages, int64_t* out_pages, int64_t out_cap,
                   int64_t* out_len);

int rs_radix_sizes(const RsRadixTree* tree, int64_t* out_evictable_pages,
                   int64_t* out_protected_pages);

// RS_OK, or the RS_BROKEN_* code of the first broken invariant found.
int rs_radix_check(const RsRadixTree* tree);

// Every cached page id, depth-first (out_cap >= evictable + protected pages).
int rs_radix_pages(const RsRadixTree* tree, int64_t* out_pages, int64_t out_cap, int64_t* out_len);

#ifdef __cplusplus
}
#endif

#endif  // RADIXSERVE_NATIVE_RADIX_TREE_H_
