"""BM25Okapi on arrays: the term-by-passage matrix and its scores (the query kernel: bm25_topk.py).

Pure functions over numpy arrays (suffixes: _v per vocabulary term, _d per passage, _z per nonzero (term, passage)
entry in CSC order, _n per corpus token, _qc per query and candidate). `searchr1.retrieval.bm25` wraps them in
an index.
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
def max_impacts(indptr_v, score_z):
    """The largest stored score of each term: the bound on what its postings can add, for pruning."""
    n_v = len(indptr_v) - 1
    out_v = np.zeros(n_v, dtype=np.float32)
    for t in range(n_v):
        m = np.float32(0)
        for p in range(indptr_v[t], indptr_v[t + 1]):
            if score_z[p] > m:
                m = score_z[p]
        out_v[t] = m
    return out_v
