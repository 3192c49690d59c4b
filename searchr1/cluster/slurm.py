"""Slurm backend: one heterogeneous job through submitit; het group 0 = trainer ranks, group 1 = rollout ranks.

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
- `RankTask` is what every task runs: torch.distributed's variables from Slurm's, then `entry(cfg, run_dir)`.
  A requeued job runs the same call again; the entry resumes from the run folder's last checkpoint by itself.

Run folder: `submit.sbatch` (exactly what was submitted), `slurm_job.json` (job id, state, nodes; also merged
into `status.json`), `logs/rank{R}.log`, `logs/batch.log` (the batch script's own output), `submitit/`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from submitit.core.utils import FailedJobError, JobPaths, pickle_load
from submitit.helpers import DelayedSubmission
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob, SlurmJobEnvironment

from searchr1.config import ClusterConfig, Config, SlurmConfig
from searchr1.rundir import REPO_ROOT, load_config, write_status

SCRIPT_FILE = "submit.sbatch"
JOB_FILE = "slurm_job.json"
SUBMITIT_DIR = "submitit"

# Job states after which the job may still run or run again (Slurm's list; submitit's misses several).
# UNKNOWN: not listed yet.
UNFINISHED = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
    "SUSPENDED", "PREEMPTED", "SIGNALING", "STAGE_OUT", "STOPPED", "UNKNOWN",
})
# The job ended more than MinJobAge ago: squeue no longer lists it and there is no accounting to ask.
ENDED = "ENDED"
# Pending reasons that no waiting clears: a request beyond what the partition, the account or the QOS allow.
# Per-job limits of a QOS or an association are all named ...PerJob...
HOPELESS_REASONS = frozenset({
    "BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount",
    "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied",
})


class SubmissionError(RuntimeError):
    """Slurm refused the job, or accepted one that can never start; the message carries Slurm's reason."""


# ---------------------------------------------------------------------------------------------- the script
@dataclass(frozen=True)
class Component:
    """One het group: a role's tasks, one per rank."""

    group: int
    role: str
    first_rank: int
    tasks: int
    nodes: int


def components(cluster: ClusterConfig) -> tuple[Component, Component]:
    return (Component(0, "trainer", 0, cluster.trainer_ranks, cluster.slurm.trainer_nodes),
            Component(1, "rollout", cluster.trainer_ranks, cluster.rollout_ranks, cluster.slurm.rollout_nodes))


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


def render_script(cfg: Config, run_dir: Path, command: str) -> str:
    """The batch script: job-wide options, the two het components, setup lines, one srun over both groups."""
    run_dir = Path(run_dir)
    logs = run_dir / "logs"
    c = cfg.cluster
    job_wide = {"job_name": f"searchr1-{run_dir.name}", "output": logs / "batch.log", "open_mode": "append",
                "requeue": True, "signal": f"{SlurmJobEnvironment.USR_SIG}@{c.slurm.signal_delay_s}"}
    lines = ["#!/bin/bash",
             f"# searchr1 run {run_dir}: one heterogeneous job (written by searchr1.cluster.slurm)",
             *_sbatch_lines(job_wide)]
    for comp in components(c):
        if comp.group:
            lines.append("#SBATCH hetjob")
        last = comp.first_rank + comp.tasks - 1
        lines.append(f"# het group {comp.group}: {comp.role} ranks {comp.first_rank}-{last}")
        lines += _sbatch_lines(component_options(c, comp))
    if c.slurm.setup:
        lines += ["", "# setup (cluster.slurm.setup)", *c.slurm.setup]
    # the task's shell expands $SLURM_PROCID; srun's own %t would add the het group index
    per_task = f"exec {command} >> {shlex.quote(str(logs))}/rank${{SLURM_PROCID}}.log 2>&1"
    lines += ["",
              "export SUBMITIT_EXECUTOR=slurm",
              f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
              "# one step over both het groups: one global rank per task, trainer ranks first;",
              "# one task failing ends them all",
              f"srun --het-group=0-1 --kill-on-bad-exit=1 bash -c {shlex.quote(per_task)}",
              ""]
    return "\n".join(lines)


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


