// C shims of radix_tree.h: check every argument before touching the tree, and turn
// std::bad_alloc into RS_ERR_NOMEM so no exception crosses into Python; rs_strerror's texts.
#include <new>

#include "radix_tree.h"
#include "radix_tree_impl.h"

struct RsRadixTree {
  radixserve::RadixTree tree;
};

namespace {

// Runs fn (which returns an RsStatus) with allocation failures mapped to a status.
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return RS_ERR_NOMEM;
  }
}

}  // namespace

extern "C" {

int rs_radix_new(int64_t page_size, RsRadixTree** out) {
  if (out == nullptr) return RS_ERR_NULL;
  if (page_size < 1 || page_size > (int64_t{1} << 30)) return RS_ERR_PAGE_SIZE;
  return guarded([&] {
    *out = new RsRadixTree{radixserve::RadixTree(page_size)};
    return RS_OK;
  });
}

void rs_radix_free(RsRadixTree* tree) { delete tree; }

int rs_radix_match(RsRadixTree* tree, const int32_t* tokens, int64_t len, int64_t* out_locations,
                   int64_t out_cap, int64_t* out_len, uint64_t* out_handle) {
  if (tree == nullptr || out_len == nullptr || out_handle == nullptr) return RS_ERR_NULL;
  if (len < 0 || out_cap < 0) return RS_ERR_LENGTH;
  if ((tokens == nullptr && len > 0) || (out_locations == nullptr && out_cap > 0)) {
    return RS_ERR_NULL;
  }
  if (out_cap < len / tree->tree.page_size() * tree->tree.page_size()) return RS_ERR_CAPACITY;
  return guarded([&] {
    const radixserve::RadixTree::Walk w = tree->tree.walk(tokens, len, out_locations);
    *out_len = w.pos;
    *out_handle = tree->tree.handle(w.node);
    return RS_OK;
  });
}

int rs_radix_lock(RsRadixTree* tree, uint64_t handle) {
  if (tree == nullptr) return RS_ERR_NULL;
  return tree->tree.lock(handle) ? RS_OK : RS_ERR_HANDLE;
}

int rs_radix_unlock(RsRadixTree* tree, uint64_t handle) {
  if (tree == nullptr) return RS_ERR_NULL;
  return guarded([&] { return tree->tree.unlock(handle); });
}

int rs_radix_insert(RsRadixTree* tree, const int32_t* tokens, const int64_t* locations,
                    int64_t len, int64_t* out_cached) {
  if (tree == nullptr || out_cached == nullptr) return RS_ERR_NULL;
  if (len < 0) return RS_ERR_LENGTH;
  if (len > 0 && (tokens == nullptr || locations == nullptr)) return RS_ERR_NULL;
  if (len % tree->tree.page_size() != 0) return RS_ERR_ALIGN;
  return guarded([&] {
    *out_cached = tree->tree.insert(tokens, locations, len);
    return RS_OK;
  });
}

int rs_radix_evict(RsRadixTree* tree, int64_t num_pages, int64_t* out_pages, int64_t out_cap,
                   int64_t* out_len) {
  if (tree == nullptr || out_len == nullptr) return RS_ERR_NULL;
  if (num_pages < 0) return RS_ERR_NUM_PAGES;
  if (out_cap < 0) return RS_ERR_LENGTH;
  if (out_pages == nullptr && out_cap > 0) return RS_ERR_NULL;
  if (num_pages > 0 && out_cap < tree->tree.evictable_pages()) return RS_ERR_CAPACITY;
  *out_len = tree->tree.evict(num_pages, out_pages);  // allocates nothing
  return RS_OK;
}

int rs_radix_sizes(const RsRadixTree* tree, int64_t* out_evictable_pages,
                   int64_t* out_protected_pages) {
  if (tree == nullptr || out_evictable_pages == nullptr || out_protected_pages == nullptr) {
    return RS_ERR_NULL;
  }
  *out_evictable_pages = tree->tree.evictable_pages();
  *out_protected_pages = tree->tree.protected_pages();
  return RS_OK;
}

int rs_radix_check(const RsRadixTree* tree) {
  if (tree == nullptr) return RS_ERR_NULL;
  return guarded([&] { return tree->tree.check(); });
}

int rs_radix_pages(const RsRadixTree* tree, int64_t* out_pages, int64_t out_cap,
                   int64_t* out_len) {
  if (tree == nullptr || out_len == nullptr) return RS_ERR_NULL;
  if (out_cap < 0) return RS_ERR_LENGTH;
  if (out_pages == nullptr && out_cap > 0) return RS_ERR_NULL;
  if (out_cap < tree->tree.evictable_pages() + tree->tree.protected_pages()) {
    return RS_ERR_CAPACITY;
  }
  return guarded([&] {
    *out_len = tree->tree.pages(out_pages);
    return RS_OK;
  });
}

const char* rs_strerror(int status) {
  switch (status) {
    case RS_OK: return "ok";
    case RS_ERR_NULL: return "NULL pointer for a non-empty buffer or an output";
    case RS_ERR_LENGTH: return "negative length or buffer capacity";
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
