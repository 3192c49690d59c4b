"""Schemas of the cluster group: which backend runs the ranks, how many, liveness, and the Slurm request.

Part of `searchr1.config.Config` (cluster=...); kept beside the backends that read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from searchr1.checks import _check, _one_of, _positive


@dataclass
class SlurmConfig:
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    time_min: int = 240
    cpus_per_task: int = 8
    mem_per_task_gb: int = 64
    trainer_nodes: int = 1  # 1 keeps both trainer GPUs on one node (gang, NVLink)
    rollout_nodes: int = 2
    gpus_per_task: int = 1
    submit: bool = True  # false: write the script into the run folder and stop (a dry run)
    wait: bool = False  # block until the job ends (tests, scripts); Hydra multirun submits without waiting
    python: str = ""  # interpreter on the nodes; empty: the one running launch.py
    setup: list[str] = field(default_factory=list)  # shell lines before srun (module load ...)
    poll_s: int = 5  # seconds between state queries while waiting for the job
    # After sbatch accepts the job, watch it this long for a pending reason that never clears
    # (BadConstraints, PartitionTimeLimit, a per-job QOS limit...): such a job is cancelled and reported.
    check_s: int = 5
    port_range: list[int] = field(default_factory=lambda: [20000, 32000])  # [lo, hi): MASTER_PORT from the job id
    signal_delay_s: int = 90  # USR2 this long before the time limit: submitit checkpoints and requeues
    max_timeouts: int = 3  # requeues after a time-out before the job is let die

    def __post_init__(self):
        _positive(self, "cluster.slurm", "time_min", "cpus_per_task", "mem_per_task_gb", "trainer_nodes",
                  "rollout_nodes", "gpus_per_task", "poll_s")
        _positive(self, "cluster.slurm", "check_s", "signal_delay_s", "max_timeouts", strict=False)
        lo, hi = (self.port_range + [0, 0])[:2]
        _check(len(self.port_range) == 2 and 1024 <= lo < hi <= 65536, "cluster.slurm.port_range",
               self.port_range, "must be [lo, hi) with 1024 <= lo < hi <= 65536")


@dataclass
class ElasticConfig:
    """Rollouts outside the trainers' world (searchr1/roles/elastic.py): a rollout that dies costs its work,
    not the job; workers may join and leave mid-run."""

    enabled: bool = False
    min_rollouts: int = 1  # below this many live workers a step waits for them (it does not fail)
    max_attempts: int = 3  # a unit whose every holder died this often is lost (counted, never replaced)
    restarts: int = 3  # local backend: a dead rollout process is started again in place this often
    units_per_step: int = 0  # work units per step (and per evaluation); 0: one per rollout rank, as fixed
    full_every: int = 10  # a full weights file every this many versions: where a joining worker starts

    def __post_init__(self):
        _positive(self, "cluster.elastic", "min_rollouts", "max_attempts", "full_every")
        _positive(self, "cluster.elastic", "restarts", "units_per_step", strict=False)


@dataclass
class ClusterConfig:
    backend: str = "local"  # local | slurm
    trainer_ranks: int = 2
    rollout_ranks: int = 2
    # GPUs a backend may hand out; local backend on a CPU machine: 0 (gloo, every rank on the CPU).
    gpus: int = 0
    port: int = 0  # rendezvous port; 0: a free port (local) or one derived from the job id (Slurm)
    # Liveness (searchr1/liveness.py): every rank beats this often from a thread of its own, whatever it is
    # doing; a rank silent for heartbeat_timeout_s is dead. A slow rank that still beats is waited for.
    heartbeat_period_s: float = 2.0
    heartbeat_timeout_s: float = 120.0
    # A collective that blocks longer than this ends the job. A last resort only: every wait for the other
    # role happens on the store, bounded by liveness, before the collective is entered.
    collective_timeout_s: int = 7200
    # Local backend, CPU: alternate = each role spreads over every core (the roles take turns in the
    # synchronous schedule); split = trainers and rollouts get cores of their own (overlapping schedules).
    placement: str = "alternate"
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def __post_init__(self):
        _one_of("cluster.backend", self.backend, {"local", "slurm"})
        _positive(self, "cluster", "trainer_ranks", "rollout_ranks", "heartbeat_period_s", "collective_timeout_s")
        _positive(self, "cluster", "gpus", strict=False)
        _check(self.heartbeat_timeout_s >= 3 * self.heartbeat_period_s, "cluster.heartbeat_timeout_s",
               self.heartbeat_timeout_s, f"must be >= 3 x cluster.heartbeat_period_s={self.heartbeat_period_s}")
        _one_of("cluster.placement", self.placement, {"alternate", "split"})
        if self.gpus > 0:
            _check(self.trainer_ranks <= self.gpus, "cluster.trainer_ranks", self.trainer_ranks,
                   f"more trainer ranks than GPUs (cluster.gpus={self.gpus})")
            _check(self.trainer_ranks + self.rollout_ranks <= self.gpus, "cluster.rollout_ranks",
                   self.rollout_ranks,
                   f"trainer_ranks + rollout_ranks exceeds cluster.gpus={self.gpus} (one GPU per rank)")
