"""The typed keys of PPO, of dynamic sampling and of several updates per batch (`algo.*`), part of searchr1/config.py's AlgoConfig
(which inherits them). Only the checks are imported here, so the schema stays light."""
from __future__ import annotations

from dataclasses import dataclass

from searchr1.checks import _check, _one_of, _positive


@dataclass
class UpdateKeys:
    # Passes over each batch and optimizer steps per pass (its rows split into `minibatches`), for every sampled
    # objective: 1 and 1 is one update per batch, whose PPO ratio is 1 at the update, so the clip acts only
    # from the second update on (searchr1/grpo.py decoupled_policy_loss says what each case computes).
    # DAPO's dynamic sampling: each RL step draws oversample x questions_per_step questions and each work unit
    # keeps its share of questions_per_step groups, those whose rewards vary first (in draw order), then flat
    # ones: a group whose samples all score alike gives a group-relative objective no gradient (1: off)
    oversample: int = 1
    ppo_epochs: int = 1
    minibatches: int = 1
    # algo=ppo (searchr1/algos/ppo.py): GAE over the policy's own tokens (retrieved ones are the environment's);
    # Search-R1's PPO uses gamma = lambda = 1 with a terminal reward
    gamma: float = 1.0
    gae_lambda: float = 1.0
    critic: str = "head"  # head: a linear value head on the policy's last hidden state
    critic_lr: float = 1e-4  # the critic's own learning rate (a linear head from zero needs far more than the policy)
    critic_trunk_grad: bool = False  # false: the value loss trains the head only, never the policy's layers
    vf_coef: float = 0.5  # the value loss's weight in the loss
    value_clip: float = 0.5  # values move at most this far from the pre-update ones before the clipped loss
    whiten_advantages: bool = True  # advantages to mean 0, std 1 over the batch's trained tokens

    def _check_updates(self) -> None:
        _positive(self, "algo", "oversample", "ppo_epochs", "minibatches", "critic_lr", "value_clip")
        _positive(self, "algo", "vf_coef", strict=False)
        for key in ("gamma", "gae_lambda"):
            _check(0 <= getattr(self, key) <= 1, f"algo.{key}", getattr(self, key), "must be in [0, 1]")
        _one_of("algo.critic", self.critic, {"head"})
