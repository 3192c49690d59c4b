"""Slurm backend: the script and the pure pieces without Slurm; het jobs against the local cluster
(slurm/cluster-up.sh) under the `slurm` marker, skipped when sbatch is missing or the cluster is down."""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from searchr1 import dist, rundir
from searchr1.cluster import slurm
from searchr1.config import ClusterConfig, Config, SlurmConfig

REPO = Path(__file__).resolve().parent.parent


def make_cfg(tmp_path: Path, **slurm_fields) -> Config:
    # the tasks unpickle toy_entry by reference: they must import this module
    here = f"export PYTHONPATH={Path(__file__).parent}${{PYTHONPATH:+:$PYTHONPATH}}"
    fields = dict(time_min=10, cpus_per_task=1, mem_per_task_gb=1, trainer_nodes=1, rollout_nodes=1, wait=False,
                  poll_s=1, check_s=1, setup=[here])
    fields.update(slurm_fields)
    cluster = ClusterConfig(backend="slurm", trainer_ranks=2, rollout_ranks=2, gpus=4, timeout_s=60,
                            slurm=SlurmConfig(**fields))
    return Config(experiment="slurm_test", run_root=str(tmp_path), cluster=cluster)


# ------------------------------------------------------------------------------------------ without Slurm
@pytest.mark.parametrize("nodelist, host", [
    ("node0", "node0"), ("node[2-3]", "node2"), ("gpu[07-09,12],cpu1", "gpu07"), ("a1,b[1-2]", "a1"),
    ("r[1-2]-n[3,5]", "r1-n3"),
])
def test_first_host(nodelist, host):
    assert slurm.first_host(nodelist) == host


def test_job_port_stays_in_range_and_is_stable():
    ports = {slurm.job_port(str(j), [20000, 20010]) for j in range(100)}
    assert ports == set(range(20000, 20010))
    assert slurm.job_port("12345", [20000, 32000]) == slurm.job_port("12345", [20000, 32000])


def het_env(procid: int, **extra) -> dict:
    env = {"SLURM_PROCID": str(procid), "SLURM_NTASKS": "4", "SLURM_NTASKS_HET_GROUP_0": "2",
           "SLURM_NTASKS_HET_GROUP_1": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "node[3-4]", "SLURM_JOB_ID": "77",
           "SLURM_LOCALID": str(procid % 2)}
    env.update(extra)
    return env


def test_rank_env_world_rank_and_rendezvous(tmp_path):
    cluster = make_cfg(tmp_path).cluster
    env = slurm.rank_env(het_env(3), cluster)
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node3",
                   "MASTER_PORT": str(slurm.job_port("77", cluster.slurm.port_range)), "OMP_NUM_THREADS": "1"}
    assert slurm.rank_env(het_env(3, SLURM_CPUS_PER_TASK="8"), cluster)["OMP_NUM_THREADS"] == "8"
    cluster.port = 29555
    assert slurm.rank_env(het_env(0), cluster)["MASTER_PORT"] == "29555"


def test_rank_env_refuses_a_step_of_another_shape(tmp_path):
    cluster = make_cfg(tmp_path).cluster
    with pytest.raises(RuntimeError, match="trainer_ranks=2"):
        slurm.rank_env(het_env(0, SLURM_NTASKS_HET_GROUP_0="1", SLURM_NTASKS="3"), cluster)
    env = het_env(0)
    del env["SLURM_JOB_NODELIST_HET_GROUP_0"]
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST_HET_GROUP_0"):
        slurm.rank_env(env, cluster)


def test_merge_components_folds_het_labels():
    rows = [("12+0", "RUNNING", "node0"), ("12+1", "PENDING", ""), ("12+0.batch", "RUNNING", "node0"),
            ("13+0", "COMPLETED", "node0"), ("13+1", "CANCELLED by 0", "node1"), ("13+1.0", "CANCELLED", "node1"),
            ("14", "COMPLETED", "node2"), ("14+1", "COMPLETED", "node3"), ("15+0", "PENDING", "(None)")]
    info = slurm.merge_components(rows)
    assert info["12"]["State"] == "RUNNING" and info["12"]["States"] == "RUNNING,PENDING"
    assert info["13"]["State"] == "CANCELLED" and info["13"]["NodeList"] == "node0,node1"
    assert info["14"]["State"] == "COMPLETED"
    assert info["15"]["State"] == "PENDING" and info["15"]["NodeList"] == ""


