"""submitit extended to one heterogeneous Slurm job: het group 0 = trainer ranks, group 1 = rollout ranks.

submitit (1.5.4) has no heterogeneous jobs. This module extends it only where it must:
- `HetSlurmExecutor` writes the batch script itself: one `#SBATCH` block per het component, a bare
  `#SBATCH hetjob` line between them, and one `srun --het-group=0-1` step over both, so that Slurm numbers all
  tasks in one sequence (SLURM_PROCID, group 0 first). submitit keeps doing the rest: it pickles the function,
  runs it in every task (`python -m submitit.core._submit`), writes one result pickle per task, and on USR2
  (preemption, time limit) calls the function's `checkpoint` in task 0 and requeues the whole job.
- Three submitit defaults hang a het step (Slurm 22.05): `%j` in srun's output paths expands to each
  component's own job id (component 1's folder never exists), `%t` to the global rank plus the group index,
  and sacct labels the components `N+0`, `N+1` (submitit looks for `N` and waits forever). So each task's own
  shell names its log `logs/rank$SLURM_PROCID.log`, and `HetWatcher` folds the `N+k` rows into N, reading
  `squeue --states=all` when the cluster keeps no accounting.
- `RankTask` is what every task runs: torch.distributed's variables from Slurm's, then the job's entry
  (searchr1/cluster/job.py). A requeued job runs the same call again; the entry resumes from the run folder's
  last checkpoint by itself. A job of one group (mode=eval) is a plain job: no `hetjob` line, no het step.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from submitit.core.utils import JobPaths
from submitit.helpers import DelayedSubmission
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob, SlurmJobEnvironment

from searchr1.cluster.job import Job
from searchr1.config import ClusterConfig, Config, SlurmConfig
from searchr1.rundir import REPO_ROOT

# inside the run folder, next to logs/ (RankLogPaths relies on that)
SUBMITIT_DIR = "submitit"

# Job states after which the job may still run or run again (Slurm's list; submitit's misses several).
# UNKNOWN: not listed yet.
UNFINISHED = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
    "SUSPENDED", "PREEMPTED", "SIGNALING", "STAGE_OUT", "STOPPED", "UNKNOWN",
})
# The job ended more than MinJobAge ago: squeue no longer lists it and there is no accounting to ask.
ENDED = "ENDED"


# ---------------------------------------------------------------------------------------------- the script
@dataclass(frozen=True)
class Component:
    """One het group: a role's tasks, one per rank."""

    group: int
    role: str
    first_rank: int
    tasks: int
    nodes: int


def components(job: Job) -> list[Component]:
    out, first = [], 0
    for i, g in enumerate(job.groups):
        out.append(Component(i, g.role, first, g.tasks, g.nodes))
        first += g.tasks
    return out


def component_options(cluster: ClusterConfig, comp: Component) -> dict[str, object]:
    """sbatch options of one het component. cluster.gpus=0 asks for no GPU (CPU tasks, gloo)."""
    s = cluster.slurm
    opts: dict[str, object] = {k: getattr(s, k) for k in ("partition", "account", "qos", "constraint")
                               if getattr(s, k)}
    opts.update(time=s.time_min, nodes=comp.nodes, ntasks=comp.tasks, cpus_per_task=s.cpus_per_task,
                # memory per task, spread over its CPUs (rounded up): the same for any gpus_per_task
                mem_per_cpu=f"{-(-s.mem_per_task_gb * 1024 // s.cpus_per_task)}M")
    if cluster.gpus > 0:
        # one device per task: each task then sees only its own GPU in CUDA_VISIBLE_DEVICES
        opts["gpus_per_task"] = s.gpus_per_task
    return opts


def _sbatch_lines(opts: Mapping[str, object]) -> list[str]:
    lines = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        lines.append(f"#SBATCH {flag}" if value is True else f"#SBATCH {flag}={shlex.quote(str(value))}")
    return lines


def python_command(s: SlurmConfig) -> str:
    return s.python or shlex.quote(sys.executable)


def task_command(python: str, folder: Path) -> str:
    """What every task runs: submitit's worker, which loads the pickled call and pickles its result."""
    return f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}"


