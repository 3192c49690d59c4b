// A plain shared library with a C ABI (no torch or Python headers: it compiles in about a second, the torch
// extension it replaced took ~30 s); kernel.py checks the tensors and calls it through ctypes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>
#if defined(__AVX512BW__) || defined(__AVX2__) || defined(__BMI2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {
constexpr int64_t kBlock = 256;  // u16 * (index in block) sums stay inside uint32
constexpr int kGapCap = 24;      // a gap quotient this large is escaped: the raw 32-bit gap follows
constexpr int kValCap = 8;       // a value quotient this large is escaped: the raw 16-bit new value follows
constexpr uint16_t kExp = 0x7F80;

struct Digest { uint64_t s0 = 0, s1 = 0; };

inline void digest_block(const uint16_t* a, int64_t m, int64_t base, Digest& d) {
  uint32_t bs = 0, bw = 0;
  for (int64_t j = 0; j < m; ++j) { bs += a[j]; bw += uint32_t(a[j]) * uint32_t(j); }
  d.s0 += bs;
  d.s1 += uint64_t(base) * bs + bw;
}

#if defined(__AVX512BW__) || defined(__AVX2__)
alignas(64) const int16_t kJ[256] = {
#define R8(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7
#define R64(x) R8(x), R8(x + 8), R8(x + 16), R8(x + 24), R8(x + 32), R8(x + 40), R8(x + 48), R8(x + 56)
    R64(0), R64(64), R64(128), R64(192)
#undef R64
#undef R8
};
#endif

// One full 256-element block, exactly as digest_block: with u = s + 32768 (s: the bits read as int16 after
// flipping the top bit), sum u = sum s + 32768*256 and sum u*j = sum s*j + 32768*sum j, and madd of int16
// pairs computes s*j exactly in int32 (|sum| <= 32768*32640 < 2^31).
inline void digest256(const int16_t* a, int64_t base, Digest& d) {
#if defined(__AVX512BW__)
  const __m512i flip = _mm512_set1_epi16(int16_t(0x8000)), ones = _mm512_set1_epi16(1);
  __m512i acc_s = _mm512_setzero_si512(), acc_w = _mm512_setzero_si512();
  for (int g = 0; g < 8; ++g) {
    const __m512i x = _mm512_xor_si512(_mm512_loadu_si512(a + 32 * g), flip);
    acc_s = _mm512_add_epi32(acc_s, _mm512_madd_epi16(x, ones));
    acc_w = _mm512_add_epi32(acc_w, _mm512_madd_epi16(x, _mm512_load_si512(kJ + 32 * g)));
  }
  const int64_t bs = int64_t(_mm512_reduce_add_epi32(acc_s)) + 32768LL * 256;
  const int64_t bw = int64_t(_mm512_reduce_add_epi32(acc_w)) + 32768LL * 32640;
#elif defined(__AVX2__)
  const __m256i flip = _mm256_set1_epi16(int16_t(0x8000)), ones = _mm256_set1_epi16(1);
  __m256i acc_s = _mm256_setzero_si256(), acc_w = _mm256_setzero_si256();
  for (int g = 0; g < 16; ++g) {
    const __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(a + 16 * g)), flip);
    acc_s = _mm256_add_epi32(acc_s, _mm256_madd_epi16(x, ones));
    acc_w = _mm256_add_epi32(acc_w, _mm256_madd_epi16(x, _mm256_load_si256((const __m256i*)(kJ + 16 * g))));
  }
  alignas(32) int32_t ls[8], lw[8];
  _mm256_store_si256((__m256i*)ls, acc_s);
  _mm256_store_si256((__m256i*)lw, acc_w);
  int64_t bs = 32768LL * 256, bw = 32768LL * 32640;
  for (int k = 0; k < 8; ++k) { bs += ls[k]; bw += lw[k]; }
#else
  digest_block(reinterpret_cast<const uint16_t*>(a), 256, base, d);
  return;
#endif
#if defined(__AVX512BW__) || defined(__AVX2__)
  d.s0 += uint64_t(bs);
  d.s1 += uint64_t(base) * uint64_t(bs) + uint64_t(bw);
#endif
}

inline void digest_any(const int16_t* a, int64_t m, int64_t base, Digest& d) {
  if (m == kBlock) digest256(a, base, d);
  else digest_block(reinterpret_cast<const uint16_t*>(a), m, base, d);
}

// Bit j set where a[j] != p[j], j < 32.
inline uint32_t diff_mask32(const int16_t* a, const int16_t* p) {
#if defined(__AVX512BW__)
  return _mm512_cmpneq_epi16_mask(_mm512_loadu_si512(a), _mm512_loadu_si512(p));
#elif defined(__AVX2__)
  __m256i e0 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i*)a), _mm256_loadu_si256((const __m256i*)p));
  __m256i e1 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i*)(a + 16)),
                                  _mm256_loadu_si256((const __m256i*)(p + 16)));
  // packs interleaves the 128-bit lanes of its operands; the permute restores element order
  return ~uint32_t(_mm256_movemask_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8)));
