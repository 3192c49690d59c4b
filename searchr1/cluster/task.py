"""Inside one task of a Slurm job: the rank's environment, its stop signals, and the record of how it ended.

`python -m searchr1.cluster.task RUN_DIR` is what srun starts in every task (searchr1/cluster/script.py). It
- derives torch.distributed's variables from Slurm's (`rank_env`): one world over every het group, the
  rendezvous on the first host of group 0 (rank 0's node) at the port the batch script checked free, and with
  `gpu_binding=node` CUDA_VISIBLE_DEVICES narrowed to the rank's own GPUs by its local rank;
- runs submitit's worker (`python -m submitit.core._submit`) as its child, which unpickles `RankTask` and calls
  the job's entry; the rank's output goes to `logs/rank{R}.log`;
- records how the child ended (exit code, or the signal that killed it, and the stop signals the task was
  sent) in `logs/exits/<job>.<restart>/rank{R}.json`, which the batch script's `finish` reads to name a failed
  rank by its global rank, role and node (srun's own message gives only the index within a het group).

Slurm delivers a job's signals to every process of a step, so the child gets them itself: this process only
records them. In the child, `RankTask` turns SIGTERM (preemption) and SIGUSR2 (the time limit) into a stop
request (`searchr1.liveness.STOP`), set at once from a thread the signal wakes (not whenever the main thread
next runs Python code, which a long collective can delay), in place of submitit's own USR2 handling.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from searchr1.cluster.job import Group, Job
from searchr1.cluster.script import STOP_SIGNAL, SUBMITIT_DIR
from searchr1.config import ClusterConfig, Config
from searchr1.liveness import EXIT_STOPPED, STOP, Stopped
from searchr1.rundir import write_atomic

JOB_FILE = "slurm_job.json"  # written at submission: the job's shape, read by every task
EXITS_DIR = "exits"  # under logs/


# --------------------------------------------------------------------------------------- the environment
def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist ("gpu[07-09,12],cpu1" -> "gpu07", "r[1-2]-n[3,5]" -> "r1-n3")."""
    first = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist)[0]
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m[1])[0], first)
    if not host:
        raise ValueError(f"SLURM_JOB_NODELIST_HET_GROUP_0={nodelist!r}: no host in it")
    return host


def job_port(job_id: str, port_range: list[int]) -> int:
    """Where the search for a free rendezvous port starts: from the job id, so that two jobs sharing a node
    rarely try the same ports."""
    lo, hi = port_range
    return lo + int(job_id) % (hi - lo)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port(job_id: str, cluster: ClusterConfig, is_free=port_is_free) -> int:
    """cluster.port if set (it must be free), else the first free port of cluster.slurm.port_range from
    job_port on (wrapping around). Raises RuntimeError naming the setting when there is none."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if cluster.port:
        if not is_free(cluster.port):
            raise RuntimeError(f"cluster.port={cluster.port} is in use on {host} (rank 0's node); set another, or "
                               "0 for a free port from cluster.slurm.port_range")
        return cluster.port
    lo, hi = cluster.slurm.port_range
    start = job_port(job_id, cluster.slurm.port_range)
    for i in range(hi - lo):
        port = lo + (start - lo + i) % (hi - lo)
        if is_free(port):
            return port
    raise RuntimeError(f"no free port in cluster.slurm.port_range={cluster.slurm.port_range} on {host}")


def rank_env(slurm: Mapping[str, str], cluster: ClusterConfig, job: Job) -> dict[str, str]:
    """torch.distributed's environment for one task of the step, from Slurm's variables.

    World: the job's groups in order, as Slurm numbers a `cmd : cmd` het step. Rendezvous on the first host of
    group 0 (the rank 0 task), at MASTER_PORT from the batch script. Refuses a step whose shape differs from the
    job's: a run never starts with fewer trainers than asked for."""
    het = len(job.groups) > 1
    try:
        rank, world = int(slurm["SLURM_PROCID"]), int(slurm["SLURM_NTASKS"])
        group0 = int(slurm["SLURM_NTASKS_HET_GROUP_0"]) if het else world
        nodes0 = slurm["SLURM_JOB_NODELIST_HET_GROUP_0" if het else "SLURM_JOB_NODELIST"]
        port = slurm["MASTER_PORT"]
    except KeyError as missing:
        raise RuntimeError(f"not a task of the expected Slurm step: {missing} is not set") from None
    if group0 != job.groups[0].tasks or world != job.world:
        raise RuntimeError(f"the step has {group0} group-0 tasks of {world}; the job asks for "
                           + " + ".join(f"{g.tasks} {g.role}" for g in job.groups))
    local = int(slurm.get("SLURM_LOCALID", "0"))
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
           "MASTER_ADDR": first_host(nodes0), "MASTER_PORT": port,
           # Slurm 22.05 gives every task of a het step the last component's value: state the request
           "SLURM_CPUS_PER_TASK": str(cluster.slurm.cpus_per_task)}
    env.update(_own_gpus(slurm, cluster, local))
    return env


