// The radix tree behind radix_tree.h (internal C++; the C shims in radix_api.cpp check arguments).
#ifndef RADIXSERVE_NATIVE_RADIX_TREE_IMPL_H_
#define RADIXSERVE_NATIVE_RADIX_TREE_IMPL_H_

#include <cstdint>
#include <vector>

namespace radixserve {

// A child reference; a node's kids are sorted by `first`, so a lookup is a binary search. Siblings
// may share a first token when P > 1 (they differ somewhere in their first page).
struct Kid {
  int32_t first;  // the child's key[0]
  int32_t id;     // the child's slot
};

struct Node {
  std::vector<int32_t> key;    // (n,) token ids of the edge from the parent, n a multiple of P
  std::vector<int64_t> value;  // (n,) KV locations of those tokens
  std::vector<Kid> kids;
  int64_t ref = 0;  // locks through this node; >= the sum over its kids (locks run root-ward)
  int64_t last_access = 0;  // clock stamp of the last match or insert through this node
  int32_t parent = -1;
  uint32_t gen = 0;  // bumped when the slot is freed, so stale handles stop resolving
  bool live = false;
};

// One LRU heap entry; (stamp, tie) is unique, so the pop order is fully determined.
struct HeapEntry {
  int64_t stamp;
  int64_t tie;
  int32_t id;
  uint32_t gen;
};

class RadixTree {
 public:
  explicit RadixTree(int64_t page_size);

  struct Walk {
    int32_t node;  // deepest matched node (0: the root)
    int64_t pos;   // matched tokens
  };
  // Descends as far as tokens[:len // P * P] matches, splitting an edge matched part-way and
  // stamping the path; copies the matched locations to out_locations when it is not null.
  Walk walk(const int32_t* tokens, int64_t len, int64_t* out_locations);
  int64_t insert(const int32_t* tokens, const int64_t* locations, int64_t len);
  bool lock(uint64_t handle);  // false: stale or invalid handle
  int unlock(uint64_t handle);  // an RsStatus
  int64_t evict(int64_t num_pages, int64_t* out_pages);
  int check() const;  // an RsStatus: RS_OK or RS_BROKEN_*
  int64_t pages(int64_t* out_pages) const;

  int64_t page_size() const { return page_size_; }
  int64_t evictable_pages() const { return evictable_tokens_ / page_size_; }
  int64_t protected_pages() const { return protected_tokens_ / page_size_; }
  uint64_t handle(int32_t id) const {
    return (static_cast<uint64_t>(nodes_[id].gen) << 32) | static_cast<uint32_t>(id);
  }

 private:
  int32_t resolve(uint64_t handle) const;  // -1 unless it names a live node
  int64_t own_locks(int32_t id) const;
  int32_t find_child(int32_t node, const int32_t* page) const;
  int32_t split(int32_t id, int64_t at);
  int32_t new_node();
  void free_node(int32_t id);
  void remove_kid(int32_t parent, int32_t child);
  void push(int32_t id);
  void reserve_heap();
  int64_t page_of(int64_t location) const;
  int check_node(int32_t id, int64_t* evictable, int64_t* protected_tokens) const;

  int64_t page_size_;
  std::vector<Node> nodes_;    // slot 0 is the root: empty key, ref 1, never evicted
  std::vector<int32_t> free_;  // free slots; capacity >= nodes_.size(), so freeing never allocates
  std::vector<HeapEntry> heap_;  // min-heap of possibly evictable leaves; stale entries are skipped
  int64_t clock_ = 0;
  int64_t tie_ = 0;
  int64_t evictable_tokens_ = 0;
  int64_t protected_tokens_ = 0;
};

}  // namespace radixserve

#endif  // RADIXSERVE_NATIVE_RADIX_TREE_IMPL_H_
