"""Local backend: every rank a process on this machine, the same roles and code path as a Slurm job.

- Before any rank starts, the job's `prepare` runs here once (model export, index, kernel), so that ranks
  only load warm caches and nothing is built inside a collective.
- Each rank is forked from a fork server (multiprocessing's forkserver) that imported the job's entry modules
  once, torch and transformers with them: four ranks starting at once each spent ~7 s of CPU importing the
  same modules, most of a short run on two cores. A rank gets its own session, the torch.distributed
  environment, its own cores (searchr1/placement.py: affinity and as many threads as cores) and its log, and
  reads the resolved config back from the run folder exactly as a Slurm task does.
- Like `srun --kill-on-bad-exit=1`, the first rank to fail takes the others down and is named; a rank that
  hangs without dying is caught inside the job by the heartbeat liveness (searchr1/liveness.py). Elastic
  rollout workers (outside the world) are restarted in place instead, while they have restarts left.
- Stop means stop: SIGTERM, SIGHUP and SIGINT to the launcher end every process of every rank (children
  included), record CANCELLED, and exit 128 + the signal.
- The console shows the run's progress log (one line per step and per evaluation batch); everything else
  stays in logs/rank{R}.log.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from searchr1 import placement
from searchr1.cluster.job import Job
from searchr1.config import Config
from searchr1.rundir import REPO_ROOT, load_config, utc_now, write_status

POLL_S = 0.2
GRACE_S = 10.0  # from SIGTERM to SIGKILL for a rank that does not exit by itself


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, cores: list[int], addr: str = "127.0.0.1") -> dict:
    env = dict(os.environ)
    threads = str(len(cores))
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR=addr,
               MASTER_PORT=str(port), OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _descendants(pids: list[int]) -> list[int]:
    """Every live process below `pids` (a rank's children may start sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _signal(leaders: list[int], others: list[int], sig: int) -> None:
    for pid in leaders + others:
        try:
            # a rank leads its own session: its process group holds what it started, unless they left it
            os.killpg(pid, sig) if pid in leaders else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate(procs: list, grace_s: float = GRACE_S) -> None:
    """End every rank and everything it started: SIGTERM, then SIGKILL for what is left after `grace_s`."""
    leaders = [p.pid for p in procs]
    others = _descendants(leaders)
    _signal(leaders, others, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    _signal(leaders, others + _descendants(leaders), signal.SIGKILL)
    for p in procs:
        p.wait()


def _echo(path: Path, offset: int) -> int:
    """Print what the progress log gained since `offset` (whole lines only)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    end = chunk.rfind(b"\n") + 1
    if end:
        sys.stdout.write(chunk[:end].decode(errors="replace"))
        sys.stdout.flush()
    return offset + end


def _last_error(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return next((x for x in reversed(lines) if "Error" in x or "Lost" in x or "failed" in x), lines[-1] if lines else "")


class _Stopped(Exception):
    def __init__(self, signum: int):
        self.signum = signum


class _Tasks:
    """The job's processes: ranks of the world (a failure ends the job) and, with elastic rollouts, workers
    outside it (a failure is restarted in place, `Group.restarts` times)."""

    def __init__(self, job: Job, run_dir: Path, target: Path, port: int, addr: str, plan: list[list[int]]):
        self.job, self.logs, self.target, self.port, self.addr, self.plan = job, run_dir / "logs", target, port, \
            addr, plan
        self.procs: list[_Forked | None] = [None] * job.tasks
        self.restarts = [0] * job.tasks
        self.rank, self.name, rank, slot = [], [], 0, 0
        for t in range(job.tasks):
            if job.group(t).in_world:
                self.rank.append(rank)
                self.name.append(f"rank{rank}")
                rank += 1
            else:
                self.rank.append(None)
                self.name.append(f"worker{slot}")
                slot += 1

    def start(self, t: int) -> None:
        g, cores = self.job.group(t), self.plan[t]
        env = rank_env(self.rank[t] or 0, self.job.world, self.port, cores, self.addr)
        if self.rank[t] is None:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                env.pop(k)
            env["SEARCHR1_WORKER_SLOT"] = self.name[t][len("worker"):]
        self.procs[t] = _Forked(_FORKS.Process(
            target=_task_main, args=(str(self.target), g.entry or self.job.entry, env, cores,
                                     str(self.logs / f"{self.name[t]}.log")), daemon=False))

    def live(self) -> list[_Forked]:
        return [p for p in self.procs if p is not None]


_FORKS = multiprocessing.get_context("forkserver")


def start_fork_server(job: Job) -> None:
    """Start the fork server now, importing the job's entry modules and `preload`, so that it loads them while
    the job is being prepared. It only imports and forks: it runs no torch operation, so no OpenMP pool or
    other thread exists in it to be lost in a fork (what makes forking a process that imported torch safe)."""
    entries = {e.partition(":")[0] for e in [job.entry] + [g.entry for g in job.groups] if e}
    _FORKS.set_forkserver_preload(sorted(entries) + list(job.preload))
    from multiprocessing import forkserver
    forkserver.ensure_running()


def _task_main(target: str, entry: str, env: dict, cores: list[int], log: str) -> None:
    """One task, in a process forked from the fork server: what a process of its own would be given (a
    session, its cores, environment and log), then the job's entry."""
    os.setsid()  # its own process group: ending a rank ends what it started
    os.sched_setaffinity(0, cores)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as PYTHONUNBUFFERED gave
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO_ROOT)
    import torch

    # OpenMP read OMP_NUM_THREADS when the fork server loaded torch, before this rank's environment existed
    torch.set_num_threads(len(cores))
    run_dir = Path(target)
    Job(entry, ()).call(load_config(run_dir), run_dir)


class _Forked:
    """A forked task behind the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, proc):
        self.proc = proc
        proc.start()
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.exitcode

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"task pid {self.pid}", timeout)
        return self.proc.exitcode


def launch(cfg: Config, run_dir: Path, job: Job, echo: bool = True) -> int:
    """Run every task of `job` to completion; returns 0, or the exit code of the first rank that failed."""
    run_dir = Path(run_dir)
    target = Path(job.target) if job.target else run_dir
    (run_dir / "logs").mkdir(exist_ok=True)

    def on_signal(signum, frame):
        raise _Stopped(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    tasks = None
    roles = [job.role(t) for t in range(job.tasks)]
    try:
        write_status(run_dir, backend="local", state="PREPARING", started_at=utc_now())
        start_fork_server(job)
        job.run_prepare(cfg, run_dir)
        addr, port = "127.0.0.1", cfg.cluster.port or free_port()
        if job.target:  # workers joining another run: its store
            where = json.loads((target / "rendezvous.json").read_text())
            addr, port = where["host"], where["port"]
        plan = placement.cpu_plan([g.tasks for g in job.groups], placement.allowed_cpus(), cfg.cluster.placement)
        tasks = _Tasks(job, run_dir, target, port, addr, plan)
        print(f"[local] {job.tasks} tasks: {placement.describe(plan, roles, tasks.name)}", flush=True)
        for t in range(job.tasks):
            tasks.start(t)
        write_status(run_dir, state="RUNNING", pids=[p.pid for p in tasks.live()], port=port, cores=plan,
                     roles=roles, tasks=tasks.name)
        failed = _watch(tasks, run_dir, echo)
    except _Stopped as stop:
        if tasks is not None:
            terminate(tasks.live())
        name = signal.Signals(stop.signum).name
        write_status(run_dir, state="CANCELLED", signal=name, ended_at=utc_now(),
                     exit_codes=[p.returncode for p in tasks.live()] if tasks else [])
        print(f"[local] {name}: every rank ended; run folder {run_dir}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if tasks is not None and any(p.poll() is None for p in tasks.live()):
            terminate(tasks.live())  # an error in the launcher itself leaves no rank behind
    codes = [p.returncode for p in tasks.procs]
    if failed is None:
        write_status(run_dir, state="COMPLETED", exit_codes=codes, restarts=tasks.restarts, ended_at=utc_now())
        return 0
    log = run_dir / "logs" / f"{tasks.name[failed]}.log"
    reason = _last_error(log)
    write_status(run_dir, state="FAILED", failed_rank=tasks.rank[failed], failed_task=tasks.name[failed],
                 failed_role=roles[failed], exit_codes=codes, reason=reason, restarts=tasks.restarts,
                 ended_at=utc_now())
    print(f"{tasks.name[failed].replace('rank', 'rank ')} ({roles[failed]}) failed with exit code {codes[failed]}: "
          f"{reason}\n  see {log}", file=sys.stderr)
    return codes[failed] if codes[failed] > 0 else 1


def _watch(tasks: _Tasks, run_dir: Path, echo: bool) -> int | None:
    """Poll until every rank of the world exits 0 (None) or one fails (its task index; the others are then
    ended). A worker outside the world that dies is started again while it has restarts left and the world is
    still whole: once one of its ranks has exited the run is ending, and a new worker could only wait for a
    store that is going away."""
    offset, job = 0, tasks.job
    world = [t for t in range(job.tasks) if tasks.rank[t] is not None]
    while True:
        if echo:
            offset = _echo(run_dir / "progress.log", offset)
        codes = [p.poll() for p in tasks.procs]
        going_on = all(codes[t] is None for t in world)
        for t in range(job.tasks):
            if tasks.rank[t] is None and codes[t] not in (None, 0) and going_on \
                    and tasks.restarts[t] < job.group(t).restarts:
                tasks.restarts[t] += 1
                print(f"[local] {tasks.name[t]} ({job.role(t)}) exited {codes[t]}: started again "
                      f"({tasks.restarts[t]}/{job.group(t).restarts})", flush=True)
                tasks.start(t)
                write_status(run_dir, restarts=tasks.restarts, pids=[p.pid for p in tasks.live()])
                codes[t] = None
        # A rank killed by a signal is the cause; ranks that exit 1 in the same instant only saw their
        # peer vanish. Otherwise the lowest failed task. Workers without restarts left fail the job only
        # when none is left while the world still needs them (a job of workers alone, or trainers without any
        # rollout).
        bad = sorted((c >= 0, t) for t, c in enumerate(codes) if c not in (None, 0) and tasks.rank[t] is not None)
        workers = [t for t in range(job.tasks) if tasks.rank[t] is None]
        if workers and going_on and all(codes[t] not in (None, 0) for t in workers):
            bad = bad or [(True, workers[0])]
        done = all(codes[t] == 0 for t in world) if world else all(codes[t] is not None for t in workers)
        if bad or done:
            if bad:
                terminate(tasks.live())
            elif workers:  # workers leave by themselves once the run is done; end those that do not
                deadline = time.monotonic() + GRACE_S
                while time.monotonic() < deadline and any(tasks.procs[t].poll() is None for t in workers):
                    time.sleep(POLL_S)
                terminate([tasks.procs[t] for t in workers])
            if echo:
                _echo(run_dir / "progress.log", offset)
            return bad[0][1] if bad else None
        time.sleep(POLL_S)

