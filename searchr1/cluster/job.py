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


@dataclass(frozen=True)
class Job:
    entry: str  # "module:function", called as function(cfg, run_dir) in every task
    groups: tuple[Group, ...]
    prepare: str = ""  # "module:function", called once as function(cfg, run_dir) before any task starts

    @property
    def world(self) -> int:
        return sum(g.tasks for g in self.groups)

    def role(self, rank: int) -> str:
        for g in self.groups:
            if rank < g.tasks:
                return g.role
            rank -= g.tasks
        raise ValueError(f"rank beyond the job's {self.world} tasks")

    def call(self, cfg: Config, run_dir: Path):
        return _resolve(self.entry)(cfg, Path(run_dir))

    def run_prepare(self, cfg: Config, run_dir: Path) -> None:
        if self.prepare:
            _resolve(self.prepare)(cfg, Path(run_dir))


def _resolve(name: str):
    module, _, fn = name.partition(":")
    return getattr(importlib.import_module(module), fn)


def training(cfg: Config) -> Job:
    """The training job: trainer ranks, then rollout ranks (searchr1.roles.run_rank)."""
    c = cfg.cluster
    return Job("searchr1.roles:run_rank", (Group("trainer", c.trainer_ranks, c.slurm.trainer_nodes),
                                           Group("rollout", c.rollout_ranks, c.slurm.rollout_nodes)),
               prepare="searchr1.roles:prepare")


def evaluation(cfg: Config) -> Job:
    """`mode=eval`: one task with one engine and one index (searchr1.apps.evaluate.main)."""
    return Job("searchr1.apps.evaluate:main", (Group("evaluator", 1, 1),), prepare="searchr1.roles:prepare")


def _cli(argv: list[str]) -> int:
    """`python -m searchr1.cluster.job prepare RUN_DIR module:function`: a batch script's preparation step."""
    from searchr1.rundir import load_config

    if len(argv) != 3 or argv[0] != "prepare":
        raise SystemExit("usage: python -m searchr1.cluster.job prepare RUN_DIR module:function")
    run_dir = Path(argv[1])
    _resolve(argv[2])(load_config(run_dir), run_dir)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_cli(sys.argv[1:]))
