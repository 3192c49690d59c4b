"""The batch script's own steps around srun (searchr1/cluster/script.py), on the node of rank 0.

    python -m searchr1.cluster.batch start RUN_DIR          status RUNNING (job id, restart count, node)
    python -m searchr1.cluster.batch port RUN_DIR           prints a rendezvous port free on this node
    python -m searchr1.cluster.batch finish RUN_DIR RC      after srun returned RC
    python -m searchr1.cluster.batch finish RUN_DIR --prepare RC    after the preparation failed
    python -m searchr1.cluster.batch finish RUN_DIR --rollouts RC   every elastic rollout worker was out of restarts

`finish` reads how each task ended (searchr1/cluster/task.py) and writes the outcome into status.json:
- every rank exited 0: COMPLETED;
- a rank failed: FAILED, naming it (`failed_rank`, `failed_role`, `node`, `exit_code` or `signal`, `reason`:
  the last error line of its log). A rank killed by a signal is the cause; ranks that exited 1 in the same
  instant only saw their peer vanish. Otherwise the first rank to end;
- elastic rollout workers (outside the world, exits/worker{slot}.{n}.json) decide nothing while trainers run;
  every one of them failed out of restarts (`--rollouts`): FAILED, naming the first (`failed_task`). A job of
  workers alone (`+join=RUN_DIR`) is COMPLETED when they left with the run;
- the ranks stopped on a signal (exit 75, searchr1.liveness.EXIT_STOPPED: the trainers saved the completed
  steps): the job requeues itself (REQUEUED, `scontrol requeue`) while Slurm still has it RUNNING (a preemption
  in its grace time, `scancel --signal`); not when Slurm is ending it (a cancel: STOPPED, and the launcher
  records Slurm's final state), nor when the time limit has stopped it more than cluster.slurm.max_timeouts
  times (TIMEOUT). Preemptions are not counted.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from searchr1.cluster import snapshot
from searchr1.cluster.script import STOP_SIGNAL
from searchr1.cluster.task import exits_dir, free_port, load_job
from searchr1.liveness import EXIT_STOPPED
from searchr1.rundir import load_config, utc_now, write_status

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"})  # what a run's status may end in
FAILURE_FIELDS = ("failed_rank", "failed_task", "failed_role", "node", "exit_code", "signal", "reason")
TIME_LIMIT = f"SIG{STOP_SIGNAL}"
BATCH_SIGNAL = "SEARCHR1_BATCH_SIGNAL"  # set by the batch script's trap when the batch shell itself is signalled


def _status(run_dir: Path) -> dict:
    path = Path(run_dir) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def last_error(log: Path) -> str:
    """The line of a log that says what went wrong (its last line if none does)."""
    try:
        lines = [x for x in Path(log).read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return next((x for x in reversed(lines) if "Error" in x or "Lost" in x or "failed" in x),
                lines[-1] if lines else "")


def describe(status: dict) -> str:
    """One line naming a failure from status.json's fields (the console's and batch.log's)."""
    how = f"was killed by {status['signal']}" if status.get("signal") else f"exited with code {status.get('exit_code')}"
    who = (f"rank {status['failed_rank']} ({status['failed_role']})" if status.get("failed_rank") is not None
           else f"{status['failed_task']} ({status['failed_role']})" if status.get("failed_task")
           else status.get("failed_role") or "the job")
    where = f" on {status['node']}" if status.get("node") else ""
    return f"{who}{where} {how}: {status.get('reason') or '(no error line)'}"


def start(run_dir: Path) -> int:
    job_id, restart = os.environ["SLURM_JOB_ID"], int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    changed = snapshot.changed_packages(run_dir)
    if changed:
        print(f"[batch] warning: the interpreter's packages changed since the submission: {', '.join(changed)}",
              file=sys.stderr, flush=True)
    write_status(run_dir, backend="slurm", state="RUNNING", job_id=job_id, restart=restart, batch_node=host,
                 started_at=utc_now(), packages_changed=changed, **dict.fromkeys(FAILURE_FIELDS))
    print(f"[batch] {utc_now()} job {job_id} restart {restart} on {host}", flush=True)
    return 0


def port(run_dir: Path) -> int:
    """Print a rendezvous port free on this node (rank 0's: the batch script runs on the first node of het
    group 0); a job without one fails here, naming the setting."""
    try:
        found = free_port(os.environ["SLURM_JOB_ID"], load_config(run_dir).cluster)
    except RuntimeError as err:
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        write_status(run_dir, state="FAILED", ended_at=utc_now(), **dict.fromkeys(FAILURE_FIELDS),
                     failed_role="rendezvous", node=host, reason=str(err))
        print(f"[batch] {err}", file=sys.stderr, flush=True)
        return 1
    write_status(run_dir, port=found)
    print(found, flush=True)
    return 0