#elif defined(__SSE2__)
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

inline bool in_class(int16_t v, int16_t thr) { return (uint16_t(v) & kExp) < uint16_t(thr); }

// Bit j set where p[j]'s exponent field is below thr >> 7 (sign and mantissa ignored), j < 32.
inline uint32_t class_mask32(const int16_t* p, int16_t thr) {
#if defined(__AVX512BW__)
  const __m512i x = _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi16(int16_t(kExp)));
  return _mm512_cmplt_epu16_mask(x, _mm512_set1_epi16(thr));
#elif defined(__AVX2__)
  // signed compares are exact here: both sides lie in [0, 0x7F80]
  const __m256i m = _mm256_set1_epi16(int16_t(kExp)), t = _mm256_set1_epi16(thr);
  __m256i c0 = _mm256_cmpgt_epi16(t, _mm256_and_si256(_mm256_loadu_si256((const __m256i*)p), m));
  __m256i c1 = _mm256_cmpgt_epi16(t, _mm256_and_si256(_mm256_loadu_si256((const __m256i*)(p + 16)), m));
  return uint32_t(_mm256_movemask_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(c0, c1), 0xD8)));
#elif defined(__SSE2__)
  const __m128i m = _mm_set1_epi16(int16_t(kExp)), t = _mm_set1_epi16(thr);
  __m128i c[4];
  for (int k = 0; k < 4; ++k) c[k] = _mm_cmplt_epi16(_mm_and_si128(_mm_loadu_si128((const __m128i*)(p + 8 * k)), m), t);
  uint32_t lo = uint32_t(_mm_movemask_epi8(_mm_packs_epi16(c[0], c[1])));
  uint32_t hi = uint32_t(_mm_movemask_epi8(_mm_packs_epi16(c[2], c[3])));
  return lo | (hi << 16);
#else
  uint32_t r = 0;
  for (int j = 0; j < 32; ++j) r |= uint32_t(in_class(p[j], thr)) << j;
  return r;
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