@pytest.mark.parametrize("states, state", [
    (["COMPLETED", "COMPLETED"], "COMPLETED"), (["COMPLETED", "FAILED"], "FAILED"),
    (["PENDING", "PENDING"], "PENDING"), (["CANCELLED", "RUNNING"], "RUNNING"),
    (["REQUEUED", "REQUEUED"], "REQUEUED"), (["TIMEOUT", "CANCELLED"], "TIMEOUT"),
])
def test_combined_state(states, state):
    assert slurm.combined_state(states) == state


def test_dry_run_writes_a_readable_het_script(tmp_path):
    cfg = make_cfg(tmp_path, submit=False, partition="gpu", account="proj", setup=["module load cuda"])
    run_dir = rundir.create(cfg)
    assert slurm.launch(cfg, run_dir, entry=print) == 0
    text = (run_dir / "submit.sbatch").read_text()
    assert not (run_dir / "slurm_job.json").exists()
    lines = text.splitlines()
    sbatch = [l for l in lines if l.startswith("#SBATCH")]
    split = sbatch.index("#SBATCH hetjob")
    group0, group1 = sbatch[:split], sbatch[split + 1:]
    assert sbatch.count("#SBATCH hetjob") == 1
    for group in (group0, group1):
        for opt in ("--nodes=1", "--ntasks=2", "--gpus-per-task=1", "--cpus-per-task=1", "--mem-per-cpu=1024M",
                    "--partition=gpu", "--account=proj", "--time=10"):
            assert f"#SBATCH {opt}" in group
    assert f"#SBATCH --output={run_dir}/logs/batch.log" in group0
    assert "#SBATCH --signal=USR2@90" in group0
    srun = [l for l in lines if l.startswith("srun ")]
    assert len(srun) == 1 and "--het-group=0-1" in srun[0] and "--kill-on-bad-exit=1" in srun[0]
    assert "rank${SLURM_PROCID}.log" in srun[0] and str(run_dir / "submitit") in srun[0]
    # srun's %j and %t are wrong inside a het step
    assert "%j" not in text and "%t" not in text
    assert lines.index("module load cuda") < lines.index(srun[0])
    assert subprocess.run(["bash", "-n", str(run_dir / "submit.sbatch")]).returncode == 0


def test_site_example_extends_the_slurm_option(tmp_path):
    from hydra import compose, initialize_config_dir

    import launch

    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    shutil.copy(REPO / "slurm" / "site.example.yaml", conf / "cluster" / "mysite.yaml")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = launch.validate(compose("config", overrides=["+experiment=search_r1", "cluster=mysite"]))
    assert cfg.cluster.backend == "slurm" and cfg.cluster.slurm.partition == "gpu"
    assert cfg.cluster.slurm.port_range == [20000, 32000]  # the rest comes from conf/cluster/slurm.yaml


def test_production_experiment_is_2_plus_14_on_three_nodes(tmp_path):
    from hydra import compose, initialize_config_dir

    import launch

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = launch.validate(compose("config", overrides=["+experiment=search_r1", f"run_root={tmp_path}"]))
    text = slurm.render_script(cfg, tmp_path / "run", "python -m submitit.core._submit x")
    group0, group1 = text.split("#SBATCH hetjob")
    assert "--ntasks=2\n" in group0 and "--nodes=1\n" in group0 and "--gpus-per-task=1\n" in group0
    assert "--ntasks=14\n" in group1 and "--nodes=2\n" in group1 and "--gpus-per-task=1\n" in group1


def test_dry_run_without_gpus_requests_none(tmp_path):
    cfg = make_cfg(tmp_path, submit=False)
    cfg.cluster.gpus = 0
    run_dir = rundir.create(cfg)
    slurm.launch(cfg, run_dir, entry=print)
    assert "--gpus" not in (run_dir / "submit.sbatch").read_text()


