"""BM25Okapi on arrays: the term-by-passage matrix, the query scan and the exact rescoring.

Pure functions over numpy arrays (suffixes: _v per vocabulary term, _d per passage, _z per nonzero (term, passage)
entry in CSC order, _n per corpus token, _qc per query and candidate). `searchr1.retrieval` wraps them in an
index; the numba kernels are cached on disk, so a process pays their compilation once per machine, not per start.
"""
from __future__ import annotations

import math
from array import array

import numba
import numpy as np


def okapi_scores(idf_v, term_z, doc_z, tf_z, len_d, k1: float, b: float) -> np.ndarray:
    """BM25Okapi's score of every nonzero (term, passage) entry: idf * tf (k1 + 1) / (tf + k1 (1 - b + b dl/avgdl))."""
    avgdl = int(len_d.sum()) / len(len_d)  # rank_bm25: total tokens / passages, a Python float
    tf_f = tf_z.astype(np.float64)
    return idf_v[term_z] * (tf_f * (k1 + 1) / (tf_f + k1 * (1 - b + b * len_d[doc_z] / avgdl)))


def okapi_idf(df_v: np.ndarray, n_docs: int, epsilon: float) -> np.ndarray:
    """BM25Okapi's idf with math.log and a sequential mean in first-seen order, as rank_bm25 computes it,
    so that scores match bit for bit (np.log and pairwise sums can differ in the last bit)."""
    idf = [math.log(n_docs - f + 0.5) - math.log(f + 0.5) for f in df_v.tolist()]
    total = 0.0
    for x in idf:
        total += x
    floor = epsilon * (total / len(idf))
    return np.array([floor if x < 0 else x for x in idf], dtype=np.float64)


def count_tokens(token_lists, n_docs: int):
    """Vocabulary in first-seen order (rank_bm25's order), flat token ids, passage lengths."""
    vocab: dict[str, int] = {}
    tok_n = array("i")
    len_d = np.empty(n_docs, dtype=np.int64)
    for d, words in enumerate(token_lists):
        ids = [vocab.setdefault(w, len(vocab)) for w in words]
        tok_n.extend(ids)
        len_d[d] = len(ids)
    return vocab, np.frombuffer(tok_n, dtype=np.int32), len_d


def term_doc_counts(tok_n, len_d, n_vocab):
    """(term, doc) pairs sorted by term then doc (CSC order), their counts, and the column pointers."""
    n_docs = len(len_d)
    key_n = tok_n.astype(np.int64) * n_docs
    key_n += np.repeat(np.arange(n_docs, dtype=np.int64), len_d)
    key_n.sort()
    first_z = np.flatnonzero(np.concatenate(([True], key_n[1:] != key_n[:-1])))
    tf_z = np.diff(np.append(first_z, len(key_n)))
    key_z = key_n[first_z]
    del key_n, first_z
    term_z = key_z // n_docs
    doc_z = (key_z - term_z * n_docs).astype(np.int32)
    indptr_v = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(np.bincount(term_z, minlength=n_vocab), out=indptr_v[1:])
    return term_z, doc_z, tf_z, indptr_v


@numba.njit(cache=True, nogil=True)
def _heap_push(hs, hd, n, s, d):
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


@numba.njit(cache=True, nogil=True)
def scan_top(q_ptr, q_term, q_mult, indptr_v, doc_z, score_z, n_docs, depth):
    """bm25s-style retrieval: add every posting of each distinct query term (times its count in the query) into
    a float32 accumulator, then keep the `depth` best passages (score desc, passage asc).

    A query whose postings reach few passages keeps a list of those it touched and selects among them; one that
    reaches many scans the whole accumulator instead (cheaper than the bookkeeping when most passages are hit)."""
    n_q = len(q_ptr) - 1
    cand_qc = np.full((n_q, depth), -1, dtype=np.int64)
    acc = np.zeros(n_docs, dtype=np.float32)
    seen = np.zeros(n_docs, dtype=np.bool_)
    touched = np.empty(n_docs, dtype=np.int32)
    hs = np.empty(depth, dtype=np.float32)
    hd = np.empty(depth, dtype=np.int64)
    for qi in range(n_q):
        n_post = 0
        for e in range(q_ptr[qi], q_ptr[qi + 1]):
            n_post += indptr_v[q_term[e] + 1] - indptr_v[q_term[e]]
        few = 4 * n_post < n_docs
        nt = 0
        for e in range(q_ptr[qi], q_ptr[qi + 1]):
            t, w = q_term[e], q_mult[e]
            for p in range(indptr_v[t], indptr_v[t + 1]):
                d = doc_z[p]
                acc[d] += w * score_z[p]
                if few and not seen[d]:
                    seen[d] = True
                    touched[nt] = d
                    nt += 1
        n = 0
        if few:
            for i in range(nt):
                d = touched[i]
                if acc[d] > 0:
                    n = _heap_push(hs, hd, n, acc[d], d)
                acc[d] = 0
                seen[d] = False
        else:
            for d in range(n_docs):
                v = acc[d]
                if v > 0 and (n < depth or v >= hs[0]):
                    n = _heap_push(hs, hd, n, v, d)
            acc[:] = 0
        cand_qc[qi, :n] = hd[:n]
    return cand_qc


@numba.njit(cache=True, nogil=True)
def rescore_exact(q_ptr, q_ids, cand_qc, indptr_v, doc_z, tf_z, len_d, idf_v, k1, b, avgdl):
    """Exact float64 BM25Okapi of each candidate, summed in query-token order like rank_bm25.get_scores."""
    out_qc = np.full(cand_qc.shape, -np.inf)
    for i in range(cand_qc.shape[0]):
        for j in range(cand_qc.shape[1]):
            d = cand_qc[i, j]
            if d < 0:
                continue
            dl = float(len_d[d])
            s = 0.0
            for p in range(q_ptr[i], q_ptr[i + 1]):
                t = q_ids[p]
                lo, hi = indptr_v[t], indptr_v[t + 1]
                pos = lo + np.searchsorted(doc_z[lo:hi], d)
                if pos < hi and doc_z[pos] == d:
                    f = float(tf_z[pos])
                    s += idf_v[t] * (f * (k1 + 1.0) / (f + k1 * (1.0 - b + b * dl / avgdl)))
            out_qc[i, j] = s
    return out_qc
