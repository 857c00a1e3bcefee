// Radix prefix tree: the whole tree and its walk live here, with one owner.
//
// Why native: a profile of the Python tree (docs/native.md) showed ~1-2 us of interpreter work per
// node, so a prompt walking a deep chain of short edges (10k branches off one 32k-token prompt)
// cost ~20 ms however fast each compare was. Here a node costs one binary search over its kids,
// one memcmp of the edge and one memcpy of its locations.
//
// The semantics mirror the pure-Python twin (engine/kvcache/radix_py.py) step for step, down to
// the LRU clock and the heap tie-breaker, so both evict the same pages in the same order.
//
// Allocation: std::bad_alloc is caught at the C boundary (radix_api.cpp). Every allocation that an
// operation needs happens before its first mutation (locals, reserve), so a failed call leaves a
// consistent tree; at worst a split done before the failure remains, which is a valid tree.
#include <algorithm>
#include <cstring>
#include <utility>

#include "compare.h"
#include "radix_tree.h"
#include "radix_tree_impl.h"

namespace radixserve {
namespace {

bool heap_after(const HeapEntry& a, const HeapEntry& b) {  // min-heap on (stamp, tie)
  return a.stamp != b.stamp ? a.stamp > b.stamp : a.tie > b.tie;
}

bool by_first(const Kid& k, int32_t first) { return k.first < first; }

// Room for one more element without a reallocation later; doubling keeps pushes amortized O(1).
template <typename T>
void reserve_one(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(4, 2 * v.capacity()));
}

}  // namespace

RadixTree::RadixTree(int64_t page_size) : page_size_(page_size) {
  nodes_.emplace_back();
  nodes_[0].ref = 1;  // the root is never evicted
  nodes_[0].live = true;
  free_.reserve(16);
}

int32_t RadixTree::resolve(uint64_t handle) const {
  const uint64_t id = handle & 0xffffffffu;
  if (id >= nodes_.size()) return -1;
  const Node& n = nodes_[id];
  return n.live && n.gen == static_cast<uint32_t>(handle >> 32) ? static_cast<int32_t>(id) : -1;
}

int64_t RadixTree::page_of(int64_t location) const {  // Python's floor division
  int64_t q = location / page_size_;
  if (location % page_size_ != 0 && location < 0) --q;
  return q;
}

int32_t RadixTree::find_child(int32_t node, const int32_t* page) const {
  const std::vector<Kid>& kids = nodes_[node].kids;
  auto it = kids.size() <= 8 ? std::find_if(kids.begin(), kids.end(),
                                            [&](const Kid& k) { return k.first >= page[0]; })
                             : std::lower_bound(kids.begin(), kids.end(), page[0], by_first);
  for (; it != kids.end() && it->first == page[0]; ++it) {
    if (page_size_ == 1) return it->id;  // the first token is the whole first page
    const int32_t* key = nodes_[it->id].key.data();
    int64_t i = 1;  // short pages: an inline loop beats a memcmp call
    while (i < page_size_ && key[i] == page[i]) ++i;
    if (i == page_size_) return it->id;
  }
  return -1;
}

int32_t RadixTree::new_node() {
  if (free_.empty()) {
    reserve_one(nodes_);
    free_.reserve(nodes_.capacity());  // so free_node never allocates
    nodes_.emplace_back();
    nodes_.back().live = true;
    return static_cast<int32_t>(nodes_.size() - 1);
  }
  const int32_t id = free_.back();
  free_.pop_back();
  nodes_[id].live = true;
  return id;
}

void RadixTree::free_node(int32_t id) {
  Node& n = nodes_[id];
  n.key = {};
  n.value = {};
  n.kids = {};
  n.ref = n.last_access = 0;
  n.parent = -1;
  n.live = false;
  ++n.gen;
  free_.push_back(id);
}

void RadixTree::remove_kid(int32_t parent, int32_t child) {
  std::vector<Kid>& kids = nodes_[parent].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), nodes_[child].key[0], by_first);
  while (it->id != child) ++it;  // the child is linked, so the scan stops inside its first token
  kids.erase(it);
}

void RadixTree::push(int32_t id) {
  heap_.push_back({nodes_[id].last_access, tie_++, id, nodes_[id].gen});
  std::push_heap(heap_.begin(), heap_.end(), heap_after);
}

void RadixTree::reserve_heap() { reserve_one(heap_); }

