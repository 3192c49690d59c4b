"""The RICE record (sync.codec=rice, rice_classes): a window's changes in ~1-2 bytes each, in one pass, without
a general-purpose compressor.

Values. With Adam at a small lr a changed bf16 element mostly moves by +-1 unit in the last place; an element
with a small exponent has a small ulp and moves by many. So a value is coded as the wrapped difference of its
int16 bit patterns, zigzagged (+-1 -> 0, 1), Rice-coded with a parameter per exponent of the old value, which
the receiver holds. An old value whose exponent field is 0 (zero, subnormal) says nothing about the new one
except that it is about one step away: there the new magnitude below the window's reference mz (the largest
sampled) and the new sign are coded instead. A quotient at the cap, or a magnitude above mz, is an escape
carrying the raw 16 bits. Bit patterns are never interpreted as numbers: -0/+0, NaN payloads, infinities and
subnormals are exact.

Positions are gaps between changes, Rice- or Exp-Golomb-coded, whichever the sample prefers (changes cluster
in some tensors, where the long tail of gaps makes Rice expensive). With rice_classes the elements are also
split by the old value's exponent (class S: exponent field < T; class L: the rest) and each change is coded as
its gap in rank among its class's elements: whether an element changes depends mostly on its exponent (the
step is about lr, so an element whose ulp is below it almost always moves), so a class where most elements
change costs ~1 bit per change. The price: a receiver reads the whole window to rank its classes.

One pass. Every parameter is chosen before the pass from a sample (16 runs of 8192 elements spread over the
window, or the whole window when it is not larger), so the encoder codes each change as it finds it, straight
into six streams, and keeps no list of changes.

Layout (little-endian uint32 words, codes LSB-first; the record is [tid, RICE, start, n, count, nbytes]):
    w0 = T | k0 << 8 | kS << 16 | kL << 24     T = 0: one class (plain index gaps, no walk)
    w1 = changes in class S                     kS, kL: gap parameters; k0: value parameter for exponent 0
    w2 = e_lo | tlen << 8 | k_out << 20 | egS << 24 | egL << 25    (eg: the class's gaps are Exp-Golomb)
    w3 = mz                                     w4..w8 = words of streams SU SR LU LR VU
    then the value parameters of exponents e_lo .. e_lo+tlen-1 (4 bits each, 8 per word; k_out elsewhere),
    then the streams SU SR LU LR VU VR, each word-aligned:
    xU: unary parts (q zeros, then a 1) of class S gaps, class L gaps, values (in index order)
    xR: the matching remainder bits (Rice: k bits or an escape's raw bits; Exp-Golomb: q + k bits)
A field's length is known from its U stream (and, for values, from the old value at the decoded position), so
the torch decoder below is data-parallel: set bits of U delimit codes, cumulative sums give offsets into R.

The receiver must hold the publisher's copy (as for any difference coding): one that does not decodes
garbage at worst, never out of bounds, and the digest check repairs it (sync.verify).

The C++ kernel (kernel.py: rice_encode, rice_apply) writes and reads the same words; the decisions below are
integer arithmetic that it mirrors exactly, so both encoders choose the same parameters (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

GAP_CAP = 24  # kGapCap in kernel.py: a Rice gap quotient this large is escaped (raw 32 bits)
VAL_CAP = 8  # kValCap: a value quotient this large is escaped (raw 16 bits)
EXP_MASK = 0x7F80
HEAD = 9  # header words before the table
SEGMENTS, SEG_LEN = 16, 8192  # kSegments, kSegLen: the sample
MAX_SAMPLE_GAPS = 4096  # kMaxSampleGaps: sampled gaps that score the gap codes


def rice_k(total: int, count: int, k_max: int) -> int:
    """Rice parameter for `count` values summing to `total`: 2^k near ln2 x mean (Golomb's rule for geometric
    data; ln2 ~ 45426 / 2^16). The decoder reads k; how it was chosen only affects the size."""
    if count <= 0 or total <= 0:
        return 0
    return min(max((total * 45426 // (count << 16)).bit_length() - 1, 0), k_max)


def gap_bits(slots: int, changes: int) -> int:
    """Estimated Rice bits for `changes` gaps spread over `slots` elements of a class."""
    if changes <= 0:
        return 0
    k = rice_k(slots - changes, changes, 30)
    return changes * (k + 1) + ((slots - changes) >> k)


def rice_len(g: torch.Tensor, k: int) -> torch.Tensor:
    q = g >> k
    return torch.where(q >= GAP_CAP, GAP_CAP + 1 + 32, q + 1 + k)


def _bit_length(x: torch.Tensor) -> torch.Tensor:
    """bit_length of positive int64s, exactly (no floating point)."""
    n = torch.zeros_like(x)
    for s in (32, 16, 8, 4, 2, 1):
        big = (x >> s) > 0
        n = n + big * s
        x = torch.where(big, x >> s, x)
    return n + (x > 0)


def eg_len(g: torch.Tensor, k: int) -> torch.Tensor:
    return 2 * (_bit_length(g + (1 << k)) - 1 - k) + 1 + k


def segments(n: int) -> list[tuple[int, int]]:
    if n <= SEGMENTS * SEG_LEN:
        return [(0, n)]
    return [(s * (n // SEGMENTS), SEG_LEN) for s in range(SEGMENTS)]


def _exponent(x: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.int64) >> 7) & 0xFF


def _in_class(x: torch.Tensor, T: int) -> torch.Tensor:
    return (x.to(torch.int64) & EXP_MASK) < (T << 7)


def _symbol(new_c: torch.Tensor, old_c: torch.Tensor, mz: int) -> torch.Tensor:
    """value_symbol in kernel.py; -1 where only an escape can carry the value."""
    d = ((new_c.to(torch.int64) - old_c.to(torch.int64) + 32768) & 0xFFFF) - 32768
    zz = ((d << 1) ^ (d >> 63)) - 1
    mag = new_c.to(torch.int64) & 0x7FFF
    zero = (old_c.to(torch.int64) & EXP_MASK) == 0
    by_mag = torch.where(mag <= mz, ((mz - mag) << 1) | ((new_c.to(torch.int64) >> 15) & 1), -1)
    return torch.where(zero, by_mag, zz)


def _from_symbol(old_c: torch.Tensor, u: torch.Tensor, mz: int) -> torch.Tensor:
    zero = (old_c.to(torch.int64) & EXP_MASK) == 0
    z = u + 1
    d = (z >> 1) ^ -(z & 1)
    by_diff = ((old_c.to(torch.int64) + d + 32768) & 0xFFFF) - 32768
    by_mag = (((u & 1) << 15) | (mz - (u >> 1))) & 0xFFFF
    return torch.where(zero, ((by_mag + 32768) & 0xFFFF) - 32768, by_diff)


class Params:
    """What kernel.py's choose_params chooses, from the same sample, with the same integer arithmetic."""

    def __init__(self, new_n: torch.Tensor, pub_n: torch.Tensor, classes: bool):
        n = new_n.numel()
        segs = segments(n)
        a = torch.cat([new_n[o:o + m] for o, m in segs])
        p = torch.cat([pub_n[o:o + m] for o, m in segs])
        seg_of = torch.cat([torch.full((m,), s, dtype=torch.int64, device=a.device) for s, (_, m) in enumerate(segs)])
        e = _exponent(p)
        ch = a != p
        oc, nc, ec = p[ch], a[ch], e[ch]
        zero = ec == 0
        self.mz = int((nc[zero].to(torch.int64) & 0x7FFF).max()) if bool(zero.any()) else 0
        dev = a.device
        n_e = torch.bincount(e, minlength=256).tolist()
        d_e = torch.bincount(ec, minlength=256).tolist()
        v_e = torch.zeros(256, dtype=torch.int64, device=dev).index_add_(0, ec, _symbol(nc, oc, self.mz)).tolist()
        n_all, d_all, v_all = sum(n_e), sum(d_e), sum(v_e)
        self.T = 0
        if classes and d_all:
            one = gap_bits(n_all, d_all)
            best, ns, ds = one, 0, 0
            for t in range(1, 256):
                ns, ds = ns + n_e[t - 1], ds + d_e[t - 1]
                if ns == 0 or ns == n_all:
                    continue
                cost = gap_bits(ns, ds) + gap_bits(n_all - ns, d_all - ds)
                if cost < best:
                    self.T, best = t, cost
            if not (self.T and best * 16 <= one * 15):
                self.T = 0
        self.k_out = rice_k(v_all, d_all, 15)
        self.k0 = rice_k(v_e[0], d_e[0], 15) if d_e[0] else self.k_out
        seen = [x for x in range(1, 256) if d_e[x]]
        self.e_lo, self.tlen = (seen[0], seen[-1] - seen[0] + 1) if seen else (1, 0)
        self.lut = [self.k0] + [rice_k(v_e[x], d_e[x], 15) if d_e[x] else self.k_out for x in range(1, 256)]
        # gaps per class: in class rank within a segment (a segment's first change has none)
        cls = (~_in_class(p, self.T)).to(torch.int64)  # 0: S, 1: L
        scale = max(1, n // n_all)
        self.k, self.eg = [0, 0], [0, 0]
        for c in (0, 1):
            slots, changes = sum(n_e[self.T:] if c else n_e[:self.T]), sum(d_e[self.T:] if c else d_e[:self.T])
            kr = rice_k(slots - changes, changes, 30) if changes else rice_k(slots * scale, 1, 30)
            self.k[c] = kr
            mine = cls == c
            rank = torch.cumsum(mine, 0) - 1  # rank among the class, counted from the sample's start
            at = (mine & ch).nonzero().squeeze(1)
            if at.numel() < 2:
                continue
            same_seg = seg_of[at[1:]] == seg_of[at[:-1]]
            g = (rank[at[1:]] - rank[at[:-1]] - 1)[same_seg][:MAX_SAMPLE_GAPS]
            if not g.numel():
                continue
            best = int(rice_len(g, kr).sum())
            for k in range(min(kr, 15) + 1):
                cost = int(eg_len(g, k).sum())
                if cost < best:
                    best, self.k[c], self.eg[c] = cost, k, 1

    def head_words(self) -> int:
        return HEAD + (self.tlen + 7) // 8


def _gap_codes(rank_c: torch.Tensor, k: int, eg: int):
    """(unary values, unary lengths, remainder values, remainder lengths) of a class's gaps."""
    g = torch.diff(rank_c, prepend=rank_c.new_full((1,), -1)) - 1
    if eg:
        x = g + (1 << k)
        b = _bit_length(x) - 1 - k
        return torch.ones_like(b) << b, b + 1, x & ((torch.ones_like(b) << (b + k)) - 1), b + k
    q = g >> k
    esc = q >= GAP_CAP
    q = q.clamp(max=GAP_CAP)
    return torch.ones_like(q) << q, q + 1, torch.where(esc, g, g & ((1 << k) - 1)), torch.where(esc, 32, k)


def _pack(v: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Concatenate codes (v_i < 2^length_i, length_i <= 32) LSB-first into uint32 words held in int64: codes
    never overlap, so adding them is OR-ing them."""
    n_words = (int(length.sum()) + 31) // 32
    off = torch.cumsum(length, 0) - length
    sh = v << (off & 31)  # < 2^63
    out = torch.zeros(n_words + 2, dtype=torch.int64, device=v.device)  # zero-length codes may sit at the end
    out.index_add_(0, off >> 5, sh & 0xFFFFFFFF)
    out.index_add_(0, (off >> 5) + 1, sh >> 32)
    return out[:n_words]


def encode(new_n: torch.Tensor, pub_n: torch.Tensor, max_words: int,
           classes: bool) -> tuple[int, Optional[torch.Tensor]]:
    """(changes, the record's int32 words or None when not within `max_words`); `pub_n` becomes `new_n`."""
    if new_n.numel() == 0:
        return 0, None
    p = Params(new_n, pub_n, classes)
    idx_c = torch.ne(new_n, pub_n).nonzero().squeeze(1)
    old_c, new_c = pub_n[idx_c], new_n[idx_c]
    if p.T:
        cls_n = _in_class(pub_n, p.T)
        s_c = cls_n[idx_c]
        before_c = torch.cumsum(cls_n, 0, dtype=torch.int64)[idx_c] - s_c.to(torch.int64)
        rank_s, rank_l = before_c[s_c], (idx_c - before_c)[~s_c]
    else:
        rank_s, rank_l = idx_c[:0], idx_c
    pub_n.index_put_((idx_c,), new_c)
    count = idx_c.numel()
    if count == 0:
        return 0, None
    codes = [*_gap_codes(rank_s, p.k[0], p.eg[0]), *_gap_codes(rank_l, p.k[1], p.eg[1])]
    k_c = torch.tensor(p.lut, dtype=torch.int64, device=new_n.device)[_exponent(old_c)]
    sym = _symbol(new_c, old_c, p.mz)
    q = sym >> k_c
    esc = (sym < 0) | (q >= VAL_CAP)
    q = torch.where(esc, VAL_CAP, q)
    codes += [torch.ones_like(q) << q, q + 1,
              torch.where(esc, new_c.to(torch.int64) & 0xFFFF, sym & ((torch.ones_like(k_c) << k_c) - 1)),
              torch.where(esc, 16, k_c)]
    streams = [_pack(codes[i], codes[i + 1]) for i in range(0, 12, 2)]
    if p.head_words() + sum(x.numel() for x in streams) > max_words:
        return count, None
    table = [p.lut[p.e_lo + t] for t in range(p.tlen)] + [0] * (-p.tlen % 8)
    head = [p.T | p.k0 << 8 | p.k[0] << 16 | p.k[1] << 24, rank_s.numel(),
            p.e_lo | p.tlen << 8 | p.k_out << 20 | p.eg[0] << 24 | p.eg[1] << 25, p.mz]
    head += [x.numel() for x in streams[:5]]
    head += [sum(table[i + j] << (4 * j) for j in range(8)) for i in range(0, len(table), 8)]
    w = torch.cat([torch.tensor(head, dtype=torch.int64, device=new_n.device)] + streams)
    return count, torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


# ---------------------------------------------------------------- decode

def _set_bits(words: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
    """Positions of the set bits of an LSB-first word stream (in chunks: 32 int64s per word at a time)."""
    j = torch.arange(32, device=words.device)
    out = [((((words[o:o + chunk].to(torch.int64) & 0xFFFFFFFF)[:, None] >> j) & 1).flatten().nonzero().squeeze(1)
            + 32 * o) for o in range(0, words.numel(), chunk)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=words.device)


def _bits_at(words: torch.Tensor, off: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """The `length`-bit fields (<= 32) at bit offsets `off` of an LSB-first word stream; zeros past its end."""
    w = torch.cat([words.to(torch.int64) & 0xFFFFFFFF, words.new_zeros(2, dtype=torch.int64)])
    i = (off >> 5).clamp(max=w.numel() - 2)
    lo, hi = w[i], w[i + 1] & 0x7FFFFFFF  # only hi's low 31 bits can reach a field of <= 32 bits
    return (((hi << 32) | lo) >> (off & 31)) & ((torch.ones_like(length) << length) - 1)


def _unary(words: torch.Tensor, m: int) -> tuple[torch.Tensor, bool]:
    """The first `m` unary parts of a U stream, and whether the stream holds exactly m codes."""
    ones = _set_bits(words)
    ok = ones.numel() == m and (m == 0 or int(ones[-1]) // 32 + 1 == words.numel())
    if ones.numel() < m:
        ones = torch.cat([ones, ones.new_full((m - ones.numel(),), int(ones[-1]) if ones.numel() else 0)])
    return torch.diff(ones[:m], prepend=ones.new_full((1,), -1)) - 1, ok


def _ranks(u_w: torch.Tensor, r_w: torch.Tensor, m: int, k: int, eg: int) -> tuple[torch.Tensor, bool]:
    q, ok = _unary(u_w, m)
    if eg:
        length = q + k
        rem = _bits_at(r_w, torch.cumsum(length, 0) - length, length)
        g = ((torch.ones_like(q) << length) | rem) - (1 << k)
    else:
        esc = q >= GAP_CAP
        length = torch.where(esc, 32, k)
        rem = _bits_at(r_w, torch.cumsum(length, 0) - length, length)
        g = torch.where(esc, rem, (q << k) | rem)
    ok = ok and (int(length.sum()) + 31) // 32 == r_w.numel()
    return torch.cumsum(g + 1, 0) - 1, ok


def apply(dst_n: torch.Tensor, words: torch.Tensor, count: int) -> bool:
    """Decode one record into `dst_n` in place; False when it did not decode consistently with dst's values."""
    n = dst_n.numel()
    if words.numel() < HEAD:
        raise ValueError(f"rice record of {words.numel()} words has no header")
    h = (words[:HEAD].to(torch.int64) & 0xFFFFFFFF).tolist()
    T, k0, kS, kL = h[0] & 0xFF, (h[0] >> 8) & 0xFF, (h[0] >> 16) & 0xFF, h[0] >> 24
    n_s, mz = h[1], h[3]
    e_lo, tlen, k_out = h[2] & 0xFF, (h[2] >> 8) & 0xFFF, (h[2] >> 20) & 0xF
    eg_s, eg_l = (h[2] >> 24) & 1, (h[2] >> 25) & 1
    head = HEAD + (tlen + 7) // 8
    off = [head]
    for size in h[4:9]:
        off.append(off[-1] + size)
    off.append(words.numel())
    if not (0 <= count <= n and n_s <= count and (T or not n_s) and k0 <= 15 and kS <= 30 and kL <= 30
            and (not eg_s or kS <= 15) and (not eg_l or kL <= 15) and e_lo > 0 and e_lo + tlen <= 256
            and not h[2] >> 26 and mz <= 0x7FFF and off[5] <= words.numel()):
        raise ValueError(f"malformed rice header ({count} changes, {words.numel()} words)")
    st = [words[off[i]:off[i + 1]] for i in range(6)]
    tw = (words[HEAD:head].to(torch.int64) & 0xFFFFFFFF).tolist()
    lut = [k_out] * 256
    lut[0] = k0
    for t in range(tlen):
        lut[e_lo + t] = (tw[t // 8] >> (4 * (t % 8))) & 0xF
    rank_s, ok_s = _ranks(st[0], st[1], n_s, kS, eg_s)
    rank_l, ok_l = _ranks(st[2], st[3], count - n_s, kL, eg_l)
    ok = ok_s and ok_l
    if T:
        cls_n = _in_class(dst_n, T)
        s_idx, l_idx = cls_n.nonzero().squeeze(1), (~cls_n).nonzero().squeeze(1)
        keep_s, keep_l = rank_s < s_idx.numel(), rank_l < l_idx.numel()
        ok = ok and bool(keep_s.all()) and bool(keep_l.all())
        idx_c = torch.sort(torch.cat([s_idx[rank_s[keep_s]], l_idx[rank_l[keep_l]]])).values
    else:
        keep = rank_l < n
        ok = ok and bool(keep.all())
        idx_c = rank_l[keep]
    m = idx_c.numel()
    old_c = dst_n[idx_c]
    k_c = torch.tensor(lut, dtype=torch.int64, device=dst_n.device)[_exponent(old_c)]
    q, ok_v = _unary(st[4], count)
    q = q[:m]
    esc = q >= VAL_CAP
    length = torch.where(esc, 16, k_c)
    rem = _bits_at(st[5], torch.cumsum(length, 0) - length, length)
    new_c = torch.where(esc, ((rem + 32768) & 0xFFFF) - 32768, _from_symbol(old_c, (q << k_c) | rem, mz))
    dst_n.index_put_((idx_c,), new_c.to(torch.int16))
    return ok and ok_v and m == count and (int(length.sum()) + 31) // 32 == st[5].numel()