def _ends(run_dir: Path, job_id: str, restart: str, kind: str = "rank") -> list[dict]:
    folder = exits_dir(run_dir, job_id, restart)
    return sorted((json.loads(p.read_text()) for p in folder.glob(f"{kind}*.json")), key=lambda e: e["at"]) \
        if folder.is_dir() else []


def _workers_failed(run_dir: Path, job_id: str, restart: str, rc: int) -> int:
    """Every elastic rollout worker ended out of restarts: the first worker's last failure is named."""
    last: dict[str, dict] = {}
    for e in _ends(run_dir, job_id, restart, "worker"):
        last[e["task"]] = e
    failed = [e for e in last.values() if e["exit_code"] != 0]
    if not failed:
        return _failed(run_dir, {"failed_rank": None, "failed_role": "rollout", "node": None, "exit_code": rc,
                                 "signal": None, "reason": _srun_errors(run_dir) or f"the workers' srun exited "
                                 f"with {rc}"}, run_dir / "logs" / "batch.log", rc or 1)
    e = _cause(failed)
    log = run_dir / "logs" / f"{e['task']}.log"
    return _failed(run_dir, {"failed_rank": None, "failed_task": e["task"], "failed_role": e["role"],
                             "node": e["node"], "exit_code": e["exit_code"], "signal": e["signal"],
                             "reason": last_error(log)}, log, rc or 1)


def _stopped(end: dict) -> bool:
    """Stopped on request: exit 75, or killed by the very signal that asked it to stop (it had not yet put its
    handlers in place)."""
    return end["exit_code"] == EXIT_STOPPED or (end["signal"] is not None and end["signal"] in end["stop_signals"])


def _cause(failed: list[dict]) -> dict:
    return sorted(failed, key=lambda e: (e["signal"] is None, e["at"]))[0]


def _job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    return next(iter(w.split("=", 1)[1] for w in out.stdout.split() if w.startswith("JobState=")), "UNKNOWN")


