"""Elastic rollouts: rollout workers outside the trainers' world, taking leased tasks, following file weights.

A trainer replica is part of a collective and may still end the job; a rollout is a producer of trajectories
and should not. With `cluster.elastic.enabled` the torch.distributed world holds the trainers only. Rollout
workers connect to the job's store (trainer rank 0 hosts it), register, beat, and take work:

- Every unit of a step (and every evaluation unit of a version) is a task with an attempt number. A worker
  takes attempt a of task t by compare-and-set on claim/t/a, so each attempt has exactly one holder. The
  dispatcher (in trainer rank 0) watches the holders: one that fails or falls silent (liveness.py) gets its
  task re-issued as attempt a + 1; only the current attempt's result is taken, so a unit is trained at most
  once; a task that used up `max_attempts` is lost and counted (never silently dropped, never replaced by a
  zero reward, which would bias its group's baseline).
- Weights are files (searchr1/weightsync/files.py): a worker that joins reads the newest full publication and
  then the deltas after it, each verified by its digests.
- The same units give the same batches as the fixed world (unit i of a step is the same slice and seed), so
  with schedule=sync and no faults an elastic run trains on exactly what a fixed one does.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from searchr1 import faults
from searchr1.config import Config
from searchr1.liveness import Heartbeat, Liveness, MemberLost, Stopped, post_failure
from searchr1.protocol import BYE, CLAIM, DONE, OPEN, RESULT, START, TASK, WEIGHTS, Channel, Unit, chunk
from searchr1.rundir import progress

log = logging.getLogger(__name__)
POLL_S = 0.05
DEAD = "dead/{}"  # set by the dispatcher for a worker it declared dead


@dataclass(frozen=True)
class Task:
    tid: str
    kind: str  # train | eval
    key: int  # the step (train) or the weights version (eval)
    index: int
    unit: Unit | None = None  # train: the unit to generate
    questions: tuple[int, ...] = ()  # eval: indices into the evaluation set


def train_tasks(step: int, units: list[Unit]) -> list[Task]:
    return [Task(f"train-{step}-{u.index}", "train", step, u.index, unit=u) for u in units]


def eval_tasks(version: int, n_questions: int, n_units: int) -> list[Task]:
    return [Task(f"eval-{version}-{i}", "eval", version, i, questions=tuple(chunk(n_questions, n_units, i)))
            for i in range(n_units)]


class Dispatcher:
    """Trainer rank 0's side: open tasks, lease them out, re-issue the dead holders', collect the results."""

    def __init__(self, channel: Channel, liveness: Liveness, max_attempts: int, min_workers: int, run_dir: Path):
        self.channel, self.store, self.liveness = channel, channel.store, liveness
        self.max_attempts, self.min_workers, self.run_dir = max_attempts, min_workers, Path(run_dir)
        self.open: dict[str, Task] = {}
        self.attempt: dict[str, int] = {}
        self.done: dict[str, tuple[int, object]] = {}  # tid -> (attempt, result)
        self.lost: set[str] = set()
        self.dead: set[str] = set()
        self.joined: set[str] = set()
        self.last_death = None
        self.stats = self._fresh()

    @staticmethod
    def _fresh() -> dict[str, float]:
        return {"elastic/reissued": 0.0, "elastic/lost": 0.0, "elastic/joins": 0.0, "elastic/rejoin_s": 0.0,
                "elastic/workers": 0.0}

    def post(self, tasks: list[Task]) -> None:
        for t in tasks:
            self.open[t.tid], self.attempt[t.tid] = t, 0
            self.channel.put(TASK, (0, t), tid=t.tid)
        self._publish_open()

    def _publish_open(self) -> None:
        self.channel.put(OPEN, list(self.open))

    def workers(self) -> list[str]:
        return [f"w{i}" for i in range(int(self.store.add("workers/next", 0)))]

    def alive(self, member: str) -> bool:
        if member in self.dead:
            return False
        failed = self.store.check([f"failed/{member}"])
        if failed or self.liveness.silent_for(member) > self.liveness.timeout_s:
            self.dead.add(member)
            self.last_death = time.monotonic()
            why = "failed" if failed else "fell silent"
            self.store.set(DEAD.format(member), why)  # it may be alive after all (a pause): it must re-register
            log.warning("rollout worker %s %s", member, why)
            progress(self.run_dir, f"rollout worker {member} {why}: its tasks are re-issued")
            return False
        return True

    def _poll(self) -> None:
        """One look at every open task: take finished results, re-issue the tasks of dead holders."""
        for tid in list(self.open):
            a = self.attempt[tid]
            if self.channel.ready(RESULT, tid=tid, attempt=a):
                result = self.channel.get(RESULT, [], tid=tid, attempt=a)
                t = self.open[tid]
                if t.kind == "eval" and result.get("version") != t.key:
                    # computed with other weights than the version it is a result for: not that evaluation
                    log.error("task %s: result computed with weights version %s, not %d: re-issued", tid,
                              result.get("version"), t.key)
                    self.channel.delete(RESULT, tid=tid, attempt=a)
                    self._reissue(tid, a)
                    continue
                self.done[tid] = (a, result)
                key = f"elastic/units/{result['worker']}"
                self.stats[key] = self.stats.get(key, 0.0) + 1
                del self.open[tid]
                continue
            claim = CLAIM.key_for(tid=tid, attempt=a)
            if not self.store.check([claim]):
                continue
            holder = self.store.get(claim).decode()
            if self.alive(holder):
                continue
            self._reissue(tid, a)
        for w in self.workers():
            if w not in self.joined and self.store.check([f"joined/{w}"]):
                self.joined.add(w)
                self.stats["elastic/joins"] += 1
                if self.last_death is not None:
                    self.stats["elastic/rejoin_s"] = time.monotonic() - self.last_death
        self._publish_open()

    def _reissue(self, tid: str, a: int) -> None:
        """Attempt a + 1 of task `tid`, or the task lost once it has used up max_attempts."""
        if a + 1 >= self.max_attempts:
            log.error("task %s lost: %d attempts, none gave a result", tid, a + 1)
            self.lost.add(tid)
            self.stats["elastic/lost"] += 1
            del self.open[tid]
        else:
            self.attempt[tid] = a + 1
            self.channel.put(TASK, (a + 1, self.open[tid]), tid=tid)
            self.stats["elastic/reissued"] += 1

    def wait(self, tids: list[str], block: bool = True, stoppable: bool = True) -> dict[str, object] | None:
        """The results of `tids` (a lost task's is absent) once all are settled; None if not yet and not
        `block`. Waits while workers are alive or may come back; fails only when the trainers are stopped."""
        warned = 0.0
        while True:
            self._poll()
            if all(t in self.done or t in self.lost for t in tids):
                return {t: self.done[t][1] for t in tids if t in self.done}
            if not block:
                return None
            self.liveness.check([], stoppable)  # a stop request ends the wait (where trainer 0 decides)
            live = [w for w in self.workers() if self.alive(w)]
            self.stats["elastic/workers"] = float(len(live))
            if len(live) < self.min_workers and time.monotonic() - warned > 30:
                warned = time.monotonic()
                progress(self.run_dir, f"waiting for rollout workers: {len(live)} alive "
                                       f"(cluster.elastic.min_rollouts={self.min_workers})")
            time.sleep(POLL_S * 4)

    def accepted(self, tids: list[str]) -> list[tuple[str, int]]:
        return [(t, self.done[t][0]) for t in tids if t in self.done]

    def forget(self, tids: list[str]) -> None:
        for t in tids:
            if t in self.done:
                self.channel.delete(RESULT, tid=t, attempt=self.done.pop(t)[0])

    def take_stats(self) -> dict[str, float]:
        out, self.stats = self.stats, self._fresh()
        out["elastic/workers"] = float(sum(self.alive(w) for w in self.workers()))
        return out


class ElasticWorker:
    """A rollout process: registers, then takes tasks until the run is over."""

    def __init__(self, cfg: Config, run_dir: Path, store, worker, weights, schedule_factory, heartbeat_period_s):
        self.cfg, self.run_dir, self.store, self.worker, self.weights = cfg, Path(run_dir), store, worker, weights
        self.id = f"w{int(store.add('workers/next', 1)) - 1}"
        self.slot = f"worker{os.environ.get('SEARCHR1_WORKER_SLOT', '?')}"  # the backend's slot (faults, logs)
        self.heartbeat_period_s = heartbeat_period_s
        self.heartbeat = Heartbeat(lambda: store, self.id, heartbeat_period_s).start()
        self.channel = Channel(store, Liveness(store, cfg.cluster.heartbeat_timeout_s), abort=(DONE,))
        self.schedule_factory = schedule_factory
        self._replace_predecessor()

    def _replace_predecessor(self) -> None:
        """A process restarted in place (same parent: the local launcher or the Slurm task that restarts it)
        proves its predecessor gone: say so, so that its tasks are re-issued now, not after heartbeat_timeout_s."""
        if "SEARCHR1_WORKER_SLOT" not in os.environ:
            return  # no slot to be restarted in
        key = f"slots/{socket.gethostname()}/{os.getppid()}/{self.slot}"
        if self.store.check([key]):
            prev = self.store.get(key).decode()
            post_failure(self.store, prev, f"{prev} ended: {self.id} was started in its place ({self.slot})")
        self.store.set(key, self.id)

    def run(self) -> None:
        start = self.channel.get(START, ["rank0"])
        self.schedule = self.schedule_factory(start["step"])
        log.info("rollout worker %s (pid %d) joined the run at step %d", self.id, os.getpid(), start["step"])
        while not self.store.check([DONE.key_for()]):
            self._check_registration()
            task = self._claim()
            if task is None:
                time.sleep(POLL_S)
                continue
            attempt, t = task
            self.channel.put(RESULT, self._do(t), tid=t.tid, attempt=attempt)
        self.heartbeat.stop()  # before BYE: once trainer 0 hears it, the store's host may exit
        self.channel.put(BYE, True, rank=self.id)  # trainer 0 hosts the store: it waits for live workers to leave

    def _check_registration(self) -> None:
        """A worker the dispatcher declared dead (silent too long: a pause, a slow file system) has had its tasks
        re-issued and its claims no longer count; it joins again under a new id rather than claim in vain."""
        if not self.store.check([DEAD.format(self.id)]):
            return
        old = self.id
        self.heartbeat.stop()
        self.id = f"w{int(self.store.add('workers/next', 1)) - 1}"
        self.heartbeat = Heartbeat(lambda: self.store, self.id, self.heartbeat_period_s).start()
        log.warning("rollout worker %s was declared dead by the trainers: re-registered as %s", old, self.id)
        progress(self.run_dir, f"rollout worker {old} re-registered as {self.id} (it had been declared dead)")

    def _claim(self):
        if not self.store.check([OPEN.key_for()]):
            return None
        for tid in self.channel.get(OPEN, ["rank0"]):
            attempt, t = self.channel.get(TASK, ["rank0"], tid=tid)
            key = CLAIM.key_for(tid=tid, attempt=attempt)
            if self.store.compare_set(key, "", self.id).decode() == self.id:
                return attempt, t
        return None

    def _version(self, version: int) -> None:
        self.channel.wait(WEIGHTS, ["rank0"], version=version)
        got = self.weights.catch_up(self.worker.weight_views(), version)
        if got["sync/joined"] and not self.store.check([f"joined/{self.id}"]):
            self.store.set(f"joined/{self.id}", str(version))

    def _do(self, t: Task):
        if t.kind == "eval":
            self._version(t.key)
            faults.hit("eval", self.slot, t.key)
            preds, summary = self.worker.evaluate([self.worker.splits.evaluation[i] for i in t.questions])
            return {"predictions": preds, "seconds": summary.get("seconds", {}).get("total_s", 0.0),
                    "worker": self.id, "version": self.weights.applied}
        self._version(self.schedule.version_for(t.key))
        faults.hit("rollout", self.slot, t.key)
        trajs, m = self.worker.generate(t.unit, lambda: self.weights.applied, self.schedule.stage(t.key))
        return {"unit": t.unit, "trajectories": trajs, "metrics": m, "worker": self.id,
                "engine_dtype": self.worker.compute_dtype}


def run_worker(cfg: Config, run_dir: Path) -> None:
    """The entry of an elastic rollout process (local backend, Slurm, or `+join=RUN_DIR`)."""
    from searchr1 import dist
    from searchr1.roles import rank_splits, setup_logging
    from searchr1.roles.worker import Worker
    from searchr1.schedule import make_schedule
    from searchr1.weightsync.files import FileSubscriber

    setup_logging(f"worker {os.environ.get('SEARCHR1_WORKER_SLOT', '?')}")

    def leave(signum, frame):  # a worker asked to go (its launcher stopped): the trainers hear of it at once
        raise Stopped(f"{signal.Signals(signum).name}: leaving the run")

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, leave)
    store = dist.connect_store(host=False)
    me = None
    try:
        splits = rank_splits(cfg)  # the trainers' pools: their units index into them
        worker = Worker(cfg, splits, "cpu")
        me = ElasticWorker(cfg, run_dir, store, worker, FileSubscriber(run_dir, cfg.sync),
                           lambda start: make_schedule(cfg, start), cfg.cluster.heartbeat_period_s)
        me.run()
    except BaseException as err:
        if isinstance(err, Stopped):
            log.info("rollout worker %s: %s", me.id if me else "(unregistered)", err.reason)
        else:
            log.exception("rollout worker failed")
        if me is not None:  # its tasks are re-issued now (not after heartbeat_timeout_s)
            post_failure(store, me.id, err.reason if isinstance(err, Stopped) else f"{type(err).__name__}: {err}")
        raise
    # Leave now, as the ranks do: interpreter teardown with a store client whose host is exiting can abort.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


class ElasticRollouts:
    """The rollout side as the trainers see it when rollouts are elastic (the fixed world's counterpart is
    searchr1.roles.trainer.FixedRollouts): units and evaluations are leased tasks, taken by whichever workers
    are alive."""

    def __init__(self, channel: Channel, dispatcher: Dispatcher, n_units: int, splits):
        self.channel, self.dispatcher, self.n_units, self.splits = channel, dispatcher, n_units, splits
        self.tids: dict[tuple[str, int], list[str]] = {}

    def units(self, step: int, schedule) -> list[dict]:
        tasks = train_tasks(step, schedule.units(step, self.n_units, self.splits.sizes(schedule.stage(step))))
        self.dispatcher.post(tasks)
        tids = self.tids[("train", step)] = [t.tid for t in tasks]
        got = self.dispatcher.wait(tids)
        return [got[t] for t in tids if t in got]  # a lost unit is missing here, and counted

    def go(self, step: int) -> dict:
        return {"results": self.dispatcher.accepted(self.tids[("train", step)])}

    def follower_units(self, step: int, go: dict) -> list[dict]:
        return [self.channel.get(RESULT, [], stoppable=False, tid=t, attempt=a) for t, a in go["results"]]

    def release(self, step: int) -> None:
        self.dispatcher.forget(self.tids.pop(("train", step)))

    def published(self, version: int, schedule) -> None:
        tasks = eval_tasks(version, len(self.splits.evaluation), self.n_units)
        self.dispatcher.post(tasks)
        self.tids[("eval", version)] = [t.tid for t in tasks]

    def eval_parts(self, version: int, block: bool) -> list[dict] | None:
        if ("eval", version) not in self.tids:  # not published yet
            if block:
                raise RuntimeError(f"evaluation of version {version} was never opened")
            return None
        tids = self.tids[("eval", version)]
        got = self.dispatcher.wait(tids, block, stoppable=False)
        if got is None:
            return None
        self.dispatcher.forget(self.tids.pop(("eval", version)))
        return [got[t] for t in tids if t in got]

    def times(self, step: int) -> list[dict]:
        return []  # workers are not ranks: the step record has the trainers' phase times only

    def stats(self) -> dict[str, float]:
        return self.dispatcher.take_stats()

    def leave(self) -> None:
        """Workers end by themselves once they see DONE; wait for the live ones (the store lives here)."""
        for w in self.dispatcher.workers():
            if self.dispatcher.alive(w):
                try:
                    self.channel.wait(BYE, [w], stoppable=False, rank=w)
                except MemberLost:
                    pass  # it died on its way out: nothing of the run depended on it any more
