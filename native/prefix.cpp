// Prefix-matching helpers for the radix prefix cache, exposed as a tiny C ABI (prefix.h).
//
// Why this split (profile of a Python radix tree matching a 32k-token prompt, docs/native.md):
//  - Long edges (depth 3, one 30k-token edge): the element compare is the whole cost (Python loop
//    2.9 ms, numpy 10 us, C 5 us), so the compare is native: rs_first_mismatch_*.
//  - Deep chains (8.6k nodes of ~3 tokens): ~0.9 us of interpreter work per node dominates however
//    the compare is done, so one call per node must do all of that node's work: scan the siblings
//    and compare the winner (rs_match_children_*), with no Python loop over children and no slices.
//  - The radix prefix cache no longer walks in Python at all: radix_tree.cpp owns the whole tree
//    and uses the same compare (compare.h). These helpers remain for callers with their own trees.
//
// Conventions: no exceptions, no allocation, no global state; every argument is checked before
// the first read, so bad input from Python yields a status code, never a crash.
#include "prefix.h"

#include <cstdint>

#include "compare.h"

namespace {

using radixserve::mismatch;

template <typename T>
int first_mismatch(const T* a, int64_t a_len, const T* b, int64_t b_len, int64_t* out) {
  if (out == nullptr) return RS_ERR_NULL;
  if (a_len < 0 || b_len < 0) return RS_ERR_LENGTH;
  if ((a == nullptr && a_len > 0) || (b == nullptr && b_len > 0)) return RS_ERR_NULL;
  *out = mismatch(a, b, a_len < b_len ? a_len : b_len);
  return RS_OK;
}

template <typename T>
int match_children(const T* prompt, int64_t prompt_len, int64_t offset, const T* keys,
                   int64_t keys_len, const int64_t* key_offsets, int64_t num_keys,
                   int64_t* out_index, int64_t* out_len) {
  if (out_index == nullptr || out_len == nullptr || key_offsets == nullptr) return RS_ERR_NULL;
  if (prompt_len < 0 || keys_len < 0 || num_keys < 0) return RS_ERR_LENGTH;
  if ((prompt == nullptr && prompt_len > 0) || (keys == nullptr && keys_len > 0)) {
    return RS_ERR_NULL;
  }
  if (offset < 0 || offset > prompt_len) return RS_ERR_OFFSET;
  // Validate every offset before reading any key, so a bad table fails as a whole.
  if (key_offsets[0] < 0) return RS_ERR_KEY_OFFSETS;
  for (int64_t i = 0; i < num_keys; ++i) {
    if (key_offsets[i + 1] < key_offsets[i]) return RS_ERR_KEY_OFFSETS;
  }
  if (key_offsets[num_keys] > keys_len) return RS_ERR_KEY_OFFSETS;

  const T* rest = prompt + offset;
  const int64_t rest_len = prompt_len - offset;
  int64_t best_index = -1;
  int64_t best_len = 0;
  for (int64_t i = 0; i < num_keys && best_len < rest_len; ++i) {
    const int64_t start = key_offsets[i];
    const int64_t key_len = key_offsets[i + 1] - start;
    // Radix siblings differ in their first token, so this rejects all but one of them cheaply.
    if (key_len == 0 || keys[start] != rest[0]) continue;
    const int64_t m = mismatch(keys + start, rest, key_len < rest_len ? key_len : rest_len);
    if (m > best_len) {
      best_len = m;
      best_index = i;
    }
  }
  *out_index = best_index;
  *out_len = best_len;
  return RS_OK;
}

}  // namespace

extern "C" {

int rs_first_mismatch_i32(const int32_t* a, int64_t a_len, const int32_t* b, int64_t b_len,
                          int64_t* out) {
  return first_mismatch(a, a_len, b, b_len, out);
}

int rs_first_mismatch_i64(const int64_t* a, int64_t a_len, const int64_t* b, int64_t b_len,
                          int64_t* out) {
  return first_mismatch(a, a_len, b, b_len, out);
}

int rs_match_children_i32(const int32_t* prompt, int64_t prompt_len, int64_t offset,
                          const int32_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len) {
  return match_children(prompt, prompt_len, offset, keys, keys_len, key_offsets, num_keys,
                        out_index, out_len);
}

int rs_match_children_i64(const int64_t* prompt, int64_t prompt_len, int64_t offset,
                          const int64_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len) {
  return match_children(prompt, prompt_len, offset, keys, keys_len, key_offsets, num_keys,
                        out_index, out_len);
}

const char* rs_strerror(int status) {
  switch (status) {
    case RS_OK: return "ok";
    case RS_ERR_NULL: return "NULL pointer for a non-empty buffer or an output";
    case RS_ERR_LENGTH: return "negative length or key count";
    case RS_ERR_OFFSET: return "offset outside [0, len(prompt)]";
    case RS_ERR_KEY_OFFSETS: return "key offsets must be non-decreasing within [0, len(keys)]";
    case RS_ERR_PAGE_SIZE: return "page size must be at least 1";
    case RS_ERR_ALIGN: return "length must be a multiple of the page size";
    case RS_ERR_HANDLE: return "handle names no live node (stale: evicted since the match)";
    case RS_ERR_UNLOCK: return "unlock without a matching lock";
    case RS_ERR_CAPACITY: return "output buffer too small";
    case RS_ERR_NOMEM: return "out of memory";
    case RS_ERR_NUM_PAGES: return "num_pages must be >= 0";
    case RS_BROKEN_EDGE: return "broken edge: empty, unaligned, or keys/locations lengths differ";
    case RS_BROKEN_REFS: return "broken lock counts: negative, or children above their parent";
    case RS_BROKEN_LINKS: return "broken links: parent/child, sibling first pages or child index";
    case RS_BROKEN_SIZES: return "cache sizes drifted from the tree";
    case RS_BROKEN_NODES: return "live node count differs from the nodes reachable from the root";
    default: return "unknown status";
  }
}

}  // extern "C"
