"""Retrieval inside the rollout process: one `Index` interface (base.py), one file per backend (bm25.py: bm25s
and rank_bm25; dense.py: an encoder and faiss; hybrid.py: the two fused), the on-disk cache every backend's
index goes through (cache.py), and the agent's search tool. Backends are chosen by `retriever.name`
(searchr1/registry.py: RETRIEVERS)."""
from searchr1.retrieval.base import (NO_RESULTS, Index, IndexCorrupt, Passage, build_index, corpus_hash,  # noqa: F401
                                     format_passages, make_retrieve)
from searchr1.retrieval.cache import load_index, load_or_build, save_index  # noqa: F401
