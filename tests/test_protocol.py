"""The step protocol, its channel, liveness and the schedules, in one process: the trainer role and two rollout
roles run as threads on an in-memory store, with a fake learner, worker and weight transport."""
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist

from searchr1 import metrics as K
from searchr1.config import Config, DataConfig, ScheduleConfig, WandbConfig
from searchr1.data import Splits
from searchr1.dist import Topology
from searchr1.liveness import (EXIT_STOPPED, SLICE_S, STOP_KEY, Heartbeat, Liveness, MemberLost, RunEnded, StopFlag,
                                StopRequested, Stopped, post_failure)
from searchr1.protocol import BATCH, CHUNK_BYTES, DONE, TRANSFERS, WEIGHTS, Channel, step_units
from searchr1.roles.rollout import RolloutRole
from searchr1.roles.weights import StagedIn, WeightsIn
from searchr1.roles.trainer import LagError, TrainerRole
from searchr1.schedule import Pipelined, Streaming, Sync, make_schedule
from searchr1.trajectory import Trajectory


def channel(store, timeout_s=5.0, stop=None, abort=()):
    return Channel(store, Liveness(store, timeout_s, stop=StopFlag() if stop is None else stop), abort=abort)


# ------------------------------------------------------------------------------------------ channel, liveness

def test_transfers_are_declared_once_with_distinct_keys():
    assert len({t.name for t in TRANSFERS}) == len({t.key for t in TRANSFERS}) == len(TRANSFERS)


def test_a_payload_above_the_store_frame_limit_travels_in_chunks_and_is_freed():
    store = dist.HashStore()
    Heartbeat(lambda: store, "rank2", 0.1).start()
    ch = channel(store)
    big = {"x": b"a" * (2 * CHUNK_BYTES + 7)}
    ch.put(BATCH, big, step=0, unit=1)
    assert ch.get(BATCH, ["rank2"], delete=True, step=0, unit=1) == big
    assert not store.check(["batch/0/1", "batch/0/1#0", "batch/0/1#2"])


def test_a_wait_outlasts_a_slow_producer_that_beats():
    store = dist.HashStore()
    Heartbeat(lambda: store, "rank2", 0.1).start()
    ch = channel(store, timeout_s=0.5)
    threading.Timer(2.0, lambda: ch.put(BATCH, "late", step=0, unit=0)).start()  # 4x the timeout
    assert ch.get(BATCH, ["rank2"], step=0, unit=0) == "late"


def test_a_silent_producer_is_dead_and_named():
    store = dist.HashStore()
    store.add("hb/rank3", 1)  # it beat once and then fell silent
    ch = channel(store, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(MemberLost, match=r"rank3 has shown no sign of life .* \(while waiting for batch"):
        ch.get(BATCH, ["rank3"], step=0, unit=0)
    assert time.monotonic() - t0 >= 1.0


def test_a_failed_producer_ends_the_wait_at_once_with_its_reason():
    store = dist.HashStore()
    Heartbeat(lambda: store, "rank3", 0.1).start()
    post_failure(store, "rank3", "CUDA out of memory")
    with pytest.raises(MemberLost, match="rank3 failed: CUDA out of memory"):
        channel(store, timeout_s=60).get(BATCH, ["rank3"], step=0, unit=0)


def test_a_stop_request_ends_a_wait():
    store, stop = dist.HashStore(), StopFlag()
    Heartbeat(lambda: store, "rank0", 0.1).start()
    threading.Timer(0.5, lambda: stop.set("SIGTERM")).start()
    with pytest.raises(StopRequested, match="SIGTERM"):
        channel(store, stop=stop).wait(WEIGHTS, ["rank0"], version=1)


# ------------------------------------------------------------------------------------------ schedules

def cfg_with(schedule="sync", max_lag=0, steps=6, **kw):
    return Config(steps=steps, schedule=ScheduleConfig(name=schedule, max_lag=max_lag), **kw)


def test_schedules_name_the_version_of_each_step():
    assert [Sync(cfg_with()).version_for(s) for s in range(4)] == [0, 1, 2, 3]
    assert [Pipelined(cfg_with("pipelined", 1)).version_for(s) for s in range(4)] == [0, 0, 1, 2]
    assert [Pipelined(cfg_with("pipelined", 2)).version_for(s) for s in range(5)] == [0, 0, 0, 1, 2]
    assert [Pipelined(cfg_with("pipelined", 2), start=3).version_for(s) for s in range(3, 6)] == [3, 3, 3]
    s = Streaming(cfg_with("streaming", 2))
    assert not s.exact and s.turn_updates and s.admits(5, 3) and not s.admits(5, 2) and not s.admits(2, 3)
    assert make_schedule(cfg_with("pipelined", 1)).name == "pipelined"


def test_evaluation_and_checkpoint_cadence():
    s = Sync(cfg_with(steps=10, eval_every=4, checkpoint_every=3))
    assert [v for v in range(11) if s.eval_due(v)] == [0, 4, 8, 10] and s.evals(0, 8) == [4, 8]
    assert [d for d in range(1, 11) if s.checkpoint_due(d)] == [3, 6, 9, 10]
    assert not Sync(cfg_with(steps=10, eval_before=False)).eval_due(0)


def test_units_are_the_same_whoever_generates_them():
    a = step_units(3, 2, 500, 8, seed=0)
    assert a == step_units(3, 2, 500, 8, seed=0) and [len(u.questions) for u in a] == [4, 4]
    assert [u.group_offset for u in a] == [0, 4] and len({u.seed for u in a}) == 2
    assert sorted(q for u in a for q in u.questions) == sorted(set(q for u in a for q in u.questions))


# ------------------------------------------------------------------------------------------ both roles, in-process



class FakeLearner:
    """Records which weights versions each step's data came from; 'weights' are just the version."""

    critic = None  # no trainable state beside the policy (the learner interface: searchr1/learner.py)
    rank, device, compute_dtype_name = 0, "cpu", "float32"

    def __init__(self):
        self.step_count, self.trained = 0, []

    def restart(self, algo, optim, top=None):
        self.restarts = getattr(self, "restarts", []) + [(self.step_count, algo.name)]

    def step(self, trajs):
        self.trained.append(sorted({t.policy_version for t in trajs}))
        self.step_count += 1
        return {"train/loss": float(self.step_count)}

    def bf16_weights(self):
        return {"version": self.step_count}

    class module:
        @staticmethod
        def save_pretrained(path):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "config.json").write_text("{}")

    tokenizer = module

    def state_dict(self):
        return {"step": self.step_count}

    def barrier(self):
        pass


