// Prefix-matching helpers for the radix prefix cache, exposed as a tiny C ABI (prefix.h).
//
// Why this split (profile of a Python radix tree matching a 32k-token prompt, docs/native.md):
//  - Long edges (depth 3, one 30k-token edge): the element compare is the whole cost (Python loop
//    2.9 ms, numpy 10 us, C 5 us), so the compare is native: rs_first_mismatch_*.
//  - Deep chains (8.6k nodes of ~3 tokens): ~0.9 us of interpreter work per node dominates however
//    the compare is done, so one call per node must do all of that node's work: scan the siblings
//    and compare the winner (rs_match_children_*), with no Python loop over children and no slices.
//  - The walk itself stays in Python: nodes carry ref counts, LRU stamps and KV page indices owned
//    by the prefix cache, and a C walk would need the tree mirrored into flat arrays and kept in
//    sync on every insert, split and eviction, two owners for one structure.
//
// Conventions: no exceptions, no allocation, no global state; every argument is checked before
// the first read, so bad input from Python yields a status code, never a crash.
#include "prefix.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

// Advances i over whole chunks of `chunk` elements that are bitwise equal in a and b.
template <typename T>
int64_t skip_equal(const T* a, const T* b, int64_t i, int64_t n, int64_t chunk) {
  const size_t bytes = static_cast<size_t>(chunk) * sizeof(T);
  while (i + chunk <= n && std::memcmp(a + i, b + i, bytes) == 0) i += chunk;
  return i;
}

// libc memcmp is SIMD-dispatched at run time (AVX2 where present), which beats a hand-written loop
// built for the portable baseline ISA by ~2.5x on 32k tokens. 1 KiB chunks skip equal runs; 64 B
// chunks then narrow the differing chunk, so the scalar scan touches at most 64 bytes.
template <typename T>
int64_t mismatch(const T* a, const T* b, int64_t n) {
  int64_t i = skip_equal(a, b, 0, n, 1024 / static_cast<int64_t>(sizeof(T)));
  i = skip_equal(a, b, i, n, 64 / static_cast<int64_t>(sizeof(T)));
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

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
    default: return "unknown status";
  }
}

}  // extern "C"
