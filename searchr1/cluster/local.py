"""Local backend: every rank a process on this machine, the same roles and code path as a Slurm job.

Each rank runs `python -m searchr1.cluster.local RUN_DIR` with the torch.distributed environment set, so it
reads the resolved config back from the run folder exactly as a Slurm task does. Like `srun
--kill-on-bad-exit=1`, the first rank to fail takes the others down: no rank can hang the job.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from searchr1.config import Config
from searchr1.rundir import REPO_ROOT, load_config, write_status

POLL_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, threads: int) -> dict:
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _terminate(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _echo(log: Path, offset: int) -> int:
    """Print what rank 0 logged since `offset`: the console shows the run's progress."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)


def launch(cfg: Config, run_dir: Path, entry: Callable | None = None, echo: bool = True) -> int:
    """Run every rank to completion; returns 0, or the exit code of the first rank that failed.

    `entry` is accepted for symmetry with the Slurm backend; local ranks always run `run_rank` through
    this module's __main__ (a fresh interpreter per rank, as on a cluster)."""
    world = cfg.cluster.trainer_ranks + cfg.cluster.rollout_ranks
    port = cfg.cluster.port or free_port()
    # The two roles mostly take turns (synchronous RL), so each role may use every core while it works.
    threads = max(1, (os.cpu_count() or 1) // max(cfg.cluster.trainer_ranks, cfg.cluster.rollout_ranks))
    logs = Path(run_dir) / "logs"
    logs.mkdir(exist_ok=True)
    procs = []
    for rank in range(world):
        out = open(logs / f"rank{rank}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "searchr1.cluster.local", str(run_dir)],
                                      env=rank_env(rank, world, port, threads), stdout=out,
                                      stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True))
        out.close()
    write_status(run_dir, backend="local", state="RUNNING", pids=[p.pid for p in procs], port=port)
    offset, failed = 0, None
    try:
        while True:
            if echo:
                offset = _echo(logs / "rank0.log", offset)
            codes = [p.poll() for p in procs]
            # A rank killed by a signal is the cause; ranks that exit 1 in the same instant only saw their
            # peer vanish. Otherwise the lowest failed rank.
            bad = sorted((c >= 0, r) for r, c in enumerate(codes) if c not in (None, 0))
            failed = bad[0][1] if bad else None
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _terminate(procs, grace_s=5)
        write_status(run_dir, state="CANCELLED", exit_codes=[p.returncode for p in procs])
        raise
    if failed is not None:
        _terminate(procs, grace_s=5)
    if echo:
        _echo(logs / "rank0.log", offset)
    codes = [p.returncode for p in procs]
    if failed is None:
        write_status(run_dir, state="COMPLETED", exit_codes=codes)
        return 0
    write_status(run_dir, state="FAILED", failed_rank=failed, exit_codes=codes)
    print(f"rank {failed} failed with exit code {codes[failed]}; see {logs / f'rank{failed}.log'}", file=sys.stderr)
    return codes[failed] if codes[failed] > 0 else 1


if __name__ == "__main__":
    from searchr1.loop import run_rank

    run_dir = Path(sys.argv[1])
    run_rank(load_config(run_dir), run_dir)
