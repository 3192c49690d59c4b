"""The CPU kernel of the delta codec: C++ built once with torch.utils.cpp_extension.load_inline, then loaded
from torch's extension cache (~25 s the first time on 2 cores, milliseconds after).

encode_window is one pass over the new and published int16 views: 32 elements per SIMD compare, a bit mask of
the differences, and for each set bit a gap/value emitted and the published element overwritten; the digest
of each 256-element block is summed while the block is in L1. apply_window walks the gaps and overwrites.
Semantics are defined by the torch path in codec.py, which produces identical bytes (tested).
"""
from __future__ import annotations

import hashlib
import logging

log = logging.getLogger(__name__)

_CPP = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {
constexpr int64_t kBlock = 256;  // u16 * (index in block) sums stay inside uint32

struct Digest { uint64_t s0 = 0, s1 = 0; };

inline void digest_block(const uint16_t* a, int64_t m, int64_t base, Digest& d) {
  uint32_t bs = 0, bw = 0;
  for (int64_t j = 0; j < m; ++j) { bs += a[j]; bw += uint32_t(a[j]) * uint32_t(j); }
  d.s0 += bs;
  d.s1 += uint64_t(base) * bs + bw;
}

// Bit j set where a[j] != p[j], j < 32.
inline uint32_t diff_mask32(const int16_t* a, const int16_t* p) {
#if defined(__SSE2__)
  __m128i e[4];
  for (int k = 0; k < 4; ++k)
    e[k] = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i*)(a + 8 * k)), _mm_loadu_si128((const __m128i*)(p + 8 * k)));
  uint32_t lo = uint32_t(_mm_movemask_epi8(_mm_packs_epi16(e[0], e[1])));
  uint32_t hi = uint32_t(_mm_movemask_epi8(_mm_packs_epi16(e[2], e[3])));
  return ~(lo | (hi << 16));
#else
  uint32_t m = 0;
  for (int j = 0; j < 32; ++j) m |= uint32_t(a[j] != p[j]) << j;
  return m;
#endif
}

struct Emitter {
  uint8_t* gaps; int32_t* esc; int16_t* vals;
  int64_t count = 0, n_esc = 0, last = -1;
  inline void emit(int64_t i, int16_t v) {
    int64_t g = i - last;
    last = i;
    if (g < 256) { gaps[count] = uint8_t(g); } else { gaps[count] = 0; esc[n_esc++] = int32_t(g); }
    vals[count++] = v;
  }
};

void check(const torch::Tensor& t, const char* name, c10::ScalarType dt) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dt, name, " has dtype ", t.scalar_type(), ", expected ", dt);
}
}  // namespace

std::vector<int64_t> encode_window(torch::Tensor nw, torch::Tensor pub, torch::Tensor gaps, torch::Tensor esc,
                                   torch::Tensor vals, int64_t offset) {
  check(nw, "new", torch::kInt16); check(pub, "published", torch::kInt16);
  check(gaps, "gaps", torch::kUInt8); check(esc, "escapes", torch::kInt32); check(vals, "values", torch::kInt16);
  const int64_t n = nw.numel();
  TORCH_CHECK(pub.numel() == n, "published has ", pub.numel(), " elements, new has ", n);
  TORCH_CHECK(n <= 2147483647LL, "window of ", n, " elements exceeds int32 indexing");
  TORCH_CHECK(gaps.numel() >= n && vals.numel() >= n && esc.numel() >= n / 256 + 1, "scratch too small for ", n);
  const int16_t* a = nw.data_ptr<int16_t>();
  int16_t* p = pub.data_ptr<int16_t>();
  Emitter em{gaps.data_ptr<uint8_t>(), esc.data_ptr<int32_t>(), vals.data_ptr<int16_t>()};
  Digest d;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    digest_block(reinterpret_cast<const uint16_t*>(a + b), m, offset + b, d);
    int64_t j = 0;
    for (; j + 32 <= m; j += 32) {
      uint32_t dm = diff_mask32(a + b + j, p + b + j);
      while (dm) {
        const int64_t i = b + j + __builtin_ctz(dm);
        dm &= dm - 1;
        em.emit(i, a[i]);
        p[i] = a[i];
      }
    }
    for (; j < m; ++j) {
      const int64_t i = b + j;
      if (a[i] != p[i]) { em.emit(i, a[i]); p[i] = a[i]; }
    }
  }
  return {em.count, em.n_esc, int64_t(d.s0), int64_t(d.s1)};
}

void apply_window(torch::Tensor dst, torch::Tensor gaps, torch::Tensor esc, torch::Tensor vals) {
  check(dst, "target", torch::kInt16); check(gaps, "gaps", torch::kUInt8);
  check(esc, "escapes", torch::kInt32); check(vals, "values", torch::kInt16);
  const int64_t n = dst.numel(), count = gaps.numel(), n_esc = esc.numel();
  TORCH_CHECK(vals.numel() == count, "record has ", count, " gaps but ", vals.numel(), " values");
  const uint8_t* g = gaps.data_ptr<uint8_t>();
  const int32_t* e = esc.data_ptr<int32_t>();
  const int16_t* v = vals.data_ptr<int16_t>();
  int16_t* d = dst.data_ptr<int16_t>();
  int64_t pos = -1, k = 0;
  for (int64_t c = 0; c < count; ++c) {
    int64_t step = g[c];
    if (step == 0) {
      TORCH_CHECK(k < n_esc, "record needs more than its ", n_esc, " escapes");
      step = e[k++];
      TORCH_CHECK(step > 0, "escape gap ", step, " is not positive");
    }
    pos += step;
    TORCH_CHECK(pos < n, "change index ", pos, " is outside the window of ", n, " elements");
    d[pos] = v[c];
  }
  TORCH_CHECK(k == n_esc, "record carries ", n_esc, " escapes but uses ", k);
}

std::vector<int64_t> digest(torch::Tensor x, int64_t offset) {
  check(x, "tensor", torch::kInt16);
  const uint16_t* a = reinterpret_cast<const uint16_t*>(x.data_ptr<int16_t>());
  const int64_t n = x.numel();
  Digest d;
  for (int64_t b = 0; b < n; b += kBlock) digest_block(a + b, std::min(kBlock, n - b), offset + b, d);
  return {int64_t(d.s0), int64_t(d.s1)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("encode_window", &encode_window);
  m.def("apply_window", &apply_window);
  m.def("digest", &digest);
}
"""

_kernel = None
_kernel_failed = False


def _cpu_tag() -> str:
    # The build uses -march=native: key the cache by the CPU's flags so a shared home on a cluster of mixed
    # nodes never loads a build with instructions this CPU lacks.
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return hashlib.sha1((flags + _CPP).encode()).hexdigest()[:12]


def load():
    """The compiled module, or None when it cannot be built here (no compiler): callers use the torch path."""
    global _kernel, _kernel_failed
    if _kernel is None and not _kernel_failed:
        try:
            from torch.utils.cpp_extension import load_inline

            _kernel = load_inline(name=f"searchr1_codec_{_cpu_tag()}", cpp_sources=[_CPP], functions=None,
                                  extra_cflags=["-O3", "-march=native"], verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure leaves the (identical) torch path
            _kernel_failed = True
            log.warning("delta codec C++ kernel unavailable (%s); using the torch path", e)
    return _kernel
