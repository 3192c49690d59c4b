"""The step protocol: every transfer between the roles, declared once, and the channel they travel on.

Neither role issues the other's half of an exchange by hand. Each transfer below names its producer, its
consumer and its key; the trainer role and the rollout role both use these declarations through `Channel`,
and which step uses which weights (and when evaluation and checkpoints are due) is the schedule's business
(searchr1/schedule.py). A new schedule is a new ordering of the same transfers, not edits to two scripts.

    START    trainer 0 -> rollouts   the step a run (re)starts from
    WEIGHTS  trainer 0 -> rollouts   version v is published: its bits follow on the weight-sync transport
    BATCH    rollouts  -> trainers   one work unit's trajectories and metrics, for step s
    GO       trainer 0 -> trainers   the verdict for step s: "train", or "stop" (a stop was requested: every
                                     trainer saves the completed steps and exits; trainer 0 alone decides, so
                                     no replica is ever left inside a collective the others never enter)
    EVAL     rollouts  -> trainer 0  one unit of held-out predictions, for weights version v
    TIMES    every rank -> trainer 0 a rank's phase times for step s
    DONE     trainer 0 -> every rank the run is over ({"state": "done" | "stopped", "step": completed steps})
    BYE      every rank -> trainer 0 it saw DONE: trainer 0, the store's host, may now exit

With elastic rollouts (cluster.elastic, searchr1/roles/elastic.py) the rollouts are workers outside the world;
units and evaluation units become leased tasks, and weights travel as files:
    OPEN     trainer 0 -> workers    the tasks open now, oldest first
    TASK     trainer 0 -> workers    task t's current attempt and what to do
    CLAIM    a worker   -> trainer 0 the lease of task t's attempt a: compare-and-set, so exactly one holder
    RESULT   a worker   -> trainers  task t's attempt a done (a BATCH or EVAL payload); only the current
                                     attempt's result is taken, so each unit is trained at most once

Payloads travel through the job's key-value store (a TCPStore that trainer rank 0 hosts; a HashStore in
tests), pickled and cut into chunks below the store's 8 MiB frame limit. Every wait is a `Liveness.wait`:
bounded by whether the producer is alive, never by a guess of how long its work takes. Collectives (DDP, the
weight broadcast) are entered only once the other side is known to be there.

A step's data is a list of work units (`Unit`): a slice of the step's questions with its own sampling seed.
The same unit gives the same trajectories whoever generates it, so the fixed world (unit i on rollout rank
i), a re-issued unit and an elastic worker all train on the same batch.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

from searchr1.data import mixed_step_questions, step_questions
from searchr1.liveness import Liveness

CHUNK_BYTES = 4 << 20  # under the libuv TCPStore's 8 MiB payload limit


@dataclass(frozen=True)
class Transfer:
    name: str
    producer: str
    consumer: str
    key: str  # a format string over the transfer's fields

    def key_for(self, **fields) -> str:
        return self.key.format(**fields)


START = Transfer("start", "trainer", "rollout", "start")
WEIGHTS = Transfer("weights", "trainer", "rollout", "weights/{version}")
BATCH = Transfer("batch", "rollout", "trainer", "batch/{step}/{unit}")
GO = Transfer("go", "trainer", "trainer", "go/{step}")
EVAL = Transfer("eval", "rollout", "trainer", "eval/{version}/{unit}")
TIMES = Transfer("times", "any", "trainer", "times/{step}/{rank}")
DONE = Transfer("done", "trainer", "any", "done")
BYE = Transfer("bye", "any", "trainer", "bye/{rank}")
OPEN = Transfer("open", "trainer", "rollout", "open")
TASK = Transfer("task", "trainer", "rollout", "task/{tid}")
CLAIM = Transfer("claim", "rollout", "trainer", "claim/{tid}/{attempt}")
RESULT = Transfer("result", "rollout", "trainer", "result/{tid}/{attempt}")
TRANSFERS = (START, WEIGHTS, BATCH, GO, EVAL, TIMES, DONE, BYE, OPEN, TASK, CLAIM, RESULT)


class Channel:
    """Put and get the declared transfers on a store; every get waits for its producers' liveness.

    `abort`: transfers whose appearance ends any other wait (RunEnded): a rollout waiting for weights learns
    at once that the trainers have stopped."""

    def __init__(self, store, liveness: Liveness, abort: tuple[Transfer, ...] = ()):
        self.store, self.liveness = store, liveness
        self.abort = [t.key_for() for t in abort]

    def put(self, t: Transfer, obj, **fields) -> None:
        key = t.key_for(**fields)
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = max(1, -(-len(data) // CHUNK_BYTES))
        for i in range(n):
            self.store.set(f"{key}#{i}", data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])
        self.store.set(key, str(n))  # last: a reader that sees the key finds every chunk

    def ready(self, t: Transfer, **fields) -> bool:
        return self.store.check([t.key_for(**fields)])

    def wait(self, t: Transfer, producers, stoppable: bool = True, **fields) -> None:
        key = t.key_for(**fields)
        self.liveness.wait([key], producers, what=f"{t.name} {fields or ''}".strip(), stoppable=stoppable,
                           abort=[k for k in self.abort if k != key])

    def get(self, t: Transfer, producers, delete: bool = False, stoppable: bool = True, **fields):
        """The object put under `t` (waiting while `producers` live); `delete` frees it from the store.
        A stop request ends the wait (StopRequested) unless not `stoppable`."""
        key = t.key_for(**fields)
        self.wait(t, producers, stoppable=stoppable, **fields)
        n = int(self.store.get(key))
        obj = pickle.loads(b"".join(self.store.get(f"{key}#{i}") for i in range(n)))
        if delete:
            self.delete(t, **fields)
        return obj

    def delete(self, t: Transfer, **fields) -> None:
        key = t.key_for(**fields)
        n = int(self.store.get(key)) if self.store.check([key]) else 0
        self.store.delete_key(key)
        for i in range(n):
            self.store.delete_key(f"{key}#{i}")


@dataclass(frozen=True)
class Unit:
    """One slice of a step's questions, generated as one batch with its own seed."""

    step: int
    index: int
    questions: tuple[int, ...]  # indices into the training pool
    group_offset: int  # the step-level group number of its first question
    seed: int
    keep: int = 0  # dynamic sampling (algo.oversample): the groups this unit keeps of those it draws; 0: all


