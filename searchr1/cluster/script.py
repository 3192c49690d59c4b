"""The batch script of a Slurm run: one heterogeneous job, rendered without Slurm (a dry run writes it too).

- One `#SBATCH` block per het component (het group 0 = trainer ranks, 1 = rollout ranks), a bare
  `#SBATCH hetjob` line between them. A job of one group (mode=eval) is a plain job.
- Each component's request (`request`) is rendered once and given to sbatch and to srun alike: Slurm 22.05's
  srun inherits no `--cpus-per-task` (a step would ask for 1 CPU per task) and sets no
  SLURM_CPUS_PER_TASK for het jobs, so each rank's thread count is written into its command from the request.
- One srun step over every group (`cmd : cmd`): Slurm numbers all its tasks together (SLURM_PROCID, group 0
  first), and `--kill-on-bad-exit=1` ends them all when one fails. With elastic rollouts (a group outside the
  world), one step per group instead (`_elastic_steps`): a worker's death ends nothing, its task restarts it.
- The job runs the code snapshot taken at submission (searchr1/cluster/snapshot.py), not the live checkout.
- Around srun, the steps of searchr1/cluster/batch.py: `start` (status RUNNING), the job's preparation (caches
  built once), `port` (a rendezvous port checked free), and `finish` (names a failed rank; requeues a job
  whose ranks stopped on a signal). srun's `%j` and `%t` are wrong inside a het step: each rank names its own log.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from searchr1.cluster.job import Job
from searchr1.config import Config, SlurmConfig
from searchr1.rundir import REPO_ROOT

SUBMITIT_DIR = "submitit"  # inside the run folder, next to logs/
CODE_DIR = "code"  # the code snapshot, inside the run folder
STOP_SIGNAL = "USR2"  # sent signal_delay_s before the time limit (SIGTERM is preemption's)


@dataclass(frozen=True)
class Component:
    """One het group: a role's tasks, one per rank, the same number on each of its nodes."""

    group: int
    role: str
    first_rank: int
    tasks: int
    nodes: int

    @property
    def per_node(self) -> int:
        return -(-self.tasks // self.nodes)


def components(job: Job) -> list[Component]:
    out, first = [], 0
    for i, g in enumerate(job.groups):
        out.append(Component(i, g.role, first, g.tasks, g.nodes))
        first += g.tasks
    return out


def request(cfg: Config, comp: Component) -> dict[str, object]:
    """What one component's tasks need: the same options for sbatch (the allocation) and srun (the step).
    cluster.gpus=0 asks for no GPU (CPU tasks, gloo)."""
    s = cfg.cluster.slurm
    opts: dict[str, object] = {
        "nodes": comp.nodes, "ntasks": comp.tasks, "ntasks_per_node": comp.per_node,
        "cpus_per_task": s.cpus_per_task,
        # memory per task, spread over its CPUs (rounded up): the same for any gpus_per_task
        "mem_per_cpu": f"{-(-s.mem_per_task_gb * 1024 // s.cpus_per_task)}M"}
    if cfg.cluster.gpus > 0:
        if s.gpu_binding == "node":
            opts["gpus_per_node"] = comp.per_node * s.gpus_per_task
        else:
            opts["gpus_per_task"] = s.gpus_per_task
    return opts


def _flags(opts: Mapping[str, object]) -> list[str]:
    return [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={shlex.quote(str(v))}"
            for k, v in opts.items()]


def python_command(s: SlurmConfig) -> str:
    return s.python or shlex.quote(sys.executable)


def code_root(cfg: Config, run_dir: Path) -> Path:
    """Where the job's code lives: the run's snapshot, or the live checkout (cluster.slurm.snapshot=false)."""
    return Path(run_dir) / CODE_DIR if cfg.cluster.slurm.snapshot else REPO_ROOT


def rank_command(python: str, run_dir: Path) -> str:
    """What every task runs: searchr1.cluster.task, which runs submitit's worker and records how it ended."""
    return f"{python} -u -m searchr1.cluster.task {shlex.quote(str(run_dir))}"


def render_script(cfg: Config, run_dir: Path, command: str, job: Job) -> str:
    """The batch script; `command` is what each task runs (rank_command)."""
    run_dir = Path(run_dir)
    c, s = cfg.cluster, cfg.cluster.slurm
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    logs, code, py = run_dir / "logs", code_root(cfg, run_dir), python_command(s)
    job_wide = {"job_name": f"searchr1-{run_dir.name}", "output": logs / "batch.log", "open_mode": "append",
                "requeue": True, "signal": f"{STOP_SIGNAL}@{s.signal_delay_s}"}
    lines = ["#!/bin/bash", f"# searchr1 run {run_dir}: one heterogeneous job (written by searchr1.cluster.script)",
             *(f"#SBATCH {f}" for f in _flags(job_wide))]
    comps = components(job)
    site = {k: getattr(s, k) for k in ("partition", "account", "qos", "constraint") if getattr(s, k)}
    for comp in comps:
        if comp.group:
            lines.append("#SBATCH hetjob")
        last = comp.first_rank + comp.tasks - 1
        lines.append(f"# het group {comp.group}: {comp.role} ranks {comp.first_rank}-{last}")
        lines += [f"#SBATCH {f}" for f in _flags({**site, "time": s.time_min, **request(cfg, comp)})]
    if s.setup:
        lines += ["", "# setup (cluster.slurm.setup)", *s.setup]
    nccl = c.slurm.nccl.variables()
    which = "run_dir/code.json names its commit" if s.snapshot else "cluster.slurm.snapshot=false: the live checkout"
    lines += ["",
              f"# the code as it was at submission ({which})",
              f"cd {q(code)} || exit 1",
              f"export PYTHONPATH={q(code)}${{PYTHONPATH:+:$PYTHONPATH}}",
              "export SUBMITIT_EXECUTOR=slurm"]
    if nccl:
        lines += ["# NCCL (cluster.slurm.nccl)", *(f"export {k}={shlex.quote(v)}" for k, v in nccl.items())]
    lines += ["# Preemption (SIGTERM) and the time limit (SIGUSR2) signal the tasks: they checkpoint and exit 75, and",
              "# `finish` requeues the job. The script must outlive them: a SIGTERM to it is only noted.",
              "trap 'export SEARCHR1_BATCH_SIGNAL=SIGTERM; echo \"[batch] SIGTERM\"' TERM"]
    lines += ["# state RUNNING in status.json (restart count, node); warns if the interpreter's packages changed",
              f"{py} -m searchr1.cluster.batch start {q(run_dir)} || exit 1"]
    if job.prepare:
        lines += ["# caches every task loads (model export, index, kernel), built once before any task starts",
                  f"{py} -m searchr1.cluster.job prepare {q(run_dir)} {q(job.prepare)} "
                  f">> {q(logs / 'prepare.log')} 2>&1 || exec {py} -m searchr1.cluster.batch finish {q(run_dir)} "
                  "--prepare $?"]
    if any(not g.in_world for g in job.groups):
        return "\n".join(lines + _elastic_steps(cfg, run_dir, command, job, comps))
    steps = []
    for comp in comps:
        threads = s.cpus_per_task
        group = [f"--het-group={comp.group}"] if len(comps) > 1 else []
        steps.append(" ".join([*group, *_flags(request(cfg, comp)),
                               f"env OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} {command}"]))
    lines += ["# the rendezvous: a port free on this node, which runs rank 0 (cluster.slurm.port_range)",
              f"MASTER_PORT=$({py} -m searchr1.cluster.batch port {q(run_dir)}) || exit 1",
              "export MASTER_PORT",
              "# one step over every group: one global rank per task, in group order; one task failing ends them all",
              "srun --kill-on-bad-exit=1 " + " \\\n  : ".join(steps),
              "# names a failed rank (status.json); requeues the job if its ranks stopped on a signal",
              f"exec {py} -m searchr1.cluster.batch finish {q(run_dir)} $?",
              ""]
    return "\n".join(lines)


ENDED_FILE = "trainers.ended"  # in a job's exits folder once its trainers' step has ended: no more restarts


def _elastic_steps(cfg: Config, run_dir: Path, command: str, job: Job, comps: list[Component]) -> list[str]:
    """Elastic rollouts (workers outside the world): one srun step per group, each task told its group's first
    task (SEARCHR1_FIRST_TASK: SLURM_PROCID restarts at 0 in every step). The trainers' step decides the job's
    end; a worker's death ends nothing (--kill-on-bad-exit=0): its task starts it again in place
    (searchr1/cluster/task.py). A job of workers alone (`+join=RUN_DIR`) is one step that finds the run's store
    through the run's rendezvous.json."""
    s = cfg.cluster.slurm
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    py, threads = python_command(s), s.cpus_per_task

    def step(comp: Component, kill: int) -> str:
        group = [f"--het-group={comp.group}"] if len(comps) > 1 else []
        return " ".join(["srun", *group, f"--kill-on-bad-exit={kill}", *_flags(request(cfg, comp)),
                         f"env SEARCHR1_FIRST_TASK={comp.first_rank} OMP_NUM_THREADS={threads} "
                         f"MKL_NUM_THREADS={threads} {command}"])

    finish = f"{py} -m searchr1.cluster.batch finish {q(run_dir)}"
    trainers = [c for c in comps if job.groups[c.group].in_world]
    workers = [c for c in comps if not job.groups[c.group].in_world]
    if not trainers:
        return ["# rollout workers joining a running run: a task that dies is started again in place "
                "(cluster.elastic.restarts);",
                "# they leave when the run ends",
                *(step(c, 0) + " &" for c in workers[:-1]), step(workers[-1], 0),
                "# the workers' end (status.json)",
                f"exec {finish} $?", ""]
    ended = f"{q(run_dir / 'logs' / 'exits')}/${{SLURM_JOB_ID}}.${{SLURM_RESTART_COUNT:-0}}"
    return ["# the rendezvous: a port free on this node, which runs rank 0 (cluster.slurm.port_range)",
            f"MASTER_PORT=$({py} -m searchr1.cluster.batch port {q(run_dir)}) || exit 1",
            "export MASTER_PORT",
            "# elastic rollouts: the trainers' step (one task failing ends them all, and the job) and the rollout",
            "# workers' step, outside the world: a worker that dies is started again in place",
            "# (cluster.elastic.restarts) and ends nothing else",
            *(step(c, 1) + " &" for c in trainers), "trainers=$!",
            *(step(c, 0) + " &" for c in workers), "workers=$!",
            "# the trainers' end is the job's; every worker out of restarts ends it too (nothing left to roll out)",
            "while kill -0 $trainers 2>/dev/null; do",
            "  if [ -n \"$workers\" ] && ! kill -0 $workers 2>/dev/null; then",
            "    wait $workers; rc=$?; workers=",
            f"    [ $rc -ne 0 ] && {{ kill -TERM $trainers; wait $trainers; exec {finish} --rollouts $rc; }}",
            "  fi",
            "  sleep 1",
            "done",
            "wait $trainers; rc=$?",
            "# the run is over: no worker starts again; the live ones said goodbye to trainer 0 and leave by",
            f"# themselves; those still there after {cfg.cluster.elastic.leave_grace_s} s (cluster.elastic.leave_grace_s; "
            "at once after a failure) are ended",
            f"mkdir -p {ended} && touch {ended}/{ENDED_FILE}",
            "if [ -n \"$workers\" ]; then",
            f"  [ $rc -eq 0 ] && for _ in $(seq {cfg.cluster.elastic.leave_grace_s}); do kill -0 $workers 2>/dev/null || break; "
            "sleep 1; done",
            "  kill -TERM $workers 2>/dev/null; wait $workers",
            "fi",
            "# names a failed rank (status.json); requeues the job if its ranks stopped on a signal",
            f"exec {finish} $rc", ""]


def batch_script(cfg: Config, run_dir: Path, job: Job) -> str:
    """What HetSlurmExecutor submits for run_dir."""
    return render_script(cfg, run_dir, rank_command(python_command(cfg.cluster.slurm), Path(run_dir)), job)