# ----------------------------------------------------------------------------- against the local cluster
def _cluster_up() -> bool:
    if shutil.which("sbatch") is None:
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in ping


needs_slurm = pytest.mark.skipif(not _cluster_up(), reason="no Slurm cluster (slurm/cluster-up.sh)")


def toy_entry(mode: str, cfg: Config, run_dir: Path) -> dict:
    """A stand-in for the loop: joins the world, all-reduces, leaves one marker per rank and run.
    mode hang: then sleeps until killed; resume: sleeps in run 0 (waiting for a requeue), returns in the next."""
    topo = dist.topology_from_env(cfg.cluster.trainer_ranks)
    dist.init(topo, cfg.cluster.timeout_s)
    x = torch.tensor([float(topo.rank + 1)])
    tdist.all_reduce(x)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    marks = Path(run_dir) / "toy"
    marks.mkdir(exist_ok=True)
    earlier = sorted(p.name for p in marks.glob(f"rank{topo.rank}.run*"))
    info = {"rank": topo.rank, "role": topo.role, "world": topo.world, "sum": x.item(), "restart": restart,
            "earlier": earlier, "pid": os.getpid(), "master": os.environ["MASTER_ADDR"],
            "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "host": os.environ.get("SLURMD_NODENAME")}
    (marks / f"rank{topo.rank}.run{restart}").write_text(json.dumps(info))
    if mode == "hang" or (mode == "resume" and restart == 0):
        time.sleep(600)
    dist.shutdown()
    return info


def _wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _markers(run_dir: Path, run: int) -> list[Path]:
    return sorted((run_dir / "toy").glob(f"rank*.run{run}"))


def _squeue(job_id: str) -> list[list[str]]:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", "-j", job_id],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines()]


@pytest.fixture
def run(tmp_path):
    """Submit toy entries; cancels whatever a test leaves running."""
    jobs = []

    def submit(mode: str, **slurm_fields):
        cfg = make_cfg(tmp_path, **slurm_fields)
        run_dir = rundir.create(cfg)
        job = slurm.submit(cfg, run_dir, functools.partial(toy_entry, mode))
        jobs.append(job.job_id)
        return cfg, run_dir, job

    yield submit
    for job_id in jobs:
        subprocess.run(["scancel", job_id], capture_output=True)


@pytest.mark.slurm
@needs_slurm
def test_het_job_forms_one_world(run):
    cfg, run_dir, job = run("join")
    assert slurm.wait(run_dir, poll_s=1) == 0
    results = job.results()  # submitit's own machinery: one result pickle per task
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["role"] for r in results] == ["trainer", "trainer", "rollout", "rollout"]
    assert {r["world"] for r in results} == {4} and {r["sum"] for r in results} == {10.0}
    assert {r["master"] for r in results} == {results[0]["host"]}
    # one GPU per task; group 0 on one node, group 1 on another (het components never share a node)
    assert [r["cuda_visible"] for r in results] == ["0", "1", "0", "1"]
    assert results[0]["host"] == results[1]["host"] != results[2]["host"] == results[3]["host"]
    rows = _squeue(job.job_id)
    assert sorted(r[0] for r in rows) == [f"{job.job_id}+0", f"{job.job_id}+1"]
    assert {r[1] for r in rows} == {"COMPLETED"}
    info = json.loads((run_dir / "slurm_job.json").read_text())
    assert info["job_id"] == job.job_id and info["state"] == "COMPLETED" and info["failed_ranks"] == []
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"
    assert "#SBATCH hetjob" in (run_dir / "submit.sbatch").read_text()
    for rank in range(4):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/4" in log
    assert "rank 2/4 (rollout)" in job.task(2).stdout()


