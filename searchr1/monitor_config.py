"""The typed keys of the collapse monitor (`monitor.*`, searchr1/monitor.py), part of searchr1/config.py's schema;
what a flagged collapse does is `trainer.on_collapse`. Only the checks are imported here, so the schema stays light.

Each rule is scale-free where it can be (a fall from the run's own best, a spike over its own recent mean), so
the defaults mean the same on a 135M CPU run and a 3B one; a rule whose key is 0 is off."""
from __future__ import annotations

from dataclasses import dataclass

from searchr1.checks import _check, _positive


@dataclass
class MonitorConfig:
    enabled: bool = True
    window: int = 5  # steps in each moving average
    warmup_steps: int = 3  # RL steps recorded before any rule applies (the averages need a history)
    # reward / answer rate: flagged when the moving average falls below (1 - drop) x its best so far, once that
    # best has reached min_level (a run that never earned a reward cannot lose it). A policy that has learned the
    # protocol answers nearly always, so a 40% fall of the answer rate is a collapse at any scale: at 0.5 the
    # committed control at temperature 1.0 (held-out EM 15 -> 0/200) went unflagged by 0.007
    reward_drop: float = 0.5
    answer_drop: float = 0.4
    min_level: float = 0.05
    # ... and, for the reward, only when the fall is more than reward_z standard errors of the two windows' means with
    # a question (train/groups) as the unit; 0 turns the test off. At 4 questions a step the reward's moving average
    # halves from one draw of questions to the next: without it 6 healthy dev-split runs were called collapses
    reward_z: float = 2.0
    # entropy below (1 - entropy_drop) x its moving average over the previous steps. A GRPO step trains only its
    # varied groups' tokens, so its entropy is a small sample's: at 0.5 the committed main runs were flagged 1-3
    # times each with nothing wrong (replayed on results/*/metrics.jsonl, tests/test_monitor.py)
    entropy_drop: float = 0.75
    grad_spike: float = 10.0  # gradient norm above grad_spike x its moving average over the previous steps
    max_kl: float = 0.0  # KL to the reference (train/kl_ref) above this
    max_is_mismatch: float = 0.0  # |is/mean - 1| above this: engine and trainer log-probs disagree
    # consecutive flagged steps that make a collapse (what trainer.on_collapse acts on): 2, so that one noisy
    # batch of 4 questions is a warning, while the flipped-sign control's lasting fall is a collapse
    patience: int = 2

    def __post_init__(self):
        _positive(self, "monitor", "window", "patience")
        _positive(self, "monitor", "warmup_steps", "min_level", "reward_z", "grad_spike", "max_kl", "max_is_mismatch",
                  strict=False)
        for key in ("reward_drop", "answer_drop", "entropy_drop"):
            _check(0 <= getattr(self, key) < 1, f"monitor.{key}", getattr(self, key), "must be in [0, 1)")
