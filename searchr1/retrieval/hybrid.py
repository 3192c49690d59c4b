"""BM25 and dense retrieval fused: each part returns its best `retriever.hybrid.depth` passages, and the fusion
ranks their union.

- `rrf` (reciprocal-rank fusion): score = sum over the parts that returned the passage of 1 / (rrf_k + rank),
  rank counted from 1. Scale-free, so BM25's unbounded scores and cosine similarities need no calibration.
- `weighted`: score = w * dense + (1 - w) * bm25, each part's scores min-max normalised over that query's
  candidates (a passage a part did not return counts 0 there).
Both are exact float64 and deterministic: ties go to the lower passage id, as every backend's do. The hybrid
index has no files: its parts come from the index cache under their own settings, shared with the standalone
`bm25s` and `dense` indexes of the same corpus.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from searchr1.retrieval.base import Index, backend, rank

FORMAT_VERSION = 1


def rrf(hits_per_part: list[list[tuple[int, float]]], rrf_k: int) -> dict[int, float]:
    """Reciprocal-rank fusion of ranked (passage id, score) lists."""
    fused: dict[int, float] = {}
    for hits in hits_per_part:
        for r, (pid, _) in enumerate(hits, start=1):
            fused[pid] = fused.get(pid, 0.0) + 1.0 / (rrf_k + r)
    return fused


def weighted(hits_per_part: list[list[tuple[int, float]]], weights: list[float]) -> dict[int, float]:
    """Weighted sum of each part's min-max normalised scores (1 for every hit when a part's scores are equal)."""
    fused: dict[int, float] = {}
    for hits, w in zip(hits_per_part, weights):
        if not hits:
            continue
        s = np.array([sc for _, sc in hits], dtype=np.float64)
        lo, span = s.min(), s.max() - s.min()
        norm = (s - lo) / span if span > 0 else np.ones_like(s)
        for (pid, _), x in zip(hits, norm.tolist()):
            fused[pid] = fused.get(pid, 0.0) + w * x
    return fused


class HybridIndex(Index):
    backend = "hybrid"
    composite = True

    def __init__(self, passages, cfg, sparse: Index, dense: Index):
        super().__init__(passages, cfg)
        self.parts = (sparse, dense)

    @staticmethod
    def part_configs(cfg) -> tuple:
        """The parts' configs: this retriever's keys under the parts' own names (so their cache is shared)."""
        return dataclasses.replace(cfg, name=cfg.hybrid.sparse), dataclasses.replace(cfg, name="dense")

    @classmethod
    def compile_kernels(cls, cfg) -> None:
        for part in cls.part_configs(cfg):
            backend(part).compile_kernels(part)

    @classmethod
    def settings(cls, cfg) -> dict:
        from searchr1.retrieval.base import backend

        h = cfg.hybrid
        return {"format": FORMAT_VERSION, "backend": "hybrid", "fusion": h.fusion, "rrf_k": h.rrf_k,
                "dense_weight": h.dense_weight, "depth": h.depth,
                "parts": [backend(c).settings(c) for c in cls.part_configs(cfg)]}

    @classmethod
    def build(cls, passages, cfg):
        from searchr1.retrieval.base import build_index

        return cls(passages, cfg, *(build_index(passages, c) for c in cls.part_configs(cfg)))

    @classmethod
    def from_parts(cls, passages, cfg, load_part):
        """The hybrid index whose parts `load_part(part_cfg)` gives (the cache's load_or_build)."""
        return cls(passages, cfg, *(load_part(c) for c in cls.part_configs(cfg)))

    def top_k_text(self, queries, k):
        h = self.cfg.hybrid
        depth = min(len(self.passages), max(h.depth, k))
        per_part = [p.top_k_text(queries, depth) for p in self.parts]
        out = []
        for q in range(len(queries)):
            hits = [part[q] for part in per_part]
            fused = rrf(hits, h.rrf_k) if h.fusion == "rrf" else weighted(hits, [1 - h.dense_weight, h.dense_weight])
            if not fused:
                out.append([])
                continue
            pids = np.fromiter(fused, dtype=np.int64, count=len(fused))
            out.append(rank(pids, np.fromiter(fused.values(), dtype=np.float64, count=len(fused)), k,
                            positive_only=False))
        return out