// A malformed input: the message is thrown here, caught at the C boundary and raised in Python as RuntimeError.
template <class... A>
[[noreturn]] void fail(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  throw std::runtime_error(s.str());
}
#define CHECK(cond, ...) \
  do {                   \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

inline int exponent(int16_t v) { return (uint16_t(v) >> 7) & 0xFF; }

// ---- rice (rice.py documents the format; every decision below is integer arithmetic mirrored there exactly)

// A change's value symbol: for an old value with exponent field 0 (zero, subnormal), the new magnitude below
// the window's reference mz, and the new sign (there the new value does not depend on the old one: it is about
// the step); otherwise the wrapped 16-bit difference of bit patterns, zigzagged so that the common +-1 ulp
// moves are 0 and 1. -1: not representable (escape: the raw new bits).
// (Both branches are computed and one selected: which applies is data, and a mispredicted branch per change
// costs more than the arithmetic.)
inline int64_t value_symbol(int16_t nw, int16_t old, int64_t mz) {
  const int64_t mag = uint16_t(nw) & 0x7FFF;
  const int64_t by_mag = mag <= mz ? ((mz - mag) << 1) | (uint16_t(nw) >> 15) : -1;
  const int32_t d = int16_t(uint16_t(uint16_t(nw) - uint16_t(old)));
  const int64_t by_diff = int64_t(uint32_t((d << 1) ^ (d >> 31))) - 1;
  return (uint16_t(old) & kExp) == 0 ? by_mag : by_diff;
}

inline int16_t from_symbol(int16_t old, uint32_t u, int64_t mz) {
  const uint16_t by_mag = uint16_t(((u & 1) << 15) | uint32_t(mz - (u >> 1)));
  const uint32_t z = u + 1;
  const uint16_t by_diff = uint16_t(uint16_t(old) + uint16_t(int32_t(z >> 1) ^ -int32_t(z & 1)));
  return int16_t((uint16_t(old) & kExp) == 0 ? by_mag : by_diff);
}

inline int bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

// Code lengths (bits) of a gap under each family: Rice (unary quotient, k bits) or Exp-Golomb of order k.
inline int64_t rice_len(uint64_t g, int k) {
  const uint64_t q = g >> k;
  return q >= uint64_t(kGapCap) ? kGapCap + 1 + 32 : int64_t(q) + 1 + k;
}
inline int64_t eg_len(uint64_t g, int k) { return 2 * (bit_length(g + (1ull << k)) - 1 - k) + 1 + k; }

// Rice parameter for `count` values summing to `total`: 2^k near ln2 x mean (Golomb's rule), ln2 ~ 45426/2^16.
inline int rice_k(int64_t total, int64_t count, int k_max) {
  if (count <= 0 || total <= 0) return 0;
  const uint64_t x = uint64_t((unsigned __int128)total * 45426u / ((unsigned __int128)count << 16));
  return std::min(std::max(bit_length(x) - 1, 0), k_max);
}

inline int64_t gap_bits(int64_t slots, int64_t changes) {  // estimated Rice bits of a class's gaps
  if (changes <= 0) return 0;
  const int k = rice_k(slots - changes, changes, 30);
  return changes * (k + 1) + ((slots - changes) >> k);
}

constexpr int kSegments = 16;         // the sample: kSegments runs of kSegLen elements spread over the window
constexpr int64_t kSegLen = 8192;     // (or the whole window when it is not larger), contiguous so that gaps
constexpr int kMaxSampleGaps = 4096;  // between changes are seen; at most this many gaps score the gap codes

struct RiceParams {
  int T = 0, k0 = 0, k_out = 0, e_lo = 1, tlen = 0;
  int k[2] = {0, 0}, eg[2] = {0, 0};  // per class (S, L): parameter, Exp-Golomb (1) or Rice (0)
  int64_t mz = 0;
  uint8_t lut[256];  // value parameter per exponent of the old value
};

struct SampledChange { int32_t seg, pos; int16_t old, nw; };

RiceParams choose_params(const int16_t* a, const int16_t* p, int64_t n, bool classes) {
  RiceParams P;
  const int n_seg = n <= kSegments * kSegLen ? 1 : kSegments;
  const int64_t seg_len = n_seg == 1 ? n : kSegLen, seg_step = n_seg == 1 ? 0 : n / kSegments;
  int64_t n_e[256] = {0}, d_e[256] = {0}, v_e[256] = {0};
  std::vector<SampledChange> ch;
  for (int s = 0; s < n_seg; ++s) {
    const int64_t o = s * seg_step;
    int64_t j = 0;
    for (; j + 32 <= seg_len; j += 32) {
      for (uint32_t dm = diff_mask32(a + o + j, p + o + j); dm; dm &= dm - 1) {
        const int64_t i = o + j + __builtin_ctz(dm);
        ch.push_back({s, int32_t(i - o), p[i], a[i]});
      }
    }
    for (; j < seg_len; ++j)
      if (a[o + j] != p[o + j]) ch.push_back({s, int32_t(j), p[o + j], a[o + j]});
    if (classes)  // only a class split needs every sampled element's exponent
      for (j = 0; j < seg_len; ++j) ++n_e[exponent(p[o + j])];
  }
  if (!classes) n_e[0] = n_seg * seg_len;  // only the total counts then
  for (const auto& c : ch) ++d_e[exponent(c.old)];
  for (const auto& c : ch)
    if (exponent(c.old) == 0) P.mz = std::max<int64_t>(P.mz, uint16_t(c.nw) & 0x7FFF);
  for (const auto& c : ch) v_e[exponent(c.old)] += value_symbol(c.nw, c.old, P.mz);
  int64_t n_all = 0, d_all = 0, v_all = 0;
  for (int e = 0; e < 256; ++e) { n_all += n_e[e]; d_all += d_e[e]; v_all += v_e[e]; }
  // T: the class split with the smallest estimated position cost; none unless it saves 1/16 (the receiver walks)
  if (classes && d_all > 0) {
    const int64_t one = gap_bits(n_all, d_all);
    int64_t best = one, ns = 0, ds = 0;
    for (int t = 1; t < 256; ++t) {
      ns += n_e[t - 1];
      ds += d_e[t - 1];
      if (ns == 0 || ns == n_all) continue;
      const int64_t cost = gap_bits(ns, ds) + gap_bits(n_all - ns, d_all - ds);
      if (cost < best) { best = cost; P.T = t; }
    }
    if (!(P.T && best * 16 <= one * 15)) P.T = 0;
  }
  // values
  P.k_out = rice_k(v_all, d_all, 15);
  P.k0 = d_e[0] ? rice_k(v_e[0], d_e[0], 15) : P.k_out;
  int e_hi = 0;
  P.e_lo = 256;
  for (int e = 1; e < 256; ++e)
    if (d_e[e]) { P.e_lo = std::min(P.e_lo, e); e_hi = e; }
  if (P.e_lo > e_hi) { P.e_lo = 1; e_hi = 0; }
  P.tlen = e_hi - P.e_lo + 1;
  P.lut[0] = uint8_t(P.k0);
  for (int e = 1; e < 256; ++e) P.lut[e] = uint8_t(d_e[e] ? rice_k(v_e[e], d_e[e], 15) : P.k_out);
  // gaps: per class, the sampled gaps in class rank (within a segment; a segment's first change has none)
  const int16_t thr = int16_t(P.T << 7);
  int64_t slots[2] = {0, 0}, changes[2] = {0, 0};
  for (int e = 0; e < 256; ++e) { slots[e >= P.T] += n_e[e]; changes[e >= P.T] += d_e[e]; }
  std::vector<uint64_t> gaps[2];
  if (P.T == 0) {
    for (size_t c = 1; c < ch.size() && gaps[1].size() < size_t(kMaxSampleGaps); ++c)
      if (ch[c].seg == ch[c - 1].seg) gaps[1].push_back(uint64_t(ch[c].pos - ch[c - 1].pos - 1));
  } else {
    size_t c = 0;
    for (int s = 0; s < n_seg; ++s) {
      const int64_t o = s * seg_step;
      int64_t rank[2] = {0, 0}, prev[2] = {-1, -1};
      for (int64_t j = 0; j < seg_len; ++j) {
        const int cl = in_class(p[o + j], thr) ? 0 : 1;
        if (c < ch.size() && ch[c].seg == s && ch[c].pos == j) {
          if (prev[cl] >= 0 && gaps[cl].size() < size_t(kMaxSampleGaps))
            gaps[cl].push_back(uint64_t(rank[cl] - prev[cl] - 1));
          prev[cl] = rank[cl];
          ++c;
        }
        ++rank[cl];
      }
    }
  }
  const int64_t scale = std::max<int64_t>(1, n / n_all);  // window elements per sampled element
  for (int cl = 0; cl < 2; ++cl) {
    // no sampled change: assume about one in the whole class
    const int kr = changes[cl] ? rice_k(slots[cl] - changes[cl], changes[cl], 30) : rice_k(slots[cl] * scale, 1, 30);
    P.k[cl] = kr;
    if (gaps[cl].empty()) continue;
    int64_t best = 0;
    for (uint64_t g : gaps[cl]) best += rice_len(g, kr);
    for (int k = 0; k <= std::min(kr, 15); ++k) {
      int64_t cost = 0;
      for (uint64_t g : gaps[cl]) cost += eg_len(g, k);
      if (cost < best) { best = cost; P.k[cl] = k; P.eg[cl] = 1; }
    }
  }
  return P;
}

// LSB-first into 32-bit little-endian words (the torch packer in rice.py writes the same words), without
// branches: every put stores the low word (the buffer has a word of slack) and advances when it is full.
struct BitOut {
  uint32_t* w; int64_t pos = 0; uint64_t buf = 0; int n = 0;
  inline void put(uint64_t x, int k) {  // x < 2^k, k <= 32
    buf |= x << n;
    n += k;
    w[pos] = uint32_t(buf);
    const int f = n >> 5;
    pos += f;
    buf >>= (f << 5);
    n -= f << 5;
  }
  void flush() { w[pos] = uint32_t(buf); }  // the partial last word (a full one was stored as it filled)
  int64_t words() const { return pos + (n > 0); }
};

inline void gap_code(BitOut& u, BitOut& r, uint64_t g, int k, int eg) {
  if (eg) {
    const uint64_t x = g + (1ull << k);
    const int b = bit_length(x) - 1 - k;
    u.put(1ull << b, b + 1);
    r.put(x & ((1ull << (b + k)) - 1), b + k);
    return;
  }
  const uint64_t q = g >> k;
  if (q >= uint64_t(kGapCap)) { u.put(1ull << kGapCap, kGapCap + 1); r.put(g, 32); }
  else { u.put(1ull << q, int(q) + 1); r.put(g & ((1ull << k) - 1), k); }
}

inline void value_code(BitOut& u, BitOut& r, int16_t o, int16_t v, const RiceParams& P) {
  const int k = P.lut[exponent(o)];
  const int64_t sym = value_symbol(v, o, P.mz);
  const uint64_t q = uint64_t(sym) >> k;
  if (sym < 0 || q >= uint64_t(kValCap)) { u.put(1ull << kValCap, kValCap + 1); r.put(uint16_t(v), 16); }
  else { u.put(1ull << q, int(q) + 1); r.put(uint64_t(sym) & ((1ull << k) - 1), k); }
}

// Reads past the end yield zeros and set `short_`: a receiver whose weights differ from the publisher's copy
// can misalign the value stream (its contexts differ), and that must end in a digest mismatch, not a crash.
struct BitRead {
  const uint32_t* w; int64_t nw, pos = 0; uint64_t buf = 0; int n = 0; bool short_ = false;
  inline void fill() {  // without a branch: whether a word is due depends on the code lengths just read
    const bool more = (n <= 32) & (pos < nw);
    const uint64_t x = nw ? w[std::min<int64_t>(pos, nw - 1)] : 0;
    buf |= (more ? x : 0) << (n & 63);  // n <= 64; at 64 nothing is added
    n += more ? 32 : 0;
    pos += more;
  }
  inline uint64_t get(int k) {  // k <= 32
    fill();
    if (n < k) { short_ = true; n = k; }
    const uint64_t v = buf & ((1ull << k) - 1);
    buf >>= k;
    n -= k;
    return v;
  }
  inline int unary(int cap) {  // the count of 0 bits before a 1, at most cap (<= 31)
    fill();
    const uint64_t m = buf & ((2ull << cap) - 1);
    if (m == 0) { short_ = true; const int used = std::min(n, cap + 1); buf >>= used; n -= used; return cap; }
    const int q = __builtin_ctzll(m);
    buf >>= q + 1;
    n -= q + 1;
    return q;
  }
  int64_t words_used() const { return pos - n / 32; }
};

inline int select_bit(uint32_t m, int j) {  // position of the j-th (from 0) set bit of m
#if defined(__BMI2__) && !defined(__znver1__) && !defined(__znver2__)  // pdep is microcoded before Zen 3
  return __builtin_ctz(_pdep_u32(1u << j, m));
#else
  int pos = 0, c = __builtin_popcount(m & 0xFFFFu);
  if (j >= c) { j -= c; m >>= 16; pos += 16; }
  c = __builtin_popcount(m & 0xFFu);
  if (j >= c) { j -= c; m >>= 8; pos += 8; }
  c = __builtin_popcount(m & 0xFu);
  if (j >= c) { j -= c; m >>= 4; pos += 4; }
  for (; j; --j) m &= m - 1;
  return pos + __builtin_ctz(m);
#endif
}

// Stream buffers, kept across calls; new[] leaves pages uncommitted until written.
struct Buffers {
  std::unique_ptr<uint32_t[]> w[6];
  int64_t size = 0;
  uint32_t* get(int k, int64_t need) {
    if (need > size) { for (auto& b : w) b.reset(new uint32_t[need]); size = need; }
    return w[k].get();
  }
};
thread_local Buffers tl_buffers;
constexpr int64_t kSlack = 512;  // words one 256-element block can add to a stream (256 codes of <= 32 bits)

// One 256-element block's changes, collected before coding (so that each coding loop keeps only its own two
// streams live in registers).
struct BlockChanges {
  int64_t idx[kBlock], rank[kBlock];
  int16_t old[kBlock], nw[kBlock];
  uint8_t cls[kBlock];  // 0: class S, 1: class L
  int n = 0;
};

template <bool kClasses>
void rice_pass(const int16_t* a, int16_t* p, int64_t n, int64_t offset, const RiceParams& P, int64_t cap,
               BitOut* st, int64_t& count, int64_t& n_s, bool& over, Digest& d) {
  const int16_t thr = int16_t(P.T << 7);
  int64_t prev[2] = {-1, -1}, c_s = 0;
  BlockChanges bc;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    digest_any(a + b, m, offset + b, d);
    bc.n = 0;
    int64_t j = 0;
    for (; j + 32 <= m; j += 32) {
      const int64_t base = b + j;
      uint32_t dm = diff_mask32(a + base, p + base);
      const uint32_t ms = kClasses ? class_mask32(p + base, thr) : 0u;  // before this group's writes
      for (; dm; dm &= dm - 1) {
        const int bit = __builtin_ctz(dm);
        const int64_t i = base + bit;
        const int k = bc.n++;
        bc.idx[k] = i;
        bc.old[k] = p[i];
        bc.nw[k] = a[i];
        if (kClasses) {
          const int64_t sp = c_s + __builtin_popcount(ms & ((1u << bit) - 1u));
          bc.cls[k] = ((ms >> bit) & 1u) ? 0 : 1;
          bc.rank[k] = bc.cls[k] ? i - sp : sp;
        }
        p[i] = a[i];
      }
      if (kClasses) c_s += __builtin_popcount(ms);
    }
    for (; j < m; ++j) {
      const int64_t i = b + j;
      const bool s = kClasses && in_class(p[i], thr);
      if (a[i] != p[i]) {
        const int k = bc.n++;
        bc.idx[k] = i;
        bc.old[k] = p[i];
        bc.nw[k] = a[i];
        bc.cls[k] = s ? 0 : 1;
        bc.rank[k] = s ? c_s : i - c_s;
        p[i] = a[i];
      }
      c_s += s;
    }
    count += bc.n;
    if (over || bc.n == 0) continue;
    if (kClasses) {
      for (int cl = 0; cl < 2; ++cl) {
        BitOut u = st[2 * cl], r = st[2 * cl + 1];
        const int k = P.k[cl], eg = P.eg[cl];
        int64_t pv = prev[cl];
        for (int c = 0; c < bc.n; ++c)
          if (bc.cls[c] == cl) { gap_code(u, r, uint64_t(bc.rank[c] - pv - 1), k, eg); pv = bc.rank[c]; }
        prev[cl] = pv;
        st[2 * cl] = u;
        st[2 * cl + 1] = r;
      }
      for (int c = 0; c < bc.n; ++c) n_s += bc.cls[c] == 0;
    } else {
      BitOut u = st[2], r = st[3];
      const int k = P.k[1], eg = P.eg[1];
      int64_t pv = prev[1];
      for (int c = 0; c < bc.n; ++c) { gap_code(u, r, uint64_t(bc.idx[c] - pv - 1), k, eg); pv = bc.idx[c]; }
      prev[1] = pv;
      st[2] = u;
      st[3] = r;
    }
    {
      BitOut u = st[4], r = st[5];
      for (int c = 0; c < bc.n; ++c) value_code(u, r, bc.old[c], bc.nw[c], P);
      st[4] = u;
      st[5] = r;
    }
    // the record is only worth sending while it stays smaller than the window
    int64_t total = 0;
    for (int k = 0; k < 6; ++k) total += st[k].pos;
    over = total > cap;
  }
}
}  // namespace