def _own_gpus(slurm: Mapping[str, str], cluster: ClusterConfig, local: int) -> dict[str, str]:
    visible = slurm.get("CUDA_VISIBLE_DEVICES", "")
    if cluster.gpus > 0 and cluster.slurm.gpu_binding == "node" and visible:
        # the step gives each task all its node's GPUs (so NCCL may reach them); the rank uses its own
        n = cluster.slurm.gpus_per_task
        devices = visible.split(",")
        mine = devices[local * n:(local + 1) * n]
        if len(mine) != n:
            raise RuntimeError(f"local rank {local} needs GPUs {local * n}-{(local + 1) * n - 1} of its node "
                               f"(cluster.slurm.gpus_per_task={n}); the step gives CUDA_VISIBLE_DEVICES={visible}")
        return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}
    return {}


def worker_env(slurm: Mapping[str, str], cluster: ClusterConfig, job: Job, slot: int, target: Path) -> dict[str, str]:
    """The environment of an elastic rollout worker (outside the world: no RANK, WORLD_SIZE, LOCAL_RANK), as the
    local backend gives it: the run's store (trainer rank 0's MASTER_ADDR:MASTER_PORT; for a job joining
    another run, that run's rendezvous.json, read anew at every start) and its slot (SEARCHR1_WORKER_SLOT)."""
    if job.target:
        try:
            where = json.loads((Path(target) / "rendezvous.json").read_text())
        except (OSError, ValueError) as err:
            raise RuntimeError(f"join={target}: no rendezvous.json to join ({err}); is the run elastic and "
                               "under way?") from None
        addr, port = where["host"], str(where["port"])
    else:
        try:
            addr, port = first_host(slurm["SLURM_JOB_NODELIST_HET_GROUP_0"]), slurm["MASTER_PORT"]
        except KeyError as missing:
            raise RuntimeError(f"not a task of the expected Slurm step: {missing} is not set") from None
    local = int(slurm.get("SLURM_LOCALID", "0"))
    return {"MASTER_ADDR": addr, "MASTER_PORT": port, "SEARCHR1_WORKER_SLOT": str(slot),
            "SLURM_CPUS_PER_TASK": str(cluster.slurm.cpus_per_task), **_own_gpus(slurm, cluster, local)}


def load_job(run_dir: Path) -> Job:
    """The job a run folder was submitted with (slurm_job.json, written before sbatch)."""
    j = json.loads((Path(run_dir) / JOB_FILE).read_text())["job"]
    return Job(j["entry"], tuple(Group(**g) for g in j["groups"]), j.get("prepare", ""), j.get("target", ""))


def exits_dir(run_dir: Path, job_id: str, restart: str) -> Path:
    return Path(run_dir) / "logs" / EXITS_DIR / f"{job_id}.{restart}"


# ------------------------------------------------------------------------------------------- stop signals
STOP_REASONS = {signal.SIGTERM: "SIGTERM (preemption, or scancel --signal=TERM)",
                getattr(signal, f"SIG{STOP_SIGNAL}"): f"SIG{STOP_SIGNAL} (the time limit is near: "
                                                      "cluster.slurm.signal_delay_s)"}
