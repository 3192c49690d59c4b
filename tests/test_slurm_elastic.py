"""Elastic rollouts on the local Slurm cluster (slurm/cluster-up.sh), the real loop with the tiny model: the het job
keeps its groups, but the rollout workers run in a step of their own where a dead one is started again in place
and ends nothing else; a job of extra workers (`join=RUN_DIR`) takes work and leaves with the run. Every wait is
bounded by the job or the launcher being alive (HANG_S only stops a hang)."""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1 import metrics as K
from searchr1.metrics import read_metrics
from tests.slurm_helpers import HANG_S, REPO, cancel_jobs, until
from tests.test_slurm_cluster import needs_slurm

ELASTIC = ("cluster.elastic.enabled=true", "cluster.heartbeat_period_s=0.5", "cluster.heartbeat_timeout_s=4")
SLURM = ("cluster=slurm", "cluster.gpus=4", "cluster.slurm.rollout_nodes=1", "cluster.slurm.cpus_per_task=1",
         "cluster.slurm.mem_per_task_gb=1", "cluster.slurm.time_min=30", "cluster.slurm.signal_delay_s=60",
         "cluster.slurm.poll_s=1", "cluster.slurm.wait=true")


def _launch(tmp_path: Path, run_root: Path, *overrides: str, faults: str = "") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SEARCHR1_FAULTS"}
    env["WANDB_MODE"] = "disabled"
    if faults:
        env["SEARCHR1_FAULTS"] = faults
    cmd = [sys.executable, str(REPO / "launch.py"), "+experiment=smoke", *SLURM, *ELASTIC, f"run_root={run_root}",
           *overrides]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [x for x in read_metrics(path) if x[K.KIND] == K.TRAIN] if path.exists() else []


def _ends(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob(f"logs/exits/*/{name}.*.json"),
                                                      key=lambda p: int(p.name.split(".")[1]))]


def _clock(run_dir: Path, hms: str) -> float:
    """A progress line's HH:MM:SS as a time stamp (the day the run started)."""
    day = dt.date.fromtimestamp((run_dir / "status.json").stat().st_mtime)
    return dt.datetime.combine(day, dt.time.fromisoformat(hms)).timestamp()


@pytest.mark.slurm
@needs_slurm
def test_a_killed_rollout_worker_is_restarted_in_place_and_the_job_completes(tmp_path):
    """SIGKILL to worker 0 at a unit of step 2 and to worker 1 at a unit of step 4: neither death ends the other
    worker or the job; each is started again in place in its task (its log says so) and rejoins; the steps
    after the second death are rolled out by the restarted workers alone. Every step completes with its full
    batch, the job is COMPLETED, the trainers ran once."""
    steps = 6
    fired0, fired1 = tmp_path / "fired0", tmp_path / "fired1"
    # Workers pull units, so which one rolls out a step is a race: each kill is made certain by holding the other
    # worker on its own unit of that step until the kill has fired (its `once` file exists), which leaves the
    # step's other unit to the worker that is to die. The second hold is in worker 0's restarted process only.
    kills = (f"rank=worker0,point=rollout,step=1,do=kill,once={fired0};"
             f"rank=worker1,point=rollout,step=1,do=wait:{fired0};"
             f"rank=worker1,point=rollout,step=3,do=kill,once={fired1};"
             f"rank=worker0,point=rollout,step=3,after={fired0},do=wait:{fired1}")
    proc = _launch(tmp_path, tmp_path / "runs", "run_name=kill", "cluster.rollout_ranks=2", f"steps={steps}",
                   faults=kills)
    try:
        out = proc.communicate(timeout=HANG_S)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        cancel_jobs(tmp_path)
    run_dir = tmp_path / "runs" / "kill"
    assert proc.returncode == 0, out[-5000:]
    assert fired0.exists() and fired1.exists()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["restart"] == 0
    train = _train(run_dir)
    assert [x[K.STEP] for x in train] == list(range(1, steps + 1))
    assert all(x[K.TRAJECTORIES] == 4 for x in train) and sum(x["elastic/lost"] for x in train) == 0
    assert sum(x["elastic/reissued"] for x in train) >= 2
    progress = (run_dir / "progress.log").read_text()
    last_step = _clock(run_dir, re.search(rf"^(\S+) step {steps}/{steps} \|", progress, re.M)[1])
    joins = 0
    for w in (0, 1):
        ends = _ends(run_dir, f"worker{w}")
        # killed once (by the fault), then started again in place: a restart that registered in time left with
        # the run (exit 0); one that came back as the run ended lost the store (an error, after the last step),
        # or was ended with the workers' step (no record)
        assert (ends[0]["start"], ends[0]["signal"], ends[0]["exit_code"]) == (0, "SIGKILL", None), ends
        assert all(e["exit_code"] == 0 or (e["signal"] is None and e["at"] >= last_step) for e in ends[1:]), ends
        log = (run_dir / "logs" / f"worker{w}.log").read_text()
        assert f"worker{w} was killed by SIGKILL: started again in place (1/3)" in log
        joins += len(re.findall(r"rollout worker w\d+ \(pid \d+\) joined the run", log))
    assert joins >= 3  # both at the start, and at least one restart
    # after worker 1's death (step 4) only the restarted workers (w2, w3) were left to roll out steps 5-6
    assert sum(x.get("elastic/units/w2", 0) + x.get("elastic/units/w3", 0) for x in train) >= 4
    for r in (0, 1):  # the trainers' tasks ran once
        assert (run_dir / "logs" / f"rank{r}.log").read_text().count("[slurm] job ") == 1
    # death to the step going on (measured: the progress log's lines around the first kill)
    killed = min(e["at"] for w in (0, 1) for e in _ends(run_dir, f"worker{w}") if e["signal"])
    # declared dead either way: its restart, once registered, posts its predecessor failed; a restart slower than
    # heartbeat_timeout_s finds it declared silent already
    dead = re.search(r"^(\S+) rollout worker w\d+ (fell silent|failed)", progress, re.M)
    assert dead, progress
    after = next(_clock(run_dir, m[1]) for m in re.finditer(r"^(\S+) step (\d+)/", progress, re.M)
                 if _clock(run_dir, m[1]) >= killed)
    print(f"\nfirst worker death: declared dead ({dead[2]}) after {_clock(run_dir, dead[1]) - killed:.1f} s, next "
          f"step line after {after - killed:.1f} s (HH:MM:SS resolution)")


