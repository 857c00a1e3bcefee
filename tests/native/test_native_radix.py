"""The radix tree's C ABI checks its own arguments: called straight through cffi, bad pointers,
lengths, buffers and handles give a status code and leave the tree unchanged."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from radixserve.native import backend_name, load
from radixserve.native.radix_tree import HANDLE_MESSAGE, UNLOCK_MESSAGE, RadixTree


def test_c_checks_its_own_arguments() -> None:
    loaded = load()
    assert loaded is not None
    ffi, lib, null = loaded.ffi, loaded.lib, loaded.ffi.NULL
    out_tree = ffi.new("RsRadixTree**")
    assert lib.rs_radix_new(0, out_tree) == lib.RS_ERR_PAGE_SIZE
    assert lib.rs_radix_new(2, null) == lib.RS_ERR_NULL
    assert lib.rs_radix_new(2, out_tree) == lib.RS_OK
    tree = ffi.gc(out_tree[0], lib.rs_radix_free)
    toks = ffi.new("int32_t[]", [1, 2, 3, 4])
    locs = ffi.new("int64_t[]", [8, 9, 10, 11])
    out, handle = ffi.new("int64_t[4]"), ffi.new("uint64_t[1]")
    assert lib.rs_radix_insert(tree, toks, locs, 3, out) == lib.RS_ERR_ALIGN
    assert lib.rs_radix_insert(tree, toks, locs, -2, out) == lib.RS_ERR_LENGTH
    assert lib.rs_radix_insert(tree, null, locs, 4, out) == lib.RS_ERR_NULL
    assert lib.rs_radix_insert(null, toks, locs, 4, out) == lib.RS_ERR_NULL
    assert lib.rs_radix_insert(tree, toks, locs, 4, null) == lib.RS_ERR_NULL
    assert lib.rs_radix_insert(tree, null, null, 0, out) == lib.RS_OK and out[0] == 0
    assert lib.rs_radix_insert(tree, toks, locs, 4, out) == lib.RS_OK and out[0] == 0
    assert lib.rs_radix_match(tree, toks, 4, out, 3, out + 3, handle) == lib.RS_ERR_CAPACITY
    assert lib.rs_radix_match(tree, toks, 4, null, 4, out + 3, handle) == lib.RS_ERR_NULL
    assert lib.rs_radix_match(tree, toks, -1, out, 4, out + 3, handle) == lib.RS_ERR_LENGTH
    assert lib.rs_radix_match(tree, toks, 4, out, 4, out + 3, null) == lib.RS_ERR_NULL
    assert lib.rs_radix_match(tree, toks, 3, out, 2, out + 3, handle) == lib.RS_OK
    assert out[3] == 2 and list(out[0:2]) == [8, 9]  # 3 tokens: one whole page of 2 matches
    assert lib.rs_radix_lock(tree, handle[0] ^ (1 << 40)) == lib.RS_ERR_HANDLE
    assert lib.rs_radix_unlock(tree, handle[0]) == lib.RS_ERR_UNLOCK
    assert lib.rs_radix_evict(tree, -1, out, 4, out + 3) == lib.RS_ERR_NUM_PAGES
    assert lib.rs_radix_evict(tree, 1, out, 1, out + 3) == lib.RS_ERR_CAPACITY
    assert lib.rs_radix_evict(tree, 0, null, 0, out + 3) == lib.RS_OK and out[3] == 0
    assert lib.rs_radix_pages(tree, out, 1, out + 3) == lib.RS_ERR_CAPACITY
    assert lib.rs_radix_sizes(tree, null, out) == lib.RS_ERR_NULL
    assert lib.rs_radix_check(null) == lib.RS_ERR_NULL
    assert lib.rs_radix_check(tree) == lib.RS_OK
    assert lib.rs_radix_evict(tree, 1, out, 2, out + 3) == lib.RS_OK
    assert out[3] == 1 and out[0] == 5  # the match split the edge: only the leaf [3, 4] goes
    lib.rs_radix_free(null)  # allowed, like free(NULL)


def test_status_texts() -> None:
    loaded = load()
    assert loaded is not None
    ffi, lib = loaded.ffi, loaded.lib
    assert ffi.string(lib.rs_strerror(lib.RS_ERR_HANDLE)).decode() == HANDLE_MESSAGE
    assert ffi.string(lib.rs_strerror(lib.RS_ERR_UNLOCK)).decode() == UNLOCK_MESSAGE
    codes = [getattr(lib, n) for n in dir(lib) if n.startswith(("RS_ERR_", "RS_BROKEN_"))]
    texts = {ffi.string(lib.rs_strerror(c)) for c in codes}
    assert len(texts) == len(codes) and b"unknown status" not in texts
    assert ffi.string(lib.rs_strerror(12345)) == b"unknown status"


def test_compiled_module_in_use() -> None:
    assert load() is not None, "radixserve.native._prefix is not built: run `pip install -e .`"
    assert backend_name() == "cpp"


def test_import_is_light() -> None:
    code = "import sys, radixserve.native.radix_tree; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "False"


def test_tree_is_numpy_only() -> None:
    tree = RadixTree(1)
    tree.insert(np.array([5, 6], np.int32), np.array([40, 41], np.int64))
    got = tree.match(np.array([5, 6, 7], np.int32))
    assert got.length == 2 and got.locations.tolist() == [40, 41] and got.handle != 0
    assert tree.sizes() == (2, 0) and sorted(tree.pages()) == [40, 41]
    tree.check_integrity()
