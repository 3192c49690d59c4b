"""Slurm backend of launch.py: submit one heterogeneous job (searchr1.cluster.hetjob), watch it, report its end.

Run folder: `submit.sbatch` (exactly what was submitted), `slurm_job.json` (the job's id and shape, Slurm's
live state), `status.json` (the run's state: RUNNING, REQUEUED, COMPLETED, FAILED naming the rank, ...),
`code/` and `code.json` (the code snapshot the job runs), `logs/rank{R}.log`, `logs/batch.log` (the batch
script's own output), `submitit/`. `python -m searchr1.cluster.slurm wait RUN_DIR` waits for a submitted run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from submitit.core.utils import FailedJobError

from searchr1.cluster import snapshot
from searchr1.cluster.batch import FINAL_STATES, describe
from searchr1.cluster.hetjob import ENDED, UNFINISHED, HetSlurmExecutor, HetSlurmJob, combined_state, merge_components
from searchr1.cluster.job import Job
from searchr1.cluster.script import CODE_DIR, batch_script, components, render_script
from searchr1.cluster.task import JOB_FILE, RankTask, first_host, job_port, rank_env
from searchr1.config import Config
from searchr1.rundir import REPO_ROOT, load_config, write_atomic, write_status

# with the other modules' helpers, so that tests and callers import one module
__all__ = ["SubmissionError", "check_fits", "combined_state", "first_host", "job_port", "launch", "main",
           "merge_components", "rank_env", "render_script", "submit", "wait"]

SCRIPT_FILE = "submit.sbatch"

# Pending reasons that no waiting clears: a request beyond what the partition, the account or the QOS allow.
# Per-job limits of a QOS or an association are all named ...PerJob...
HOPELESS_REASONS = frozenset({
    "BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount",
    "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied",
})


class SubmissionError(RuntimeError):
    """Slurm refused the job, or accepted one that can never start; the message carries the reason."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(run_dir: Path, **fields) -> None:
    """Merge fields into run_dir/slurm_job.json (the launcher's file; the run's state is in status.json)."""
    path = Path(run_dir) / JOB_FILE
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(fields)
    write_atomic(path, json.dumps(info, indent=1) + "\n")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------ requests that cannot start
def _minutes(limit: str) -> float:
    """A partition's MaxTime ("UNLIMITED", "1-00:00:00", "04:00:00", "30:00") in minutes."""
    if limit in ("UNLIMITED", "INFINITE", "NONE", ""):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + h * 60 + m + sec / 60


def _gpus(gres: str) -> int:
    """GPUs of a node from sinfo's %G ("gpu:8", "gpu:h100:4(S:0-1),gpu:a100:2", "(null)")."""
    return sum(int(m[1]) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))


