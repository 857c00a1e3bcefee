// libFuzzer target for the prefix helpers (build and run with run.sh).
//
// Every input drives one C entry point with buffers allocated at their exact size (so ASan sees any
// read past an end) and compares the status and results with the obvious loops below. Arrays are
// mostly derived from one another, because the interesting cases are long common prefixes that
// end inside or exactly at a 64 B / 1 KiB chunk of the memcmp fast path.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "prefix.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_prefix: mismatch with the reference: %s\n", what);
    std::abort();
  }
}

// An exact-size heap copy; empty vectors become NULL half of the time (allowed for length 0).
template <typename T>
std::unique_ptr<T[]> exact(const std::vector<T>& v, bool null_if_empty) {
  if (v.empty() && null_if_empty) return nullptr;
  std::unique_ptr<T[]> p(new T[v.size() ? v.size() : 1]);
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  return p;
}

template <typename T>
T token(FuzzedDataProvider& fdp) {
  // A tiny alphabet makes accidental matches common; the extremes exercise sign handling.
  switch (fdp.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return std::numeric_limits<T>::min();
    case 1: return std::numeric_limits<T>::max();
    case 2: return -1;
    default: return static_cast<T>(fdp.ConsumeIntegralInRange<int>(0, 3));
  }
}

// A base array (long runs cost few input bytes), then a few point edits.
template <typename T>
std::vector<T> tokens(FuzzedDataProvider& fdp, size_t max_len) {
  std::vector<T> v(fdp.ConsumeIntegralInRange<size_t>(0, max_len), token<T>(fdp));
  if (fdp.ConsumeBool()) {
    for (auto& x : v) x = static_cast<T>(fdp.ConsumeIntegralInRange<int>(0, 1));
  }
  for (int edits = fdp.ConsumeIntegralInRange<int>(0, 4); edits > 0 && !v.empty(); --edits) {
    v[fdp.ConsumeIntegralInRange<size_t>(0, v.size() - 1)] = token<T>(fdp);
  }
  return v;
}

// b = a prefix of a, then its own tail, then maybe one edit: most pairs share a long prefix.
template <typename T>
std::vector<T> derived(FuzzedDataProvider& fdp, const std::vector<T>& a, size_t max_len) {
  std::vector<T> b(a.begin(), a.begin() + fdp.ConsumeIntegralInRange<size_t>(0, a.size()));
  for (T x : tokens<T>(fdp, max_len / 8)) b.push_back(x);
  if (!b.empty() && fdp.ConsumeBool()) {
    b[fdp.ConsumeIntegralInRange<size_t>(0, b.size() - 1)] = token<T>(fdp);
  }
  return b;
}

template <typename T>
int64_t ref_mismatch(const T* a, int64_t a_len, const T* b, int64_t b_len) {
  int64_t i = 0;
  while (i < a_len && i < b_len && a[i] == b[i]) ++i;
  return i;
}

template <typename T>
int call_first(const T* a, int64_t an, const T* b, int64_t bn, int64_t* out);
template <>
int call_first(const int32_t* a, int64_t an, const int32_t* b, int64_t bn, int64_t* out) {
  return rs_first_mismatch_i32(a, an, b, bn, out);
}
template <>
int call_first(const int64_t* a, int64_t an, const int64_t* b, int64_t bn, int64_t* out) {
  return rs_first_mismatch_i64(a, an, b, bn, out);
}

template <typename T>
int call_match(const T* p, int64_t pn, int64_t off, const T* k, int64_t kn, const int64_t* ko,
               int64_t nk, int64_t* oi, int64_t* ol);
template <>
int call_match(const int32_t* p, int64_t pn, int64_t off, const int32_t* k, int64_t kn,
               const int64_t* ko, int64_t nk, int64_t* oi, int64_t* ol) {
  return rs_match_children_i32(p, pn, off, k, kn, ko, nk, oi, ol);
}
template <>
int call_match(const int64_t* p, int64_t pn, int64_t off, const int64_t* k, int64_t kn,
               const int64_t* ko, int64_t nk, int64_t* oi, int64_t* ol) {
  return rs_match_children_i64(p, pn, off, k, kn, ko, nk, oi, ol);
}

// Lengths handed to C: the true one, or (rarely) a negative one that must be rejected.
int64_t maybe_negative(FuzzedDataProvider& fdp, size_t len) {
  return fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? -fdp.ConsumeIntegralInRange<int64_t>(1, 3)
                                                       : static_cast<int64_t>(len);
}

