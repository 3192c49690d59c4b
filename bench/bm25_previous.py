"""The previous bm25s query path (searchr1 at b4dff5f), kept as the benchmark's same-run baseline: a float32
scan of every posting of every query term into an accumulator, the `depth` best passages kept, rescored in
float64 and ranked in numpy per query. bench/retrieval.py times it on the same index and queries as today's
kernel (searchr1.retrieval.bm25_topk.top_k_exact)."""
from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from searchr1.retrieval.base import rank
from searchr1.retrieval.bm25 import tokenize
from searchr1.retrieval.bm25_select import heap_push as _heap_push  # unchanged since b4dff5f


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


@dataclass(frozen=True)
class Passage:  # the hit type as it was (a frozen dataclass)
    pid: int
    title: str
    text: str
    score: float


def search(index, queries: list[str], k: int, depth: int = 16, pool: ThreadPoolExecutor | None = None):
    """index.search(queries, k) as it was: the same tokens, the previous kernels and ranking."""
    cfg = index.cfg
    tokens = [tokenize(q, cfg.bm25.stopwords)[: cfg.bm25.max_query_words] for q in queries]
    ids = [[index.vocab[w] for w in q if w in index.vocab] for q in tokens]
    live = [i for i, q in enumerate(ids) if q]
    out = [[] for _ in tokens]
    s = index.bm.scores
    threads = min(cfg.bm25.threads or len(os.sched_getaffinity(0)), max(1, len(live)))
    depth = min(max(k, depth), len(index.passages))

    def run(chunk):
        counts = [Counter(ids[i]) for i in chunk]
        q_ptr = np.cumsum([0] + [len(c) for c in counts], dtype=np.int64)
        q_term = np.array([t for c in counts for t in c], dtype=np.int64)
        q_mult = np.array([m for c in counts for m in c.values()], dtype=np.float32)
        cand_qc = scan_top(q_ptr, q_term, q_mult, s["indptr"], s["indices"], s["data"], len(index.passages), depth)
        q_ptr = np.cumsum([0] + [len(ids[i]) for i in chunk], dtype=np.int64)
        q_ids = np.array([t for i in chunk for t in ids[i]], dtype=np.int64)
        exact_qc = rescore_exact(q_ptr, q_ids, cand_qc, s["indptr"], s["indices"], index.tf_z, index.len_d,
                                 index.idf_v, float(cfg.bm25.k1), float(cfg.bm25.b), index.avgdl)
        for row, i in enumerate(chunk):
            out[i] = rank(cand_qc[row], exact_qc[row], k)

    if live:
        if threads == 1 or pool is None:
            run(live)
        else:
            list(pool.map(run, [live[c::threads] for c in range(threads)]))
    return [[Passage(pid, index.passages[pid]["title"], index.passages[pid]["text"], score)
             for pid, score in h] for h in out]
