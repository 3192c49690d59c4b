"""Schedules: which policy version each step's data is generated with, and when evaluation and checkpoints
are due. Both roles read the same schedule, so they agree on the order of the protocol's transfers.

Versions: version v is the policy after v optimizer steps (version 0: the initial weights; a run resumed at
step c starts from version c). Step s trains on a batch and turns version s into s + 1. With a warm start, the
first `warm_start.steps` steps are supervised (scripted trajectories, algo sft) and RL starts at version
`warm`, which is always evaluated: the learning experiment measures what RL adds from there. A trajectory's lag
is s - (the oldest version any of its turns was generated with); `max_lag` bounds it.

- `sync`: step s's batch comes from version s (lag 0): the roles take turns, as in the seed.
- `pipelined`: step s's batch comes from exactly version max(s - k, 0), so rollouts generate step s + 1 while
  the trainers train step s; the lag is exactly min(s, k) every step (min(s - c, k) after a resume at c, when
  the versions before c are gone), and a run is deterministic for a seed.
- `streaming`: rollouts generate continuously with the newest weights they hold, picking up new ones between
  turns; a unit of step s may only start once they hold version s - k or newer (admission control, as in
  AReaL's staleness bound), so nothing past the bound is generated, rather than generated and then dropped
  (dropping stale samples biases training toward short, search-free trajectories). With
  `schedule.partial_tokens`, a step's unfinished groups may wait for the rank's next step (searchr1/agent.py
  Partial) when that step still admits their oldest turn: the bound above holds for them too.
"""
from __future__ import annotations

from dataclasses import replace

from searchr1.config import AlgoConfig, Config, OptimConfig
from searchr1.protocol import Unit, step_units


class Schedule:
    name = ""
    exact = True  # generate each step with exactly `version_for(step)`, never newer
    turn_updates = False  # new weights may be applied between the turns of an episode

    def __init__(self, cfg: Config, start: int = 0):
        self.cfg, self.warm = cfg, cfg.warm_start.steps
        self.steps, self.max_lag, self.start = self.warm + cfg.steps, cfg.schedule.max_lag, start
        self.eval_every, self.eval_before, self.checkpoint_every = cfg.eval_every, cfg.eval_before, cfg.checkpoint_every

    def stage(self, step: int) -> str:
        """"sft" for the warm start's steps, "rl" after."""
        return "sft" if step < self.warm else "rl"

    def stage_configs(self, step: int) -> tuple[AlgoConfig, OptimConfig, int]:
        """The objective, the optimizer and the trained top layers (0: all) of `step`'s stage."""
        if self.stage(step) == "rl":
            return self.cfg.algo, self.cfg.optim, self.cfg.trainer.train_top_layers
        w = self.cfg.warm_start
        return (AlgoConfig(name="sft", group_size=1, questions_per_step=w.questions_per_step),
                replace(self.cfg.optim, lr=w.lr, warmup_steps=0), w.train_top_layers)

    def units(self, step: int, n_units: int, n_pool: int | tuple[int, ...]) -> list[Unit]:
        """Step `step`'s work units. RL data positions count from the first RL step, so the questions RL sees do
        not depend on the length of a warm start; the warm start draws from its own stream. `n_pool`: the
        stage's pool size, or each training set's (Splits.sizes) with a training mix."""
        algo = self.stage_configs(step)[0]
        mix = self.cfg.data.train_mix
        shares = (1 - sum(mix.values()), *mix.values()) if mix else ()
        if self.stage(step) == "sft":
            return step_units(step, n_units, n_pool, algo.questions_per_step, self.cfg.seed + 7_919, shares=shares)
        drawn = algo.questions_per_step * algo.oversample
        return step_units(step, n_units, n_pool, drawn, self.cfg.seed, position=step - self.warm,
                          keep_per_step=algo.questions_per_step if algo.oversample > 1 else 0, shares=shares)

    def version_for(self, step: int) -> int:
        """The version step `step`'s data is generated with (streaming: the oldest one it may be). Scripted
        warm-start data needs no weights; RL never starts from data older than its first version."""
        if self.stage(step) == "sft":
            return max(step, self.start)
        return max(step - self.max_lag, self.start, self.warm)

    def admits(self, step: int, version: int) -> bool:
        """Whether data of `version` may be trained in `step` (scripted data carries no version)."""
        return self.stage(step) == "sft" or 0 <= step - version <= self.max_lag

    def eval_due(self, version: int) -> bool:
        """Held-out evaluation of weights `version` (0 only if eval_before; always the last)."""
        if version == 0:
            return self.eval_before
        return version in (self.steps, self.warm) or (self.eval_every > 0 and version % self.eval_every == 0)

    def evals(self, after: int, upto: int) -> list[int]:
        """The versions in (after, upto] due for evaluation, in order."""
        return [v for v in range(after + 1, upto + 1) if self.eval_due(v)]

    def checkpoint_due(self, done: int) -> bool:
        return done == self.steps or (self.checkpoint_every > 0 and done % self.checkpoint_every == 0)


class Sync(Schedule):
    name = "sync"


class Pipelined(Schedule):
    name = "pipelined"


class Streaming(Schedule):
    name = "streaming"
    exact = False
    turn_updates = True


def make_schedule(cfg: Config, start: int = 0) -> Schedule:
    from searchr1.registry import SCHEDULES, resolve

    return resolve(SCHEDULES, cfg.schedule.name, "schedule.name")(cfg, start)
