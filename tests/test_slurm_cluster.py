"""The Slurm backend against the local cluster (slurm/cluster-up.sh), under the `slurm` marker; skipped when sbatch
is missing or the cluster is down. Toy entries (tests/slurm_helpers.py) except the preemption test, which runs
the real loop with the tiny model."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1 import rundir
from searchr1.cluster import slurm, snapshot
from tests.slurm_helpers import (HANG_S, REPO, cancel_jobs, git, gone, launch_toy, make_cfg, markers, queued, squeue,
                                 toy_job, until)


def _cluster_up() -> bool:
    if shutil.which("sbatch") is None:
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in ping


needs_slurm = pytest.mark.skipif(not _cluster_up(), reason="no Slurm cluster (slurm/cluster-up.sh)")


@pytest.fixture
def run(tmp_path):
    """Submit toy jobs from the checkout under test; cancels whatever a test leaves running."""

    def submit(entry: str, **slurm_fields):
        cfg = make_cfg(tmp_path, **slurm_fields)
        run_dir = rundir.create(cfg)
        return cfg, run_dir, slurm.submit(cfg, run_dir, toy_job(entry, cfg))

    yield submit
    cancel_jobs(tmp_path)


def _step_cpus(job_id: str) -> list[str]:
    """TresPerTask of the step in each het component (each component has a job id of its own, %A)."""
    ids = subprocess.run(["squeue", "--noheader", "--format=%A", "-j", job_id], capture_output=True, text=True,
                         check=True).stdout.split()
    out = []
    for own in sorted(ids, key=int):
        text = subprocess.run(["scontrol", "show", "step", f"{own}.0"], capture_output=True, text=True).stdout
        out += re.findall(r"TresPerTask=(\S+)", text)
    return out


@pytest.mark.slurm
@needs_slurm
def test_het_job_forms_one_world_with_the_requested_cpus_gpus_and_a_free_port(run):
    """One world over both groups; each rank runs as many threads as its request has CPUs, and so does the step
    (srun --cpus-per-task); both trainers' step holds both GPUs of their node, each rank uses its own; NCCL's
    settings reach the ranks; the rendezvous port is the one free port of the range; the code is the
    snapshot's."""
    lo = 26000 + os.getpid() % 1000 * 4
    held = []
    for port in range(lo, lo + 3):  # all but lo + 3
        s = socket.socket()
        s.bind(("", port))
        s.listen()
        held.append(s)
    try:
        cfg, run_dir, job = run("toy_join", cpus_per_task=3, port_range=[lo, lo + 4])
        until(lambda: len(markers(run_dir, 0)) == 4, "every rank to join", job.job_id)
        assert _step_cpus(job.job_id) == ["cpu:3", "cpu:3"]
        (run_dir / "release").touch()
        assert slurm.wait(run_dir, poll_s=1) == 0
    finally:
        for s in held:
            s.close()
    results = job.results()  # submitit's own machinery: one result pickle per task
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["role"] for r in results] == ["trainer", "trainer", "rollout", "rollout"]
    assert {r["world"] for r in results} == {4} and {r["sum"] for r in results} == {10.0}
    hosts = [r["env"]["SLURMD_NODENAME"] for r in results]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]  # het components never share a node
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["job_id"] == job.job_id and status["failed_rank"] is None
    assert {r["env"]["MASTER_ADDR"] for r in results} == {hosts[0], status["batch_node"]}
    assert {r["env"]["MASTER_PORT"] for r in results} == {str(lo + 3)} and status["port"] == lo + 3
    for r in results:
        # torch runs no more threads than the machine has cores (2 here)
        assert r["env"]["OMP_NUM_THREADS"] == "3" and r["threads"] == min(3, os.cpu_count())
        assert r["env"]["SLURM_CPUS_PER_TASK"] == "3"
        assert r["env"]["SLURM_STEP_GPUS"] == "0,1" and r["env"]["CUDA_VISIBLE_DEVICES"] == str(r["rank"] % 2)
        assert r["env"]["NCCL_DEBUG"] == "WARN" and r["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
        assert r["module"] == str(run_dir / "code" / "tests" / "slurm_helpers.py")
        assert r["package"] == str(run_dir / "code" / "searchr1" / "__init__.py")
    assert json.loads((run_dir / "code.json").read_text())["commit"] == rundir.git_state()["commit"]
    for rank in range(4):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/4 ({results[rank]['role']}) on {hosts[rank]}" in log and "3 threads, 3 CPUs" in log
    assert "rank 2/4 (rollout)" in job.task(2).stdout()


@pytest.mark.slurm
@needs_slurm
def test_gang_allocation_waits_for_group0_gpus(run):
    # 7 of 8 GPUs busy on three nodes: 4+ GPUs are free, but only one node has 2 free together,
    # and the two groups need one node each
    blocker = subprocess.run(["sbatch", "--parsable", "--job-name=gang-blocker", "--nodes=3", "--ntasks-per-node=1",
                              "--gres=gpu:7", "--output=/dev/null", "--wrap=sleep 600"],
                             capture_output=True, text=True, check=True).stdout.strip()
    try:
        until(lambda: squeue(blocker)[0][1] == "RUNNING", "the blocker to run", blocker)
        cfg, run_dir, job = run("toy_join")
        # backfill has looked at the job (its reason is set) and left it pending: no task started
        until(lambda: {r[2] for r in squeue(job.job_id)} - {"None"}, "a pending reason", job.job_id)
        assert {r[1] for r in squeue(job.job_id)} == {"PENDING"} and not (run_dir / "toy").exists()
    finally:
        subprocess.run(["scancel", blocker], check=True)
    until(lambda: len(markers(run_dir, 0)) == 4, "every rank to join", job.job_id)
    (run_dir / "release").touch()
    assert slurm.wait(run_dir, poll_s=1) == 0
    assert [m["role"] for m in markers(run_dir, 0)] == ["trainer"] * 2 + ["rollout"] * 2


@pytest.mark.slurm
@needs_slurm
def test_a_killed_rollout_is_named_by_its_global_rank(run, capsys):
    """SIGKILL to rank 3 (index 1 of het group 1, as srun would call it): status.json and the console name
    rank 3, its role and node, and the signal; every task ends."""
    cfg, run_dir, job = run("toy_hang")
    until(lambda: len(markers(run_dir, 0)) == 4, "every rank to join", job.job_id)
    marks = markers(run_dir, 0)
    os.kill(marks[3]["pid"], signal.SIGKILL)
    assert slurm.wait(run_dir, poll_s=1) == 1
    status = json.loads((run_dir / "status.json").read_text())
    node = marks[3]["env"]["SLURMD_NODENAME"]
    assert (status["state"], status["failed_rank"], status["failed_role"]) == ("FAILED", 3, "rollout")
    assert (status["node"], status["signal"], status["exit_code"]) == (node, "SIGKILL", None)
    assert f"rank 3 (rollout) on {node} was killed by SIGKILL" in capsys.readouterr().err
    assert "rank 3 (rollout)" in (run_dir / "logs" / "batch.log").read_text()
    until(lambda: gone([m["pid"] for m in marks]), "every task process to end")


@pytest.mark.slurm
@needs_slurm
# SIGHUP takes the same handler as these two (the one tuple of signals in slurm.launch): a third job would test
# the tuple's third member for 20 s of the suite's time.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_waiting_launcher_cancels_the_job(tmp_path, sig):
    proc, run_dir = launch_toy(REPO, tmp_path, "toy_hang", wait=True)
    try:
        until(lambda: len(markers(run_dir, 0)) == 4 if (run_dir / "toy").exists() else False,
               "every rank to join", proc=proc)
        pids = [m["pid"] for m in markers(run_dir, 0)]
        job_id = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
        proc.send_signal(sig)
        out = proc.communicate(timeout=HANG_S)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        cancel_jobs(tmp_path)
    assert proc.returncode == 128 + sig, out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "CANCELLED" and status["signal"] == sig.name
    assert {r[1] for r in squeue(job_id)} == {"CANCELLED"}
    assert gone(pids)  # the launcher returned only once Slurm had ended every task
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", leftovers


@pytest.mark.slurm
@needs_slurm
def test_a_stopped_job_requeues_itself_and_runs_its_snapshot(tmp_path):
    """SIGTERM to the steps (scancel --signal=TERM, what a preemption sends here) stops every rank (exit 75) and
    the job requeues itself; the requeued job runs the code as submitted though the checkout changed. A SIGTERM
    that also reaches the batch shell and srun (--full), which then kills every task at once, still requeues.
    Then SIGUSR2 (the time limit) with cluster.slurm.max_timeouts=0 ends the job as TIMEOUT, not requeued."""
    checkout = tmp_path / "checkout"
    snapshot.take(REPO, checkout, tmp_path)
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "the checkout at submission")
    proc, run_dir = launch_toy(checkout, tmp_path / "runs", "toy_stoppable", wait=False)
    assert proc.wait(timeout=HANG_S) == 0, proc.stdout.read()
    job_id = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
    try:
        until(lambda: len(markers(run_dir, 0)) == 4 if (run_dir / "toy").exists() else False, "run 0", job_id)
        toy = checkout / "tests" / "slurm_helpers.py"
        toy.write_text(toy.read_text().replace('TOY_VERSION = "as submitted"', 'TOY_VERSION = "changed later"'))
        git(checkout, "commit", "-qam", "changed after the submission")
        subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
        until(lambda: len(markers(run_dir, 1)) == 4, "run 1 after the requeue", job_id, nudge=True)
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "RUNNING" and status["restart"] == 1
        assert [r["signal"] for r in status["requeues"]] == ["SIGTERM"]
        for m in markers(run_dir, 1):
            assert m["version"] == "as submitted"
            assert m["module"] == str(run_dir / "code" / "tests" / "slurm_helpers.py")
        subprocess.run(["scancel", "--signal=TERM", "--full", job_id], check=True)
        until(lambda: len(markers(run_dir, 2)) == 4, "run 2 after the requeue", job_id, nudge=True)
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        assert slurm.wait(run_dir, poll_s=1) == 1
    finally:
        cancel_jobs(tmp_path)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "TIMEOUT" and "cluster.slurm.max_timeouts=0" in status["reason"]
    assert [(r["restart"], r["signal"]) for r in status["requeues"]] == [(0, "SIGTERM"), (1, "SIGTERM")]
    assert json.loads((run_dir / "code.json").read_text())["source"] == str(checkout)
    for rank in range(4):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert "SIGTERM at" in log and "SIGUSR2 at" in log
    batch_log = (run_dir / "logs" / "batch.log").read_text()
    assert "[batch] SIGTERM\n" in batch_log and "reached srun, which killed every task" in batch_log


