"""The rollout stack, built in one place: an engine and a BM25 index in the same process, the agent's search
tool over that index, and the reward; warm for the whole job.

The seed's lesson: a separate retriever service stalled rollouts while they held GPUs; here retrieval is a
function call on an index that every rollout process loads (memory-mapped) from the shared cache. The training
role, `mode=eval` and the benchmarks all build their rollout stack here.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from searchr1 import metrics
from searchr1.agent import Partial, run_episodes, sampling_for
from searchr1.config import Config, ModelConfig
from searchr1.data import Question, Splits
from searchr1.engines import make_engine
from searchr1.evaluation import evaluate
from searchr1.grpo import varied_groups_first
from searchr1.protocol import Unit
from searchr1.retrieval import load_or_build
from searchr1.retrieval import format_passages, make_retrieve
from searchr1.scripted import scripted_episodes
from searchr1.reward import make_score

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, cfg: Config, splits: Splits, device: torch.device | str = "cpu",
                 model: ModelConfig | None = None):
        """`model` overrides cfg.model (mode=eval of a checkpoint)."""
        self.cfg, self.splits = cfg, splits
        t0 = time.perf_counter()
        self.index = load_or_build(splits.corpus, cfg.retriever) if cfg.agent.search else None
        t1 = time.perf_counter()
        self.engine = make_engine(model or cfg.model, cfg.engine, cfg.agent.max_context_tokens, device,
                                  cfg.sampling.temperature or 1.0)
        self.compute_dtype = str(self.engine.compute_dtype).removeprefix("torch.")
        self.retrieve = make_retrieve(self.index, self.engine.tokenizer, cfg.retriever) if self.index else None
        self.score = make_score(cfg.reward.name, cfg.reward.format_score, cfg.reward.scale)
        # every other evaluation set is searched in its own corpus (searchr1/datasets), indexed once here
        self.set_retrieve = {name: make_retrieve(load_or_build(s.corpus, cfg.retriever), self.engine.tokenizer,
                                                 cfg.retriever) if cfg.agent.search else None
                             for name, s in splits.eval_sets.items()}
        log.info("rollout worker ready: index of %d passages in %.1fs, %s engine in %.1fs",
                 len(splits.corpus), t1 - t0, cfg.engine.name, time.perf_counter() - t1)

    def generate(self, unit: Unit, version: Callable[[], int], stage: str = "rl",
                 partial: Partial | None = None) -> tuple[list, dict]:
        """One work unit: `algo.group_size` sampled trajectories per question, seeded by the unit; `version()`
        names the weights each turn is generated with. In the warm start's stage, one scripted trajectory per
        question instead (searchr1/scripted.py). `partial`: this rank's partial rollouts (searchr1/agent.py),
        whose carried groups go on before the unit's questions, and which may keep some of them for later."""
        pool = self.splits.pool(stage)
        questions = [pool[i] for i in unit.questions]
        if stage == "sft":
            r, tok = self.cfg.retriever, self.engine.tokenizer
            return scripted_episodes(questions, tok, lambda qs: self.index.search(qs, r.top_k),
                                     lambda hits: format_passages(hits, tok, r.passage_max_tokens), self.cfg.agent,
                                     self.score, unit.group_offset)
        sampling = sampling_for(self.cfg.agent, self.cfg.sampling, seed=unit.seed)
        trajs, m = run_episodes(self.engine, questions, self.cfg.algo.group_size, self.retrieve, self.cfg.agent,
                                sampling, self.score, version, group_offset=unit.group_offset, partial=partial)
        if partial is not None:
            m[metrics.GROUPS_CARRIED_IN], m[metrics.GROUPS_CARRIED_OUT] = float(partial.carried_in), \
                float(partial.carried_out)
        if unit.keep:  # dynamic sampling: only the groups kept are sent (searchr1/grpo.py varied_groups_first)
            by_group: dict[int, list] = {}
            for tr in trajs:
                by_group.setdefault(tr.group, []).append(tr)
            groups = list(by_group.values())
            kept = varied_groups_first([[tr.reward for tr in g] for g in groups], unit.keep)
            m[metrics.GROUPS_DRAWN] = float(len(groups))
            m[metrics.GROUPS_VARIED] = float(sum(len({tr.reward for tr in g}) > 1 for g in groups))
            trajs = [tr for i in kept for tr in groups[i]]
        return trajs, m

    def evaluate(self, questions: list[Question], progress: Callable[[int, int], None] = lambda d, t: None,
                 dataset: str = "hotpotqa"):
        """Greedy episodes over `questions` of `dataset`: searched in that set's corpus, scored by its metrics."""
        if dataset == "hotpotqa":
            return evaluate(self.engine, questions, self.retrieve, self.cfg.agent, self.cfg.sampling, self.score,
                            self.cfg.engine.eval_batch_size, progress)
        s = self.splits.eval_sets[dataset]
        return evaluate(self.engine, questions, self.set_retrieve[dataset], self.cfg.agent, self.cfg.sampling,
                        self.score, self.cfg.engine.eval_batch_size, progress, scorer=(s.em, s.f1))

    def weight_views(self) -> dict[str, torch.Tensor]:
        return self.engine.weight_views()
