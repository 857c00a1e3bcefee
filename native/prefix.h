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