int32_t RadixTree::split(int32_t id, int64_t at) {
  // Allocate first: the new upper part's key, locations and kid list, then its slot.
  std::vector<int32_t> key(nodes_[id].key.begin(), nodes_[id].key.begin() + at);
  std::vector<int64_t> value(nodes_[id].value.begin(), nodes_[id].value.begin() + at);
  std::vector<Kid> kids{{nodes_[id].key[at], id}};
  const int32_t head_id = new_node();  // may move nodes_: take references only after this
  Node& head = nodes_[head_id];
  Node& node = nodes_[id];
  head.key = std::move(key);
  head.value = std::move(value);
  head.kids = std::move(kids);
  head.parent = node.parent;
  head.ref = node.ref;  // the lower part keeps its locks; so does the path above it
  head.last_access = node.last_access;
  for (Kid& k : nodes_[node.parent].kids) {  // same first token, so the order is unchanged
    if (k.id == id) k.id = head_id;
  }
  node.key.erase(node.key.begin(), node.key.begin() + at);
  node.value.erase(node.value.begin(), node.value.begin() + at);
  node.parent = head_id;
  return head_id;
}

RadixTree::Walk RadixTree::walk(const int32_t* tokens, int64_t len, int64_t* out_locations) {
  const int64_t P = page_size_, limit = len / P * P, now = ++clock_;
  int32_t node = 0;
  int64_t pos = 0;
  while (pos < limit) {
    int32_t child = find_child(node, tokens + pos);
    if (child < 0) break;
    const Node& next = nodes_[child];
    // A deep chain is a run of dependent cache misses (node, key, locations, kids); issue the
    // last three together so they overlap instead of following each other.
    __builtin_prefetch(next.value.data());
    __builtin_prefetch(next.kids.data());
    const int64_t key_len = static_cast<int64_t>(next.key.size());
    // The first page is known equal; edges of a few tokens (deep chains) skip the memcmp path.
    const int32_t* key = nodes_[child].key.data();
    const int64_t n = std::min(key_len, limit - pos);
    int64_t m = P;
    if (n - m <= 16) {
      while (m < n && key[m] == tokens[pos + m]) ++m;
    } else {
      m += mismatch(key + m, tokens + pos + m, n - m);
    }
    m = m / P * P;
    if (m < key_len) child = split(child, m);  // m >= P: the first page matched
    Node& c = nodes_[child];
    c.last_access = now;
    if (out_locations) std::memcpy(out_locations + pos, c.value.data(), m * sizeof(int64_t));
    pos += m;
    node = child;
    if (m < key_len) break;  // the tokens leave the edge at the split point
  }
  return {node, pos};
}

int64_t RadixTree::insert(const int32_t* tokens, const int64_t* locations, int64_t len) {
  const Walk w = walk(tokens, len, nullptr);
  if (w.pos == len) return w.pos;
  std::vector<int32_t> key(tokens + w.pos, tokens + len);
  std::vector<int64_t> value(locations + w.pos, locations + len);
  reserve_one(nodes_[w.node].kids);
  reserve_heap();
  const int32_t id = new_node();  // the last allocation: nothing below can fail
  Node& leaf = nodes_[id];
  leaf.key = std::move(key);
  leaf.value = std::move(value);
  leaf.parent = w.node;
  leaf.last_access = ++clock_;
  std::vector<Kid>& kids = nodes_[w.node].kids;
  kids.insert(std::upper_bound(kids.begin(), kids.end(), leaf.key[0],
                               [](int32_t first, const Kid& k) { return first < k.first; }),
              Kid{leaf.key[0], id});
  evictable_tokens_ += len - w.pos;
  push(id);
  return w.pos;
}

// Locks taken through this node's own handle: its count less its children's, which pass through.
// Unlocking a node that holds none (e.g. an ancestor of the locked node) would leave a child
// locked more than its parent, so unlock refuses it.
int64_t RadixTree::own_locks(int32_t id) const {
  int64_t below = 0;
  for (const Kid& k : nodes_[id].kids) below += nodes_[k.id].ref;
  return nodes_[id].ref - below;
}

bool RadixTree::lock(uint64_t handle) {
  int32_t id = resolve(handle);
  if (id < 0) return false;
  for (; id != 0; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    if (n.ref++ == 0) {
      evictable_tokens_ -= static_cast<int64_t>(n.key.size());
      protected_tokens_ += static_cast<int64_t>(n.key.size());
    }
  }
  return true;
}

