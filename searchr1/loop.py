"""The synchronous training loop, both sides of one protocol, run by every rank of the job.

Each rank calls `run_rank(cfg, run_dir)` once the backend has set RANK/WORLD_SIZE/MASTER_*; the role follows
from the global rank (trainers first). Models, engines, indexes and optimizer state are built once and live
through every step; between steps only weights move. One step:

    rollout ranks                                 trainer ranks
    questions[chunk r] x group_size, local BM25   (wait)
    gather (trajectories, metrics) ─────────────► rank 0 ─► fan out to every trainer
    (wait)                                        advantages, clipped loss, DDP update
    receive, apply in place, verify ◄──────────── rank 0 publishes bf16 weights (delta | full)
    evaluate held-out (when due) ───────────────► rank 0 writes predictions
    per-rank phase times ───────────────────────► rank 0 writes metrics.jsonl + wandb, checkpoints

Objects travel on the gloo `ctrl` group; tensors (DDP, weights) on NCCL when there are GPUs. A rank that
raises logs its traceback and exits non-zero at once; the backend then ends the others, and collective
timeouts (cluster.timeout_s) bound any wait.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

from searchr1 import dist
from searchr1.config import Config
from searchr1.data import load_splits, step_questions
from searchr1.rundir import REPO_ROOT
from searchr1.weightsync import Publisher, Subscriber

log = logging.getLogger("searchr1")
USEFUL = ("rollout", "train", "eval")  # phases that count as useful work; the rest is transfer, sync, waiting


class PhaseTimer:
    def __init__(self):
        self.s = defaultdict(float)
        self.t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.s[phase] += time.perf_counter() - t

    def add(self, phase: str, seconds: float) -> None:
        self.s[phase] += seconds

    def close(self) -> dict:
        wall = time.perf_counter() - self.t0
        return {**self.s, "wait": max(0.0, wall - sum(self.s.values())), "wall": wall}


def eval_due(done: int, cfg: Config) -> bool:
    if done == 0:
        return cfg.eval_before
    return done == cfg.steps or (cfg.eval_every > 0 and done % cfg.eval_every == 0)


def chunk(n: int, parts: int, i: int) -> range:
    """The i-th of `parts` contiguous, near-equal slices of range(n)."""
    q, r = divmod(n, parts)
    start = i * q + min(i, r)
    return range(start, start + q + (i < r))


def _setup_logging(topo: dist.Topology) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format=f"%(asctime)s [rank {topo.rank} {topo.role}] %(message)s", datefmt="%H:%M:%S")


def run_rank(cfg: Config, run_dir: Path) -> None:
    run_dir = Path(run_dir)
    topo = dist.topology_from_env(cfg.cluster.trainer_ranks)
    _setup_logging(topo)
    expected = cfg.cluster.trainer_ranks + cfg.cluster.rollout_ranks
    try:
        if topo.world != expected:
            raise ValueError(f"world size {topo.world} != cluster.trainer_ranks + cluster.rollout_ranks = {expected}")
        random.seed(cfg.seed + topo.rank)
        np.random.seed(cfg.seed + topo.rank)
        torch.manual_seed(cfg.seed + topo.rank)
        groups = dist.init(topo, cfg.cluster.timeout_s)
        log.info("joined world of %d on %s", topo.world, groups.device)
        splits = load_splits(cfg.data, REPO_ROOT)
        role = Trainer if topo.role == "trainer" else Rollout
        role(cfg, run_dir, topo, groups, splits).run()
    except SystemExit as stop:  # submitit's requeue on preemption exits this way: not a failure of ours
        log.info("exiting (%s)", stop.code)
        raise
    except BaseException:
        # Exit now: a rank blocked in a collective with us would otherwise wait out the whole timeout.
        log.exception("rank %d (%s) failed", topo.rank, topo.role)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(1)
    dist.shutdown()


class _Role:
    def __init__(self, cfg: Config, run_dir: Path, topo: dist.Topology, groups: dist.Groups, splits):
        self.cfg, self.run_dir, self.topo, self.g, self.splits = cfg, run_dir, topo, groups, splits

    def bcast(self, obj=None):
        box = [obj]
        tdist.broadcast_object_list(box, src=0, group=self.g.ctrl)
        return box[0]

    def arrive(self):
        """Meet every rank before a transfer, so that waiting for the other role (untimed: it lands in the
        step's `wait`) is not booked as transfer time."""
        tdist.barrier(group=self.g.ctrl)

    def gather(self, obj):
        """Every rank's obj, in rank order, on rank 0 (None elsewhere)."""
        out = [None] * self.topo.world if self.topo.rank == 0 else None
        tdist.gather_object(obj, out, dst=0, group=self.g.ctrl)
        return out


class Rollout(_Role):
    def run(self):
        from searchr1.rollout import RolloutWorker

        cfg, topo = self.cfg, self.topo
        worker = RolloutWorker(cfg, self.splits, self.g.device)
        sub = Subscriber(self.g.sync, cfg.sync, self.g.device)
        start = self.bcast()
        sub.receive(worker.weight_views())  # the first publication is always a full export
        version = start
        if start == 0 and eval_due(0, cfg):
            self.evaluate(worker, PhaseTimer())
        train, per_step = self.splits.train, cfg.algo.questions_per_step
        for step in range(start, cfg.steps):
            t = PhaseTimer()
            idx = step_questions(len(train), step, per_step, cfg.seed)
            mine = chunk(per_step, topo.n_rollout, topo.rollout_index)
            with t("rollout"):
                trajs, metrics = worker.rollout([train[idx[i]] for i in mine], mine.start, version,
                                                seed=cfg.seed * 100_003 + step * 1_009 + topo.rollout_index)
            self.arrive()
            with t("transfer"):
                self.gather((trajs, metrics))
            got = sub.receive(worker.weight_views())  # blocks while the trainers train: that part is waiting
            t.add("sync", got["sync/apply_s"] + got["sync/verify_s"])
            version = step + 1
            if eval_due(step + 1, cfg):
                self.evaluate(worker, t)
            self.gather({"times": t.close()})

    def evaluate(self, worker, t: PhaseTimer):
        heldout = self.splits.heldout
        mine = chunk(len(heldout), self.topo.n_rollout, self.topo.rollout_index)
        with t("eval"):
            preds, _ = worker.evaluate([heldout[i] for i in mine])
        self.gather(preds)


class Trainer(_Role):
    def run(self):
        from searchr1.trainer import Trainer as Learner

        cfg, topo = self.cfg, self.topo
        self.learner = Learner(cfg.model, cfg.algo, self.g.device, self.g.trainer, cfg.seed)
        start = self._resume()
        self.bcast(start)
        lead = topo.rank == 0
        pub = Publisher(self.g.sync, cfg.sync, self.g.device) if lead else None
        writer = self._writer(resume=start > 0) if lead else None
        if lead:
            self._write_data_manifest()
            pub.publish(self.learner.bf16_weights(), version=start)
        if start == 0 and eval_due(0, cfg):
            self.evaluate(0, writer)
        for step in range(start, cfg.steps):
            t = PhaseTimer()
            self.arrive()
            with t("transfer"):
                got = self.gather(None)
                box = [[(tr, m) for tr, m in got[topo.n_trainer:]] if lead else None]
                tdist.broadcast_object_list(box, src=0, group=self.g.trainer_ctrl)
            trajs = [tr for part, _ in box[0] for tr in part]
            with t("train"):
                train_m = self.learner.step(trajs)
            pub_m = {}
            if lead:
                with t("sync"):
                    weights = self.learner.bf16_weights()
                    pub_m = pub.publish(weights, version=step + 1)
            done = step + 1
            if done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
                with t("checkpoint"):
                    self._checkpoint(done)
            if eval_due(done, cfg):
                self.evaluate(done, writer)
            ranks = self.gather({"times": t.close()})
            if lead:
                writer.log(self._record(done, trajs, [m for _, m in box[0]], train_m, pub_m, ranks))
        if lead:
            self._finish(writer)

    def _resume(self) -> int:
        for root in (self.run_dir, Path(self.cfg.resume) if self.cfg.resume else None):
            latest = root / "checkpoints" / "latest" if root else None
            if latest and latest.is_file():
                path = latest.parent / latest.read_text().strip()
                extra = self.learner.load_checkpoint(path)
                log.info("resumed from %s at step %d", path, extra["step"])
                return int(extra["step"])
        return 0

    def _checkpoint(self, done: int) -> None:
        """Every trainer rank takes part (rank 0 writes, the replicas wait for it); rank 0 moves the pointer."""
        ckpts = self.run_dir / "checkpoints"
        name = f"step_{done:06d}"
        self.learner.save_checkpoint(ckpts / name, {"step": done, "version": done})
        if self.topo.rank != 0:
            return
        tmp = ckpts / "latest.tmp"
        tmp.write_text(name + "\n")
        tmp.replace(ckpts / "latest")  # the pointer moves only once the checkpoint is complete
        for old in sorted(p for p in ckpts.glob("step_*") if p.is_dir())[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _writer(self, resume: bool):
        from searchr1.metrics import MetricsWriter

        return MetricsWriter(self.cfg, self.run_dir, resume=resume)

    def _write_data_manifest(self) -> None:
        s = self.splits
        manifest = {"train_questions": len(s.train), "heldout_questions": len(s.heldout),
                    "corpus_passages": len(s.corpus), "corpus_scope": s.corpus_scope,
                    "train_files": self.cfg.data.train_files, "eval_file": self.cfg.data.eval_file,
                    "heldout_ids": [q.qid for q in s.heldout]}
        (self.run_dir / "data.json").write_text(json.dumps(manifest, indent=1) + "\n")

    def evaluate(self, done: int, writer):
        got = self.gather(None)
        if self.topo.rank != 0:
            return
        preds = [p for part in got[self.topo.n_trainer:] for p in part]
        out = self.run_dir / "predictions"
        out.mkdir(exist_ok=True)
        with open(out / f"step_{done:06d}.jsonl", "w") as f:
            for p in preds:
                f.write(json.dumps(p) + "\n")
        n = len(preds)
        em = sum(p["em"] for p in preds)
        rec = {"kind": "eval", "step": done, "eval/n": n, "eval/em_count": int(em), "eval/em": em / max(n, 1),
               "eval/f1": sum(p["f1"] for p in preds) / max(n, 1),
               "eval/searches": sum(p["searches"] for p in preds) / max(n, 1),
               "eval/answer_rate": sum(p.get("prediction") is not None for p in preds) / max(n, 1)}
        writer.log(rec)
        log.info("held-out EM after %d steps: %d/%d (%.1f%%), F1 %.3f", done, em, n, 100 * rec["eval/em"], rec["eval/f1"])

    def _record(self, done, trajs, rollout_ms, train_m, pub_m, ranks) -> dict:
        n = max(len(trajs), 1)
        rec = {"kind": "train", "step": done, "policy_version": done, "trajectories": len(trajs),
               "reward": sum(t.reward for t in trajs) / n, "em": sum(t.em for t in trajs) / n,
               "f1": sum(t.f1 for t in trajs) / n,
               "answer_rate": sum(t.prediction is not None for t in trajs) / n,
               "searches": sum(t.searches for t in trajs) / n, "turns": sum(t.turns for t in trajs) / n,
               "generated_tokens": sum(t.generated_tokens for t in trajs),
               "info_tokens": sum(t.info_tokens for t in trajs)}
        for key in sorted({k for m in rollout_ms for k in m}):
            vals = [m[key] for m in rollout_ms if isinstance(m.get(key), (int, float))]
            if vals:  # counts add up; rollout ranks get equal shares, so a mean of their means is the batch mean
                summed = "malformed/" in key or key.endswith("trajectories")
                rec[key if "/" in key else f"rollout/{key}"] = sum(vals) if summed else sum(vals) / len(vals)
        gen_s = rec.get("rollout/generation_s", 0.0)
        rec["rollout/retrieval_to_generation"] = rec.get("rollout/retrieval_s", 0.0) / gen_s if gen_s else 0.0
        rec.update({k if "/" in k else f"train/{k}": v for k, v in train_m.items()})
        rec.update({k if "/" in k else f"sync/{k}": v for k, v in pub_m.items()})
        # The publisher's metrics already carry the slowest receiver's apply and verify times.
        wall = ranks[0]["times"]["wall"]
        useful = 0.0
        for role, members in (("trainer", ranks[: self.topo.n_trainer]), ("rollout", ranks[self.topo.n_trainer:])):
            phases = {k for r in members for k in r["times"]}
            for ph in sorted(phases):
                rec[f"time/{role}/{ph}_s"] = sum(r["times"].get(ph, 0.0) for r in members) / len(members)
            useful += sum(r["times"].get(ph, 0.0) for r in members for ph in USEFUL)
        rec["time/step_s"] = wall
        rec["useful_work_fraction"] = useful / (self.topo.world * wall) if wall > 0 else 0.0
        return rec

    def _finish(self, writer) -> None:
        from searchr1.metrics import read_metrics

        writer.close()
        evals = [r for r in read_metrics(self.run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
        summary = {"run_dir": str(self.run_dir), "steps": self.cfg.steps, "evals": evals}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        if evals:
            first, last = evals[0], evals[-1]
            log.info("held-out EM before (step %d): %d/%d, after (step %d): %d/%d", first["step"],
                     first["eval/em_count"], first["eval/n"], last["step"], last["eval/em_count"], last["eval/n"])
        log.info("run folder: %s", self.run_dir)