def rank_env(slurm: Mapping[str, str], cluster: ClusterConfig) -> dict[str, str]:
    """torch.distributed's environment for one task of the het step, from Slurm's variables.

    World: trainer ranks then rollout ranks, as Slurm numbers a `--het-group=0-1` step. Rendezvous on the first
    host of group 0 (the rank 0 task). Refuses a step whose shape differs from the config's: a run never starts
    with fewer trainers than asked for."""
    try:
        rank, world = int(slurm["SLURM_PROCID"]), int(slurm["SLURM_NTASKS"])
        group0 = int(slurm["SLURM_NTASKS_HET_GROUP_0"])
        nodes0, job_id = slurm["SLURM_JOB_NODELIST_HET_GROUP_0"], slurm["SLURM_JOB_ID"]
    except KeyError as missing:
        raise RuntimeError(f"not a task of a heterogeneous Slurm step: {missing} is not set") from None
    if group0 != cluster.trainer_ranks or world != cluster.trainer_ranks + cluster.rollout_ranks:
        raise RuntimeError(
            f"het step has {group0} group-0 tasks of {world}; the config asks for cluster.trainer_ranks="
            f"{cluster.trainer_ranks} + cluster.rollout_ranks={cluster.rollout_ranks}")
    port = cluster.port or job_port(job_id, cluster.slurm.port_range)
    # torch would start one thread per core of the node, whatever Slurm gave the task
    threads = slurm.get("OMP_NUM_THREADS") or slurm.get("SLURM_CPUS_PER_TASK", "1")
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": slurm.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": first_host(nodes0), "MASTER_PORT": str(port), "OMP_NUM_THREADS": threads}


@dataclass
class RankTask:
    """The pickled call every task runs (the same in every task; the rank comes from the environment)."""

    entry: Callable[[Config, Path], None]
    cfg: Config
    run_dir: Path

    def __call__(self):
        env = rank_env(os.environ, self.cfg.cluster)
        os.environ.update(env)
        # after a requeue, this rank's result from the previous run would pass for this run's (job.done())
        JobPaths(os.environ["SUBMITIT_FOLDER"], os.environ["SLURM_JOB_ID"], int(env["RANK"])).result_pickle.unlink(
            missing_ok=True)
        role = "trainer" if int(env["RANK"]) < self.cfg.cluster.trainer_ranks else "rollout"
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(f"[slurm] job {os.environ['SLURM_JOB_ID']} restart {os.environ.get('SLURM_RESTART_COUNT', '0')}: "
              f"rank {env['RANK']}/{env['WORLD_SIZE']} ({role}) on {node}, "
              f"rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}", flush=True)
        return self.entry(self.cfg, self.run_dir)

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

    def __init__(self, cfg: Config, run_dir: Path) -> None:
        self._cfg, self._run_dir = cfg, Path(run_dir)
        s = cfg.cluster.slurm
        super().__init__(self._run_dir / SUBMITIT_DIR, max_num_timeout=s.max_timeouts, python=python_command(s))
        # submitit's time-out logic reads the limit from here
        self.update_parameters(time=s.time_min)

    @property
    def _submitit_command_str(self) -> str:
        return task_command(self.python, self.folder)

    def _num_tasks(self) -> int:
        return self._cfg.cluster.trainer_ranks + self._cfg.cluster.rollout_ranks

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return render_script(self._cfg, self._run_dir, command)

    @property
    def script(self) -> str:
        return self._make_submission_file_text(self._submitit_command_str, "")


# ---------------------------------------------------------------------------------------- submit and watch
def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(run_dir: Path, **fields) -> None:
    """Merge fields into run_dir/slurm_job.json (and the backend-neutral status.json)."""
    path = Path(run_dir) / JOB_FILE
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    tmp.replace(path)
    write_status(run_dir, backend="slurm", **fields)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def check_fits(cfg: Config) -> None:
    """Refuse what sbatch accepts but can never start: het components never share a node, so a job needing
    more nodes than its partition has pends forever ("Resources"). Everything else is left to sbatch."""
    if shutil.which("sbatch") is None:
        raise SubmissionError("cluster.backend=slurm: sbatch is not on PATH (slurm/cluster-up.sh starts a "
                              "local cluster)")
    s = cfg.cluster.slurm
    out = _run(["sinfo", "--noheader", "--Node", "--format=%N|%P"])
    nodes = {node for node, _, part in (line.partition("|") for line in out.stdout.splitlines())
             if (part.rstrip("*") == s.partition if s.partition else part.endswith("*"))}
    need = s.trainer_nodes + s.rollout_nodes
    if nodes and need > len(nodes):
        where = f"partition {s.partition!r}" if s.partition else "the default partition"
        raise SubmissionError(
            f"cluster.slurm.trainer_nodes={s.trainer_nodes} + cluster.slurm.rollout_nodes={s.rollout_nodes} "
            f"nodes needed, {where} has {len(nodes)}; het components never share a node")


def _reject_if_hopeless(job_id: str, check_s: int) -> None:
    deadline = time.monotonic() + check_s
    while True:
        out = _run(["squeue", "--noheader", "--format=%i|%T|%r", "-j", job_id]).stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
        reasons = {reason for _, state, reason in rows if state == "PENDING"}
        hopeless = ", ".join(sorted(r for r in reasons if r in HOPELESS_REASONS or "PerJob" in r))
        if hopeless:
            _run(["scancel", job_id])
            raise SubmissionError(f"job {job_id} can never start (Slurm's pending reason: {hopeless}); cancelled it")
        if not reasons or time.monotonic() >= deadline:
            return
        time.sleep(1)


