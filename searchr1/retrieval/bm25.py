"""The BM25 backends (retrieval inside each rollout process: a separate retriever service stalled rollouts while
they held GPUs; each index is built once per corpus and cached on disk, searchr1/retrieval/cache.py, memory-mapped
where the backend allows).

Two backends behind `Index`:
- `rank_bm25`: rank_bm25's BM25Okapi itself, the reference (exact, slow: a Python pass per passage and term).
- `bm25s`: the index is bm25s's: its sparse CSC arrays of precomputed (term, passage) scores, its save/load and
  memory-mapped load. What is ours: the matrix is built here (vectorised numpy) with BM25Okapi's idf (negative idf
  floored to epsilon * mean idf), which none of bm25s's idf variants is, and ATIRE term weighting, which is
  BM25Okapi's; the query kernel (bm25_topk.py: top_k_exact) is ours too: bm25s's numba retrieval compiles
  for ~20 s in every process and cannot be cached, this one is cached on disk, weights a repeated query word
  instead of scanning it twice, breaks ties by passage id, and skips postings (exact dynamic pruning: once no
  unseen passage can reach the k-th score, common words only update the candidates). It sums float32 with
  bounds that allow for float32 rounding, and rescores in float64, with the very expression rank_bm25
  evaluates, every candidate that could be in the top k: the returned passages and scores are rank_bm25's,
  bit for bit.
Both order hits by (score desc, passage id asc) and drop passages that score 0 (they share no term with the query).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pickle
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from searchr1.retrieval import bm25_scores as bm25
from searchr1.retrieval import bm25_topk
from searchr1.retrieval.base import Index, IndexCorrupt, doc_text, rank

if TYPE_CHECKING:
    from searchr1.config import RetrieverConfig

FORMAT_VERSION = 1
TOKENIZER_NAME = "lower-alnum-v1"
_WORD_RE = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits: "Beyoncé" stays one word
PIPELINE = 4  # slices of a batch per search thread (bm25s backend): tokenizing overlaps the kernels' searching


@functools.lru_cache(maxsize=None)
def _stopword_set(stopwords: str) -> frozenset[str]:
    if stopwords == "none":
        return frozenset()
    if stopwords == "en":
        from bm25s.stopwords import STOPWORDS_EN

        return frozenset(STOPWORDS_EN)
    raise ValueError(f"retriever.stopwords={stopwords!r}: must be one of ['en', 'none']")


def tokenize(text: str, stopwords: str = "none") -> list[str]:
    """The one tokenizer for passages and queries: lower-case, split on non-alphanumerics, drop stop words."""
    words = _WORD_RE.findall(text.lower())
    stop = _stopword_set(stopwords)
    return [w for w in words if w not in stop] if stop else words


def tokenizer_signature(stopwords: str) -> dict:
    """What a saved index records about its tokenizer; a different one means the index must be rebuilt."""
    stop = sorted(_stopword_set(stopwords))
    return {"name": TOKENIZER_NAME, "pattern": _WORD_RE.pattern, "lowercase": True, "stopwords": stopwords,
            "stopwords_sha256": hashlib.sha256("\n".join(stop).encode()).hexdigest()}


class BM25Index(Index):
    """What the BM25 backends share: the tokenizer, a query's words, the settings their files depend on."""

    @classmethod
    def settings(cls, cfg: RetrieverConfig) -> dict:
        b = cfg.bm25
        return {"format": FORMAT_VERSION, "backend": cfg.name, "k1": b.k1, "b": b.b, "epsilon": b.epsilon,
                "tokenizer": tokenizer_signature(b.stopwords)}

    def words(self, query: str) -> list[str]:
        """A query's words as the index sees them: tokenized, cut at max_query_words."""
        return tokenize(query, self.cfg.bm25.stopwords)[: self.cfg.bm25.max_query_words]