@pytest.mark.slurm
@needs_slurm
@pytest.mark.parametrize("fields, reason", [
    ({"partition": "nosuch"}, "Invalid partition"),
    ({"gpus_per_task": 9}, r"18 GPUs each.*has 0 such node"),
    ({"trainer_nodes": 2, "rollout_nodes": 3, "cluster": {"rollout_ranks": 3, "gpus": 5}},
     r"het group 1 needs 3 node.*2 of them taken by the other het groups \(they never share a node\)"),
    ({"partition": "short"}, r"time_min=30 minutes exceeds the MaxTime of partition 'short'"),
])
def test_unsatisfiable_requests_fail_at_submission_and_leave_no_run_folder(tmp_path, capsys, fields, reason):
    cfg = make_cfg(tmp_path, **fields)
    run_dir = rundir.create(cfg)
    with pytest.raises(slurm.SubmissionError, match=reason):
        slurm.submit(cfg, run_dir, toy_job("toy_join", cfg))
    assert not run_dir.exists()
    run_dir = rundir.create(cfg)
    assert slurm.launch(cfg, run_dir, toy_job("toy_join", cfg)) == 2  # launch.py's path: the reason on stderr
    err = capsys.readouterr().err
    assert re.search(reason, err, re.S) and "run folder removed" in err and not run_dir.exists()