// The functions below take each tensor as (pointer, element count), dtypes checked by kernel.py, and return
// their results through `ret`.
void encode_window(const int16_t* a, int64_t n, int16_t* p, int64_t n_pub, uint8_t* gaps, int64_t n_gaps,
                   int32_t* esc, int64_t n_escs, int16_t* vals, int64_t n_vals, int64_t offset, int64_t* ret) {
  CHECK(n_pub == n, "published has ", n_pub, " elements, new has ", n);
  CHECK(n <= 2147483647LL, "window of ", n, " elements exceeds int32 indexing");
  CHECK(n_gaps >= n && n_vals >= n && n_escs >= n / 256 + 1, "scratch too small for ", n);
  Emitter em{gaps, esc, vals};
  Digest d;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    digest_any(a + b, m, offset + b, d);
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
  ret[0] = em.count; ret[1] = em.n_esc; ret[2] = int64_t(d.s0); ret[3] = int64_t(d.s1);
}

void apply_window(int16_t* d, int64_t n, const uint8_t* g, int64_t count, const int32_t* e, int64_t n_esc,
                  const int16_t* v, int64_t n_vals) {
  CHECK(n_vals == count, "record has ", count, " gaps but ", n_vals, " values");
  int64_t pos = -1, k = 0;
  for (int64_t c = 0; c < count; ++c) {
    int64_t step = g[c];
    if (step == 0) {
      CHECK(k < n_esc, "record needs more than its ", n_esc, " escapes");
      step = e[k++];
      CHECK(step > 0, "escape gap ", step, " is not positive");
    }
    pos += step;
    CHECK(pos < n, "change index ", pos, " is outside the window of ", n, " elements");
    d[pos] = v[c];
  }
  CHECK(k == n_esc, "record carries ", n_esc, " escapes but uses ", k);
}

