"""The rollout role: hold the weights the schedule asks for, evaluate the versions due, generate the units.

A rollout rank owns one engine and one index (searchr1/roles/worker.py) for the whole job. Per step it brings
its engine to the version the schedule names for the step's data, evaluating on the way every version the
schedule marks due, then generates its work units and hands each to the trainers. Every trajectory records
the version of each of its turns, as the publications received said.
"""
from __future__ import annotations

import logging
from pathlib import Path

from searchr1 import faults
from searchr1.agent import Partial
from searchr1.config import Config
from searchr1.dist import Topology
from searchr1.liveness import RunEnded, StopRequested, Stopped, spread_stop
from searchr1.metrics import PhaseTimer
from searchr1.protocol import BATCH, BYE, DONE, EVAL, START, TIMES, Channel, chunk
from searchr1.rundir import progress
from searchr1.schedule import make_schedule

log = logging.getLogger(__name__)


class RolloutRole:
    def __init__(self, cfg: Config, run_dir: Path, topo: Topology, channel: Channel, worker, weights_in_factory):
        """`weights_in_factory(first_version)` makes this rank's receiving end (searchr1/roles/weights.py)."""
        self.cfg, self.run_dir, self.topo, self.channel = cfg, Path(run_dir), topo, channel
        self.worker, self.weights_in_factory = worker, weights_in_factory
        self.trainer0 = topo.member(0)

    def run(self) -> None:
        try:
            self._run()
        except (StopRequested, RunEnded) as why:
            # the trainers stop (preemption, time limit): wait until trainer 0 has saved what a restart needs
            spread_stop(self.channel.store, str(why))
            done = self.channel.get(DONE, [self.trainer0], stoppable=False)
            self.channel.put(BYE, True, rank=self.topo.rank)
            raise Stopped(f"{why}; the trainers stopped after step {done['step']}")

    def _run(self) -> None:
        cfg, topo = self.cfg, self.topo
        # trainer 0 publishes the first version right after START: be there (a stop ends this wait via DONE)
        start = self.channel.get(START, [self.trainer0], stoppable=False)
        first = start["step"]
        self.schedule = make_schedule(cfg, first)
        self.weights = self.weights_in_factory(first)
        # partial rollouts: the groups this rank set aside go on in its next step (lost at a stop: their
        # questions were drawn for a step that is done or will be redone with new ones)
        partial = Partial(cfg.schedule.partial_tokens, cfg.algo.questions_per_step) \
            if cfg.schedule.partial_tokens else None
        t = PhaseTimer()
        self._apply(first, t)  # the full export of the version the run starts from
        if start["evaluate"]:
            with t("eval"):
                self._evaluate(first)
        for step in range(first, self.schedule.steps):
            if step > first:
                t = PhaseTimer()
            self._advance(self._target(step), t)
            sizes = self.worker.splits.sizes(self.schedule.stage(step))
            unit = self.schedule.units(step, topo.n_rollout, sizes)[topo.rollout_index]
            version = self._between_turns if self.schedule.turn_updates else (lambda: self.weights.applied)
            if partial is not None:  # a group may wait only for a next step that admits its oldest turn
                partial.may_carry = lambda v, nxt=step + 1: nxt < self.schedule.steps and self.schedule.admits(nxt, v)
            with t("rollout"):
                faults.hit("rollout", topo.rank, step)
                trajs, m = self.worker.generate(unit, version, self.schedule.stage(step), partial)
            with t("transfer"):
                self.channel.put(BATCH, {"unit": unit, "trajectories": trajs, "metrics": m,
                                         "engine_dtype": self.worker.compute_dtype}, step=step,
                                 unit=unit.index)
            self.channel.put(TIMES, t.close(), step=step, rank=topo.rank)
        self._advance(self.schedule.steps, PhaseTimer())
        self.channel.wait(DONE, [self.trainer0])
        self.weights.close()
        self.channel.put(BYE, True, rank=topo.rank)

    def _target(self, step: int) -> int:
        """The version to generate step `step` with: exactly the schedule's (sync, pipelined), or the newest the
        staging holds but never older than the schedule admits (streaming: admission control)."""
        oldest = self.schedule.version_for(step)
        return oldest if self.schedule.exact else max(oldest, self.weights.received())

    def _between_turns(self) -> int:
        """Streaming: before each turn, take the newest weights received, short of the next version due for
        evaluation (evaluated between units); returns the version the turn is generated with."""
        held = self.weights.applied
        due = self.schedule.evals(held, self.schedule.steps)
        upto = min(self.weights.received(), due[0] - 1) if due else self.weights.received()
        if upto > held:
            self.weights.apply_until(upto)
        return self.weights.applied

    def _apply(self, version: int, t: PhaseTimer) -> None:
        got = self.weights.apply_until(version)
        t.add("sync", got["sync/apply_s"] + got["sync/verify_s"])

    def _advance(self, target: int, t: PhaseTimer) -> None:
        """Apply publications up to `target`, stopping at every version due for evaluation to evaluate it."""
        for v in self.schedule.evals(self.weights.applied, target):
            self._apply(v, t)
            with t("eval"):
                self._evaluate(v)
        if target > self.weights.applied:
            self._apply(target, t)

    def _evaluate(self, version: int) -> None:
        heldout, topo = self.worker.splits.evaluation, self.topo
        faults.hit("eval", topo.rank, version)
        mine = chunk(len(heldout), topo.n_rollout, topo.rollout_index)

        def report(done: int, total: int) -> None:
            progress(self.run_dir, f"held-out eval of version {version}: rank {topo.rank} {done}/{total}")

        preds, summary = self.worker.evaluate([heldout[i] for i in mine], report)
        sets = {}  # the other held-out sets (data.eval_sets), each this rank's share, in its own corpus
        for name, s in self.worker.splits.eval_sets.items():
            share = chunk(len(s.questions), topo.n_rollout, topo.rollout_index)
            p, m = self.worker.evaluate([s.questions[i] for i in share], dataset=name, progress=lambda d, n, name=name:
                                        progress(self.run_dir, f"{name} eval of version {version}: rank {topo.rank} "
                                                               f"{d}/{n}"))
            sets[name] = {"predictions": p, "seconds": m.get("seconds", {}).get("total_s", 0.0)}
        self.channel.put(EVAL, {"predictions": preds, "seconds": summary.get("seconds", {}).get("total_s", 0.0),
                                "sets": sets}, version=version, unit=topo.rollout_index)