int RadixTree::unlock(uint64_t handle) {
  int32_t id = resolve(handle);
  if (id < 0) return RS_ERR_HANDLE;
  if (id != 0 && own_locks(id) <= 0) return RS_ERR_UNLOCK;
  reserve_heap();
  for (; id != 0; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    if (--n.ref == 0) {
      evictable_tokens_ += static_cast<int64_t>(n.key.size());
      protected_tokens_ -= static_cast<int64_t>(n.key.size());
      if (n.kids.empty()) push(id);  // only the start node can be a leaf: one push at most
    }
  }
  return RS_OK;
}

int64_t RadixTree::evict(int64_t num_pages, int64_t* out_pages) {
  // Every push below follows a pop, so the heap never grows here and never reallocates.
  int64_t freed = 0;
  while (freed < num_pages && !heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), heap_after);
    const HeapEntry e = heap_.back();
    heap_.pop_back();
    Node& n = nodes_[e.id];
    if (!n.live || n.gen != e.gen || e.id == 0 || n.ref > 0 || !n.kids.empty()) {
      continue;  // no longer an evictable leaf; a later event re-queues it
    }
    if (e.stamp != n.last_access) {
      push(e.id);  // touched since queued: re-queue at its new age
      continue;
    }
    const int64_t len = static_cast<int64_t>(n.key.size());
    for (int64_t i = 0; i < len; i += page_size_) out_pages[freed++] = page_of(n.value[i]);
    evictable_tokens_ -= len;
    const int32_t parent = n.parent;
    remove_kid(parent, e.id);
    free_node(e.id);
    const Node& p = nodes_[parent];
    if (parent != 0 && p.ref == 0 && p.kids.empty()) push(parent);
  }
  return freed;
}

int64_t RadixTree::pages(int64_t* out_pages) const {
  int64_t count = 0;
  std::vector<int32_t> stack{0};
  while (!stack.empty()) {
    const Node& n = nodes_[stack.back()];
    stack.pop_back();
    for (size_t i = 0; i < n.key.size(); i += page_size_) out_pages[count++] = page_of(n.value[i]);
    for (const Kid& k : n.kids) stack.push_back(k.id);
  }
  return count;
}

int RadixTree::check_node(int32_t id, int64_t* evictable, int64_t* protected_tokens) const {
  const Node& n = nodes_[id];
  const int64_t len = static_cast<int64_t>(n.key.size());
  if (id != 0) {
    if (len == 0 || len % page_size_ != 0 || n.value.size() != n.key.size()) return RS_BROKEN_EDGE;
    if (n.ref < 0 || own_locks(id) < 0) return RS_BROKEN_REFS;
    *(n.ref ? protected_tokens : evictable) += len;
  }
  const size_t page_bytes = static_cast<size_t>(page_size_) * sizeof(int32_t);
  for (size_t i = 0; i < n.kids.size(); ++i) {
    const Kid& k = n.kids[i];
    if (k.id <= 0 || static_cast<size_t>(k.id) >= nodes_.size()) return RS_BROKEN_LINKS;
    const Node& c = nodes_[k.id];
    if (!c.live || c.parent != id || c.key.empty() || c.key[0] != k.first) return RS_BROKEN_LINKS;
    // Sorted by first token; within a run of equal first tokens, first pages pairwise distinct.
    for (size_t j = i + 1; j < n.kids.size() && n.kids[j].first <= k.first; ++j) {
      if (n.kids[j].first < k.first) return RS_BROKEN_LINKS;
      const Node& d = nodes_[n.kids[j].id];
      if (d.key.size() < static_cast<size_t>(page_size_) ||
          c.key.size() < static_cast<size_t>(page_size_) ||
          std::memcmp(c.key.data(), d.key.data(), page_bytes) == 0) {
        return RS_BROKEN_LINKS;
      }
    }
  }
  return RS_OK;
}

int RadixTree::check() const {
  const Node& root = nodes_[0];
  if (!root.live || root.ref != 1 || root.parent != -1 || !root.key.empty()) return RS_BROKEN_REFS;
  const int64_t num_live = static_cast<int64_t>(nodes_.size() - free_.size());
  int64_t evictable = 0, protected_tokens = 0, seen = 0;
  std::vector<int32_t> stack{0};
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    if (++seen > num_live) return RS_BROKEN_NODES;  // also stops on a cycle
    if (const int status = check_node(id, &evictable, &protected_tokens)) return status;
    for (const Kid& k : nodes_[id].kids) stack.push_back(k.id);
  }
  if (seen != num_live) return RS_BROKEN_NODES;
  if (evictable != evictable_tokens_ || protected_tokens != protected_tokens_) {
    return RS_BROKEN_SIZES;
  }
  return RS_OK;
}

}  // namespace radixserve