@pytest.mark.slurm
@needs_slurm
def test_gang_allocation_waits_for_group0_gpus(run):
    # 7 of 8 GPUs busy on three nodes: 4+ GPUs are free, but only one node has 2 free together,
    # and the two groups need one node each
    blocker = subprocess.run(["sbatch", "--parsable", "--job-name=gang-blocker", "--nodes=3", "--ntasks-per-node=1",
                              "--gres=gpu:7", "--output=/dev/null", "--wrap=sleep 120"],
                             capture_output=True, text=True, check=True).stdout.strip()
    try:
        _wait_for(lambda: _squeue(blocker)[0][1] == "RUNNING", 20, "the blocker to run")
        cfg, run_dir, job = run("join")
        time.sleep(3)
        assert {r[1] for r in _squeue(job.job_id)} == {"PENDING"}
        assert not (run_dir / "toy").exists()  # no task started, not even one trainer
    finally:
        subprocess.run(["scancel", blocker], check=True)
    assert slurm.wait(run_dir, poll_s=1) == 0
    assert [json.loads(p.read_text())["role"] for p in _markers(run_dir, 0)] == ["trainer"] * 2 + ["rollout"] * 2


@pytest.mark.slurm
@needs_slurm
def test_scancel_ends_every_task(run):
    cfg, run_dir, job = run("hang")
    _wait_for(lambda: len(_markers(run_dir, 0)) == 4, 60, "every task to start")
    pids = [json.loads(p.read_text())["pid"] for p in _markers(run_dir, 0)]
    job.cancel()  # scancel <leader>
    assert slurm.wait(run_dir, poll_s=1) == 1
    info = json.loads((run_dir / "slurm_job.json").read_text())
    assert info["state"] == "CANCELLED" and info["failed_ranks"] == [0, 1, 2, 3]

    def all_gone():
        for pid in pids:
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                pass
        return True

    _wait_for(all_gone, 15, "every task process to end")


@pytest.mark.slurm
@needs_slurm
def test_preemption_requeues_through_submitit_and_resumes(run):
    """submitit's hook: USR2 makes task 0 checkpoint the call and `scontrol requeue` the whole het job; the
    requeued tasks run the same entry again and find what the first run left. (`scontrol requeue` by hand, with
    the real loop's checkpoints: test_launch_smoke_het_job_survives_a_requeue.)"""
    cfg, run_dir, job = run("resume")
    _wait_for(lambda: len(_markers(run_dir, 0)) == 4, 60, "run 0")
    job._interrupt()  # as Slurm preempts: SIGTERM (submitit ignores it), then USR2
    # a requeued job may restart once its credentials expire; a nudge gets backfill to look at it again
    _wait_for(lambda: _nudge(job.job_id) or len(_markers(run_dir, 1)) == 4, 90, "run 1 after preemption")
    assert slurm.wait(run_dir, poll_s=1) == 0
    for rank, result in enumerate(job.results()):
        assert result["restart"] == 1 and result["earlier"] == [f"rank{rank}.run0"]
    log0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "Calling checkpoint method" in log0 and f"Requeued job {job.job_id}" in log0


def _nudge(job_id: str) -> bool:
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "nice=0"], capture_output=True)
    return False


@pytest.mark.slurm
@needs_slurm
@pytest.mark.parametrize("fields, reason", [
    ({"partition": "nosuch"}, "Invalid partition"),
    ({"gpus_per_task": 9}, "Requested node configuration is not available"),
    ({"trainer_nodes": 3, "rollout_nodes": 2}, "never share a node"),
    # sbatch accepts this one (the local cluster's `short` partition allows 1 minute); it would pend forever
    ({"partition": "short"}, "PartitionTimeLimit|PartitionConfig"),
])
def test_unsatisfiable_requests_fail_at_submission(tmp_path, capsys, fields, reason):
    cfg = make_cfg(tmp_path, **fields)
    run_dir = rundir.create(cfg)
    with pytest.raises(slurm.SubmissionError, match=reason):
        slurm.submit(cfg, run_dir, entry=print)
    assert slurm.launch(cfg, run_dir, entry=print) == 2  # launch.py's path: Slurm's reason on stderr
    assert re.search(reason, capsys.readouterr().err)
    info = json.loads((run_dir / "slurm_job.json").read_text())
    assert info["state"] == "REJECTED" and re.search(reason, info["reason"])
    if "job_id" in info:  # accepted, then cancelled: nothing is left waiting
        assert {r[1] for r in _squeue(info["job_id"])} == {"CANCELLED"}