class FakeOut:
    def __init__(self, ch, shared):
        self.ch, self.shared = ch, shared

    def publish(self, weights, version):
        self.shared[version] = weights["version"]
        self.ch.put(WEIGHTS, version, version=version)
        return {"sync/bytes": 1.0}


class FakeIn:
    def __init__(self, ch, shared, first, log):
        self.ch, self.shared, self.next, self.applied, self.log = ch, shared, first, -1, log

    def apply_until(self, version):
        while self.applied < version:
            self.ch.wait(WEIGHTS, ["rank0"], version=self.next)
            assert self.shared[self.next] == self.next  # the trainer's weights of that version
            self.applied, self.next = self.next, self.next + 1
            self.log.append(self.applied)
        return {"sync/apply_s": 0.0, "sync/verify_s": 0.0}

    def close(self):
        pass


@dataclass(frozen=True)
class Q:
    qid: str
    question: str = "?"
    answers: tuple = ("x",)


class FakeWorker:
    compute_dtype = "float32"

    def __init__(self, splits, delay_s=0.0):
        self.splits, self.delay_s = splits, delay_s

    def generate(self, unit, version, stage="rl", partial=None):
        assert partial is None  # these tests run no partial rollouts
        time.sleep(self.delay_s)
        trajs = [Trajectory(qid=f"q{q}", group=unit.group_offset + i, prompt_ids=[1], response_ids=[2],
                            loss_mask=[1], logprobs=[0.0], reward=float(q % 2), turn_versions=[version()])
                 for i, q in enumerate(unit.questions)]
        return trajs, {"rollout/generation_s": 0.01}

    def evaluate(self, questions, progress):
        progress(len(questions), len(questions))
        return [{"id": q.qid, "question": q.question, "answers": list(q.answers), "em": 1.0, "f1": 1.0, "searches": 0,
                 "prediction": "x"} for q in questions], {}  # the fields of evaluation.py's records


class Broadcast:
    """The weight sync's collective, in threads: the publisher and every receiver must all enter it; one that never
    comes breaks it (after `timeout_s`) instead of hanging the test."""

    def __init__(self, parties: int, timeout_s: float = 20.0):
        self.barrier = threading.Barrier(parties, timeout=timeout_s)


class CollectiveOut(FakeOut):
    def __init__(self, ch, shared, bcast):
        super().__init__(ch, shared)
        self.bcast = bcast

    def publish(self, weights, version):
        m = super().publish(weights, version)  # announced first, as WeightsOut does for a broadcast
        self.bcast.barrier.wait()
        return m


class CollectiveSubscriber:
    """The receiving end for the real WeightsIn: joins the collective, reports the version it carried."""

    def __init__(self, shared, bcast, first, log):
        self.shared, self.bcast, self.version, self.log = shared, bcast, first, log

    def receive(self, views):
        self.bcast.barrier.wait()
        self.log.append(self.version)
        self.version += 1
        return {"sync/version": self.version - 1, "sync/apply_s": 0.0, "sync/verify_s": 0.0}