template <typename T>
void fuzz_first_mismatch(FuzzedDataProvider& fdp) {
  const std::vector<T> a = tokens<T>(fdp, 3000);
  const std::vector<T> b = derived(fdp, a, 3000);
  auto pa = exact(a, fdp.ConsumeBool());
  auto pb = exact(b, fdp.ConsumeBool());
  const int64_t an = maybe_negative(fdp, a.size()), bn = maybe_negative(fdp, b.size());
  const bool null_out = fdp.ConsumeIntegralInRange<int>(0, 15) == 0;
  int64_t out = -7;

  int want = RS_OK;
  if (null_out) want = RS_ERR_NULL;
  else if (an < 0 || bn < 0) want = RS_ERR_LENGTH;
  else if ((!pa && an > 0) || (!pb && bn > 0)) want = RS_ERR_NULL;

  const int got = call_first<T>(pa.get(), an, pb.get(), bn, null_out ? nullptr : &out);
  check(got == want, "first_mismatch status");
  if (want != RS_OK) {
    check(out == -7, "first_mismatch wrote its output on error");
    return;
  }
  check(out == ref_mismatch(a.data(), an, b.data(), bn), "first_mismatch result");
}

template <typename T>
void fuzz_match_children(FuzzedDataProvider& fdp) {
  const std::vector<T> prompt = tokens<T>(fdp, 3000);
  const int64_t offset = fdp.ConsumeIntegralInRange<int64_t>(-2, prompt.size() + 2);
  const std::vector<T> rest(prompt.begin() + std::min<int64_t>(std::max<int64_t>(offset, 0),
                                                                prompt.size()),
                            prompt.end());
  std::vector<T> keys;
  std::vector<int64_t> offsets{0};
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 12); n > 0; --n) {
    for (T x : fdp.ConsumeBool() ? derived(fdp, rest, 3000) : tokens<T>(fdp, 40)) keys.push_back(x);
    offsets.push_back(static_cast<int64_t>(keys.size()));
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) {  // corrupt one offset
    offsets[fdp.ConsumeIntegralInRange<size_t>(0, offsets.size() - 1)] =
        fdp.ConsumeIntegralInRange<int64_t>(-3, keys.size() + 3);
  }
  auto pp = exact(prompt, fdp.ConsumeBool());
  auto pk = exact(keys, fdp.ConsumeBool());
  auto po = exact(offsets, false);
  const int64_t pn = maybe_negative(fdp, prompt.size()), kn = maybe_negative(fdp, keys.size());
  const int64_t nk = maybe_negative(fdp, offsets.size() - 1);
  const bool null_offsets = fdp.ConsumeIntegralInRange<int>(0, 15) == 0;
  const bool null_out = fdp.ConsumeIntegralInRange<int>(0, 15) == 0;
  int64_t out_index = -7, out_len = -7;

  bool offsets_ok = nk < 0 || offsets[0] >= 0;
  for (int64_t i = 0; offsets_ok && i < nk; ++i) offsets_ok = offsets[i] <= offsets[i + 1];
  offsets_ok = offsets_ok && (nk < 0 || offsets[nk] <= kn);
  int want = RS_OK;
  if (null_out || null_offsets) want = RS_ERR_NULL;
  else if (pn < 0 || kn < 0 || nk < 0) want = RS_ERR_LENGTH;
  else if ((!pp && pn > 0) || (!pk && kn > 0)) want = RS_ERR_NULL;
  else if (offset < 0 || offset > pn) want = RS_ERR_OFFSET;
  else if (!offsets_ok) want = RS_ERR_KEY_OFFSETS;

  const int got = call_match<T>(pp.get(), pn, offset, pk.get(), kn,
                                null_offsets ? nullptr : po.get(), nk,
                                null_out ? nullptr : &out_index, &out_len);
  check(got == want, "match_children status");
  if (want != RS_OK) {
    check(out_index == -7 && out_len == -7, "match_children wrote its outputs on error");
    return;
  }
  int64_t best_index = -1, best_len = 0;
  for (int64_t i = 0; i < nk; ++i) {
    const int64_t len = ref_mismatch(keys.data() + offsets[i], offsets[i + 1] - offsets[i],
                                     rest.data(), static_cast<int64_t>(rest.size()));
    if (len > best_len) best_index = i, best_len = len;
  }
  check(out_index == best_index && out_len == best_len, "match_children result");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: fuzz_first_mismatch<int32_t>(fdp); break;
    case 1: fuzz_first_mismatch<int64_t>(fdp); break;
    case 2: fuzz_match_children<int32_t>(fdp); break;
    case 3: fuzz_match_children<int64_t>(fdp); break;
    default: check(rs_strerror(fdp.ConsumeIntegral<int>()) != nullptr, "strerror");
  }
  return 0;
}
