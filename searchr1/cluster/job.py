"""What a backend runs: an entry point and the groups of tasks that run it, in global rank order.

A backend (local processes, a Slurm job) starts `Job.world` tasks, gives each the torch.distributed
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and calls `entry(cfg, run_dir)` in every
one; the entry takes its role from its rank. Backends know nothing else of what runs.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from searchr1.config import Config


@dataclass(frozen=True)
class Group:
    role: str
    tasks: int
    nodes: int = 1  # Slurm: nodes for this group (het components never share a node)
    entry: str = ""  # "module:function" these tasks run instead of the job's entry
    in_world: bool = True  # false: not ranks of the torch.distributed world (elastic rollout workers)
    restarts: int = 0  # a task of this group that dies is started again in place this often


@dataclass(frozen=True)
class Job:
    entry: str  # "module:function", called as function(cfg, run_dir) in every task
    groups: tuple[Group, ...]
    prepare: str = ""  # "module:function", called once as function(cfg, run_dir) before any task starts
    target: str = ""  # the run folder the tasks work in, when not the job's own (a job joining another run)
    # modules every task imports besides its entry's: a backend that forks its tasks imports them once, first
    preload: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        """Ranks of the torch.distributed world (tasks of groups outside it are not counted)."""
        return sum(g.tasks for g in self.groups if g.in_world)

    @property
    def tasks(self) -> int:
        return sum(g.tasks for g in self.groups)

    def group(self, task: int) -> Group:
        for g in self.groups:
            if task < g.tasks:
                return g
            task -= g.tasks
        raise ValueError(f"task beyond the job's {self.tasks} tasks")

    def role(self, task: int) -> str:
        return self.group(task).role

    def call(self, cfg: Config, run_dir: Path):
        return _resolve(self.entry)(cfg, Path(run_dir))

    def run_prepare(self, cfg: Config, run_dir: Path) -> None:
        if self.prepare:
            _resolve(self.prepare)(cfg, Path(run_dir))


def _resolve(name: str):
    module, _, fn = name.partition(":")
    return getattr(importlib.import_module(module), fn)


# What every rank loads the policy with: transformers' model classes are 4 of the ~7 s of CPU a rank spends
# importing (the entry modules import torch themselves, transformers only when loading a model).
POLICY_MODULES = ("transformers.modeling_utils", "transformers.models.auto.modeling_auto")


def training(cfg: Config) -> Job:
    """The training job: trainer ranks, then rollout ranks (searchr1.roles.run_rank); with elastic rollouts,
    the rollouts are restartable workers outside the world (searchr1.roles.elastic.run_worker)."""
    c, e = cfg.cluster, cfg.cluster.elastic
    rollouts = (Group("rollout", c.rollout_ranks, c.slurm.rollout_nodes, entry=WORKER, in_world=False,
                      restarts=e.restarts) if e.enabled else Group("rollout", c.rollout_ranks, c.slurm.rollout_nodes))
    return Job("searchr1.roles:run_rank", (Group("trainer", c.trainer_ranks, c.slurm.trainer_nodes), rollouts),
               prepare="searchr1.roles:prepare", preload=POLICY_MODULES)


def joining(cfg: Config) -> Job:
    """`join=RUN_DIR`: rollout workers (cluster.rollout_ranks of them) that join a running elastic run, work in
    its folder, and leave when it ends (or when stopped)."""
    c = cfg.cluster
    return Job(WORKER, (Group("rollout", c.rollout_ranks, c.slurm.rollout_nodes, in_world=False,
                              restarts=c.elastic.restarts),), target=cfg.join, preload=POLICY_MODULES)


WORKER = "searchr1.roles.elastic:run_worker"


def evaluation(cfg: Config) -> Job:
    """`mode=eval`: one task with one engine and one index (searchr1.apps.evaluate.main)."""
    return Job("searchr1.apps.evaluate:main", (Group("evaluator", 1, 1),), prepare="searchr1.roles:prepare",
               preload=POLICY_MODULES)


def pass_rates(cfg: Config) -> Job:
    """`mode=pass_rate`: one task with one engine and one index (searchr1.apps.pass_rate.main)."""
    return Job("searchr1.apps.pass_rate:main", (Group("evaluator", 1, 1),), prepare="searchr1.roles:prepare",
               preload=POLICY_MODULES)


def _cli(argv: list[str]) -> int:
    """`python -m searchr1.cluster.job prepare RUN_DIR module:function`: a batch script's preparation step;
    `... run RUN_DIR module:function`: an entry with the run's config (an elastic worker in a Slurm task)."""
    from searchr1.rundir import load_config

    if len(argv) != 3 or argv[0] not in ("prepare", "run"):
        raise SystemExit("usage: python -m searchr1.cluster.job prepare|run RUN_DIR module:function")
    run_dir = Path(argv[1])
    _resolve(argv[2])(load_config(run_dir), run_dir)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_cli(sys.argv[1:]))
