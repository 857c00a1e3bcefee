// libFuzzer target for the radix tree (build and run with run.sh).
//
// Each input is a page size and a sequence of operations on one tree. After every operation the
// tree must pass rs_radix_check, and its answers must agree with a page-granular oracle: the set
// of cached page-aligned prefixes, each mapped to the page id it was inserted with (every insert
// uses fresh page ids, so an evicted id names exactly one prefix). Bad arguments (NULL, negative
// or unaligned lengths, short buffers, forged handles) must return their status and change nothing.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "radix_tree.h"

namespace {

using Tokens = std::vector<int32_t>;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_radix: %s\n", what);
    std::abort();
  }
}

struct Handle {
  uint64_t value;
  Tokens prefix;  // the matched tokens; the handle's node ends at prefix.size()
  int64_t last_page;  // page id of the last matched page at match time (-1: the root)
};

struct Oracle {
  int64_t P;
  std::map<Tokens, int64_t> page_of;  // cached prefix (whole pages) -> page id of its last page
  std::multiset<Tokens> locks;        // prefixes of live locks

  bool cached(const Tokens& t, size_t end) const {
    return page_of.count(Tokens(t.begin(), t.begin() + end)) != 0;
  }
  size_t match_len(const Tokens& t) const {
    size_t n = 0;
    while (n + P <= t.size() && cached(t, n + P)) n += P;
    return n;
  }
  bool live(const Handle& h) const {  // its node still exists iff its last page is still cached
    if (h.last_page < 0) return true;
    auto it = page_of.find(h.prefix);
    return it != page_of.end() && it->second == h.last_page;
  }
  bool protected_prefix(const Tokens& p) const {  // some live lock covers p's last page
    for (const Tokens& l : locks) {
      if (l.size() >= p.size() && std::equal(p.begin(), p.end(), l.begin())) return true;
    }
    return false;
  }
};

Tokens draw_tokens(FuzzedDataProvider& fdp, const std::vector<Tokens>& seen, int64_t P) {
  Tokens t;
  if (!seen.empty() && fdp.ConsumeBool()) {  // extend a prefix of an earlier sequence
    const Tokens& base = seen[fdp.ConsumeIntegralInRange<size_t>(0, seen.size() - 1)];
    t.assign(base.begin(), base.begin() + fdp.ConsumeIntegralInRange<size_t>(0, base.size()));
  }
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 4 * static_cast<int>(P)); n > 0; --n) {
    t.push_back(fdp.ConsumeIntegralInRange<int32_t>(0, 2));  // tiny alphabet: many splits
  }
  return t;
}

void check_sizes(RsRadixTree* tree, const Oracle& o) {
  check(rs_radix_check(tree) == RS_OK, "rs_radix_check failed");
  int64_t evictable = -1, protected_pages = -1;
  check(rs_radix_sizes(tree, &evictable, &protected_pages) == RS_OK, "sizes status");
  int64_t want_protected = 0;
  for (const auto& kv : o.page_of) want_protected += o.protected_prefix(kv.first);
  check(protected_pages == want_protected, "protected pages");
  check(evictable + protected_pages == static_cast<int64_t>(o.page_of.size()), "cached pages");
}

void op_match(FuzzedDataProvider& fdp, RsRadixTree* tree, Oracle& o, const Tokens& t,
              std::vector<Handle>& handles) {
  const int64_t aligned = static_cast<int64_t>(t.size()) / o.P * o.P;
  std::unique_ptr<int64_t[]> out(new int64_t[aligned + 1]);
  int64_t len = -7;
  uint64_t handle = 7;
  if (aligned > 0 && fdp.ConsumeIntegralInRange<int>(0, 9) == 0) {  // one slot short
    check(rs_radix_match(tree, t.data(), t.size(), out.get(), aligned - 1, &len, &handle) ==
              RS_ERR_CAPACITY && len == -7, "match with a short buffer");
    return;
  }
  check(rs_radix_match(tree, t.data(), t.size(), aligned ? out.get() : nullptr, aligned, &len,
                       &handle) == RS_OK, "match status");
  const size_t want = o.match_len(t);
  check(len == static_cast<int64_t>(want), "match length");
  for (size_t end = o.P; end <= want; end += o.P) {
    const int64_t page = o.page_of.at(Tokens(t.begin(), t.begin() + end));
    for (int64_t i = 0; i < o.P; ++i) {
      check(out[end - o.P + i] == page * o.P + i, "match locations");
    }
  }
  const Tokens prefix(t.begin(), t.begin() + want);
  handles.push_back({handle, prefix, want ? o.page_of.at(prefix) : -1});
}

void op_insert(FuzzedDataProvider& fdp, RsRadixTree* tree, Oracle& o, Tokens t,
               int64_t& next_page) {
  const bool unaligned = t.size() % o.P != 0 && fdp.ConsumeBool();
  if (!unaligned) t.resize(t.size() / o.P * o.P);
  std::vector<int64_t> locs(t.size());
  for (size_t i = 0; i < t.size(); ++i) locs[i] = (next_page + i / o.P) * o.P + i % o.P;
  int64_t cached = -7;
  const int status = rs_radix_insert(tree, t.data(), locs.data(), t.size(), &cached);
  if (unaligned) {
    check(status == RS_ERR_ALIGN && cached == -7, "unaligned insert");
    return;
  }
  check(status == RS_OK && cached == static_cast<int64_t>(o.match_len(t)), "insert result");
  for (size_t end = cached + o.P; end <= t.size(); end += o.P) {
    o.page_of[Tokens(t.begin(), t.begin() + end)] = next_page + (end / o.P - 1);
  }
  next_page += static_cast<int64_t>(t.size()) / o.P;
}

