"""Elastic rollouts on local processes: the same run as the fixed world without faults (curricula on); a killed
worker costs its unit, not the job; a restarted one rejoins with verified weights; a worker added mid-run takes
work; a trainer's death still ends the job."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from golden import differences, signature
from searchr1 import metrics as K
from searchr1.metrics import read_metrics
from test_loop import FAST_LIVENESS, alive, launch

ROOT = Path(__file__).resolve().parent.parent
ELASTIC = ("cluster.elastic.enabled=true",)


def train_records(run: Path) -> list[dict]:
    return [x for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.TRAIN]


# Both curricula on (the CPU experiment's): a work unit names questions by their index in its stage's pool, so
# every worker must hold the trainers' pools (searchr1/roles.rank_splits); a worker on the whole training pool
# rolled out other questions, from the first step on.
CURRICULA = ("curriculum.warm_start=answerable", "curriculum.rl=retrievable", "warm_start.steps=1",
             "warm_start.questions_per_step=2", "data.train_size=40")


def test_without_faults_an_elastic_run_is_the_fixed_run(tmp_path):
    """schedule=sync, no faults, both curricula on: the same units, the same questions, weights bit-exact through
    files: the same run as the fixed world's (whose smoke run test_golden holds to its recording)."""
    r, run = launch(tmp_path / "elastic", *ELASTIC, *CURRICULA)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r, fixed = launch(tmp_path / "fixed", *CURRICULA)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert differences(signature(fixed), signature(run)) == []
    pools = json.loads((run / "data.json").read_text())["curriculum"]
    # strict subsets of the 40 questions, so an index into the whole pool would name another question
    assert 0 < pools["rl"]["questions"] < 40 and 0 < pools["sft"]["questions"] < 40
    assert (run / "weights").is_dir() and json.loads((run / "rendezvous.json").read_text())["port"] > 0


def test_a_killed_worker_costs_its_unit_not_the_job_and_rejoins(tmp_path):
    once, back = tmp_path / "fired", tmp_path / "restarted_worker_claimed_a_unit"
    # worker 1 dies holding a unit of step 3 (0-based 2): workers pull units, so worker 0 holds its own unit of
    # that step until the kill has fired, leaving the other to worker 1; worker 0 holds its unit of step 4 until
    # worker 1's restart has claimed a unit, so the restart comes back within the run by what happened, not by
    # its length
    kill = (f"rank=worker1,point=rollout,step=2,do=kill,once={once};"
            f"rank=worker0,point=rollout,step=2,do=wait:{once};"
            f"rank=worker1,point=rollout,after={once},do=touch:{back};"
            f"rank=worker0,point=rollout,step=3,do=wait:{back}")
    r, run = launch(tmp_path, *ELASTIC, *FAST_LIVENESS, "steps=5", faults=kill)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert once.exists()  # the fault fired: worker 1 died holding a unit of step 3
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["restarts"][3] == 1
    train = train_records(run)
    assert [x[K.STEP] for x in train] == list(range(1, 6))
    assert all(x[K.TRAJECTORIES] == 4 for x in train)  # the configured batch every step: nothing lost
    assert sum(x["elastic/reissued"] for x in train) >= 1 and sum(x["elastic/lost"] for x in train) == 0
    # the restarted worker registered anew and joined from a full weights file, verified
    assert sum(x["elastic/joins"] for x in train) >= 1
    assert any(x["elastic/rejoin_s"] > 0 for x in train)
    assert "weights: rejoining" not in (run / "logs" / "worker1.log").read_text()


def test_a_trainer_death_still_ends_the_job(tmp_path):
    r, run = launch(tmp_path, *ELASTIC, "steps=4", faults="rank=1,point=train,step=1,do=kill")
    assert r.returncode != 0
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED" and status["failed_rank"] == 1 and status["failed_role"] == "trainer"
    assert not any(alive(p) for p in status["pids"])


def test_a_worker_added_mid_run_takes_work_and_leaves_with_the_run(tmp_path):
    """One worker, four units per step; a second joins from another launch (`join=RUN_DIR`) and takes units.
    The run's worker holds its first unit of step 1 until the joined worker has claimed one (fault rules wait and
    touch), so the join lands mid-run by what happened, not by how long the steps take."""
    go = tmp_path / "joined_worker_claimed_a_unit"
    run_root = tmp_path / "runs"
    main = subprocess.Popen([sys.executable, "launch.py", "+experiment=smoke", f"run_root={run_root}", *ELASTIC,
                             "cluster.rollout_ranks=1", "cluster.elastic.units_per_step=4", "steps=4",
                             "algo.questions_per_step=4"], cwd=ROOT,
                            env=dict(os.environ, SEARCHR1_FAULTS=f"rank=worker0,point=rollout,step=1,do=wait:{go}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    join = None
    try:
        run = None
        for line in main.stdout:
            if line.startswith("run folder: "):
                run = Path(line.split(": ", 1)[1].strip())
            if " | reward " in line:  # step 0 is done: the run's worker is now held at step 1
                break
        assert run is not None and main.poll() is None, "the run ended before its first step"
        rest = []  # drained while the joiner runs: a full pipe would stall the run's launcher
        drain = threading.Thread(target=lambda: rest.extend(main.stdout), daemon=True)
        drain.start()
        join = subprocess.Popen([sys.executable, "launch.py", "+experiment=smoke", f"run_root={tmp_path / 'joins'}",
                                 *ELASTIC, f"join={run}", "cluster.rollout_ranks=1"], cwd=ROOT,
                                env=dict(os.environ, SEARCHR1_FAULTS=f"rank=worker0,point=rollout,do=touch:{go}"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        join_out = join.communicate(timeout=900)[0]  # it leaves with the run, or fails: the run cannot end first
        main.wait(timeout=900)
        drain.join(timeout=60)
    finally:
        for p in (main, join):
            if p is not None and p.poll() is None:
                p.kill()
    assert join.returncode == 0, join_out[-3000:]
    assert main.returncode == 0, "".join(rest)[-3000:]
    assert go.exists()
    train = train_records(run)
    assert len(train) == 4 and all(x[K.TRAJECTORIES] == 8 for x in train)
    assert max(x["elastic/workers"] for x in train) == 2
    assert sum(x.get("elastic/units/w1", 0) for x in train) > 0  # the joined worker did work