void digest(const int16_t* a, int64_t n, int64_t offset, int64_t* ret) {
  Digest d;
  for (int64_t b = 0; b < n; b += kBlock) digest_any(a + b, std::min(kBlock, n - b), offset + b, d);
  ret[0] = int64_t(d.s0); ret[1] = int64_t(d.s1);
}

// One window, one call, one pass: sample the window, choose every parameter, then the pass: digest, each
// change coded straight into its streams (class S gaps, class L gaps, values), the published copy updated.
// Returns {count, words written to `out` (-1: not smaller than out, send the window whole), s0, s1, T}.
void rice_encode(const int16_t* a, int64_t n, int16_t* p, int64_t n_pub, int32_t* out, int64_t cap, int64_t offset,
                 bool classes, int64_t* ret) {
  CHECK(n_pub == n, "published has ", n_pub, " elements, new has ", n);
  CHECK(n <= 2147483647LL, "window of ", n, " elements exceeds int32 indexing");
  const RiceParams P = n ? choose_params(a, p, n, classes) : RiceParams{};
  BitOut st[6];
  for (int k = 0; k < 6; ++k) st[k].w = tl_buffers.get(k, cap + kSlack);
  int64_t count = 0, n_s = 0;
  bool over = false;
  Digest d;
  if (P.T) rice_pass<true>(a, p, n, offset, P, cap, st, count, n_s, over, d);
  else rice_pass<false>(a, p, n, offset, P, cap, st, count, n_s, over, d);
  int64_t body = 0;
  for (auto& x : st) { x.flush(); body += x.words(); }
  const int64_t head = 9 + (P.tlen + 7) / 8;
  ret[0] = count; ret[1] = -1; ret[2] = int64_t(d.s0); ret[3] = int64_t(d.s1); ret[4] = P.T;
  if (count == 0 || over || head + body > cap) return;
  uint32_t* w = reinterpret_cast<uint32_t*>(out);
  w[0] = uint32_t(P.T) | uint32_t(P.k0) << 8 | uint32_t(P.k[0]) << 16 | uint32_t(P.k[1]) << 24;
  w[1] = uint32_t(n_s);
  w[2] = uint32_t(P.e_lo) | uint32_t(P.tlen) << 8 | uint32_t(P.k_out) << 20 | uint32_t(P.eg[0]) << 24 |
         uint32_t(P.eg[1]) << 25;
  w[3] = uint32_t(P.mz);
  for (int k = 0; k < 5; ++k) w[4 + k] = uint32_t(st[k].words());
  std::fill(w + 9, w + head, 0u);
  for (int t = 0; t < P.tlen; ++t) w[9 + t / 8] |= uint32_t(P.lut[P.e_lo + t]) << (4 * (t % 8));
  uint32_t* o = w + head;
  for (auto& x : st) o = std::copy(x.w, x.w + x.words(), o);
  ret[1] = head + body;
}