def _srun_errors(run_dir: Path) -> str:
    try:
        lines = (Path(run_dir) / "logs" / "batch.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "; ".join([x for x in lines if x.startswith("srun: error:")][-3:])


def finish(run_dir: Path, rc: int, prepare: bool = False, rollouts: bool = False) -> int:
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    job_id, restart = os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_RESTART_COUNT", "0")
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job = load_job(run_dir)
    if prepare:
        log = run_dir / "logs" / "prepare.log"
        return _failed(run_dir, {"failed_rank": None, "failed_role": "prepare", "node": host, "exit_code": rc,
                                 "signal": None, "reason": last_error(log)}, log, rc)
    if rollouts:
        return _workers_failed(run_dir, job_id, restart, rc)
    ends = _ends(run_dir, job_id, restart)
    if job.world == 0:  # workers joining another run (`+join=RUN_DIR`)
        return _joined(run_dir, job, job_id, restart, rc)
    stopped = [e for e in ends if _stopped(e)]
    # once a rank has stopped, a peer that exits with an error has only seen it leave (the store is gone)
    first_stop = min((e["at"] for e in stopped), default=float("inf"))
    failed = [e for e in ends if e["exit_code"] != 0 and not _stopped(e) and (e["signal"] or e["at"] < first_stop)]
    signalled = os.environ.get(BATCH_SIGNAL)
    # a signal that reached srun too (scancel --full/-b) makes srun SIGKILL every task at once; a task whose child
    # died a moment before the task did records that SIGKILL (seen in the suite under load): the stop's, not a failure
    if signalled:
        failed = [e for e in failed if e["signal"] != "SIGKILL"]
    if failed:
        e = _cause(failed)
        log = run_dir / "logs" / f"rank{e['rank']}.log"
        return _failed(run_dir, {"failed_rank": e["rank"], "failed_role": e["role"], "node": e["node"],
                                 "exit_code": e["exit_code"], "signal": e["signal"], "reason": last_error(log)},
                       log, e["exit_code"] or 128 + signal.Signals[e["signal"]].value)
    if stopped:
        return _stopped_job(run_dir, cfg, job_id, int(restart), sorted({s for e in stopped for s in e["stop_signals"]}))
    if rc == 0 and len(ends) == job.world:
        write_status(run_dir, state="COMPLETED", ended_at=utc_now())
        print(f"[batch] job {job_id}: every rank completed", flush=True)
        return 0
    if signalled:
        # nothing was saved: the requeued job resumes from the last periodic checkpoint
        print(f"[batch] {signalled} reached srun, which killed every task before they could save their state",
              file=sys.stderr, flush=True)
        return _stopped_job(run_dir, cfg, job_id, int(restart), [signalled])
    # no task recorded its end (a node lost, a task never started): srun's own words
    return _failed(run_dir, {"failed_rank": None, "failed_role": None, "node": None, "exit_code": rc,
                             "signal": None, "reason": _srun_errors(run_dir) or f"srun exited with {rc}"},
                   run_dir / "logs" / "batch.log", rc or 1)


def _joined(run_dir: Path, job, job_id: str, restart: str, rc: int) -> int:
    """A job of workers that joined another run: COMPLETED when they left with it (or after it ended)."""
    from searchr1.cluster.task import run_over

    workers = _ends(run_dir, job_id, restart, "worker")
    if rc == 0 or (workers and run_over(Path(job.target))):
        write_status(run_dir, state="COMPLETED", ended_at=utc_now(), target=str(job.target))
        print(f"[batch] job {job_id}: the workers left with the run {job.target}", flush=True)
        return 0
    return _workers_failed(run_dir, job_id, restart, rc)


def _failed(run_dir: Path, fields: dict, log: Path, code: int) -> int:
    write_status(run_dir, state="FAILED", ended_at=utc_now(), **fields)
    print(f"[batch] {describe(fields)}\n  see {log}", file=sys.stderr, flush=True)
    return code


def _stopped_job(run_dir: Path, cfg, job_id: str, restart: int, signals: list[str]) -> int:
    why = TIME_LIMIT if TIME_LIMIT in signals else (signals or ["a stop request"])[0]
    latest = run_dir / "checkpoints" / "latest"
    point = latest.read_text().strip() if latest.is_file() else None
    state = _job_state(job_id)
    if state != "RUNNING":
        # Slurm is ending the job (a cancel, the time limit): COMPLETING. A requeue would undo a cancel.
        reason = f"the ranks stopped on {why}; Slurm is ending the job (JobState={state}): not requeued"
        write_status(run_dir, state="STOPPED", stop_signal=why, checkpoint=point, reason=reason, ended_at=utc_now())
        print(f"[batch] {reason}", flush=True)
        return 0
    requeues = _status(run_dir).get("requeues", [])
    timeouts = sum(r["signal"] == TIME_LIMIT for r in requeues) + (why == TIME_LIMIT)
    limit = cfg.cluster.slurm.max_timeouts
    if why == TIME_LIMIT and timeouts > limit:
        reason = (f"stopped at the time limit {timeouts} time(s), more than cluster.slurm.max_timeouts={limit}: not "
                  f"requeued; " + (f"the run resumes from {point}" if point else "the run has no checkpoint yet"))
        write_status(run_dir, state="TIMEOUT", stop_signal=why, checkpoint=point, reason=reason, ended_at=utc_now())
        print(f"[batch] {reason}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    entry = {"restart": restart, "signal": why, "checkpoint": point, "at": utc_now()}
    write_status(run_dir, state="REQUEUED", stop_signal=why, checkpoint=point, requeues=requeues + [entry])
    saved = f"checkpoint {point}" if point else "no checkpoint yet"
    print(f"[batch] {entry['at']} the ranks stopped on {why} ({saved}): requeueing job {job_id}", flush=True)
    # ends this script too (the requeued job starts again from the top): write nothing after a success
    out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return EXIT_STOPPED
    write_status(run_dir, state="FAILED", ended_at=utc_now(), **dict.fromkeys(FAILURE_FIELDS),
                 reason=f"scontrol requeue {job_id} failed: {(out.stderr or out.stdout).strip()}")
    print(f"[batch] scontrol requeue {job_id} failed: {(out.stderr or out.stdout).strip()}", file=sys.stderr,
          flush=True)
    return EXIT_STOPPED


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("start", "port"):
        return (start if argv[0] == "start" else port)(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "finish":
        return finish(Path(argv[1]), int(argv[2]))
    if len(argv) == 4 and argv[0] == "finish" and argv[2] in ("--prepare", "--rollouts"):
        return finish(Path(argv[1]), int(argv[3]), prepare=argv[2] == "--prepare", rollouts=argv[2] == "--rollouts")
    raise SystemExit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
