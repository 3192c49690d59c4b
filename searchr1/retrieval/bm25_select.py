"""Selection and search helpers of the query kernel (bm25_topk.py), numba, cached on disk: a bounded
heap of (score, passage) pairs, the k-th largest value, sorted-unique, binary and galloping searches.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def heap_push(hs, hd, n, s, d):
    """Keep the best len(hs) (score, doc) pairs in a min-heap, ranking (score desc, doc asc); return its size."""
    cap = hs.shape[0]
    if n == cap:
        if s < hs[0] or (s == hs[0] and d > hd[0]):
            return n
        i = 0  # replace the worst, sift down
        while True:
            c = 2 * i + 1
            if c >= cap:
                break
            if c + 1 < cap and (hs[c + 1] < hs[c] or (hs[c + 1] == hs[c] and hd[c + 1] > hd[c])):
                c += 1
            if hs[c] < s or (hs[c] == s and hd[c] > d):
                hs[i], hd[i] = hs[c], hd[c]
                i = c
            else:
                break
        hs[i], hd[i] = s, d
        return n
    i = n  # append, sift up
    while i > 0:
        par = (i - 1) // 2
        if hs[par] > s or (hs[par] == s and hd[par] < d):
            hs[i], hd[i] = hs[par], hd[par]
            i = par
        else:
            break
    hs[i], hd[i] = s, d
    return n + 1


@numba.njit(cache=True, nogil=True, inline="always")
def sort_unique(cand, n):
    """Sort cand[:n] and drop repeats in place; the new length."""
    cand[:n].sort()
    u = 0
    for i in range(n):
        if i == 0 or cand[i] != cand[i - 1]:
            cand[u] = cand[i]
            u += 1
    return u


@numba.njit(cache=True, nogil=True, inline="always")
def find(doc_z, lo, hi, d):
    """The first position in doc_z[lo:hi] (sorted) whose passage is >= d."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_z[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def gallop(doc_z, p, hi, d):
    """The first position in doc_z[p:hi] (sorted) whose passage is >= d, searching outward from p: ~2 log2 of
    the distance, for candidates visited in order through a long postings list."""
    if p >= hi or doc_z[p] >= d:
        return p
    step = 1
    while p + step < hi and doc_z[p + step] < d:
        p += step
        step <<= 1
    return find(doc_z, p + 1, min(p + step, hi), d)


@numba.njit(cache=True, nogil=True)
def kth(vals, n, top):
    """The k-th largest of vals[:n] (-1 when n < k), k = len(top) (scratch), in one pass when k is small."""
    k = top.shape[0]
    if n < k:
        return -1.0
    if k > 32:  # an insertion costs up to k: a selection instead (its copy is n values, once)
        return float(np.partition(vals[:n].copy(), n - k)[n - k])
    top[:] = -np.inf  # descending
    for i in range(n):
        v = vals[i]
        if v > top[k - 1]:
            j = k - 1
            while j > 0 and top[j - 1] < v:
                top[j] = top[j - 1]
                j -= 1
            top[j] = v
    return top[k - 1]