def check_fits(cfg: Config, job: Job) -> None:
    """Refuse, before sbatch, what the partition can never run (sbatch accepts much of it and the job then pends
    forever): a time beyond its MaxTime, a component needing more nodes than it has with enough CPUs, memory
    and GPUs per node, het components that cannot get nodes of their own (they never share one)."""
    if shutil.which("sbatch") is None:
        raise SubmissionError("cluster.backend=slurm: sbatch is not on PATH (slurm/cluster-up.sh starts a "
                              "local cluster)")
    s = cfg.cluster.slurm
    parts = [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
             for line in _run(["scontrol", "show", "partition", "-o"]).stdout.splitlines()]
    part = next((p for p in parts if (p.get("PartitionName") == s.partition if s.partition
                                       else p.get("Default") == "YES")), None)
    if part is None:  # an unknown partition: sbatch's own refusal names it
        return
    where = f"partition {part['PartitionName']!r}"
    if s.time_min > _minutes(part.get("MaxTime", "")):
        raise SubmissionError(f"cluster.slurm.time_min={s.time_min} minutes exceeds the MaxTime of {where} "
                              f"({part['MaxTime']}): the job would pend forever")
    rows = [line.split("|") for line in _run(["sinfo", "--noheader", "--Node", f"--partition={part['PartitionName']}",
                                              "--format=%N|%c|%m|%G|%f"]).stdout.splitlines()]
    # a plain feature name filters the nodes; an expression (a|b, a&b, [a*2]) is left to Slurm
    feature = s.constraint if re.fullmatch(r"[\w.-]+", s.constraint or "-") else ""
    number = lambda text: int(re.match(r"\d*", text)[0] or 0)  # noqa: E731  ("512000+" on mixed nodes)
    nodes = {n: (number(c), number(m), _gpus(g)) for n, c, m, g, f in rows if not feature or feature in f.split(",")}
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    taken: set[str] = set()

    def fits(comp):
        need = (comp.per_node * s.cpus_per_task, comp.per_node * s.mem_per_task_gb * 1024,
                comp.per_node * s.gpus_per_task if cfg.cluster.gpus > 0 else 0)
        return need, sorted(n for n, have in nodes.items() if all(h >= x for h, x in zip(have, need)))

    # the most constrained component chooses its nodes first
    for comp in sorted(components(job), key=lambda comp: len(fits(comp)[1])):
        if max_nodes.isdigit() and comp.nodes > int(max_nodes):
            raise SubmissionError(f"cluster.slurm.{comp.role}_nodes={comp.nodes} exceeds the MaxNodes of {where} "
                                  f"({max_nodes})")
        (cpus, mem_mb, gpus), fit = fits(comp)
        free = [n for n in fit if n not in taken]
        if len(free) < comp.nodes:
            shape = (f"{comp.per_node} {comp.role} ranks per node x (cluster.slurm.cpus_per_task="
                     f"{s.cpus_per_task} CPUs, mem_per_task_gb={s.mem_per_task_gb}"
                     + (f", gpus_per_task={s.gpus_per_task}" if gpus else "") + ")")
            biggest = max(nodes.values(), default=(0, 0, 0))
            raise SubmissionError(
                f"het group {comp.group} needs {comp.nodes} node(s) (cluster.slurm.{comp.role}_nodes) with "
                f"{cpus} CPUs, {mem_mb} MB" + (f", {gpus} GPUs" if gpus else "") + f" each: {shape}; {where}"
                + (f" with constraint {feature!r}" if feature else "") + f" has {len(fit)} such node(s)"
                + (f", {len(fit) - len(free)} of them taken by the other het groups (they never share a "
                   "node)" if len(fit) > len(free) else "")
                + f"; its largest node has {biggest[0]} CPUs, {biggest[1]} MB, {biggest[2]} GPUs")
        taken.update(free[:comp.nodes])


def hopeless_reason(job_id: str) -> str:
    """The pending reasons of a job that no waiting clears ("" when there is none)."""
    out = _run(["squeue", "--noheader", "--format=%i|%T|%r", "-j", job_id]).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
    return ", ".join(sorted({r for _, state, r in rows if state == "PENDING" and (r in HOPELESS_REASONS
                                                                                 or "PerJob" in r)}))


def _pending(job_id: str) -> bool:
    out = _run(["squeue", "--noheader", "--format=%T", "-j", job_id]).stdout
    return "PENDING" in out.split()


# --------------------------------------------------------------------------------------------- submission
def _discard(run_dir: Path, reason: str) -> str:
    """After a refusal: a run folder holding no work of its own is removed; another one records why."""
    if not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        return "run folder removed"
    write_status(run_dir, backend="slurm", state="REJECTED", reason=reason, ended_at=_now())
    return f"recorded in {run_dir / 'status.json'}"


