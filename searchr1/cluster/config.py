"""Schemas of the cluster group: which backend runs the ranks, how many, liveness, and the Slurm request.

Part of `searchr1.config.Config` (cluster=...); kept beside the backends that read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from searchr1.checks import _check, _one_of, _positive

NCCL_DEBUG_LEVELS = {"", "VERSION", "WARN", "INFO", "TRACE"}


@dataclass
class NcclConfig:
    """NCCL's environment in every task of a Slurm job (the batch script exports it; gloo ignores it).
    An empty string or 0 leaves NCCL's or torch's own default."""

    socket_ifname: str = ""  # NCCL_SOCKET_IFNAME: bootstrap/socket interface, e.g. ib0, ^lo,docker0
    ib_disable: bool = False  # NCCL_IB_DISABLE=1: no InfiniBand/RoCE (plain Ethernet sites)
    ib_hca: str = ""  # NCCL_IB_HCA: which host channel adapters, e.g. mlx5_0,mlx5_1
    ib_timeout: int = 0  # NCCL_IB_TIMEOUT: InfiniBand verbs timeout exponent (1-31; NCCL's default is 20)
    # NCCL_DEBUG: WARN prints errors only; INFO also the transport of each peer (P2P/NVLink, SHM, NET)
    debug: str = "WARN"
    debug_subsys: str = ""  # NCCL_DEBUG_SUBSYS, e.g. INIT,P2P,NET
    # TORCH_NCCL_ASYNC_ERROR_HANDLING: 3 ends the process at once when a collective fails or exceeds
    # cluster.collective_timeout_s, without waiting for a hung communicator to abort (srun then ends the job);
    # 1 aborts the communicator first, 2 aborts it and keeps the process, 0 leaves the collective hanging.
    async_error_handling: int = 3
    # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: torch kills a process whose NCCL watchdog is stuck this long (0: torch's
    # default, 480 s)
    heartbeat_timeout_s: int = 0
    env: dict[str, str] = field(default_factory=dict)  # any other NCCL_*/TORCH_NCCL_* variable, exported as is

    def variables(self) -> dict[str, str]:
        named = {"NCCL_SOCKET_IFNAME": self.socket_ifname, "NCCL_IB_DISABLE": "1" if self.ib_disable else "",
                 "NCCL_IB_HCA": self.ib_hca, "NCCL_IB_TIMEOUT": str(self.ib_timeout or ""),
                 "NCCL_DEBUG": self.debug, "NCCL_DEBUG_SUBSYS": self.debug_subsys,
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING": str(self.async_error_handling),
                 "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(self.heartbeat_timeout_s or "")}
        return {k: v for k, v in {**named, **self.env}.items() if v != ""}

    def __post_init__(self):
        p = "cluster.slurm.nccl"
        _one_of(f"{p}.debug", self.debug, NCCL_DEBUG_LEVELS)
        _one_of(f"{p}.async_error_handling", self.async_error_handling, {0, 1, 2, 3})
        _check(self.ib_timeout == 0 or 1 <= self.ib_timeout <= 31, f"{p}.ib_timeout", self.ib_timeout,
               "must be 0 (NCCL's default) or 1-31")
        _positive(self, p, "heartbeat_timeout_s", strict=False)
        named = {"NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT", "NCCL_DEBUG",
                 "NCCL_DEBUG_SUBSYS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"}
        for key, value in self.env.items():
            _check(bool(re.fullmatch(r"(TORCH_)?NCCL_[A-Z0-9_]+", key)), f"{p}.env", key,
                   "takes NCCL_* and TORCH_NCCL_* variables only")
            _check(key not in named, f"{p}.env.{key}", value, "has a key of its own in cluster.slurm.nccl")


@dataclass
class SlurmConfig:
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    time_min: int = 240
    # CPUs of every task, trainer and rollout alike; each rank runs as many threads (OMP_NUM_THREADS)
    cpus_per_task: int = 8
    mem_per_task_gb: int = 64
    trainer_nodes: int = 1  # 1 keeps both trainer GPUs on one node (gang, NVLink)
    rollout_nodes: int = 2
    gpus_per_task: int = 1
    # node: --gpus-per-node, every task may reach each GPU of its node (NCCL P2P/NVLink between the ranks of a
    # node, also where the site constrains devices) and CUDA_VISIBLE_DEVICES names the rank's own, by local
    # rank; task: --gpus-per-task, Slurm confines each task to its own GPU (NCCL then goes through host memory)
    gpu_binding: str = "node"
    nccl: NcclConfig = field(default_factory=NcclConfig)
    # Run a copy of the code made at submission (run_dir/code, with its commit in run_dir/code.json), so that a
    # requeue after a `git pull` still runs what the run started with. false: the live checkout.
    snapshot: bool = True
    submit: bool = True  # false: write the script into the run folder and stop (a dry run)
    wait: bool = False  # block until the job ends (tests, scripts); Hydra multirun submits without waiting
    python: str = ""  # interpreter on the nodes; empty: the one running launch.py
    setup: list[str] = field(default_factory=list)  # shell lines before srun (module load ...)
    poll_s: int = 5  # seconds between state queries while waiting for the job
    # A request no partition node can hold is refused before sbatch (time, nodes, CPUs, memory, GPUs). Then a
    # waiting launcher watches the pending reasons for as long as the job pends (a per-job QOS or account limit
    # shows only there); without wait, for this many seconds after the submission.
    check_s: int = 5
    port_range: list[int] = field(default_factory=lambda: [20000, 32000])  # [lo, hi): MASTER_PORT, checked free
    # USR2 this long before the time limit: the ranks finish the step in progress, checkpoint and the job
    # requeues itself. Must cover one step plus one checkpoint.
    signal_delay_s: int = 600
    max_timeouts: int = 3  # requeues after a time limit before the job is let end (preemptions do not count)

    def __post_init__(self):
        _positive(self, "cluster.slurm", "time_min", "cpus_per_task", "mem_per_task_gb", "trainer_nodes",
                  "rollout_nodes", "gpus_per_task", "poll_s")
        _positive(self, "cluster.slurm", "check_s", "signal_delay_s", "max_timeouts", strict=False)
        _one_of("cluster.slurm.gpu_binding", self.gpu_binding, {"node", "task"})
        lo, hi = (self.port_range + [0, 0])[:2]
        _check(len(self.port_range) == 2 and 1024 <= lo < hi <= 65536, "cluster.slurm.port_range",
               self.port_range, "must be [lo, hi) with 1024 <= lo < hi <= 65536")
        _check(self.signal_delay_s < self.time_min * 60, "cluster.slurm.signal_delay_s", self.signal_delay_s,
               f"must be below the time limit (cluster.slurm.time_min={self.time_min} minutes)")


@dataclass
class ElasticConfig:
    """Rollouts outside the trainers' world (searchr1/roles/elastic.py): a rollout that dies costs its work,
    not the job; workers may join and leave mid-run."""

    enabled: bool = False
    min_rollouts: int = 1  # below this many live workers a step waits for them (it does not fail)
    max_attempts: int = 3  # a unit whose every holder died this often is lost (counted, never replaced)
    restarts: int = 3  # a dead rollout process (local) or task (Slurm) is started again in place this often
    # once the trainers ended: seconds a worker still there (frozen, restarting) gets before it is ended; live
    # workers have already left by then (they said goodbye to trainer 0)
    leave_grace_s: int = 10
    units_per_step: int = 0  # work units per step (and per evaluation); 0: one per rollout rank, as fixed
    full_every: int = 10  # a full weights file every this many versions: where a joining worker starts

    def __post_init__(self):
        _positive(self, "cluster.elastic", "min_rollouts", "max_attempts", "full_every")
        _positive(self, "cluster.elastic", "restarts", "units_per_step", "leave_grace_s", strict=False)


@dataclass
class ClusterConfig:
    backend: str = "local"  # local | slurm
    trainer_ranks: int = 2
    rollout_ranks: int = 2
    # GPUs a backend may hand out; local backend on a CPU machine: 0 (gloo, every rank on the CPU).
    gpus: int = 0
    port: int = 0  # rendezvous port; 0: a free port (local) or a free one from cluster.slurm.port_range (Slurm)
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
        if self.backend == "slurm":
            # every node of a group runs the same number of ranks (--ntasks-per-node): none idles, none is short
            for role, ranks, nodes in (("trainer", self.trainer_ranks, self.slurm.trainer_nodes),
                                       ("rollout", self.rollout_ranks, self.slurm.rollout_nodes)):
                _check(ranks % nodes == 0, f"cluster.{role}_ranks", ranks,
                       f"must be a multiple of cluster.slurm.{role}_nodes={nodes} (the same ranks on every node)")
