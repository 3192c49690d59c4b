"""The trainer role: each step, the units of the step's batch in, one optimizer step, the new weights out.

Every trainer rank reads the whole batch from the channel and trains its shard (DDP). Trainer rank 0 also
publishes the weights, writes checkpoints' pointer and metrics, and collects held-out evaluations as they
arrive (they are produced by the rollouts, when the schedule says a version is due). The schedule decides
which weights version each step's data came from; this role checks that every trajectory it trains is within
the schedule's bound, from the versions the trajectories themselves carry.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from searchr1 import checkpoint, faults, metrics, placement, stats
from searchr1.config import Config
from searchr1.dist import Topology
from searchr1.evaluation import read_predictions, write_predictions
from searchr1.liveness import StopRequested, Stopped, spread_stop
from searchr1.monitor import Monitor
from searchr1.protocol import BATCH, BYE, DONE, EVAL, GO, START, TIMES, Channel
from searchr1.rundir import progress, write_atomic, write_status
from searchr1.schedule import Schedule, make_schedule

log = logging.getLogger(__name__)


class LagError(RuntimeError):
    """A trajectory older than the schedule allows reached the trainer."""


class Collapsed(RuntimeError):
    """The monitor flagged a collapse and trainer.on_collapse=stop: the job fails, naming the last good checkpoint."""


class FixedRollouts:
    """The rollout side of the fixed world, as the trainers see it: rollout rank i generates unit i of every
    step and evaluates its share of every version due, by itself (the schedule tells it when), and reports its
    phase times. The elastic counterpart is searchr1.roles.elastic.ElasticRollouts."""

    def __init__(self, channel: Channel, topo: Topology):
        self.channel, self.topo = channel, topo
        self.members = [topo.member(r) for r in topo.rollouts]

    def units(self, step: int, schedule: Schedule) -> list[dict]:
        return [self.channel.get(BATCH, [m], step=step, unit=u) for u, m in enumerate(self.members)]

    def go(self, step: int) -> dict:
        return {}

    def follower_units(self, step: int, go: dict) -> list[dict]:
        return [self.channel.get(BATCH, [m], stoppable=False, step=step, unit=u) for u, m in enumerate(self.members)]

    def release(self, step: int) -> None:
        for u in range(len(self.members)):
            self.channel.delete(BATCH, step=step, unit=u)  # every trainer has read it: it trained on it

    def published(self, version: int, schedule: Schedule) -> None:
        pass  # the rollouts evaluate the versions due by themselves

    def eval_parts(self, version: int, block: bool) -> list[dict] | None:
        n = len(self.members)
        if not block and not all(self.channel.ready(EVAL, version=version, unit=u) for u in range(n)):
            return None
        return [self.channel.get(EVAL, [m], delete=True, stoppable=False, version=version, unit=u)
                for u, m in enumerate(self.members)]

    def times(self, step: int) -> list[dict]:
        return [self.channel.get(TIMES, [self.topo.member(r)], delete=True, stoppable=False, step=step, rank=r)
                for r in self.topo.rollouts]

    def stats(self) -> dict[str, float]:
        return {}

    def leave(self) -> None:
        for r in self.topo.rollouts:  # the store lives in trainer 0: it stays until every rank has left
            self.channel.wait(BYE, [self.topo.member(r)], stoppable=False, rank=r)


class TrainerRole:
    """Only `_collect` (trainer 0's wait for a step's data) reacts to a stop request: that is where trainer 0
    decides for every replica; every other wait finishes what was begun."""

    def __init__(self, cfg: Config, run_dir: Path, topo: Topology, channel: Channel, make_learner, weights_out,
                 splits, rollouts=None, writer_factory=metrics.MetricsWriter):
        """`make_learner(algo, optim)` builds the learner for a stage; `weights_out`: trainer rank 0's publisher
        (None on the other trainer ranks); `rollouts`: the rollout side (FixedRollouts by default)."""
        self.cfg, self.run_dir, self.topo, self.channel = cfg, Path(run_dir), topo, channel
        self.make_learner, self.weights_out, self.splits = make_learner, weights_out, splits
        self.rollouts = rollouts or FixedRollouts(channel, topo)
        self.lead = topo.rank == 0
        self.writer_factory = writer_factory
        self.pending: list[int] = []  # versions whose evaluation has not been written yet
        self.engine_dtypes: set[str] = set()  # what the rollouts' engines computed in, as their batches say

    def run(self) -> None:
        cfg = self.cfg
        point = checkpoint.resume_point(self.run_dir, cfg.resume)
        start = int(checkpoint.read_extra(point)["step"]) if point else 0
        schedule = make_schedule(cfg, start)
        # a checkpoint at the warm start's end holds that stage's state (its optimizer; no critic): the learner
        # of that stage loads it, and the loop's restart begins RL as the uninterrupted run did
        self.learner = self.make_learner(*schedule.stage_configs(start - 1 if start == schedule.warm > 0 else start))
        self.monitor, self.rollbacks = Monitor(cfg.monitor), 0
        if point:
            extra = checkpoint.load(point, self.learner)
            if "monitor" in extra:
                self.monitor.load_state_dict(extra["monitor"])
            self.rollbacks = int(extra.get("rollbacks", 0))
            log.info("resumed from %s at step %d", point, start)
        self.writer = self.writer_factory(cfg, self.run_dir, resume_step=start) if self.lead else None
        if self.lead:
            evaluated = {r[metrics.STEP] for r in metrics.records(self.writer.path, metrics.EVAL)}
            self.pending = [v for v in range(start, schedule.steps + 1) if schedule.eval_due(v) and v not in evaluated]
            lost = [v for v in range(start) if schedule.eval_due(v) and v not in evaluated]
            if lost:  # cut by the stop: the weights of those versions are gone, so say so rather than leave a gap
                progress(self.run_dir, f"evaluations of versions {lost} were cut by the stop and cannot be redone "
                                       f"after the resume at step {start} (their weights are not kept)")
            self._write_data_manifest()
            self.channel.put(START, {"step": start, "evaluate": self.pending[:1] == [start]})
            self.weights_out.publish(self.learner.bf16_weights(), version=start)
            if self.pending[:1] == [start]:
                self.rollouts.published(start, schedule)
        t_run = time.perf_counter()
        t = metrics.PhaseTimer()
        for step in range(start, schedule.steps):
            if step == schedule.warm > 0:
                self.learner.restart(*schedule.stage_configs(step))  # RL begins: its objective, a fresh optimizer
                placement.return_free_memory()
            units = self._collect(step, schedule)
            if units is None:
                self._stop(step)
            trajs = [tr for u in units for tr in u["trajectories"]]
            self.engine_dtypes.update(u["engine_dtype"] for u in units if "engine_dtype" in u)
            self._check_lag(step, trajs, schedule)
            with t("train"):
                factor = faults.hit("train", self.topo.rank, step)
                if factor is not None:
                    self.learner.scale_lr(factor)
                train_m = self.learner.step(trajs)
                placement.return_free_memory()
            # every replica judges the same numbers (the batch, the all-reduced train/ values): the same verdict
            mon_m, flags = ({}, []) if schedule.stage(step) == "sft" else \
                self.monitor.observe(step + 1, {**metrics.trajectory_metrics(trajs), **train_m})
            good, act = self._on_collapse(schedule) if self.monitor.collapsed else (None, "warn")
            if act == "rollback":
                mon_m[metrics.ROLLBACK] = 1.0
            pub_m = {}
            if self.lead:
                faults.hit("publish", self.topo.rank, step)
                with t("sync"):
                    pub_m = self.weights_out.publish(self.learner.bf16_weights(), version=step + 1)
                if step + 1 in self.pending:
                    self.rollouts.published(step + 1, schedule)
            if self.lead:
                self._record(step, t, trajs, units, {**train_m, **mon_m}, pub_m, schedule, t_run, start, flags)
            else:
                self.channel.put(TIMES, t.close(), step=step, rank=self.topo.rank)
            if act == "stop":
                return self._collapsed(step + 1, flags, good)
            if act == "rollback":
                self._rollback(step + 1, flags, good)
            # After the step's line, so that a checkpoint never stands for a step whose record was lost (a resume
            # starts after it); its seconds count in the next step's record.
            t = metrics.PhaseTimer()
            if schedule.checkpoint_due(step + 1):
                with t("checkpoint"):
                    checkpoint.save(self.run_dir, step + 1, self.learner, self._extra(step + 1), cfg.keep_checkpoints)
        if self.lead:
            self._drain_evals(block=True)
            self._finish()
            self.channel.put(DONE, {"state": "done", "step": schedule.steps})
            for r in range(1, self.topo.n_trainer):  # the store lives in this process: stay until all have left
                self.channel.wait(BYE, [self.topo.member(r)], stoppable=False, rank=r)
            self.rollouts.leave()
        else:
            self.channel.wait(DONE, [self.topo.member(0)], stoppable=False)
            self.channel.put(BYE, True, rank=self.topo.rank)

    def _extra(self, done: int) -> dict:
        return {"step": done, "version": done, "monitor": self.monitor.state_dict(), "rollbacks": self.rollbacks}

    def _on_collapse(self, schedule: Schedule) -> tuple[Path | None, str]:
        """The last good checkpoint (the newest before the first flagged step) and what the collapse does. Every
        replica decides alike: the same verdict, the same checkpoints (saved by trainer 0 before the all-reduce of
        the step that any replica is past). A rollback needs an RL checkpoint (the warm start's hold another
        stage's optimizer) and a rollback left, else it stops."""
        good = checkpoint.newest_before(self.run_dir, self.monitor.first_flagged)
        act = self.cfg.trainer.on_collapse
        if act == "rollback" and (good is None or int(good.name[5:]) <= schedule.warm
                                  or self.rollbacks >= self.cfg.trainer.max_rollbacks):
            act = "stop"
        return good, act

    def _rollback(self, done: int, flags: list[str], good: Path) -> None:
        """trainer.on_collapse=rollback: every replica restores `good` (policy, optimizer, monitor; the replicas
        stay equal) and scales its learning rates by rollback_lr_factor per rollback so far; the step count goes
        on, so the next publication (version done + 1) carries the restored policy to the rollouts."""
        first = self.monitor.first_flagged
        extra = checkpoint.load(good, self.learner)
        self.monitor = Monitor(self.cfg.monitor)
        if "monitor" in extra:
            self.monitor.load_state_dict(extra["monitor"])
        self.rollbacks += 1
        factor = self.cfg.trainer.rollback_lr_factor ** self.rollbacks
        self.learner.scale_lr(factor)
        if self.lead:
            msg = (f"collapse: steps {first}-{done} flagged by the monitor ({'; '.join(flags)}); rolled back to "
                   f"{good} (trainer.on_collapse=rollback {self.rollbacks}/{self.cfg.trainer.max_rollbacks}), "
                   f"learning rates x{factor:g}, going on at step {done + 1}")
            log.warning("%s", msg)
            progress(self.run_dir, msg)
            write_status(self.run_dir, rollbacks=self.rollbacks, last_rollback={
                "first_flagged_step": first, "step": done, "reasons": flags, "restored": str(good),
                "lr_factor": factor})

    def _collapsed(self, done: int, flags: list[str], good: Path | None) -> None:
        """trainer.on_collapse=stop (or a rollback that cannot be made): trainer 0 writes the collapse to the
        progress log and status.json, waits for the other replicas to leave (they return), and fails the job with
        it (Collapsed, in its log); no checkpoint is written of the collapsed policy."""
        first = self.monitor.first_flagged
        how = "stopped (trainer.on_collapse=stop)" if self.cfg.trainer.on_collapse == "stop" else \
            f"stopped: no rollback left or no RL checkpoint before it ({self.rollbacks} made)"
        msg = (f"collapse: steps {first}-{done} flagged by the monitor ({'; '.join(flags)}); {how}; the last "
               f"checkpoint before it: {good or 'none'}")
        if not self.lead:
            self.channel.wait(DONE, [self.topo.member(0)], stoppable=False)
            self.channel.put(BYE, True, rank=self.topo.rank)
            return
        progress(self.run_dir, msg)
        write_status(self.run_dir, collapse={"first_flagged_step": first, "step": done, "reasons": flags,
                                             "last_good_checkpoint": str(good) if good else None})
        self.writer.close()
        self.channel.put(DONE, {"state": "collapsed", "step": done})
        for r in range(1, self.topo.n_trainer):
            self.channel.wait(BYE, [self.topo.member(r)], stoppable=False, rank=r)
        raise Collapsed(msg)

    def _record(self, step, t, trajs, units, train_m, pub_m, schedule: Schedule, t_run: float, start: int,
                flags: list[str] = ()) -> None:
        self.rollouts.release(step)
        self._drain_evals(block=False)
        times = [t.close()] + [self.channel.get(TIMES, [self.topo.member(r)], delete=True, stoppable=False,
                                                step=step, rank=r)
                               for r in range(1, self.topo.n_trainer)] + self.rollouts.times(step)
        rec = metrics.step_record(step, trajs, [u["metrics"] for u in units], train_m, pub_m, times,
                                  self.topo.n_trainer)
        rec.update(self.rollouts.stats())
        if schedule.warm:
            rec["stage"] = schedule.stage(step)
        self.writer.log(rec)
        self._progress(step, rec, t_run, start, schedule)
        if flags:
            log.warning("step %d flagged by the collapse monitor: %s", step + 1, "; ".join(flags))
            progress(self.run_dir, f"step {step + 1} COLLAPSE? {'; '.join(flags)}"
                                   + (" (a collapse: monitor.patience reached)" if self.monitor.collapsed else ""))

    def _collect(self, step: int, schedule: Schedule) -> list[dict] | None:
        """The step's units, in unit order (the same batch whichever process generated which unit); None when a
        stop was requested. Trainer 0 alone decides and tells the others (GO), so that the replicas either all
        train the step (DDP collectives) or all stop before it."""
        if not self.lead:
            go = self.channel.get(GO, [self.topo.member(0)], stoppable=False, step=step)
            return None if go["verdict"] == "stop" else self.rollouts.follower_units(step, go)
        try:
            self.channel.liveness.check([])  # a stop asked here, or seen by any member, is a stop now
            units = self.rollouts.units(step, schedule)
        except StopRequested as why:
            spread_stop(self.channel.store, str(why))
            self.channel.put(GO, {"verdict": "stop"}, step=step)
            return None
        self.channel.put(GO, {"verdict": "train", **self.rollouts.go(step)}, step=step)
        return units

    def _stop(self, done: int) -> None:
        """A stop was requested (preemption, time limit): save the completed steps, tell the rollouts, exit.
        The step in progress, if any, was finished first: a stop loses no completed step."""
        reason = self.channel.liveness.stop.reason or "a stop request seen by another member"
        latest = checkpoint.latest(self.run_dir)
        if done > 0 and (latest is None or latest.name != f"step_{done:06d}"):
            checkpoint.save(self.run_dir, done, self.learner, self._extra(done), self.cfg.keep_checkpoints)
        if self.lead:
            self._drain_evals(block=False)
            self.writer.close()
            self.channel.put(DONE, {"state": "stopped", "step": done})
            progress(self.run_dir, f"stopped ({reason}) after step {done}; checkpoint saved")
            for r in range(1, self.topo.n_trainer):  # everyone leaves the store (hosted here) before it goes
                self.channel.wait(BYE, [self.topo.member(r)], stoppable=False, rank=r)
            self.rollouts.leave()
        else:
            self.channel.wait(DONE, [self.topo.member(0)], stoppable=False)
            self.channel.put(BYE, True, rank=self.topo.rank)
        raise Stopped(reason)

    def _check_lag(self, step: int, trajs, schedule: Schedule) -> None:
        for tr in trajs:
            if not schedule.admits(step, tr.policy_version):
                raise LagError(f"step {step}: trajectory {tr.qid} (group {tr.group}) was generated with weights "
                               f"version {tr.policy_version} (turns {tr.turn_versions}), {step - tr.policy_version} "
                               f"behind; schedule {schedule.name} allows at most {schedule.max_lag}")

    def _drain_evals(self, block: bool) -> None:
        """Write every pending evaluation whose units have all arrived; with `block`, wait for all of them."""
        while self.pending:
            v = self.pending[0]
            parts = self.rollouts.eval_parts(v, block)
            if parts is None:
                return
            preds = [p for part in parts for p in part["predictions"]]
            out = self.run_dir / "predictions"
            out.mkdir(exist_ok=True)
            write_predictions(out / f"step_{v:06d}.jsonl", preds)
            rec = metrics.eval_record(v, preds, max(part["seconds"] for part in parts))
            self.writer.log(rec)
            self.writer.log_predictions(v, preds)
            self._say(f"{'held-out' if self.splits.eval_on == 'heldout' else 'dev'} EM at version {v}", rec)
            for name in self.splits.eval_sets:  # each other set: its own prediction file and metrics line
                preds = [p for part in parts for p in part["sets"][name]["predictions"]]
                (out / name).mkdir(exist_ok=True)
                write_predictions(out / name / f"step_{v:06d}.jsonl", preds)
                rec = metrics.eval_set_record(name, v, preds, max(part["sets"][name]["seconds"] for part in parts))
                self.writer.log(rec)
                self.writer.log_predictions(v, preds, name)
                self._say(f"{name} held-out EM at version {v}", rec)
            self.pending.pop(0)

    def _say(self, what: str, rec: dict) -> None:
        msg = (f"{what}: {rec[metrics.EVAL_EM_COUNT]}/{rec[metrics.EVAL_N]} ({100 * rec[metrics.EVAL_EM]:.1f}%), F1 "
               f"{rec[metrics.EVAL_F1]:.3f}, searched {rec['eval/n_searched']}/{rec[metrics.EVAL_N]}, "
               f"{rec['eval/seconds_s']:.0f} s")
        log.info(msg)
        progress(self.run_dir, msg)

    def _progress(self, step: int, rec: dict, t_run: float, start: int, schedule: Schedule) -> None:
        done, total = step + 1, schedule.steps
        per_step = (time.perf_counter() - t_run) / (done - start)
        eta = per_step * (total - done)
        stage = f" {schedule.stage(step)}" if schedule.warm else ""
        progress(self.run_dir, f"step {done}/{total}{stage} | reward {rec[metrics.REWARD]:.3f} | answered "
                               f"{rec[metrics.ANSWER_RATE]:.2f} | searches {rec[metrics.SEARCHES]:.2f} | "
                               f"{rec[metrics.STEP_S]:.1f} s/step | ETA {int(eta // 60)}m{int(eta % 60):02d}s")

    def _write_data_manifest(self) -> None:
        s = self.splits
        manifest = {"train_questions": len(s.train), "heldout_questions": len(s.heldout), "dev_questions": len(s.dev),
                    "evaluated_on": s.eval_on,
                    "corpus_passages": len(s.corpus), "corpus_scope": s.corpus_scope,
                    "train_files": self.cfg.data.train_files, "eval_file": self.cfg.data.eval_file,
                    "heldout_ids": [q.qid for q in s.heldout],
                    "curriculum": {stage: {"questions": len(pool), "ids": [q.qid for q in pool]}
                                   for stage, pool in s.pools.items()}}
        if s.mix:
            manifest["train_mix"] = {"shares": dict(self.cfg.data.train_mix),
                                     "questions": {n: sum(q.dataset == n for q in s.train) for n in ("hotpotqa", *s.mix)}}
        if s.eval_sets:
            manifest["eval_sets"] = {name: {"heldout_questions": len(e.questions), "corpus_passages": len(e.corpus),
                                            "heldout_ids": [q.qid for q in e.questions]}
                                     for name, e in s.eval_sets.items()}
        write_atomic(self.run_dir / "data.json", json.dumps(manifest, indent=1) + "\n")

    def _finish(self) -> None:
        self.writer.close()
        evals = metrics.records(self.run_dir / "metrics.jsonl", metrics.EVAL)
        summary = {"run_dir": str(self.run_dir), "steps": self.cfg.warm_start.steps + self.cfg.steps,
                   "warm_start_steps": self.cfg.warm_start.steps, "seed": self.cfg.seed,
                   "compute_dtype": {"trainer": self.learner.compute_dtype_name,
                                     "engine": "+".join(sorted(self.engine_dtypes)) or None},
                   "evals": evals}
        if self.splits.eval_sets:
            summary["eval_sets"] = {name: metrics.set_records(self.run_dir / "metrics.jsonl", name)
                                    for name in self.splits.eval_sets}
        write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
        where = "held-out" if self.splits.eval_on == "heldout" else "dev"
        self._paired(where, evals, self.run_dir / "predictions")
        for name in self.splits.eval_sets:
            self._paired(f"{name} held-out", metrics.set_records(self.run_dir / "metrics.jsonl", name),
                         self.run_dir / "predictions" / name)
        log.info("run folder: %s", self.run_dir)

    def _paired(self, where: str, evals: list[dict], folder: Path) -> None:
        """The run's first evaluation against its last, on the console: counts, and the paired exact test."""
        if len(evals) < 2:
            return
        first, last = evals[0], evals[-1]
        msg = (f"{where} EM before (step {first['step']}): {first[metrics.EVAL_EM_COUNT]}/{first[metrics.EVAL_N]}"
               f", after (step {last['step']}): {last[metrics.EVAL_EM_COUNT]}/{last[metrics.EVAL_N]}")
        files = [folder / f"step_{e['step']:06d}.jsonl" for e in (first, last)]
        if all(f.is_file() for f in files):  # the claim is a paired one: the same questions, before and after
            r = stats.paired_predictions(*map(read_predictions, files))
            msg += (f"; {r.only_b} questions gained, {r.only_a} lost, exact McNemar p = {r.p_value:.2g} "
                    f"(python -m searchr1.stats {files[0]} {files[1]})")
        log.info(msg)
        progress(self.run_dir, msg)
