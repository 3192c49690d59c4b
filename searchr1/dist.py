"""One torch.distributed world for every role: rank, role, the job's store, process groups and timeouts.

The cluster backends (local processes, a Slurm het job) only have to set the usual environment variables
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; everything else follows from the global rank.
World layout: trainer ranks 0..T-1, then rollout ranks T..T+R-1.

Trainer rank 0 hosts the job's TCPStore on MASTER_PORT. torch.distributed rendezvous through it (under a
prefix of its own), and the step protocol's transfers and every heartbeat travel on it (searchr1/protocol.py,
searchr1/liveness.py), so the collectives below carry tensors only: DDP between trainers and the weight
broadcast from trainer 0 to the rollouts.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    rank: int
    world: int
    n_trainer: int

    @property
    def n_rollout(self) -> int:
        return self.world - self.n_trainer

    @property
    def role(self) -> str:
        return "trainer" if self.rank < self.n_trainer else "rollout"

    @property
    def trainers(self) -> list[int]:
        return list(range(self.n_trainer))

    @property
    def rollouts(self) -> list[int]:
        return list(range(self.n_trainer, self.world))

    @property
    def rollout_index(self) -> int:
        """Position among the rollout ranks (0..R-1); -1 on a trainer."""
        return self.rank - self.n_trainer if self.role == "rollout" else -1

    @property
    def sync_members(self) -> list[int]:
        """Who takes part in a weight publication: the publishing trainer (rank 0) and every rollout rank."""
        return [0] + self.rollouts

    def member(self, rank: int | None = None) -> str:
        """A rank's name on the store (heartbeats, failures)."""
        return f"rank{self.rank if rank is None else rank}"

    def describe(self, member: str) -> str:
        """'rank 3 (rollout)' for 'rank3'; other members (elastic workers) as they are."""
        if member.startswith("rank") and member[4:].isdigit():
            r = int(member[4:])
            return f"rank {r} ({'trainer' if r < self.n_trainer else 'rollout'})"
        return member


@dataclass
class Groups:
    trainer: dist.ProcessGroup  # DDP between trainer replicas
    sync: dist.ProcessGroup  # weight publication: trainer 0 + rollout ranks
    device: torch.device


def topology_from_env(n_trainer: int, elastic: bool = False) -> Topology:
    """The rank's topology. With elastic rollouts the world is the trainers alone (the rollouts are workers)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if elastic and world != n_trainer:
        raise ValueError(f"elastic rollouts: the world must be the cluster.trainer_ranks={n_trainer} trainers, "
                         f"not {world} ranks")
    if not elastic and not 0 < n_trainer < world:
        raise ValueError(f"cluster.trainer_ranks={n_trainer} leaves no rollout rank in a world of {world}")
    return Topology(rank=rank, world=world, n_trainer=n_trainer)


def device_for_rank() -> torch.device:
    """One GPU per task: the backend restricts CUDA_VISIBLE_DEVICES or LOCAL_RANK picks among those visible."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    n = torch.cuda.device_count()
    idx = 0 if n == 1 else int(os.environ.get("LOCAL_RANK", "0")) % n
    torch.cuda.set_device(idx)
    return torch.device("cuda", idx)


def connect_store(host: bool, timeout_s: float = 300.0) -> dist.TCPStore:
    """The job's store on MASTER_ADDR:MASTER_PORT: hosted here when `host` (trainer rank 0), else a client
    connection. It accepts any number of clients (heartbeat threads; elastic workers)."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(addr, port, None, host, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def init(topo: Topology, store, collective_timeout_s: int) -> Groups:
    """Join the world through `store` and build the role groups. Every rank must call this."""
    device = device_for_rank()
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    dist.init_process_group(backend=backend, store=dist.PrefixStore("pg", store), rank=topo.rank,
                            world_size=topo.world, timeout=timeout)
    # new_group is collective: every rank creates every group, in the same order.
    trainer = dist.new_group(topo.trainers, backend=backend, timeout=timeout)
    sync = dist.new_group(topo.sync_members, backend=backend, timeout=timeout)
    return Groups(trainer=trainer, sync=sync, device=device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
