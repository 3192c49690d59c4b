"""The Slurm tests' toy entries and helpers (tests/test_slurm.py, tests/test_slurm_cluster.py).

The toy entries ("tests.slurm_helpers:toy_...") run inside the tasks of a job, imported from the run's code
snapshot. Every wait here is bounded by the other side being alive (the job still queued or running, the
launcher still running), not by a guess of how long the work takes; HANG_S only stops a test that would
otherwise hang for ever.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from searchr1.cluster import hetjob
from searchr1.cluster.job import Group, Job
from searchr1.config import ClusterConfig, Config, SlurmConfig
from searchr1.rundir import write_atomic

REPO = Path(__file__).resolve().parent.parent
HANG_S = 600
TOY_VERSION = "as submitted"  # the snapshot test edits this line in a copy of the checkout


def make_cfg(tmp_path: Path, cluster: dict | None = None, **slurm_fields) -> Config:
    fields = dict(time_min=30, cpus_per_task=1, mem_per_task_gb=1, trainer_nodes=1, rollout_nodes=1, wait=False,
                  poll_s=1, check_s=1, signal_delay_s=60)
    fields.update(slurm_fields)
    cluster = ClusterConfig(**{"backend": "slurm", "trainer_ranks": 2, "rollout_ranks": 2, "gpus": 4,
                               "collective_timeout_s": 120, **(cluster or {})}, slurm=SlurmConfig(**fields))
    return Config(experiment="slurm_test", run_root=str(tmp_path), cluster=cluster)


def toy_job(entry: str, cfg: Config) -> Job:
    """A toy entry of this module in the shape of the training job (searchr1.cluster.job.training)."""
    c = cfg.cluster
    return Job(f"tests.slurm_helpers:{entry}", (Group("trainer", c.trainer_ranks, c.slurm.trainer_nodes),
                                               Group("rollout", c.rollout_ranks, c.slurm.rollout_nodes)))


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


# ------------------------------------------------------------------------------------ toy entries
def _join(cfg: Config):
    from searchr1 import dist

    topo = dist.topology_from_env(cfg.cluster.trainer_ranks)
    store = dist.connect_store(host=topo.rank == 0)
    dist.init(topo, store, cfg.cluster.collective_timeout_s)
    return topo, store


def _mark(run_dir: Path, topo, **extra) -> dict:
    import torch
    import torch.distributed as tdist

    import searchr1

    x = torch.tensor([float(topo.rank + 1)])
    tdist.all_reduce(x)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS",
                                          "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "NCCL_DEBUG",
                                          "TORCH_NCCL_ASYNC_ERROR_HANDLING", "SLURMD_NODENAME")}
    info = {"rank": topo.rank, "role": topo.role, "world": topo.world, "sum": x.item(), "restart": restart,
            "pid": os.getpid(), "threads": torch.get_num_threads(), "env": env, "version": TOY_VERSION,
            "module": __file__, "package": searchr1.__file__, **extra}
    marks = Path(run_dir) / "toy"
    marks.mkdir(exist_ok=True)
    # whole or not at all: the tests read the markers while the ranks write them (one read a half-written one)
    write_atomic(marks / f"rank{topo.rank}.run{restart}", json.dumps(info))
    return info


def toy_join(cfg: Config, run_dir: Path) -> dict:
    """Joins the world, all-reduces, leaves a marker; waits for the test to say `release` (so that the test
    can look at the running step)."""
    topo, store = _join(cfg)
    info = _mark(run_dir, topo)
    while not (Path(run_dir) / "release").exists():
        time.sleep(0.2)
    store.set(f"left/{topo.rank}", "1")
    if topo.rank == 0:  # the store's host leaves last
        store.wait([f"left/{r}" for r in range(topo.world)])
    return info


def toy_hang(cfg: Config, run_dir: Path) -> None:
    topo, _ = _join(cfg)
    _mark(run_dir, topo)
    time.sleep(HANG_S)


def toy_stoppable(cfg: Config, run_dir: Path) -> None:
    """Runs until a stop is requested (searchr1.liveness.STOP, set by the task's signal handlers), then stops as
    the roles do (exit 75)."""
    from searchr1.liveness import STOP, Stopped

    topo, _ = _join(cfg)
    _mark(run_dir, topo)
    while not STOP:
        time.sleep(0.1)
    print(f"toy rank {topo.rank} stopping: {STOP.reason}", flush=True)
    raise Stopped(STOP.reason)


# ------------------------------------------------------------------------- watching the cluster
def squeue(job_id: str) -> list[list[str]]:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", "-j", job_id],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines()]


def queued(job_id: str) -> bool:
    return any(state in hetjob.UNFINISHED for _, state, _ in squeue(job_id))


def until(pred, what: str, job_id: str | None = None, proc: subprocess.Popen | None = None, nudge: bool = False):
    """Poll `pred` while the job is still queued or running (and `proc` still runs). `nudge`: a requeued job is
    pending; make backfill look at it again (it may start once its credentials expire, cred_expire=10)."""
    deadline = time.monotonic() + HANG_S
    while not pred():
        if job_id and not queued(job_id) and not pred():
            raise AssertionError(f"job {job_id} ended before {what}: {squeue(job_id)}")
        if proc is not None and proc.poll() is not None and not pred():
            raise AssertionError(f"the launcher exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {HANG_S} s")
        if nudge and job_id:
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "nice=0"], capture_output=True)
        time.sleep(0.3)


def markers(run_dir: Path, run: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "toy").glob(f"rank*.run{run}"))]


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def cancel_jobs(run_root: Path) -> None:
    for path in run_root.glob("**/slurm_job.json"):
        job_id = json.loads(path.read_text()).get("job_id")
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True)


LAUNCH_TOY = """
import sys
from pathlib import Path
from searchr1 import rundir
from searchr1.cluster import slurm
from tests.slurm_helpers import make_cfg, toy_job
cfg = make_cfg(Path(sys.argv[1]), wait={wait}, max_timeouts=0)
run_dir = rundir.create(cfg)
print("run folder:", run_dir, flush=True)
sys.exit(slurm.launch(cfg, run_dir, toy_job(sys.argv[2], cfg)))
"""


def launch_toy(root: Path, run_root: Path, entry: str, wait: bool) -> tuple[subprocess.Popen, Path]:
    """launch.py's path, with a toy job, from the checkout at `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH_TOY.format(wait=wait), str(run_root), entry], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    assert first.startswith("run folder: "), first + proc.stdout.read()
    return proc, Path(first.split(": ", 1)[1].strip())


