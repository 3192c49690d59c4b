"""Issue 26's review findings in the elastic dispatcher, driven in-process on an in-memory store: an evaluation
result computed with other weights than its task's version is refused and re-issued (finding 2), and a worker
declared dead while it was alive learns it and re-registers instead of claiming in vain (finding 5)."""
import time

import torch.distributed as dist

from searchr1.config import Config
from searchr1.liveness import Liveness, StopFlag
from searchr1.protocol import RESULT, TASK, Channel
from searchr1.roles.elastic import DEAD, Dispatcher, ElasticWorker, eval_tasks


def dispatcher(store, tmp_path, timeout_s=5.0, max_attempts=3):
    channel = Channel(store, Liveness(store, timeout_s, stop=StopFlag()))
    return Dispatcher(channel, channel.liveness, max_attempts, 1, tmp_path), channel


def test_an_evaluation_result_of_other_weights_is_refused_and_reissued(tmp_path):
    store = dist.HashStore()
    d, channel = dispatcher(store, tmp_path)
    (task,) = eval_tasks(10, n_questions=4, n_units=1)
    d.post([task])
    channel.put(RESULT, {"predictions": [], "worker": "w0", "version": 11}, tid=task.tid, attempt=0)
    assert d.wait([task.tid], block=False) is None  # not taken as version 10's evaluation
    assert d.attempt[task.tid] == 1 and d.stats["elastic/reissued"] == 1
    assert channel.get(TASK, [], tid=task.tid)[0] == 1  # attempt 1 is open for any worker
    channel.put(RESULT, {"predictions": ["p"], "worker": "w1", "version": 10}, tid=task.tid, attempt=1)
    assert d.wait([task.tid], block=False) == {task.tid: {"predictions": ["p"], "worker": "w1", "version": 10}}


def test_a_worker_declared_dead_while_alive_re_registers(tmp_path):
    store = dist.HashStore()
    worker = ElasticWorker(Config(), tmp_path, store, None, None, None, heartbeat_period_s=0.05)
    assert worker.id == "w0"
    d, _ = dispatcher(store, tmp_path, timeout_s=0.3)
    assert d.alive("w0")
    worker.heartbeat.stop()  # a long pause: no beats, the process is still there
    deadline = time.monotonic() + 60  # only a bound; the loop ends when the dispatcher's liveness rule fires
    while d.alive("w0") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not d.alive("w0") and store.check([DEAD.format("w0")])
    worker._check_registration()  # what the worker does before each claim
    assert worker.id == "w1" and "w1" in d.workers() and d.alive("w1")
    worker._check_registration()
    assert worker.id == "w1"  # a live registration stays as it is
    worker.heartbeat.stop()
