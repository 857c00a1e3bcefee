"""cffi out-of-line API-mode build of `radixserve.native._prefix` (run by setup.py's cffi_modules).

The extension holds the radix tree (radix_tree.h).

API mode compiles the `cdef` below against radix_tree.h, so a declaration that drifts from the C++
signature is a build error instead of a crash at call time (the cffi docs' reason to prefer it).
"""

from __future__ import annotations

import os
import sys

from cffi import FFI

# setuptools runs this with the project root as cwd and wants relative source paths.
_HERE = os.path.relpath(os.path.dirname(os.path.abspath(__file__)))

CDEF = """
enum RsStatus {
  RS_OK, RS_ERR_NULL, RS_ERR_LENGTH, RS_ERR_PAGE_SIZE, RS_ERR_ALIGN, RS_ERR_HANDLE, RS_ERR_UNLOCK,
  RS_ERR_CAPACITY, RS_ERR_NOMEM, RS_ERR_NUM_PAGES,
  RS_BROKEN_EDGE, RS_BROKEN_REFS, RS_BROKEN_LINKS, RS_BROKEN_SIZES, RS_BROKEN_NODES, ...
};
const char* rs_strerror(int status);

typedef struct RsRadixTree RsRadixTree;
int rs_radix_new(int64_t page_size, RsRadixTree** out);
void rs_radix_free(RsRadixTree* tree);
int rs_radix_match(RsRadixTree* tree, const int32_t* tokens, int64_t len, int64_t* out_locations,
                   int64_t out_cap, int64_t* out_len, uint64_t* out_handle);
int rs_radix_lock(RsRadixTree* tree, uint64_t handle);
int rs_radix_unlock(RsRadixTree* tree, uint64_t handle);
int rs_radix_insert(RsRadixTree* tree, const int32_t* tokens, const int64_t* locations,
                    int64_t len, int64_t* out_cached);
int rs_radix_evict(RsRadixTree* tree, int64_t num_pages, int64_t* out_pages, int64_t out_cap,
                   int64_t* out_len);
int rs_radix_sizes(const RsRadixTree* tree, int64_t* out_evictable_pages,
                   int64_t* out_protected_pages);
int rs_radix_check(const RsRadixTree* tree);
int rs_radix_pages(const RsRadixTree* tree, int64_t* out_pages, int64_t out_cap, int64_t* out_len);
"""

# Exceptions stay on: radix_api.cpp catches std::bad_alloc and returns RS_ERR_NOMEM.
_FLAGS = [] if sys.platform == "win32" else ["-O3", "-std=c++17"]
_SOURCES = ["radix_tree.cpp", "radix_api.cpp"]
_HEADERS = ["compare.h", "radix_tree.h", "radix_tree_impl.h"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "radixserve.native._prefix",
    '#include "radix_tree.h"',
    source_extension=".cpp",
    sources=[os.path.join(_HERE, name) for name in _SOURCES],
    include_dirs=[_HERE],
    depends=[os.path.join(_HERE, name) for name in _HEADERS],
    extra_compile_args=_FLAGS,
    language="c++",
)
