"""Slurm backend of launch.py: submit one heterogeneous job (searchr1.cluster.hetjob), watch it, report its end.

Run folder: `submit.sbatch` (exactly what was submitted), `slurm_job.json` (job id, state, nodes; also merged
into `status.json`), `logs/rank{R}.log`, `logs/batch.log` (the batch script's own output), `submitit/`.
`python -m searchr1.cluster.slurm wait RUN_DIR` waits for a submitted run's job later.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from submitit.core.utils import FailedJobError, JobPaths, pickle_load

from searchr1.cluster.hetjob import (ENDED, SUBMITIT_DIR, UNFINISHED, HetSlurmExecutor, HetSlurmJob, RankTask,
                                     batch_script, combined_state, components, first_host, job_port,
                                     merge_components, rank_env, render_script)
from searchr1.cluster.job import Job
from searchr1.config import Config
from searchr1.rundir import load_config, write_status

# with hetjob's helpers, so that tests and callers import one module
__all__ = ["SubmissionError", "check_fits", "combined_state", "first_host", "job_port", "launch", "main",
           "merge_components", "rank_env", "record", "render_script", "submit", "wait"]

SCRIPT_FILE = "submit.sbatch"
JOB_FILE = "slurm_job.json"

# Pending reasons that no waiting clears: a request beyond what the partition, the account or the QOS allow.
# Per-job limits of a QOS or an association are all named ...PerJob...
HOPELESS_REASONS = frozenset({
    "BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount",
    "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied",
})


class SubmissionError(RuntimeError):
    """Slurm refused the job, or accepted one that can never start; the message carries Slurm's reason."""


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


def check_fits(cfg: Config, job: Job) -> None:
    """Refuse what sbatch accepts but can never start: het components never share a node, so a job needing
    more nodes than its partition has pends forever ("Resources"). Everything else is left to sbatch."""
    if shutil.which("sbatch") is None:
        raise SubmissionError("cluster.backend=slurm: sbatch is not on PATH (slurm/cluster-up.sh starts a "
                              "local cluster)")
    s = cfg.cluster.slurm
    out = _run(["sinfo", "--noheader", "--Node", "--format=%N|%P"])
    nodes = {node for node, _, part in (line.partition("|") for line in out.stdout.splitlines())
             if (part.rstrip("*") == s.partition if s.partition else part.endswith("*"))}
    need = sum(g.nodes for g in job.groups)
    if nodes and need > len(nodes):
        where = f"partition {s.partition!r}" if s.partition else "the default partition"
        raise SubmissionError(
            f"{' + '.join(f'{g.nodes} ({g.role})' for g in job.groups)} nodes needed "
            f"(cluster.slurm.trainer_nodes, rollout_nodes), {where} has {len(nodes)}; het components never "
            "share a node")


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


def submit(cfg: Config, run_dir: Path, job: Job) -> HetSlurmJob:
    """Submit the het job; returns submitit's job (`results()`, `cancel()`, `task(r).stdout()` work).
    Raises SubmissionError with Slurm's reason when the request cannot be satisfied."""
    run_dir = Path(run_dir).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    try:
        check_fits(cfg, job)
        executor = HetSlurmExecutor(cfg, run_dir, job)
        (run_dir / SCRIPT_FILE).write_text(batch_script(cfg, run_dir, job))
        try:
            # submitit also prints sbatch's refusal to stderr; the error below carries it once
            with contextlib.redirect_stderr(io.StringIO()):
                submitted = executor.submit(RankTask(job, cfg, run_dir))
        except FailedJobError as err:
            raise SubmissionError(f"sbatch rejected the job for {run_dir}:\n{str(err).strip()}") from None
        record(run_dir, job_id=submitted.job_id, state="PENDING", submitted_at=_now(), script=SCRIPT_FILE,
               components=[vars(c) for c in components(job)])
        _reject_if_hopeless(submitted.job_id, cfg.cluster.slurm.check_s)
    except SubmissionError as err:
        record(run_dir, state="REJECTED", reason=str(err), ended_at=_now())
        raise
    return submitted


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


def launch(cfg: Config, run_dir: Path, job: Job) -> int:
    """The Slurm backend of launch.py. cluster.slurm.submit=false writes run_dir/submit.sbatch and stops;
    wait=true blocks until the job ends (0: completed); otherwise prints the job id and returns 0.
    A request the cluster cannot satisfy returns 2 after printing Slurm's reason."""
    run_dir = Path(run_dir).resolve()
    s = cfg.cluster.slurm
    if not s.submit:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / SCRIPT_FILE).write_text(batch_script(cfg, run_dir, job))
        print(f"[slurm] dry run (cluster.slurm.submit=false): wrote {run_dir / SCRIPT_FILE}", flush=True)
        return 0
    try:
        submitted = submit(cfg, run_dir, job)
    except SubmissionError as err:
        print(f"[slurm] not submitted: {err}", file=sys.stderr, flush=True)
        return 2
    shape = " + ".join(f"{g.tasks} {g.role}" for g in job.groups)
    print(f"[slurm] submitted job {submitted.job_id} ({shape} tasks); logs in {run_dir / 'logs'}", flush=True)
    return wait(run_dir, s.poll_s) if s.wait else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1.cluster.slurm")
    parser.add_argument("command", choices=["wait"], help="wait: block until the run's job ends")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    return wait(args.run_dir, load_config(args.run_dir).cluster.slurm.poll_s)


if __name__ == "__main__":
    sys.exit(main())