def render_script(cfg: Config, run_dir: Path, command: str, job: Job) -> str:
    """The batch script: job-wide options, the het components, setup lines, the job's preparation (caches built
    once, before any task starts), one srun over every group."""
    run_dir = Path(run_dir)
    logs = run_dir / "logs"
    c = cfg.cluster
    job_wide = {"job_name": f"searchr1-{run_dir.name}", "output": logs / "batch.log", "open_mode": "append",
                "requeue": True, "signal": f"{SlurmJobEnvironment.USR_SIG}@{c.slurm.signal_delay_s}"}
    lines = ["#!/bin/bash",
             f"# searchr1 run {run_dir}: one heterogeneous job (written by searchr1.cluster.slurm)",
             *_sbatch_lines(job_wide)]
    comps = components(job)
    for comp in comps:
        if comp.group:
            lines.append("#SBATCH hetjob")
        last = comp.first_rank + comp.tasks - 1
        lines.append(f"# het group {comp.group}: {comp.role} ranks {comp.first_rank}-{last}")
        lines += _sbatch_lines(component_options(c, comp))
    if c.slurm.setup:
        lines += ["", "# setup (cluster.slurm.setup)", *c.slurm.setup]
    # the task's shell expands $SLURM_PROCID; srun's own %t would add the het group index
    per_task = f"exec {command} >> {shlex.quote(str(logs))}/rank${{SLURM_PROCID}}.log 2>&1"
    groups = f" --het-group=0-{len(comps) - 1}" if len(comps) > 1 else ""
    python = python_command(c.slurm)
    lines += ["",
              "export SUBMITIT_EXECUTOR=slurm",
              f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
              "# caches every task loads (model export, index, kernel), built once before any task starts",
              f"{python} -m searchr1.cluster.job prepare {shlex.quote(str(run_dir))} {shlex.quote(job.prepare)} "
              f">> {shlex.quote(str(logs))}/prepare.log 2>&1 || exit 1" if job.prepare else "",
              "# one step over every group: one global rank per task, in group order;",
              "# one task failing ends them all",
              f"srun{groups} --kill-on-bad-exit=1 bash -c {shlex.quote(per_task)}",
              ""]
    return "\n".join(lines)


def batch_script(cfg: Config, run_dir: Path, job: Job) -> str:
    """What HetSlurmExecutor submits for run_dir, rendered without Slurm (a dry run writes it too)."""
    command = task_command(python_command(cfg.cluster.slurm), Path(run_dir) / SUBMITIT_DIR)
    return render_script(cfg, run_dir, command, job)


# ------------------------------------------------------------------------------------------- inside a task
def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist ("gpu[07-09,12],cpu1" -> "gpu07", "r[1-2]-n[3,5]" -> "r1-n3")."""
    first = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist)[0]
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m[1])[0], first)
    if not host:
        raise ValueError(f"SLURM_JOB_NODELIST_HET_GROUP_0={nodelist!r}: no host in it")
    return host


def job_port(job_id: str, port_range: list[int]) -> int:
    """A rendezvous port from the job id: two jobs sharing a node rarely collide, a requeued job keeps it."""
    lo, hi = port_range
    return lo + int(job_id) % (hi - lo)


def rank_env(slurm: Mapping[str, str], cluster: ClusterConfig, job: Job) -> dict[str, str]:
    """torch.distributed's environment for one task of the step, from Slurm's variables.

    World: the job's groups in order, as Slurm numbers a `--het-group=0-k` step. Rendezvous on the first host
    of group 0 (the rank 0 task). Refuses a step whose shape differs from the job's: a run never starts with
    fewer trainers than asked for."""
    het = len(job.groups) > 1
    try:
        rank, world = int(slurm["SLURM_PROCID"]), int(slurm["SLURM_NTASKS"])
        group0 = int(slurm["SLURM_NTASKS_HET_GROUP_0"]) if het else world
        nodes0 = slurm["SLURM_JOB_NODELIST_HET_GROUP_0" if het else "SLURM_JOB_NODELIST"]
        job_id = slurm["SLURM_JOB_ID"]
    except KeyError as missing:
        raise RuntimeError(f"not a task of the expected Slurm step: {missing} is not set") from None
    if group0 != job.groups[0].tasks or world != job.world:
        raise RuntimeError(f"the step has {group0} group-0 tasks of {world}; the job asks for "
                           + " + ".join(f"{g.tasks} {g.role}" for g in job.groups))
    port = cluster.port or job_port(job_id, cluster.slurm.port_range)
    # torch would start one thread per core of the node, whatever Slurm gave the task
    threads = slurm.get("OMP_NUM_THREADS") or slurm.get("SLURM_CPUS_PER_TASK", "1")
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": slurm.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": first_host(nodes0), "MASTER_PORT": str(port), "OMP_NUM_THREADS": threads}


@dataclass
class RankTask:
    """The pickled call every task runs (the same in every task; the rank comes from the environment)."""

    job: Job
    cfg: Config
    run_dir: Path

    def __call__(self):
        env = rank_env(os.environ, self.cfg.cluster, self.job)
        os.environ.update(env)
        # after a requeue, this rank's result from the previous run would pass for this run's (job.done())
        JobPaths(os.environ["SUBMITIT_FOLDER"], os.environ["SLURM_JOB_ID"], int(env["RANK"])).result_pickle.unlink(
            missing_ok=True)
        role = self.job.role(int(env["RANK"]))
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(f"[slurm] job {os.environ['SLURM_JOB_ID']} restart {os.environ.get('SLURM_RESTART_COUNT', '0')}: "
              f"rank {env['RANK']}/{env['WORLD_SIZE']} ({role}) on {node}, "
              f"rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}", flush=True)
        return self.job.call(self.cfg, self.run_dir)

    def checkpoint(self) -> DelayedSubmission:
        """submitit calls this in task 0 on USR2 (preemption, time limit), then requeues the job: the requeued
        job makes the same call, and the entry resumes from the run folder's last checkpoint."""
        return DelayedSubmission(self)


