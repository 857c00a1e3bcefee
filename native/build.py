"""cffi out-of-line API-mode build of `radixserve.native._prefix` (run by setup.py's cffi_modules).

API mode compiles the `cdef` below against prefix.h, so a declaration that drifts from the C++
signature is a build error instead of a crash at call time (the cffi docs' reason to prefer it).
"""

from __future__ import annotations

import os
import sys

from cffi import FFI

# setuptools runs this with the project root as cwd and wants relative source paths.
_HERE = os.path.relpath(os.path.dirname(os.path.abspath(__file__)))

CDEF = """
enum RsStatus { RS_OK, RS_ERR_NULL, RS_ERR_LENGTH, RS_ERR_OFFSET, RS_ERR_KEY_OFFSETS, ... };
int rs_first_mismatch_i32(const int32_t* a, int64_t a_len, const int32_t* b, int64_t b_len,
                          int64_t* out);
int rs_first_mismatch_i64(const int64_t* a, int64_t a_len, const int64_t* b, int64_t b_len,
                          int64_t* out);
int rs_match_children_i32(const int32_t* prompt, int64_t prompt_len, int64_t offset,
                          const int32_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len);
int rs_match_children_i64(const int64_t* prompt, int64_t prompt_len, int64_t offset,
                          const int64_t* keys, int64_t keys_len, const int64_t* key_offsets,
                          int64_t num_keys, int64_t* out_index, int64_t* out_len);
const char* rs_strerror(int status);
"""

_FLAGS = [] if sys.platform == "win32" else ["-O3", "-std=c++17", "-fno-exceptions"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "radixserve.native._prefix",
    '#include "prefix.h"',
    source_extension=".cpp",
    sources=[os.path.join(_HERE, "prefix.cpp")],
    include_dirs=[_HERE],
    depends=[os.path.join(_HERE, "prefix.h")],
    extra_compile_args=_FLAGS,
    language="c++",
)