_stop_lock = threading.Lock()


def _request_stop(signum: int) -> None:
    with _stop_lock:
        if STOP:
            return
        STOP.set(STOP_REASONS[signum])
    stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
    print(f"[slurm] {signal.Signals(signum).name} at {stamp}: stopping at the next safe point "
          "(checkpoint, then exit 75)", flush=True)


def stop_on_signals() -> None:
    """SIGTERM and SIGUSR2 ask this rank to stop (STOP). The Python handler runs only when the main thread next
    executes Python code; the wakeup fd wakes a thread of ours at once, whatever the main thread is doing."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    for s in STOP_REASONS:
        signal.signal(s, lambda signum, frame: _request_stop(signum))
    signal.signal(signal.SIGCONT, signal.SIG_DFL)  # a preemption sends it first; submitit's handler only logs it

    def wakeups():
        while True:
            for signum in os.read(r, 64):
                if signum in STOP_REASONS:
                    _request_stop(signum)

    threading.Thread(target=wakeups, name="stop-signals", daemon=True).start()


@dataclass
class RankTask:
    """The pickled call every task runs (the same in every task; the rank comes from the environment)."""

    job: Job
    cfg: Config
    run_dir: Path

    def __call__(self):
        # replaces submitit's handlers: its USR2 requeue would run only in task 0, from the main thread
        stop_on_signals()
        from submitit.core.utils import JobPaths

        # after a requeue, this rank's result from the previous run would pass for this run's (job.done())
        JobPaths(os.environ["SUBMITIT_FOLDER"], os.environ["SLURM_JOB_ID"], int(os.environ["RANK"])).result_pickle \
            .unlink(missing_ok=True)
        try:
            return self.job.call(self.cfg, self.run_dir)
        except Stopped as stop:
            # Its state is saved: leave at once. The interpreter's teardown of a live process group and store
            # threads can abort ("terminate called without an active exception"), a SIGABRT for a clean stop.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stop.code)


# ----------------------------------------------------------------------------------------- the task itself
def _exit_like(code: int) -> int:
    """Leave as the child did: with its exit code, or killed by its signal (srun then reports the signal)."""
    if code >= 0:
        return code
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code


def _record_end(run_dir: Path, job_id: str, restart: str, rank: int | None, name: str = "", **end) -> None:
    out = exits_dir(run_dir, job_id, restart)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name or f'rank{rank}'}.json", json.dumps({"rank": rank, "at": time.time(), **end}) + "\n")


def run_over(target: Path) -> bool:
    """Whether the run in `target` has ended (its trainers' step, or the job): a worker is not started again."""
    try:
        status = json.loads((Path(target) / "status.json").read_text())
    except (OSError, ValueError):
        return False
    if status.get("state") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "STOPPED", "REQUEUED", "REJECTED"):
        return True
    if status.get("job_id") is None:
        return False
    from searchr1.cluster.script import ENDED_FILE

    return (exits_dir(target, str(status["job_id"]), str(status.get("restart", 0))) / ENDED_FILE).exists()