namespace {
// The decoder's state: the six streams, the parameters, the target window.
struct RiceDecoder {
  BitRead su, sr, lu, lr, vu, vr;
  uint8_t lut[256];
  int kS, kL, egS, egL;
  int64_t mz, rem_s, rem_l, prev_s = -1, prev_l = -1;
  int16_t* d;
  inline int64_t next(BitRead& u, BitRead& r, int k, int eg, int64_t& prev, int64_t& rem) {
    if (rem == 0) return INT64_MAX;
    --rem;
    int64_t g;
    if (eg) {
      const int b = u.unary(31);
      g = int64_t((1ull << (b + k)) | r.get(b + k)) - (int64_t(1) << k);
    } else {
      const int q = u.unary(kGapCap);
      g = q >= kGapCap ? int64_t(r.get(32)) : (int64_t(q) << k) | int64_t(r.get(k));
    }
    prev += g + 1;
    return prev;
  }
  inline int64_t next_s() { return next(su, sr, kS, egS, prev_s, rem_s); }
  inline int64_t next_l() { return next(lu, lr, kL, egL, prev_l, rem_l); }
  inline void put(int64_t i) {
    const int16_t old = d[i];
    const int k = lut[exponent(old)];
    const int q = vu.unary(kValCap);
    d[i] = q >= kValCap ? int16_t(uint16_t(vr.get(16)))
                        : from_symbol(old, (uint32_t(q) << k) | uint32_t(vr.get(k)), mz);
  }
  // The changes of the group at b (class masks ms, ml; c_s, c_l elements of each class before it), given the
  // next target rank of each class; leaves the next targets after the group.
  __attribute__((noinline)) void group(int64_t b, uint32_t ms, uint32_t ml, int64_t c_s, int64_t c_l,
                                       int64_t& ns, int64_t& nl) {
    uint32_t cm = 0;
    const int64_t end_s = c_s + __builtin_popcount(ms), end_l = c_l + __builtin_popcount(ml);
    for (; ns < end_s; ns = next_s()) cm |= 1u << select_bit(ms, int(ns - c_s));
    for (; nl < end_l; nl = next_l()) cm |= 1u << select_bit(ml, int(nl - c_l));
    while (cm) {
      const int bit = __builtin_ctz(cm);
      cm &= cm - 1;
      put(b + bit);
    }
  }
};
}  // namespace