@pytest.mark.slurm
@needs_slurm
def test_a_join_job_takes_work_and_leaves_with_the_run(tmp_path):
    """One rollout worker, four units per step; it falls silent (SIGSTOP) at a unit of step 3, so that the steps
    after it can only be rolled out by the workers of a second Slurm job (`join=RUN_DIR`), submitted once the
    run is under way. The join job's worker takes work, leaves when the run ends, and its job is COMPLETED;
    the run is COMPLETED."""
    steps = 6
    main = _launch(tmp_path, tmp_path / "runs", "run_name=main", "cluster.rollout_ranks=1",
                   "cluster.elastic.units_per_step=4", "algo.questions_per_step=4", f"steps={steps}",
                   faults="rank=worker0,point=rollout,step=2,do=stop")
    run_dir, join = tmp_path / "runs" / "main", None
    try:
        until(lambda: (run_dir / "rendezvous.json").exists(), "the run's rendezvous", proc=main)
        join = _launch(tmp_path, tmp_path / "joins", "run_name=join", "cluster.rollout_ranks=1", f"join={run_dir}")
        out = main.communicate(timeout=HANG_S)[0]
        join_out = join.communicate(timeout=HANG_S)[0]
    finally:
        for p in (main, join):
            if p is not None and p.poll() is None:
                p.kill()
        cancel_jobs(tmp_path)
    assert main.returncode == 0, out[-5000:]
    assert join.returncode == 0, join_out[-5000:]
    join_dir = tmp_path / "joins" / "join"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"
    joined = json.loads((join_dir / "status.json").read_text())
    assert joined["state"] == "COMPLETED" and joined["target"] == str(run_dir)
    assert "SEARCHR1_FIRST_TASK=0" in (join_dir / "submit.sbatch").read_text()
    assert "hetjob" not in (join_dir / "submit.sbatch").read_text()
    train = _train(run_dir)
    assert [x[K.STEP] for x in train] == list(range(1, steps + 1)) and all(x[K.TRAJECTORIES] == 8 for x in train)
    log = (join_dir / "logs" / "worker0.log").read_text()
    me = re.search(r"rollout worker (w\d+) \(pid \d+\) joined the run", log)[1]
    assert me != "w0" and sum(x.get(f"elastic/units/{me}", 0) for x in train) >= 4 * (steps - 3)
    assert [e["exit_code"] for e in _ends(join_dir, "worker0")] == [0]  # it left with the run, not killed
    ended = dt.datetime.fromisoformat(json.loads((run_dir / "status.json").read_text())["ended_at"]).timestamp()
    left = _ends(join_dir, "worker0")[0]["at"]
    print(f"\nthe join job's worker left {left - ended:+.1f} s after the run's status was final")