# ------------------------------------------------------------------------------------------- submitit parts
@functools.lru_cache(maxsize=None)
def accounting_enabled() -> bool:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"^AccountingStorageType\s*=\s*(\S+)", out, re.M)
    return bool(m) and m[1] != "accounting_storage/none"


def combined_state(states: list[str]) -> str:
    """One state for a het job from its components' (group 0 first)."""
    unfinished = [s for s in states if s in UNFINISHED]
    if unfinished:
        return "RUNNING" if "RUNNING" in unfinished else unfinished[0]
    return next((s for s in states if s != "COMPLETED"), "COMPLETED")


def merge_components(rows: list[tuple[str, str, str]]) -> dict[str, dict[str, str]]:
    """sacct/squeue rows (job id, state, nodes) -> {job id: info}, folding het components `N+k` into N.

    sacct sometimes labels component 0 plain `N` right after the end; steps (`N.batch`, `N+1.0`) are skipped."""
    parts: dict[str, dict[int, tuple[str, str]]] = {}
    for job_id, state, nodes in rows:
        m = re.fullmatch(r"(\d+)(?:\+(\d+))?", job_id.strip())
        if m:  # "CANCELLED by 0" -> CANCELLED
            parts.setdefault(m[1], {})[int(m[2] or 0)] = ((state.split() or ["UNKNOWN"])[0], nodes.strip())
    info = {}
    for job_id, comps in parts.items():
        ordered = [comps[k] for k in sorted(comps)]
        info[job_id] = {"State": combined_state([s for s, _ in ordered]),
                        "States": ",".join(s for s, _ in ordered),
                        # a pending component has "(null)"/"None assigned" or a "(reason)" instead of nodes
                        "NodeList": ",".join(n for _, n in ordered if n and n[0] != "(" and n != "None assigned")}
    return info


class HetWatcher(SlurmInfoWatcher):
    """submitit's state poller, for het jobs and for clusters without an accounting database."""

    def _make_command(self) -> list[str] | None:
        ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
        if not ids:
            return None
        if accounting_enabled():
            return ["sacct", "--noheader", "--parsable2", "--format=JobID,State,NodeList", "-j", ",".join(ids)]
        # all of this user's jobs: `squeue -j` fails outright once one of the ids is forgotten
        return ["squeue", "--me", "--noheader", "--states=all", "--format=%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        rows = [tuple((line.split("|") + ["", ""])[:3]) for line in text.splitlines() if line.strip()]
        info = merge_components(rows)
        if not accounting_enabled():
            for job_id in self._registered - self._finished:
                info.setdefault(job_id, {"State": ENDED, "States": "", "NodeList": ""})
        return info

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id, mode=mode) not in UNFINISHED


class RankLogPaths(JobPaths):
    """submitit's paths, with each task's log where the task's shell writes it (run_dir/logs/rank{R}.log)."""

    @property
    def stdout(self) -> Path:
        return self._folder.parent / "logs" / f"rank{self.task_id}.log"

    @property
    def stderr(self) -> Path:
        return self.stdout


class HetSlurmJob(SlurmJob):
    watcher = HetWatcher(delay_s=60)

    def __init__(self, folder: Path | str, job_id: str, tasks=(0,)) -> None:
        super().__init__(folder, job_id, tasks)
        self._paths = RankLogPaths(folder, job_id=job_id, task_id=self.task_id)


class HetSlurmExecutor(SlurmExecutor):
    """submitit's Slurm executor with our batch script: one het job, one task per rank."""

    job_class = HetSlurmJob

    def __init__(self, cfg: Config, run_dir: Path, job: Job) -> None:
        self._cfg, self._run_dir, self._job = cfg, Path(run_dir), job
        s = cfg.cluster.slurm
        super().__init__(self._run_dir / SUBMITIT_DIR, max_num_timeout=s.max_timeouts, python=python_command(s))
        # submitit's time-out logic reads the limit from here
        self.update_parameters(time=s.time_min)

    @property
    def _submitit_command_str(self) -> str:
        # the same command batch_script renders, whatever submitit's default becomes
        return task_command(self.python, self.folder)

    def _num_tasks(self) -> int:
        return self._job.world

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return render_script(self._cfg, self._run_dir, command, self._job)