class RankBM25Index(BM25Index):
    backend = "rank_bm25"

    def __init__(self, passages, cfg, okapi):
        super().__init__(passages, cfg)
        self.okapi = okapi

    @classmethod
    def build(cls, passages, cfg):
        from rank_bm25 import BM25Okapi

        # one string object per distinct word: rank_bm25 keeps a dict per passage, keyed by these
        corpus = [[sys.intern(w) for w in tokenize(doc_text(p), cfg.bm25.stopwords)] for p in passages]
        return cls(passages, cfg, BM25Okapi(corpus, k1=cfg.bm25.k1, b=cfg.bm25.b, epsilon=cfg.bm25.epsilon))

    def top_k_text(self, queries, k):
        pids = np.arange(len(self.passages))
        return [rank(pids, self.okapi.get_scores(w), k) if w else [] for w in map(self.words, queries)]

    def save(self, path):
        with open(os.path.join(path, "rank_bm25.pkl"), "wb") as f:
            pickle.dump(self.okapi, f, protocol=pickle.HIGHEST_PROTOCOL)
        return {}

    @classmethod
    def load(cls, path, passages, cfg, manifest):
        with open(os.path.join(path, "rank_bm25.pkl"), "rb") as f:
            okapi = pickle.load(f)  # trusted: our own file, checked against its sha256 before this
        if okapi.corpus_size != len(passages):
            raise IndexCorrupt(f"{path}: rank_bm25 index has {okapi.corpus_size} passages, corpus has {len(passages)}")
        return cls(passages, cfg, okapi)