# ------------------------------------------------------------------------- launch.py with the real loop
def _launch(tmp_path: Path, *overrides: str, multirun: bool = False, experiment: str = "smoke"):
    cmd = [sys.executable, str(REPO / "launch.py"), *(["-m"] if multirun else []), f"+experiment={experiment}",
           "cluster=slurm", "cluster.gpus=4", "cluster.rollout_ranks=2", "cluster.slurm.rollout_nodes=1",
           "cluster.slurm.cpus_per_task=1", "cluster.slurm.mem_per_task_gb=1", "cluster.slurm.time_min=10",
           "cluster.slurm.poll_s=1", "cluster.timeout_s=120", f"run_root={tmp_path}", *overrides]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    # from tmp_path: Hydra's multirun.yaml lands in the working directory (conf/config.yaml: sweep.dir=.)
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


N_STEPS = 30


@pytest.mark.slurm
@pytest.mark.slow
@needs_slurm
def test_launch_smoke_het_job_survives_a_requeue(tmp_path):
    """launch.py submits the smoke experiment as one het job; a requeue mid-run resumes from the last
    checkpoint and the step counter continues; the job completes with every rank in its role."""
    # steps run ~1 s each here, and tasks keep going for a few seconds after the requeue (submitit ignores
    # SIGTERM): N_STEPS leaves the requeue something to interrupt
    proc = _launch(tmp_path, "run_name=smoke", "cluster.slurm.wait=true", f"steps={N_STEPS}", "checkpoint_every=1")
    run_dir, job_id = tmp_path / "smoke", None
    try:
        _wait_for(lambda: (run_dir / "slurm_job.json").exists(), 60, "the submission")
        job_id = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
        _wait_for(lambda: _squeue(job_id)[0][1] != "PENDING", 30, "the job to start")
        assert sorted(r[0] for r in _squeue(job_id)) == [f"{job_id}+0", f"{job_id}+1"]
        _wait_for(lambda: 2 <= len(_train_steps(run_dir)) or proc.poll() is not None, 180, "two steps")
        subprocess.run(["scontrol", "requeue", job_id], check=True)
        _wait_for(lambda: _nudge(job_id) or proc.poll() is not None, 200, "the requeued job to end")
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            if job_id:
                subprocess.run(["scancel", job_id])
    assert proc.returncode == 0, out
    info = json.loads((run_dir / "slurm_job.json").read_text())
    assert info["state"] == "COMPLETED" and info["component_states"] == "COMPLETED,COMPLETED"
    assert info["failed_ranks"] == []
    log0 = (run_dir / "logs" / "rank0.log").read_text()
    resumed = re.search(r"resumed from .*step_0*(\d+) at step (\d+)", log0)
    assert resumed, log0[-3000:]
    k = int(resumed[2])
    # the counter continued from the last checkpoint (at least the two steps seen before the requeue) ...
    assert k >= 2
    # ... and the resumed run logged every remaining step once
    steps = _train_steps(run_dir)
    assert k < N_STEPS, "the requeue came after the last step: nothing was interrupted"
    assert sorted(set(steps)) == list(range(1, N_STEPS + 1))
    assert steps[len(steps) - (N_STEPS - k):] == list(range(k + 1, N_STEPS + 1))
    assert (run_dir / "submit.sbatch").read_text().count("#SBATCH hetjob") == 1
    for rank, role in enumerate(["trainer", "trainer", "rollout", "rollout"]):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"restart 0: rank {rank}/4 ({role})" in log and f"restart 1: rank {rank}/4 ({role})" in log


@pytest.mark.slurm
@needs_slurm
def test_multirun_submits_one_job_per_sweep_point(tmp_path):
    proc = _launch(tmp_path, "algo.lr=1e-6,2e-6", "cluster.slurm.check_s=0", multirun=True,
                   experiment="search_r1_cpu")
    out = proc.communicate(timeout=120)[0]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/slurm_job.json")}
    for info in jobs.values():
        subprocess.run(["scancel", info["job_id"]], capture_output=True)
    assert proc.returncode == 0, out
    assert len(jobs) == 2 and len({info["job_id"] for info in jobs.values()}) == 2, out
    lrs = sorted(rundir.load_config(tmp_path / name).algo.lr for name in jobs)
    assert lrs == [1e-6, 2e-6]