def run_roles(tmp_path, cfg, slow_rank=None, trainer_stop=None, learner_cls=FakeLearner, rollout_stop=None,
              collective=False):
    """`rollout_stop`: the rollouts' stop flag (the trainer's, for a signal that reaches every rank); `collective`:
    weights travel through a collective every role must enter, received by the real WeightsIn."""
    store, shared = dist.HashStore(), {}
    bcast = Broadcast(3) if collective else None
    for r in range(3):
        Heartbeat(lambda: store, f"rank{r}", 0.1).start()
    splits = Splits(corpus_scope="train+eval", train=list(range(40)), heldout=[Q(f"h{i}") for i in range(6)], corpus=[])
    learner, applied = learner_cls(), {1: [], 2: []}
    errors = []

    def trainer():
        topo = Topology(0, 3, 1)  # one trainer, two rollouts (ranks 1 and 2)
        ch = channel(store, stop=trainer_stop)
        out = CollectiveOut(ch, shared, bcast) if collective else FakeOut(ch, shared)
        TrainerRole(cfg, tmp_path, topo, ch, lambda algo, optim, top: learner, out, splits).run()

    def rollout(rank):
        topo = Topology(rank, 3, 1)
        ch = channel(store, stop=rollout_stop, abort=(DONE,))
        worker = FakeWorker(splits, delay_s=0.3 if rank == slow_rank else 0.0)
        if collective:
            weights_in = lambda first: WeightsIn(ch, CollectiveSubscriber(shared, bcast, first, applied[rank]),
                                                 dict, "rank0", first)
        else:
            weights_in = lambda first: FakeIn(ch, shared, first, applied[rank])
        RolloutRole(cfg, tmp_path, topo, ch, worker, weights_in).run()

    def guard(member, fn, *a):
        try:
            fn(*a)
        except BaseException as err:  # noqa: BLE001 - as run_rank does: the others must not wait for us
            post_failure(store, member, f"{type(err).__name__}: {err}")
            errors.append(err)

    threads = [threading.Thread(target=guard, args=("rank0", trainer))] + [
        threading.Thread(target=guard, args=(f"rank{r}", rollout, r)) for r in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if trainer_stop is None:
        assert not errors, errors
        return learner, applied, K.read_metrics(Path(tmp_path) / "metrics.jsonl")
    return learner, errors, K.read_metrics(Path(tmp_path) / "metrics.jsonl")


BASE = dict(eval_every=2, checkpoint_every=0, data=DataConfig(eval_size=6), wandb=WandbConfig(mode="disabled"))


def test_sync_schedule_trains_each_step_on_its_own_version(tmp_path):
    cfg = cfg_with("sync", 0, steps=5, **BASE)
    learner, applied, recs = run_roles(tmp_path, cfg)
    assert learner.trained == [[0], [1], [2], [3], [4]]
    train = [r for r in recs if r[K.KIND] == K.TRAIN]
    assert [r[K.STEP] for r in train] == [1, 2, 3, 4, 5] and all(r[K.LAG_MAX] == 0 for r in train)
    assert sorted(r[K.STEP] for r in recs if r[K.KIND] == K.EVAL) == [0, 2, 4, 5]
    assert all(r[K.EVAL_N] == 6 for r in recs if r[K.KIND] == K.EVAL)
    assert applied == {1: [0, 1, 2, 3, 4, 5], 2: [0, 1, 2, 3, 4, 5]}


@pytest.mark.parametrize("k", [1, 2])
def test_pipelined_schedule_lags_exactly_min_step_k(tmp_path, k):
    cfg = cfg_with("pipelined", k, steps=6, **BASE)
    learner, applied, recs = run_roles(tmp_path, cfg, slow_rank=2)
    assert learner.trained == [[max(s - k, 0)] for s in range(6)]
    train = [r for r in recs if r[K.KIND] == K.TRAIN]
    assert [r[K.LAG_MAX] for r in train] == [min(s, k) for s in range(6)]
    # every version due is evaluated even though the rollouts run behind, the last one included
    assert sorted(r[K.STEP] for r in recs if r[K.KIND] == K.EVAL) == [0, 2, 4, 6]


def test_the_trainer_refuses_data_past_the_bound():
    role = TrainerRole.__new__(TrainerRole)
    stale = [Trajectory(qid="q7", group=0, prompt_ids=[1], response_ids=[2], loss_mask=[1], logprobs=[0.0],
                        turn_versions=[3, 5])]
    with pytest.raises(LagError, match=r"q7 .* version 3 \(turns \[3, 5\]\), 3 behind; schedule sync allows at most 0"):
        role._check_lag(6, stale, Sync(cfg_with()))


@pytest.mark.timeout(60)  # the bug the second case guards against is a hang: fail instead
@pytest.mark.parametrize("everyone", [False, True], ids=["trainer0", "every_rank_while_the_step_trains"])
def test_a_stop_request_saves_the_completed_steps_and_ends_every_role(tmp_path, everyone):
    """Preemption: the trainer finishes the step in progress, saves it, tells the rollouts; all exit 'stopped'.

    every_rank: as Slurm does, the signal reaches every rank at once. The rollouts, waiting for the weights of the
    step that trains, see the stop long before trainer 0 finishes the step; trainer 0 then publishes those weights
    (it finishes what it began) in a collective the rollouts must still join, and only then stops. Leaving the wait
    on the stop hung trainer 0 in that collective until Slurm's GraceTime killed the job (CI, stop 37)."""
    from searchr1 import checkpoint

    stop = StopFlag()
    cfg = cfg_with("sync", 0, steps=50, **BASE)

    class Stopping(FakeLearner):
        def step(self, trajs):
            out = super().step(trajs)
            if self.step_count == 3:
                stop.set("SIGTERM")  # arrives while step 3 trains
                if everyone:
                    time.sleep(3 * SLICE_S)  # the step trains on: every waiting rollout sees the stop meanwhile
            return out

    learner, errors, recs = run_roles(tmp_path, cfg, trainer_stop=stop, learner_cls=Stopping,
                                      rollout_stop=stop if everyone else None, collective=everyone)
    assert len(errors) == 3 and all(isinstance(e, Stopped) and e.code == EXIT_STOPPED for e in errors), errors
    assert learner.step_count == 3 and [r[K.STEP] for r in recs if r[K.KIND] == K.TRAIN] == [1, 2, 3]
    assert checkpoint.latest(tmp_path).name == "step_000003"


@pytest.mark.timeout(60)  # the bug this guards against is a hang: fail instead
def test_a_stop_in_a_wait_that_may_not_end_on_it_becomes_the_jobs_stop():
    """A rank the signal reached alone (trainer 1, a rollout), waiting where it must not leave: the stop goes on the
    store, where trainer 0's next decision sees it."""
    store, stop = dist.HashStore(), StopFlag()
    Heartbeat(lambda: store, "rank0", 0.1).start()
    ch = channel(store, stop=stop)
    threading.Timer(0.2, lambda: stop.set("SIGTERM")).start()
    threading.Timer(2.5 * SLICE_S, lambda: ch.put(WEIGHTS, 4, version=4)).start()
    ch.wait(WEIGHTS, ["rank0"], stoppable=False, version=4)  # ends on the key, not on the stop
    assert store.check([STOP_KEY]) and store.get(STOP_KEY) == b"SIGTERM"


@pytest.mark.timeout(60)  # the bug this guards against is a hang: fail instead
def test_staged_weights_for_a_version_the_stopped_trainers_never_publish_end_the_wait():
    """Pipelined and streaming rollouts run ahead: the version a rollout waits for may never come once the trainers
    stopped; their DONE ends the wait (RunEnded), as it ends the synchronous one."""
    store = dist.HashStore()
    Heartbeat(lambda: store, "rank0", 0.1).start()
    ch = channel(store, abort=(DONE,))
    staged = StagedIn(ch, subscriber=None, views=dict, publisher_member="rank0", first=5)
    threading.Timer(0.2, lambda: ch.put(DONE, {"state": "stopped", "step": 4})).start()
    with pytest.raises(RunEnded, match="weights version 5 will not come"):
        staged.apply_until(5)
    staged.close()


def test_a_warm_start_runs_supervised_steps_then_rl_from_its_own_version(tmp_path):
    from searchr1.config import WarmStartConfig

    cfg = cfg_with("sync", 0, steps=3, **BASE)
    cfg.warm_start = WarmStartConfig(steps=2, questions_per_step=4)
    cfg.eval_every = 0
    learner, applied, recs = run_roles(tmp_path, cfg)
    assert learner.restarts == [(2, "grpo")]  # RL's objective and a fresh optimizer where it begins
    train = [r for r in recs if r[K.KIND] == K.TRAIN]
    assert [(r[K.STEP], r["stage"]) for r in train] == [(1, "sft"), (2, "sft"), (3, "rl"), (4, "rl"), (5, "rl")]
    assert [r[K.TRAJECTORIES] for r in train] == [4, 4, 16, 16, 16]  # the fake worker: one per question
    assert sorted(r[K.STEP] for r in recs if r[K.KIND] == K.EVAL) == [0, 2, 5]  # before, where RL starts, end