def submit(cfg: Config, run_dir: Path, job: Job, watch_s: int | None = None) -> HetSlurmJob:
    """Submit the het job; returns submitit's job (`results()`, `cancel()`, `task(r).stdout()` work).
    Raises SubmissionError with the reason when the request cannot be satisfied (the run folder is then
    removed, or says why). `watch_s`: how long to watch the pending reasons (cluster.slurm.check_s)."""
    run_dir = Path(run_dir).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    try:
        check_fits(cfg, job)
        if cfg.cluster.slurm.snapshot:
            try:
                snapshot.take(REPO_ROOT, run_dir / CODE_DIR, run_dir)
            except snapshot.SnapshotError as err:
                raise SubmissionError(f"cluster.slurm.snapshot=true: cannot copy the code ({err}); "
                                      "cluster.slurm.snapshot=false runs the live checkout") from None
        (run_dir / SCRIPT_FILE).write_text(batch_script(cfg, run_dir, job))
        # every task reads the job's shape from here: written before the job can start
        record(run_dir, job={"entry": job.entry, "prepare": job.prepare, "target": str(Path(job.target).resolve()) if job.target else "",
                             "groups": [vars(g) for g in job.groups]},
               components=[vars(c) for c in components(job)], script=SCRIPT_FILE)
        write_status(run_dir, backend="slurm", state="PENDING", submitted_at=_now())
        try:
            # submitit also prints sbatch's refusal to stderr; the error below carries it once
            with contextlib.redirect_stderr(io.StringIO()):
                submitted = HetSlurmExecutor(cfg, run_dir, job).submit(RankTask(job, cfg, run_dir))
        except FailedJobError as err:
            raise SubmissionError(f"sbatch rejected the job for {run_dir}:\n{str(err).strip()}") from None
        record(run_dir, job_id=submitted.job_id, submitted_at=_now())
        deadline = time.monotonic() + (cfg.cluster.slurm.check_s if watch_s is None else watch_s)
        while True:
            hopeless = hopeless_reason(submitted.job_id)
            if hopeless:
                _run(["scancel", submitted.job_id])
                raise SubmissionError(f"job {submitted.job_id} can never start (Slurm's pending reason: {hopeless}); "
                                      "cancelled it")
            if time.monotonic() >= deadline or not _pending(submitted.job_id):
                break
            time.sleep(1)
    except SubmissionError as err:
        raise SubmissionError(f"{err}\n({_discard(run_dir, str(err))})") from None
    return submitted


# -------------------------------------------------------------------------------------------------- waiting
def _status(run_dir: Path) -> dict:
    path = Path(run_dir) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _conclude(run_dir: Path, job_id: str, slurm_state: str) -> int:
    """The run's final state once Slurm's job has ended: the batch script's, when it got to record one."""
    status = _status(run_dir)
    if status.get("state") not in FINAL_STATES:
        # the batch script could not record the end: cancelled, killed at the time limit, a node lost
        state = slurm_state if slurm_state != ENDED else "FAILED"
        write_status(run_dir, state=state, ended_at=_now(), reason=status.get("reason") or (
            f"Slurm ended the job ({slurm_state}) before its batch script could record why; see "
            f"{run_dir / 'logs' / 'batch.log'}"))
        status = _status(run_dir)
    state = status["state"]
    line = f"[slurm] job {job_id}: {state}"
    if state == "FAILED":
        line += f": {describe(status)}\n  see " + str(run_dir / "logs" / (
            f"rank{status['failed_rank']}.log" if status.get("failed_rank") is not None
            else f"{status['failed_task']}.log" if status.get("failed_task") else "batch.log"))
    elif state != "COMPLETED" and status.get("reason"):
        line += f": {status['reason']}"
    print(line, file=sys.stdout if state == "COMPLETED" else sys.stderr, flush=True)
    return 0 if state == "COMPLETED" else 1