// A node's own locks are those taken through a handle naming it; live handles with equal prefixes
// name the same node (a locked node is never evicted), so the oracle keys locks by prefix.
void op_lock(FuzzedDataProvider& fdp, RsRadixTree* tree, Oracle& o, const Handle& h) {
  const bool unlock = fdp.ConsumeBool();
  int want = RS_OK;
  if (!o.live(h)) want = RS_ERR_HANDLE;
  else if (unlock && h.last_page >= 0 && o.locks.count(h.prefix) == 0) want = RS_ERR_UNLOCK;
  const int got = unlock ? rs_radix_unlock(tree, h.value) : rs_radix_lock(tree, h.value);
  check(got == want, "lock/unlock status");
  if (got != RS_OK || h.last_page < 0) return;
  if (unlock) o.locks.erase(o.locks.find(h.prefix));
  else o.locks.insert(h.prefix);
}

void op_evict(FuzzedDataProvider& fdp, RsRadixTree* tree, Oracle& o) {
  int64_t evictable = 0, protected_pages = 0;
  rs_radix_sizes(tree, &evictable, &protected_pages);
  const int64_t n = fdp.ConsumeIntegralInRange<int64_t>(-1, 8);
  const bool short_buffer = evictable > 0 && n > 0 && fdp.ConsumeIntegralInRange<int>(0, 7) == 0;
  const int64_t cap = short_buffer ? evictable - 1 : evictable;
  std::unique_ptr<int64_t[]> out(new int64_t[cap + 1]);
  int64_t len = -7;
  const int status = rs_radix_evict(tree, n, cap ? out.get() : nullptr, cap, &len);
  if (n < 0 || short_buffer) {
    check(status == (n < 0 ? RS_ERR_NUM_PAGES : RS_ERR_CAPACITY) && len == -7, "evict errors");
    return;
  }
  check(status == RS_OK && len >= std::min(n, evictable) && len <= evictable, "evict count");
  std::set<int64_t> freed(out.get(), out.get() + len);
  check(static_cast<int64_t>(freed.size()) == len, "a page evicted twice");
  for (auto it = o.page_of.begin(); it != o.page_of.end();) {
    if (freed.erase(it->second)) {
      check(!o.protected_prefix(it->first), "evicted a locked page");
      it = o.page_of.erase(it);
    } else {
      ++it;
    }
  }
  check(freed.empty(), "evicted a page that was not cached");
  for (const auto& kv : o.page_of) {  // what is left is still prefix-closed
    const Tokens& p = kv.first;
    check(p.size() == static_cast<size_t>(o.P) || o.cached(p, p.size() - o.P), "orphaned pages");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const int64_t page_sizes[] = {1, 2, 4};
  RsRadixTree* raw = nullptr;
  check(rs_radix_new(0, &raw) == RS_ERR_PAGE_SIZE && raw == nullptr, "page size 0 accepted");
  Oracle o{page_sizes[fdp.ConsumeIntegralInRange<int>(0, 2)], {}, {}};
  check(rs_radix_new(o.P, &raw) == RS_OK, "rs_radix_new");
  std::unique_ptr<RsRadixTree, void (*)(RsRadixTree*)> tree(raw, rs_radix_free);
  std::vector<Tokens> seen;
  std::vector<Handle> handles{{0, {}, -1}};
  int64_t next_page = 0;
  for (int steps = 0; steps < 64 && fdp.remaining_bytes() > 0; ++steps) {
    const int kind = fdp.ConsumeIntegralInRange<int>(0, 5);
    if (kind <= 1) {
      seen.push_back(draw_tokens(fdp, seen, o.P));
      if (kind == 0) op_match(fdp, tree.get(), o, seen.back(), handles);
      else op_insert(fdp, tree.get(), o, seen.back(), next_page);
    } else if (kind == 2) {
      const size_t pick = fdp.ConsumeIntegralInRange<size_t>(0, handles.size() - 1);
      op_lock(fdp, tree.get(), o, handles[pick]);
    } else if (kind == 3) {
      op_evict(fdp, tree.get(), o);
    } else if (kind == 4) {  // forged handles: the root's slot at another generation, a slot
      // never allocated (inputs are far too short to reach it)
      const uint64_t gen = fdp.ConsumeIntegralInRange<uint32_t>(1, UINT32_MAX);
      check(rs_radix_lock(tree.get(), gen << 32) == RS_ERR_HANDLE, "forged root handle");
      check(rs_radix_unlock(tree.get(), (gen << 32) | 0xfffffff0u) == RS_ERR_HANDLE,
            "forged slot accepted");
    } else {  // NULL and negative arguments
      int64_t x = 0;
      uint64_t h = 0;
      RsRadixTree* t = tree.get();
      check(rs_radix_match(t, nullptr, 2, nullptr, 0, &x, &h) == RS_ERR_NULL, "NULL tokens");
      check(rs_radix_match(t, nullptr, -1, nullptr, 0, &x, &h) == RS_ERR_LENGTH, "len < 0");
      check(rs_radix_insert(tree.get(), nullptr, nullptr, o.P, &x) == RS_ERR_NULL, "NULL insert");
      check(rs_radix_insert(nullptr, nullptr, nullptr, 0, &x) == RS_ERR_NULL, "NULL tree");
      check(rs_radix_pages(tree.get(), nullptr, 0, nullptr) == RS_ERR_NULL, "NULL pages out");
    }
    check_sizes(tree.get(), o);
  }
  return 0;
}
