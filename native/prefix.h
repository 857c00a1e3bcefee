// C ABI of the prefix-matching helpers (see prefix.cpp for the design notes).
// Every function checks its arguments and returns an RsStatus; results go through out-pointers.
#ifndef RADIXSERVE_NATIVE_PREFIX_H_
#define RADIXSERVE_NATIVE_PREFIX_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum RsStatus {
  RS_OK = 0,
  RS_ERR_NULL = 1,         // a NULL pointer where data or an out-pointer is required
  RS_ERR_LENGTH = 2,       // a negative length or key count
  RS_ERR_OFFSET = 3,       // prompt offset outside [0, prompt_len]
  RS_ERR_KEY_OFFSETS = 4,  // key offsets not non-decreasing within [0, keys_len]
  // Radix tree (radix_tree.h).
  RS_ERR_PAGE_SIZE = 5,    // page size < 1
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

// Index of the first position where a and b differ; min(a_len, b_len) if one is a prefix of the
// other. A pointer may be NULL only when its length is 0.
int rs_first_mismatch_i32(const int32_t* a, int64_t a_len, const int32_t* b, int64_t b_len,
                          int64_t* out);
int rs_first_mismatch_i64(const int64_t* a, int64_t a_len, const int64_t* b, int64_t b_len,
                          int64_t* out);

// One radix-node lookup: key i is keys[key_offsets[i] : key_offsets[i + 1]] (num_keys + 1 offsets).
// Writes the index of the key sharing the longest prefix with prompt[offset:] and that length;
// ties go to the lowest index; -1 and 0 when no key shares even its first token.
int rs_match_children_i32(const int32_t* prompt, int64_t prompt_len, int64_t offset,
                          const int32_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len);
int rs_match_children_i64(const int64_t* prompt, int64_t prompt_len, int64_t offset,
                          const int64_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len);

// Static, human-readable text for a status code (never NULL).
const char* rs_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif  // RADIXSERVE_NATIVE_PREFIX_H_