def chunk(n: int, parts: int, i: int) -> range:
    """The i-th of `parts` contiguous, near-equal slices of range(n)."""
    q, r = divmod(n, parts)
    start = i * q + min(i, r)
    return range(start, start + q + (i < r))


def step_units(step: int, n_units: int, n_pool: int | tuple[int, ...], questions_per_step: int, seed: int,
               position: int | None = None, keep_per_step: int = 0, shares: tuple[float, ...] = ()) -> list[Unit]:
    """The work units of `step`: its questions (searchr1.data.step_questions at data `position`, the step by
    default) in `n_units` contiguous slices, each with its own sampling seed; `keep_per_step` > 0 shares the
    groups the step keeps (dynamic sampling) among the units the same way. With a training mix, `n_pool` is
    each set's size in the pool and `shares` their shares of the step (searchr1.data.mixed_step_questions)."""
    pos = step if position is None else position
    if isinstance(n_pool, tuple):
        idx = mixed_step_questions(n_pool, shares, pos, questions_per_step, seed)
    else:
        idx = step_questions(n_pool, pos, questions_per_step, seed)
    units = []
    for u in range(n_units):
        r = chunk(questions_per_step, n_units, u)
        keep = len(chunk(keep_per_step, n_units, u)) if keep_per_step else 0
        units.append(Unit(step, u, tuple(idx[i] for i in r), r.start, seed * 100_003 + pos * 1_009 + u, keep))
    return units