// Decode one record into `dst` in place. Returns 0, or 1 when the record did not decode consistently with
// dst's current values (a receiver that does not hold the publisher's copy): the digest check repairs that.
// Malformed headers raise.
int64_t rice_apply(int16_t* dst, int64_t n, const int32_t* words, int64_t nw, int64_t count) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(words);
  CHECK(nw >= 9, "record of ", nw, " words has no header");
  const int T = w[0] & 0xFF, k0 = (w[0] >> 8) & 0xFF, kS = (w[0] >> 16) & 0xFF, kL = w[0] >> 24;
  const int64_t n_s = w[1], mz = w[3];
  const int e_lo = w[2] & 0xFF, tlen = int((w[2] >> 8) & 0xFFF), k_out = int((w[2] >> 20) & 0xF);
  const int egS = (w[2] >> 24) & 1, egL = (w[2] >> 25) & 1;
  const int64_t head = 9 + (tlen + 7) / 8;
  int64_t off[7] = {head};
  for (int k = 0; k < 5; ++k) off[k + 1] = off[k] + w[4 + k];
  off[6] = nw;
  CHECK(count >= 0 && count <= n && n_s <= count && (T != 0 || n_s == 0) && k0 <= 15 && kS <= 30 &&
              kL <= 30 && (!egS || kS <= 15) && (!egL || kL <= 15) && e_lo > 0 && e_lo + tlen <= 256 &&
              (w[2] >> 26) == 0 && mz <= 0x7FFF && off[5] <= nw,
              "malformed rice header (", count, " changes, ", nw, " words)");
  auto rd = [&](int k) { return BitRead{w + off[k], off[k + 1] - off[k]}; };
  RiceDecoder dec{rd(0), rd(1), rd(2), rd(3), rd(4), rd(5)};
  std::fill(dec.lut, dec.lut + 256, uint8_t(k_out));
  dec.lut[0] = uint8_t(k0);
  for (int t = 0; t < tlen; ++t) dec.lut[e_lo + t] = (w[9 + t / 8] >> (4 * (t % 8))) & 0xF;
  dec.kS = kS; dec.kL = kL; dec.egS = egS; dec.egL = egL; dec.mz = mz;
  dec.rem_s = n_s; dec.rem_l = count - n_s;
  dec.d = dst;
  bool bad = false;
  if (T == 0) {
    // Positions are decoded one batch ahead of the values, and their old values prefetched: each value needs its
    // old value, which at ~1% density is a cache miss the hardware prefetcher does not foresee. (A batch of 16
    // measured best of 4..64 here: enough lead to hide the latency, few enough misses in flight at once.)
    constexpr int kBatch = 16;
    int64_t batch[2][kBatch];
    int m[2] = {0, 0}, cur = 0;
    for (int64_t left = count;;) {
      m[cur] = 0;
      for (; m[cur] < kBatch && left > 0; ++m[cur], --left) {
        const int64_t i = dec.next_l();
        if (i >= n) { bad = true; left = 0; break; }
        __builtin_prefetch(dec.d + i, 1);
        batch[cur][m[cur]] = i;
      }
      for (int j = 0; j < m[cur ^ 1]; ++j) dec.put(batch[cur ^ 1][j]);
      if (m[cur] == 0) break;
      cur ^= 1;
    }
  } else {
    // Walk the window's classes (from dst's values before this record's writes) until every target is found.
    const int16_t thr = int16_t(T << 7);
    const int16_t* d = dec.d;
    int64_t ns = dec.next_s(), nl = dec.next_l(), c_s = 0, b = 0;
    for (; b + 32 <= n && (ns != INT64_MAX || nl != INT64_MAX); b += 32) {
      const uint32_t ms = class_mask32(d + b, thr);
      const int64_t p_s = __builtin_popcount(ms);
      if (ns < c_s + p_s || nl < b + 32 - c_s - p_s) dec.group(b, ms, ~ms, c_s, b - c_s, ns, nl);
      c_s += p_s;
    }
    if (b < n && (ns != INT64_MAX || nl != INT64_MAX)) {  // the tail group
      const int m = int(n - b);
      uint32_t ms = 0;
      for (int j = 0; j < m; ++j) ms |= uint32_t(in_class(d[b + j], thr)) << j;
      dec.group(b, ms, ~ms & ((1u << m) - 1u), c_s, b - c_s, ns, nl);
    }
    bad = ns != INT64_MAX || nl != INT64_MAX;
  }
  BitRead* rs[6] = {&dec.su, &dec.sr, &dec.lu, &dec.lr, &dec.vu, &dec.vr};
  for (int k = 0; k < 6; ++k) bad = bad || rs[k]->short_ || rs[k]->words_used() != off[k + 1] - off[k];
  return bad ? 1 : 0;
}