@pytest.mark.slurm
@needs_slurm
def test_a_waiting_launcher_cancels_a_job_that_can_never_start(run):
    """A pending reason that no waiting clears, appearing only once the job has pended a while (here it is moved
    to a partition whose time limit it exceeds, while a blocker holds every node), is caught while the launcher
    waits: the job is cancelled and the run REJECTED."""
    blocker = subprocess.run(["sbatch", "--parsable", "--job-name=blocker", "--nodes=4", "--exclusive",
                              "--output=/dev/null", "--wrap=sleep 600"], capture_output=True, text=True,
                             check=True).stdout.strip()
    try:
        until(lambda: squeue(blocker)[0][1] == "RUNNING", "the blocker to run", blocker)
        cfg, run_dir, job = run("toy_join")
        assert {r[1] for r in squeue(job.job_id)} == {"PENDING"}
        subprocess.run(["scontrol", "update", f"jobid={job.job_id}", "partition=short"], check=True)
        assert slurm.wait(run_dir, poll_s=1) == 1
    finally:
        subprocess.run(["scancel", blocker], check=True)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "REJECTED" and re.search("PartitionTimeLimit|PartitionConfig", status["reason"])
    assert {r[1] for r in squeue(job.job_id)} == {"CANCELLED"} and not (run_dir / "toy").exists()


