"""The rollout role's worker: one engine and one BM25 index in the same process, warm for the whole job.

The seed's lesson: a separate retriever service stalled rollouts while they held GPUs; here retrieval is a
function call on an index that every rollout rank loads (memory-mapped) from the shared cache.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from searchr1.agent import run_episodes, sampling_for
from searchr1.config import Config, RetrieverConfig
from searchr1.data import Question, Splits
from searchr1.engines import make_engine
from searchr1.eval import evaluate
from searchr1.retrieval import format_passages, load_or_build

log = logging.getLogger(__name__)


def make_retrieve(index, tokenizer, cfg: RetrieverConfig) -> Callable[[list[str]], list[str]]:
    """The agent's search tool: one batched BM25 call per turn, each hit list formatted as Search-R1's
    information text, passages cut to `passage_max_tokens` policy tokens."""
    def retrieve(queries: list[str]) -> list[str]:
        return [format_passages(p, tokenizer, cfg.passage_max_tokens) for p in index.search(queries, cfg.top_k)]
    return retrieve


class RolloutWorker:
    def __init__(self, cfg: Config, splits: Splits, device: torch.device):
        self.cfg = cfg
        t0 = time.perf_counter()
        self.index = load_or_build(splits.corpus, cfg.retriever, cfg.retriever.cache_dir)
        t1 = time.perf_counter()
        self.engine = make_engine(cfg.model, cfg.rollout, device)
        self.retrieve = make_retrieve(self.index, self.engine.tokenizer, cfg.retriever)
        log.info("rollout worker ready: index of %d passages in %.1fs, %s engine in %.1fs",
                 len(splits.corpus), t1 - t0, cfg.rollout.engine, time.perf_counter() - t1)

    def rollout(self, questions: list[Question], group_offset: int, version: int, seed: int):
        return run_episodes(self.engine, questions, self.cfg.algo.group_size, self.retrieve, self.cfg.rollout,
                            sampling_for(self.cfg.rollout, seed=seed), policy_version=version,
                            group_offset=group_offset)

    def evaluate(self, questions: list[Question]):
        return evaluate(self.engine, questions, self.retrieve, self.cfg.rollout)

    def weight_views(self) -> dict[str, torch.Tensor]:
        return self.engine.weight_views()