// ---- the C boundary: 0 on success; -1 with the message in searchr1_error() (per thread) on a malformed input
namespace {
thread_local std::string tl_error;
template <class F>
int64_t guarded(F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    tl_error = e.what();
    return -1;
  }
}
}  // namespace

extern "C" {
const char* searchr1_error() { return tl_error.c_str(); }
int64_t searchr1_encode_window(const int16_t* a, int64_t n, int16_t* p, int64_t n_pub, uint8_t* gaps, int64_t n_gaps,
                               int32_t* esc, int64_t n_escs, int16_t* vals, int64_t n_vals, int64_t offset,
                               int64_t* ret) {
  return guarded([&] { encode_window(a, n, p, n_pub, gaps, n_gaps, esc, n_escs, vals, n_vals, offset, ret); return 0; });
}
int64_t searchr1_apply_window(int16_t* d, int64_t n, const uint8_t* g, int64_t count, const int32_t* e, int64_t n_esc,
                              const int16_t* v, int64_t n_vals) {
  return guarded([&] { apply_window(d, n, g, count, e, n_esc, v, n_vals); return 0; });
}
int64_t searchr1_digest(const int16_t* a, int64_t n, int64_t offset, int64_t* ret) {
  return guarded([&] { digest(a, n, offset, ret); return 0; });
}
int64_t searchr1_rice_encode(const int16_t* a, int64_t n, int16_t* p, int64_t n_pub, int32_t* out, int64_t cap,
                             int64_t offset, int64_t classes, int64_t* ret) {
  return guarded([&] { rice_encode(a, n, p, n_pub, out, cap, offset, classes != 0, ret); return 0; });
}
// 0, or 1 when the record did not decode consistently with dst (rice_apply); -1 malformed
int64_t searchr1_rice_apply(int16_t* dst, int64_t n, const int32_t* words, int64_t nw, int64_t count) {
  return guarded([&] { return rice_apply(dst, n, words, nw, count); });
}
}
