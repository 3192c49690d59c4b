"""Every rank of a training job starts here: `run_rank(cfg, run_dir)` (what the backends run in each task).

Bootstrap, top-down: the rank's topology from the environment, logging, seeds, the job's store (trainer rank
0 hosts it), a heartbeat thread, the world's process groups, then the role that the global rank names
(trainers first). A rank that raises posts its failure on the store, logs its traceback and exits at once, so
the others stop waiting for it and the backend ends the job naming it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

from searchr1 import curriculum, dist
from searchr1.config import Config
from searchr1.datasets import load_all
from searchr1.liveness import Heartbeat, Liveness, post_failure
from searchr1.protocol import DONE, Channel
from searchr1.rundir import REPO_ROOT, progress, write_atomic

log = logging.getLogger("searchr1")


def setup_logging(label: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format=f"%(asctime)s [{label}] %(message)s", datefmt="%H:%M:%S")


def prepare(cfg: Config, run_dir: Path) -> None:
    """The caches every rank loads, built once before any starts (by the backend): the model's bf16 directory
    (exported outside torch.distributed: transformers 5 writes a model's weights only on rank 0 of a world),
    the BM25 index (and its query kernel), and the delta codec's compiled kernel."""
    from searchr1 import models
    from searchr1.retrieval import load_or_build
    from searchr1.retrieval.base import backend
    from searchr1.weightsync import kernel

    setup_logging("prepare")
    progress(run_dir, f"preparing the model ({cfg.model.name}), the {cfg.retriever.name} index and the codec kernel")
    models.model_dir(cfg.model)
    if cfg.agent.search:
        splits = load_all(cfg.data, REPO_ROOT)
        for corpus in [splits.corpus] + [s.corpus for s in splits.eval_sets.values()]:
            load_or_build(corpus, cfg.retriever)
        backend(cfg.retriever).compile_kernels(cfg.retriever)  # cached by `make install`; else once here
    if cfg.sync.method == "delta":
        kernel.prepare()  # built here once (logged), never inside the first weight publication


def run_rank(cfg: Config, run_dir: Path) -> None:
    run_dir = Path(run_dir)
    c = cfg.cluster
    topo = dist.topology_from_env(c.trainer_ranks, c.elastic.enabled)
    setup_logging(f"rank {topo.rank} {topo.role}")
    store = None
    try:
        expected = c.trainer_ranks + (0 if c.elastic.enabled else c.rollout_ranks)
        if topo.world != expected:
            raise ValueError(f"world size {topo.world} != the {expected} ranks cluster.* asks for")
        random.seed(cfg.seed + topo.rank)
        np.random.seed(cfg.seed + topo.rank)
        torch.manual_seed(cfg.seed + topo.rank)
        store = dist.connect_store(host=topo.rank == 0)
        heartbeat = Heartbeat(lambda: dist.connect_store(host=False), topo.member(), c.heartbeat_period_s).start()
        groups = dist.init(topo, store, c.collective_timeout_s)
        log.info("joined world of %d on %s (pid %d, cores %s, %s threads)", topo.world, groups.device, os.getpid(),
                 ",".join(map(str, sorted(os.sched_getaffinity(0)))), torch.get_num_threads())
        channel = Channel(store, Liveness(store, c.heartbeat_timeout_s, topo.describe),
                          abort=(DONE,) if topo.role == "rollout" else ())
        splits = rank_splits(cfg)
        role = _trainer if topo.role == "trainer" else _rollout
        role(cfg, run_dir, topo, groups, channel, splits).run()
        heartbeat.stop()
    except SystemExit as stop:  # a stop on request (Stopped, exit 75), or submitit's requeue: not a failure
        log.info("exiting (%s)", stop.code)
        # exit now: interpreter teardown with a live process group, store and heartbeat can abort (SIGABRT)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException as err:
        # Exit now: ranks waiting for us see the failure on the store; the backend ends the job.
        log.exception("rank %d (%s) failed", topo.rank, topo.role)
        if store is not None:
            post_failure(store, topo.member(), f"{type(err).__name__}: {err}")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(1)
    dist.shutdown()


def _trainer(cfg, run_dir, topo, groups, channel, splits):
    from searchr1.learner import Learner
    from searchr1.roles.trainer import TrainerRole
    from searchr1.roles.weights import WeightsOut
    from searchr1.weightsync import Publisher

    def make_learner(algo, optim, top):
        return Learner(cfg.model, algo, optim, cfg.trainer, groups.device, groups.trainer, cfg.seed,
                       cfg.sampling.temperature, top)

    e, lead = cfg.cluster.elastic, topo.rank == 0
    if not e.enabled:
        out = WeightsOut(channel, Publisher(groups.sync, cfg.sync, groups.device)) if lead else None
        return TrainerRole(cfg, run_dir, topo, channel, make_learner, out, splits)
    from searchr1.roles.elastic import Dispatcher, ElasticRollouts
    from searchr1.weightsync.files import FilePublisher

    if lead:  # where workers of another job find this run's store (`+join=RUN_DIR`)
        write_atomic(run_dir / "rendezvous.json", json.dumps({"host": os.environ["MASTER_ADDR"],
                                                             "port": int(os.environ["MASTER_PORT"])}))
    out = WeightsOut(channel, FilePublisher(run_dir, cfg.sync, e.full_every, groups.device)) if lead else None
    dispatcher = Dispatcher(channel, channel.liveness, e.max_attempts, e.min_rollouts, run_dir)
    rollouts = ElasticRollouts(channel, dispatcher, e.units_per_step or cfg.cluster.rollout_ranks, splits)
    return TrainerRole(cfg, run_dir, topo, channel, make_learner, out, splits, rollouts=rollouts)


def _rollout(cfg, run_dir, topo, groups, channel, splits):
    from searchr1.roles.rollout import RolloutRole
    from searchr1.roles.weights import StagedIn, WeightsIn
    from searchr1.roles.worker import Worker
    from searchr1.weightsync import Subscriber

    worker = Worker(cfg, splits, groups.device)
    sub = Subscriber(groups.sync, cfg.sync, groups.device)
    # the synchronous schedule receives straight into the engine; the others into a staging copy, in a thread
    receiver = WeightsIn if cfg.schedule.name == "sync" else StagedIn
    return RolloutRole(cfg, run_dir, topo, channel, worker,
                       lambda first: receiver(channel, sub, worker.weight_views, topo.member(0), first))


def rank_splits(cfg: Config):
    """The questions every process of a run draws from: the data with the stages' curriculum pools. A work unit
    names questions by their index in a stage's pool, so a trainer and every rollout process (fixed rank,
    elastic worker, joined worker) must hold the same pools."""
    return stage_pools(load_all(cfg.data, REPO_ROOT), cfg)


def stage_pools(splits, cfg):
    """`splits` with the stages' pools (Splits.pools: stage -> training questions) as `cfg.curriculum` says."""
    c = cfg.curriculum
    # only the reach filters need the tokenizer and the index
    pools = _reach_pools(splits, cfg) if c.warm_start == "answerable" or c.rl == "retrievable" else {}
    if c.rl == "pass_rate":
        pools["rl"] = curriculum.pass_rate_pool(c, splits.train)
    if not c.rl_copyable:
        pools["rl"] = [q for q in pools.get("rl", splits.train) if not curriculum.copyable(q)]
    if not pools:
        return splits
    per_step = {"sft": cfg.warm_start.questions_per_step, "rl": cfg.algo.questions_per_step}
    for stage, pool in pools.items():
        key = f"curriculum.{'rl' if stage == 'rl' else 'warm_start'}"
        if not pool:
            raise ValueError(f"{key}: no training question qualifies (pool of {len(splits.train)})")
        if len(pool) < per_step[stage]:  # a step would draw a question twice
            raise ValueError(f"{key}={getattr(c, 'rl' if stage == 'rl' else 'warm_start')}: {len(pool)} training "
                             f"questions qualify, fewer than the {per_step[stage]} questions per step")
    return dataclasses.replace(splits, pools=pools)


def _reach_pools(splits, cfg) -> dict:
    """The pools of curriculum.warm_start=answerable and curriculum.rl=retrievable: the questions whose answer the
    scripted trajectory's or one search's information holds."""
    from searchr1.models import load_tokenizer
    from searchr1.retrieval import format_passages, load_or_build
    from searchr1.reward import make_score
    from searchr1.scripted import scripted_episodes

    c, r, tok = cfg.curriculum, cfg.retriever, load_tokenizer(cfg.model)
    index = load_or_build(splits.corpus, r)

    def search(queries):
        return index.search(queries, r.top_k)

    def render(hits):
        return format_passages(hits, tok, r.passage_max_tokens)

    pools = {}
    if c.warm_start == "answerable":
        score = make_score(cfg.reward.name, cfg.reward.format_score, cfg.reward.scale)
        trajs, _ = scripted_episodes(splits.train, tok, search, render, cfg.agent, score)
        ok = curriculum.answerable(splits.train, trajs, tok, c.yes_no)
        pools["sft"] = [q for q, keep in zip(splits.train, ok) if keep]
    if c.rl == "retrievable":
        ok = curriculum.retrievable(splits.train, search, render, c.yes_no)
        pools["rl"] = [q for q, keep in zip(splits.train, ok) if keep]
    return pools