def submit(cfg: Config, run_dir: Path, entry: Callable[[Config, Path], None]) -> HetSlurmJob:
    """Submit the het job; returns submitit's job (`results()`, `cancel()`, `task(r).stdout()` work).
    Raises SubmissionError with Slurm's reason when the request cannot be satisfied."""
    run_dir = Path(run_dir).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    try:
        check_fits(cfg)
        executor = HetSlurmExecutor(cfg, run_dir)
        (run_dir / SCRIPT_FILE).write_text(executor.script)
        try:
            # submitit also prints sbatch's refusal to stderr; the error below carries it once
            with contextlib.redirect_stderr(io.StringIO()):
                job = executor.submit(RankTask(entry, cfg, run_dir))
        except FailedJobError as err:
            raise SubmissionError(f"sbatch rejected the job for {run_dir}:\n{str(err).strip()}") from None
        record(run_dir, job_id=job.job_id, state="PENDING", submitted_at=_now(), script=SCRIPT_FILE,
               components=[vars(c) for c in components(cfg.cluster)])
        _reject_if_hopeless(job.job_id, cfg.cluster.slurm.check_s)
    except SubmissionError as err:
        record(run_dir, state="REJECTED", reason=str(err), ended_at=_now())
        raise
    return job


def _failed_ranks(run_dir: Path, job_id: str, world: int) -> list[int]:
    """Ranks without a successful result pickle (submitit writes one per task as its call returns)."""
    paths = [JobPaths(Path(run_dir) / SUBMITIT_DIR, job_id, task_id=r).result_pickle for r in range(world)]
    return [r for r, p in enumerate(paths) if not p.exists() or pickle_load(p)[0] != "success"]


def wait(run_dir: Path, poll_s: int = 5) -> int:
    """Block until the run folder's job ends (through requeues); record and print its state.
    Returns 0 when every task completed, 1 otherwise."""
    run_dir = Path(run_dir)
    submitted = json.loads((run_dir / JOB_FILE).read_text())
    job_id, world = submitted["job_id"], sum(c["tasks"] for c in submitted["components"])
    watcher, state = HetSlurmJob.watcher, None
    while True:
        info = watcher.get_info(job_id, mode="force")
        if info.get("State", "UNKNOWN") != state:
            state = info.get("State", "UNKNOWN")
            record(run_dir, state=state, component_states=info.get("States", ""), nodes=info.get("NodeList", ""))
        if state not in UNFINISHED:
            break
        time.sleep(poll_s)
    failed = _failed_ranks(run_dir, job_id, world)
    if state == ENDED:
        state = "FAILED" if failed else "COMPLETED"
    record(run_dir, state=state, ended_at=_now(), failed_ranks=failed)
    print(f"[slurm] job {job_id}: {state}" + (f"; no result from ranks {failed}, see {run_dir / 'logs'}"
                                              if failed else ""), flush=True)
    return 0 if state == "COMPLETED" and not failed else 1


def launch(cfg: Config, run_dir: Path, entry: Callable[[Config, Path], None]) -> int:
    """The Slurm backend of launch.py. cluster.slurm.submit=false writes run_dir/submit.sbatch and stops;
    wait=true blocks until the job ends (0: completed); otherwise prints the job id and returns 0.
    A request the cluster cannot satisfy returns 2 after printing Slurm's reason."""
    run_dir = Path(run_dir).resolve()
    s = cfg.cluster.slurm
    if not s.submit:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        script = render_script(cfg, run_dir, task_command(python_command(s), run_dir / SUBMITIT_DIR))
        (run_dir / SCRIPT_FILE).write_text(script)
        print(f"[slurm] dry run (cluster.slurm.submit=false): wrote {run_dir / SCRIPT_FILE}", flush=True)
        return 0
    try:
        job = submit(cfg, run_dir, entry)
    except SubmissionError as err:
        print(f"[slurm] not submitted: {err}", file=sys.stderr, flush=True)
        return 2
    n0, n1 = cfg.cluster.trainer_ranks, cfg.cluster.rollout_ranks
    print(f"[slurm] submitted het job {job.job_id} ({n0} trainer + {n1} rollout tasks); logs in "
          f"{run_dir / 'logs'}", flush=True)
    return wait(run_dir, s.poll_s) if s.wait else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1.cluster.slurm")
    parser.add_argument("command", choices=["wait"], help="wait: block until the run's job ends")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    return wait(args.run_dir, load_config(args.run_dir).cluster.slurm.poll_s)


if __name__ == "__main__":
    sys.exit(main())