class BM25sIndex(BM25Index):
    backend = "bm25s"
    _EXTRA = ("tf.npy", "doc_len.npy", "idf.npy")

    def __init__(self, passages, cfg, bm, tf_z, len_d, idf_v):
        super().__init__(passages, cfg)
        self.bm, self.tf_z, self.len_d, self.idf_v = bm, tf_z, len_d, idf_v
        self.avgdl = int(len_d.sum()) / len(len_d)  # rank_bm25: total tokens / passages, a Python float
        self.vocab = bm.vocab_dict
        self._maxv = None
        self._pool, self._pool_size = None, 0
        self._cpus = len(os.sched_getaffinity(0))  # threads=0: one per core this process may run on
        self._ws = threading.local()  # each thread's kernel scratch (bm25_topk.Workspace), reused across calls

    @classmethod
    def compile_kernels(cls, cfg):
        """The query kernel into numba's on-disk cache (beside bm25_topk.py), by one search of a small index saved
        and memory-mapped as a run's is (read-only arrays are another numba type than a build's own): a fresh
        clone's ranks otherwise each compiled it in their first search, ~18 s of CPU each, four at once on a
        2-core machine (~40 s before the first step). Loading it from the cache takes a fraction of a second."""
        import tempfile

        from searchr1.retrieval.cache import load_or_build

        passages = [{"id": str(i), "title": f"Passage {i}", "text": f"word{i} in passage {i} of a small corpus {i % 3}"}
                    for i in range(32)]
        with tempfile.TemporaryDirectory() as d:
            index = load_or_build(passages, dataclasses.replace(cfg, name=cls.backend), cache_dir=d)
            index.search(["corpus word3"], 2)

    @classmethod
    def build(cls, passages, cfg):
        import bm25s

        words = (tokenize(doc_text(p), cfg.bm25.stopwords) for p in passages)
        vocab, tok_n, len_d = bm25.count_tokens(words, len(passages))
        if not vocab:
            raise ValueError("passages: no passage has a single word; nothing to index")
        term_z, doc_z, tf_z, indptr_v = bm25.term_doc_counts(tok_n, len_d, len(vocab))
        del tok_n
        idf_v = bm25.okapi_idf(np.diff(indptr_v), len(passages), cfg.bm25.epsilon)
        score_z = bm25.okapi_scores(idf_v, term_z, doc_z, tf_z, len_d, cfg.bm25.k1, cfg.bm25.b)
        del term_z
        # method/idf_method are bm25s's labels only: the scores are computed above, not by bm25s.index()
        bm = bm25s.BM25(k1=cfg.bm25.k1, b=cfg.bm25.b, method="atire", idf_method="atire", backend="numpy")
        bm.scores = {"data": score_z.astype(np.float32), "indices": doc_z, "indptr": indptr_v,
                     "num_docs": len(passages)}
        bm.vocab_dict = vocab
        bm.nonoccurrence_array = None
        tf_dtype = np.uint16 if tf_z.max() <= np.iinfo(np.uint16).max else np.uint32
        return cls(passages, cfg, bm, tf_z.astype(tf_dtype), len_d.astype(np.int32), idf_v)

    def top_k_text(self, queries, k):
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        if not queries:
            return out
        if self._maxv is None:  # each term's largest score: the bound that lets the kernel skip postings
            self._maxv = bm25.max_impacts(self.bm.scores["indptr"], self.bm.scores["data"])
        threads = min(self.cfg.bm25.threads or self._cpus, len(queries))
        get, words = self.vocab.get, self.words
        if threads == 1:
            self._run([[get(w, -1) for w in words(q)] for q in queries], 0, k, out)
            return out
        # The kernels release the GIL; tokenizing does not. Contiguous slices, several per thread: this thread
        # tokenizes the next slice while the pool's threads search the ones before it.
        if self._pool is None or self._pool_size != threads:
            self._pool, self._pool_size = ThreadPoolExecutor(threads, thread_name_prefix="bm25"), threads
        n_slices = threads * PIPELINE if len(queries) >= threads * PIPELINE * 8 else threads
        cuts = [len(queries) * c // n_slices for c in range(n_slices + 1)]
        jobs = [self._pool.submit(self._run, [[get(w, -1) for w in words(q)] for q in queries[lo:hi]], lo, k, out)
                for lo, hi in zip(cuts, cuts[1:])]
        for j in jobs:
            j.result()
        return out

    def _run(self, ids: list[list[int]], first: int, k: int, out: list) -> None:
        """The kernel on one slice of queries (word ids; -1: a word the index does not know, which the kernel
        skips), its hits written to out[first:first + len(ids)]."""
        live = [i for i, q in enumerate(ids) if q]
        if not live:
            return
        q_ptr = np.zeros(len(live) + 1, dtype=np.int64)
        np.cumsum([len(ids[i]) for i in live], out=q_ptr[1:])
        q_ids = np.array([t for i in live for t in ids[i]], dtype=np.int64)
        ws = getattr(self._ws, "ws", None)
        if ws is None:
            ws = self._ws.ws = bm25_topk.Workspace()
        s, b = self.bm.scores, self.cfg.bm25
        pid_qk, score_qk = bm25_topk.top_k_exact(q_ptr, q_ids, s["indptr"], s["indices"], s["data"], self._maxv,
                                                 self.tf_z, self.len_d, self.idf_v, b.k1, b.b, self.avgdl, k,
                                                 b.rerank_depth, ws=ws)
        pids, scores = pid_qk.tolist(), score_qk.tolist()
        for row, i in enumerate(live):
            out[first + i] = [(p, sc) for p, sc in zip(pids[row], scores[row]) if p >= 0]

    def save(self, path):
        self.bm.save(path, show_progress=False)
        for name, arr in zip(self._EXTRA, (self.tf_z, self.len_d, self.idf_v)):
            np.save(os.path.join(path, name), arr)
        return {"vocab_size": len(self.vocab), "nnz": int(self.tf_z.shape[0])}

    @classmethod
    def load(cls, path, passages, cfg, manifest):
        import bm25s

        try:
            bm = bm25s.BM25.load(path, mmap=True, load_corpus=False, show_progress=False)
            tf_z, len_d, idf_v = (np.load(os.path.join(path, n), mmap_mode="r") for n in cls._EXTRA)
        except (OSError, ValueError, KeyError) as e:
            raise IndexCorrupt(f"{path}: cannot read bm25s index ({type(e).__name__}: {e})") from e
        s, v = bm.scores, len(bm.vocab_dict)
        shapes_ok = (s["num_docs"] == len(passages) == len(len_d) and len(s["indptr"]) == v + 1 == len(idf_v) + 1
                     and s["indptr"][-1] == len(s["data"]) == len(s["indices"]) == len(tf_z)
                     and v == manifest.get("vocab_size"))
        if not shapes_ok:
            raise IndexCorrupt(f"{path}: bm25s arrays disagree with each other or with the corpus "
                               f"({len(passages)} passages)")
        return cls(passages, cfg, bm, tf_z, len_d, idf_v)