def run(run_dir: Path) -> int:
    from searchr1.rundir import load_config

    run_dir = Path(run_dir)
    cfg, job = load_config(run_dir), load_job(run_dir)
    # each group's step numbers its tasks from 0 (elastic rollouts: a step per group); one step over every
    # group numbers them all together
    rank = int(os.environ.get("SEARCHR1_FIRST_TASK", "0")) + int(os.environ["SLURM_PROCID"])
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job_id, restart = os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_RESTART_COUNT", "0")
    got: list[str] = []
    for s in STOP_REASONS:
        signal.signal(s, lambda signum, frame: got.append(signal.Signals(signum).name))
    if rank < job.tasks and not job.group(rank).in_world:
        return _run_worker(run_dir, cfg, job, rank, node, job_id, restart, got)
    role = job.role(rank) if rank < job.world else "(beyond the job)"
    with open(run_dir / "logs" / f"rank{rank}.log", "ab") as log:
        try:
            env = rank_env(os.environ, cfg.cluster, job)
        except RuntimeError as err:  # the step is not the job's: named in this rank's log, and so in status.json
            log.write(f"[slurm] job {job_id} restart {restart}: rank {rank} on {node}: RuntimeError: {err}\n".encode())
            _record_end(run_dir, job_id, restart, rank, role=role, node=node, pid=os.getpid(), stop_signals=got,
                        exit_code=1, signal=None)
            return 1
        log.write(f"[slurm] job {job_id} restart {restart}: rank {rank}/{env['WORLD_SIZE']} ({role}) on {node}, "
                  f"rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}, {os.environ.get('OMP_NUM_THREADS')} "
                  f"threads, {env['SLURM_CPUS_PER_TASK']} CPUs, CUDA_VISIBLE_DEVICES="
                  f"{env.get('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES', ''))}\n".encode())
        log.flush()
        child = subprocess.Popen([sys.executable, "-u", "-m", "submitit.core._submit", str(run_dir / SUBMITIT_DIR)],
                                 env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    code = child.wait()
    _record_end(run_dir, job_id, restart, rank, role=role, node=node, pid=child.pid, stop_signals=got,
                exit_code=code if code >= 0 else None, signal=signal.Signals(-code).name if code < 0 else None)
    return _exit_like(code)


def _run_worker(run_dir: Path, cfg: Config, job: Job, task: int, node: str, job_id: str, restart: str,
                got: list[str]) -> int:
    """An elastic rollout worker's task: its entry as a child (no submitit: it is no rank of the world and
    returns nothing), started again in place when it dies (not on a stop signal, not once the run is over),
    `Group.restarts` times. Every end is recorded (exits/worker{slot}.{n}.json), every start logged."""
    slot = sum(1 for t in range(task) if not job.group(t).in_world)
    group, name = job.group(task), f"worker{slot}"
    target = Path(job.target) if job.target else run_dir
    entry = group.entry or job.entry
    n = 0
    while True:
        with open(run_dir / "logs" / f"{name}.log", "ab") as log:
            try:
                env = worker_env(os.environ, cfg.cluster, job, slot, target)
            except RuntimeError as err:
                log.write(f"[slurm] job {job_id} restart {restart}: {name} on {node}: RuntimeError: {err}\n".encode())
                _record_end(run_dir, job_id, restart, None, f"{name}.{n}", role=group.role, task=name, node=node,
                            pid=os.getpid(), stop_signals=got, exit_code=1, signal=None, start=n)
                return 1
            log.write(f"[slurm] job {job_id} restart {restart}: {name} ({group.role}, outside the world) on {node}, "
                      f"start {n}, store {env['MASTER_ADDR']}:{env['MASTER_PORT']}, run {target}, "
                      f"{os.environ.get('OMP_NUM_THREADS')} threads\n".encode())
            log.flush()
            env = {k: v for k, v in {**os.environ, **env}.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            child = subprocess.Popen([sys.executable, "-u", "-m", "searchr1.cluster.job", "run", str(target), entry],
                                     env=env, stdout=log, stderr=subprocess.STDOUT)
        code = child.wait()
        _record_end(run_dir, job_id, restart, None, f"{name}.{n}", role=group.role, task=name, node=node,
                    pid=child.pid, stop_signals=got, start=n, exit_code=code if code >= 0 else None,
                    signal=signal.Signals(-code).name if code < 0 else None)
        how = f"exited {code}" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
        if code == 0 or got or code == EXIT_STOPPED or n >= group.restarts or run_over(target):
            break
        n += 1
        stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
        with open(run_dir / "logs" / f"{name}.log", "ab") as log:
            log.write(f"[slurm] {stamp} {name} {how}: started again in place ({n}/{group.restarts})\n".encode())
    return _exit_like(code)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m searchr1.cluster.task RUN_DIR   (in a task of a Slurm step)")
    sys.exit(run(Path(sys.argv[1])))