# ------------------------------------------------------------------------- launch.py with the real loop
def _launch(tmp_path: Path, *overrides: str, multirun: bool = False, experiment: str = "smoke",
            env: dict | None = None):
    cmd = [sys.executable, str(REPO / "launch.py"), *(["-m"] if multirun else []), f"+experiment={experiment}",
           "cluster=slurm", "cluster.gpus=4", "cluster.rollout_ranks=2", "cluster.slurm.rollout_nodes=1",
           "cluster.slurm.cpus_per_task=1", "cluster.slurm.mem_per_task_gb=1", "cluster.slurm.time_min=30",
           "cluster.slurm.signal_delay_s=60", "cluster.slurm.poll_s=1", f"run_root={tmp_path}", *overrides]
    env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    # from tmp_path: Hydra's multirun.yaml lands in the working directory (conf/config.yaml: sweep.dir=.)
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


N_STEPS = 8


@pytest.mark.slurm
@pytest.mark.slow
@needs_slurm
def test_a_preempted_smoke_run_requeues_and_loses_no_completed_step(tmp_path):
    """A real preemption: a job of the higher-priority partition `urgent` needs the trainers' node. Slurm sends
    SIGTERM to every rank; trainer 0 finishes the step in progress and publishes its weights, stops at its next
    safe point, every trainer saves the completed steps, every rank exits 75, the job requeues itself, resumes from
    that checkpoint and completes: each step is in metrics.jsonl exactly once and no completed step was done twice.

    To preempt at a known point, trainer 0 holds the third step's training (a fault rule) until every rank has
    the SIGTERM and both rollouts, waiting for that step's weights, have passed the stop on: the interleaving in
    which trainer 0 once published into a collective the rollouts had already left, and hung until GraceTime."""
    go = tmp_path / "go"
    env = {"SEARCHR1_FAULTS": f"rank=0,point=train,step=2,do=wait:{go}"}
    proc = _launch(tmp_path, "run_name=smoke", "cluster.slurm.wait=true", f"steps={N_STEPS}", "checkpoint_every=0",
                   "eval_before=false", env=env)
    run_dir, job_id, preemptor = tmp_path / "smoke", None, None

    def in_logs(text: str, ranks) -> bool:
        paths = [run_dir / "logs" / f"rank{r}.log" for r in ranks]
        return all(p.exists() and text in p.read_text() for p in paths)

    try:
        until(lambda: "job_id" in json.loads((run_dir / "slurm_job.json").read_text())
               if (run_dir / "slurm_job.json").exists() else False, "the submission", proc=proc)
        job_id = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
        until(lambda: in_logs("[faults] rank 0 at train step 2: wait:", [0]), "trainer 0 to hold step 3", job_id,
              proc)
        done = _train_steps(run_dir)
        trainer_node = json.loads((run_dir / "status.json").read_text())["batch_node"]
        t_preempt = time.time()
        preemptor = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-w", trainer_node, "--gres=gpu:8",
                                    "--job-name=preemptor", "--output=/dev/null", "--wrap=sleep 1"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        until(lambda: in_logs("SIGTERM at", range(4)), "the SIGTERM in every rank", job_id, proc)
        until(lambda: in_logs("passed on to the job", [2, 3]), "the rollouts to pass the stop on", job_id, proc)
        go.touch()
        until(lambda: json.loads((run_dir / "status.json").read_text())["state"] == "REQUEUED", "the requeue",
               job_id, proc)
        # the preemptor takes the node, then the requeued job may start again
        until(lambda: not queued(preemptor), "the preemptor to run", preemptor, nudge=True)
        until(lambda: json.loads((run_dir / "status.json").read_text()).get("restart") == 1, "the restart",
               job_id, proc, nudge=True)
        out = proc.communicate(timeout=HANG_S)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        cancel_jobs(tmp_path)
        if preemptor:
            subprocess.run(["scancel", preemptor], capture_output=True)
    assert proc.returncode == 0, out[-5000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["restart"] == 1
    k = int(status["requeues"][0]["checkpoint"].removeprefix("step_"))
    assert status["requeues"][0]["signal"] == "SIGTERM"
    # what was done when the preemption came was saved, and the step then in progress (held) was finished first
    assert done == [1, 2] and k == 3, (k, done)
    # each step in metrics.jsonl once, and none trained twice: the progress log keeps both runs' lines
    assert _train_steps(run_dir) == list(range(1, N_STEPS + 1))
    progress = (run_dir / "progress.log").read_text()
    assert [int(x) for x in re.findall(rf" step (\d+)/{N_STEPS} \|", progress)] == list(range(1, N_STEPS + 1))
    log0 = (run_dir / "logs" / "rank0.log").read_text()
    assert f"resumed from {run_dir}/checkpoints/step_{k:06d} at step {k}" in log0
    assert {r[1] for r in squeue(preemptor)} == {"COMPLETED"}
    for rank in range(4):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert "SIGTERM at" in log and "restart 1: rank" in log
    t = _timeline(run_dir, t_preempt)
    print(f"\npreemption timeline (s after the preemptor's sbatch): {t}")


def _timeline(run_dir: Path, t0: float) -> dict:
    """Seconds from t0 (the preemptor's sbatch) to: SIGTERM in rank 0, the checkpoint written, the requeue, the
    restart (batch script), the first step of the resumed run (its progress line)."""
    import datetime as dt

    def clock(hms: str) -> float:
        return round(dt.datetime.combine(dt.date.fromtimestamp(t0), dt.time.fromisoformat(hms)).timestamp() - t0, 1)

    status = json.loads((run_dir / "status.json").read_text())
    point = status["requeues"][0]["checkpoint"]
    state = run_dir / "checkpoints" / point / "trainer.pt"
    restart = re.search(r"\[batch\] (\S+) job \d+ restart 1 ", (run_dir / "logs" / "batch.log").read_text())
    k = int(point.removeprefix("step_"))
    step = re.search(rf"^(\S+) step {k + 1}/", (run_dir / "progress.log").read_text(), re.M)
    return {"sigterm": clock(re.search(r"SIGTERM at (\S+):", (run_dir / "logs" / "rank0.log").read_text())[1]),
            "checkpoint": round(state.stat().st_mtime - t0, 1) if state.exists() else None,
            "requeue": round(dt.datetime.fromisoformat(status["requeues"][0]["at"]).timestamp() - t0, 1),
            "restart": round(dt.datetime.fromisoformat(restart[1]).timestamp() - t0, 1),
            "first_resumed_step": clock(step[1])}


@pytest.mark.slurm
@needs_slurm
def test_multirun_submits_one_job_per_sweep_point(tmp_path):
    proc = _launch(tmp_path, "optim.lr=1e-6,2e-6", "cluster.slurm.check_s=0", multirun=True,
                   experiment="search_r1_cpu")
    out = proc.communicate(timeout=HANG_S)[0]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/slurm_job.json")}
    cancel_jobs(tmp_path)
    assert proc.returncode == 0, out
    assert len(jobs) == 2 and len({info["job_id"] for info in jobs.values()}) == 2, out
    lrs = sorted(rundir.load_config(tmp_path / name).optim.lr for name in jobs)
    assert lrs == [1e-6, 2e-6]