def wait(run_dir: Path, poll_s: int = 5, signalled: list[int] | None = None) -> int:
    """Block until the run folder's job ends (through requeues); record and print its end. A job that can never
    start is cancelled (REJECTED). Returns 0 when every rank completed, 1 otherwise. A signal number appearing
    in `signalled` (the launcher's handlers) cancels the job instead."""
    run_dir = Path(run_dir)
    job_id = json.loads((run_dir / JOB_FILE).read_text())["job_id"]
    watcher, state = HetSlurmJob.watcher, None
    while True:
        if signalled:
            return _cancel(run_dir, signalled[0], poll_s)
        info = watcher.get_info(job_id, mode="force")
        if info.get("State", "UNKNOWN") != state:
            state = info.get("State", "UNKNOWN")
            record(run_dir, slurm_state=state, component_states=info.get("States", ""), nodes=info.get("NodeList", ""))
        if state == "PENDING":
            hopeless = hopeless_reason(job_id)
            if hopeless:
                _run(["scancel", job_id])
                reason = f"job {job_id} can never start (Slurm's pending reason: {hopeless}); cancelled it"
                write_status(run_dir, state="REJECTED", reason=reason, ended_at=_now())
                print(f"[slurm] {reason}", file=sys.stderr, flush=True)
                return 1
        if state not in UNFINISHED:
            return _conclude(run_dir, job_id, state)
        time.sleep(poll_s)


def _cancel(run_dir: Path, signum: int, poll_s: int) -> int:
    """SIGTERM, SIGHUP or SIGINT to a waiting launcher: the job is its to end. scancel, wait until Slurm has
    ended every task, record CANCELLED."""
    name = signal.Signals(signum).name
    info = json.loads((run_dir / JOB_FILE).read_text()) if (run_dir / JOB_FILE).exists() else {}
    job_id = info.get("job_id")
    if job_id:
        _run(["scancel", job_id])
        watcher = HetSlurmJob.watcher
        while watcher.get_info(job_id, mode="force").get("State", "UNKNOWN") in UNFINISHED:
            time.sleep(poll_s)
    write_status(run_dir, state="CANCELLED", signal=name, ended_at=_now(),
                 reason=f"the launcher got {name} and cancelled job {job_id}")
    print(f"[slurm] {name}: cancelled job {job_id}; every task ended; run folder {run_dir}", file=sys.stderr,
          flush=True)
    return 128 + signum


def launch(cfg: Config, run_dir: Path, job: Job) -> int:
    """The Slurm backend of launch.py. cluster.slurm.submit=false writes run_dir/submit.sbatch and stops;
    wait=true blocks until the job ends (0: completed), and a SIGTERM, SIGHUP or SIGINT to it cancels the job;
    otherwise prints the job id and returns 0 (the job is the user's). A request the cluster cannot satisfy
    returns 2 after printing the reason."""
    run_dir = Path(run_dir).resolve()
    s = cfg.cluster.slurm
    if not s.submit:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / SCRIPT_FILE).write_text(batch_script(cfg, run_dir, job))
        print(f"[slurm] dry run (cluster.slurm.submit=false): wrote {run_dir / SCRIPT_FILE}", flush=True)
        return 0

    # The handlers only note the signal: an exception raised from them could land inside submitit's state
    # poller, which swallows every exception. The wait loop looks at the note every poll_s seconds.
    signalled: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: signalled.append(signum))
           for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)} if s.wait else {}
    try:
        try:
            submitted = submit(cfg, run_dir, job, watch_s=0 if s.wait else None)
        except SubmissionError as err:
            print(f"[slurm] not submitted: {err}", file=sys.stderr, flush=True)
            return 2
        shape = " + ".join(f"{g.tasks} {g.role}" for g in job.groups)
        print(f"[slurm] submitted job {submitted.job_id} ({shape} tasks); logs in {run_dir / 'logs'}", flush=True)
        return wait(run_dir, s.poll_s, signalled) if s.wait else 0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1.cluster.slurm")
    parser.add_argument("command", choices=["wait"], help="wait: block until the run's job ends")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    return wait(args.run_dir, load_config(args.run_dir).cluster.slurm.poll_s)


if __name__ == "__main__":
    sys.exit(main())
