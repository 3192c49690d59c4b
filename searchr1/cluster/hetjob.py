"""submitit extended to one heterogeneous Slurm job: het group 0 = trainer ranks, group 1 = rollout ranks.

submitit (1.5.4) has no heterogeneous jobs. This module extends it only where it must:
- `HetSlurmExecutor` submits our batch script (searchr1/cluster/script.py) instead of its own, and expects one
  result pickle per rank of every group. submitit keeps doing the rest: it pickles the call (`RankTask`,
  searchr1/cluster/task.py), and in every task its worker loads it, runs it and pickles its result.
- Its requeue is not used: submitit's USR2 handler would checkpoint and requeue from task 0's main thread
  only, and it ignores SIGTERM (preemption). The tasks stop on either signal and the batch script requeues.
- sacct labels het components `N+0`, `N+1` (submitit looks for `N` and waits forever): `HetWatcher` folds
  them into N, reading `squeue --states=all` when the cluster keeps no accounting; each rank's log is
  `logs/rank{R}.log` (`RankLogPaths`: srun's `%j`/`%t` are wrong inside a het step).
"""
from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from searchr1.cluster.job import Job
from searchr1.cluster.script import SUBMITIT_DIR, python_command, rank_command, render_script
from searchr1.config import Config

# Job states after which the job may still run or run again (Slurm's list; submitit's misses several).
# UNKNOWN: not listed yet.
UNFINISHED = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
    "SUSPENDED", "PREEMPTED", "SIGNALING", "STAGE_OUT", "STOPPED", "UNKNOWN",
})
# The job ended more than MinJobAge ago: squeue no longer lists it and there is no accounting to ask.
ENDED = "ENDED"


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
    """submitit's paths, with each task's log where searchr1.cluster.task writes it (run_dir/logs/rank{R}.log)."""

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
        super().__init__(self._run_dir / SUBMITIT_DIR, python=python_command(s))
        self.update_parameters(time=s.time_min)

    @property
    def _submitit_command_str(self) -> str:
        # the same command batch_script renders, whatever submitit's default becomes
        return rank_command(self.python, self._run_dir)

    def _num_tasks(self) -> int:
        # ranks of the world write results; elastic workers do not (a job of workers alone: submitit's one job)
        return max(self._job.world, 1)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return render_script(self._cfg, self._run_dir, command, self._job)
