"""Slurm backend without Slurm: the batch script (and the production one the slurm README shows), the settings,
the rank environment, the port, the code snapshot, how the batch script names a failure. The jobs themselves:
tests/test_slurm_cluster.py."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1 import rundir
from searchr1.cluster import batch, slurm, snapshot
from searchr1.cluster.script import batch_script, rank_command
from searchr1.config import ClusterConfig, ConfigError, SlurmConfig
from tests.slurm_helpers import REPO, git, make_cfg, toy_job


@pytest.mark.parametrize("nodelist, host", [
    ("node0", "node0"), ("node[2-3]", "node2"), ("gpu[07-09,12],cpu1", "gpu07"), ("a1,b[1-2]", "a1"),
    ("r[1-2]-n[3,5]", "r1-n3"),
])
def test_first_host(nodelist, host):
    assert slurm.first_host(nodelist) == host


def test_the_port_is_the_first_free_one_from_the_job_port(tmp_path):
    from searchr1.cluster.task import free_port

    cluster = make_cfg(tmp_path, port_range=[20000, 20010]).cluster
    assert {slurm.job_port(str(j), [20000, 20010]) for j in range(100)} == set(range(20000, 20010))
    start = slurm.job_port("12345", [20000, 20010])
    assert free_port("12345", cluster, is_free=lambda p: True) == start
    busy = {start, start + 1 if start < 20009 else 20000}
    assert free_port("12345", cluster, is_free=lambda p: p not in busy) not in busy
    with pytest.raises(RuntimeError, match=r"no free port in cluster.slurm.port_range=\[20000, 20010\]"):
        free_port("12345", cluster, is_free=lambda p: False)
    cluster.port = 29555
    with pytest.raises(RuntimeError, match="cluster.port=29555 is in use"):
        free_port("12345", cluster, is_free=lambda p: False)
    assert free_port("12345", cluster, is_free=lambda p: True) == 29555


def het_env(procid: int, **extra) -> dict:
    env = {"SLURM_PROCID": str(procid), "SLURM_NTASKS": "4", "SLURM_NTASKS_HET_GROUP_0": "2",
           "SLURM_NTASKS_HET_GROUP_1": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "node[3-4]", "SLURM_JOB_ID": "77",
           "SLURM_LOCALID": str(procid % 2), "MASTER_PORT": "20077", "SLURM_CPUS_PER_TASK": "2",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    env.update(extra)
    return env


def test_rank_env_world_rank_rendezvous_and_own_gpu(tmp_path):
    cfg = make_cfg(tmp_path, cpus_per_task=3)
    cluster, job = cfg.cluster, toy_job("toy_join", cfg)
    env = slurm.rank_env(het_env(3), cluster, job)
    # the step's SLURM_CPUS_PER_TASK is the last component's (Slurm 22.05): the request is stated instead
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node3",
                   "MASTER_PORT": "20077", "SLURM_CPUS_PER_TASK": "3", "CUDA_VISIBLE_DEVICES": "1"}
    cluster.slurm.gpus_per_task = 2
    with pytest.raises(RuntimeError, match="local rank 1 needs GPUs 2-3"):
        slurm.rank_env(het_env(3), cluster, job)
    cluster.slurm.gpu_binding = "task"  # Slurm has confined the task to its GPU already
    assert "CUDA_VISIBLE_DEVICES" not in slurm.rank_env(het_env(3, CUDA_VISIBLE_DEVICES="0"), cluster, job)


def test_rank_env_refuses_a_step_of_another_shape(tmp_path):
    cfg = make_cfg(tmp_path)
    cluster, job = cfg.cluster, toy_job("toy_join", cfg)
    with pytest.raises(RuntimeError, match="the step has 1 group-0 tasks of 3; the job asks for 2 trainer"):
        slurm.rank_env(het_env(0, SLURM_NTASKS_HET_GROUP_0="1", SLURM_NTASKS="3"), cluster, job)
    env = het_env(0)
    del env["SLURM_JOB_NODELIST_HET_GROUP_0"]
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST_HET_GROUP_0"):
        slurm.rank_env(env, cluster, job)


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


def _split(text: str) -> tuple[list[str], list[str], list[str]]:
    lines = text.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    cut = sbatch.index("#SBATCH hetjob")
    return sbatch[:cut], sbatch[cut + 1:], lines


def test_dry_run_writes_a_readable_het_script(tmp_path):
    cfg = make_cfg(tmp_path, submit=False, partition="gpu", account="proj", setup=["module load cuda"],
                   cpus_per_task=3)
    cfg.cluster.slurm.nccl.socket_ifname = "ib0"
    run_dir = rundir.create(cfg)
    assert slurm.launch(cfg, run_dir, toy_job("toy_join", cfg)) == 0
    text = (run_dir / "submit.sbatch").read_text()
    assert not (run_dir / "slurm_job.json").exists() and not (run_dir / "code").exists()
    group0, group1, lines = _split(text)
    assert text.count("#SBATCH hetjob") == 1
    request = ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=3", "--mem-per-cpu=342M",
               "--gpus-per-node=2"]
    for group in (group0, group1):
        for opt in request + ["--partition=gpu", "--account=proj", "--time=30"]:
            assert f"#SBATCH {opt}" in group
    assert f"#SBATCH --output={run_dir}/logs/batch.log" in group0 and "#SBATCH --signal=USR2@60" in group0
    # one srun, one command per het group, each with the same request as its #SBATCH block and its threads
    i = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    step = " ".join(line.rstrip("\\") for line in lines[i:i + 2])
    parts = step.split(" : ")
    assert len(parts) == 2 and parts[0].startswith("srun --kill-on-bad-exit=1 --het-group=0 ")
    assert parts[1].startswith("--het-group=1 ")
    for part in parts:
        assert all(opt in part.split() for opt in request)
        assert f"env OMP_NUM_THREADS=3 MKL_NUM_THREADS=3 {rank_command(sys.executable, run_dir)}" in part
    # the snapshot, not the live checkout; NCCL from the config; the stop signals end in a requeue
    assert f"cd {run_dir}/code || exit 1" in lines
    assert f"export PYTHONPATH={run_dir}/code${{PYTHONPATH:+:$PYTHONPATH}}" in lines
    assert {"export NCCL_SOCKET_IFNAME=ib0", "export NCCL_DEBUG=WARN", "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3"} \
        <= set(lines)
    assert any(line.startswith("trap ") and line.endswith(" TERM") for line in lines)
    assert lines[-1] == f"exec {sys.executable} -m searchr1.cluster.batch finish {run_dir} $?"
    # srun's %j and %t are wrong inside a het step
    assert "%j" not in text and "%t" not in text
    assert lines.index("module load cuda") < lines.index(f"cd {run_dir}/code || exit 1") < i
    assert subprocess.run(["bash", "-n", str(run_dir / "submit.sbatch")]).returncode == 0


def test_elastic_rollouts_run_in_a_step_of_their_own(tmp_path):
    """cluster.elastic.enabled: the same two het groups, but one srun step per group, each task told its
    group's first task; a dead worker ends nothing (--kill-on-bad-exit=0); the trainers' step decides the job's
    end. A job joining a run (`join=RUN_DIR`) is a plain job of one worker step, with no rendezvous port of its
    own."""
    from dataclasses import replace

    from searchr1.cluster import job as jobs

    cfg = make_cfg(tmp_path, cpus_per_task=3)
    cfg.cluster.elastic.enabled = True
    run_dir = tmp_path / "run"
    text = batch_script(cfg, run_dir, jobs.training(cfg))
    group0, group1, lines = _split(text)
    assert "#SBATCH --ntasks=2" in group0 and "#SBATCH --ntasks=2" in group1
    sruns = [line for line in lines if line.startswith("srun ")]
    cmd = rank_command(sys.executable, run_dir)
    assert len(sruns) == 2 and " : " not in text
    assert sruns[0].startswith("srun --het-group=0 --kill-on-bad-exit=1 --nodes=1 --ntasks=2 ")
    assert sruns[0].endswith(f"env SEARCHR1_FIRST_TASK=0 OMP_NUM_THREADS=3 MKL_NUM_THREADS=3 {cmd} &")
    assert sruns[1].startswith("srun --het-group=1 --kill-on-bad-exit=0 --nodes=1 --ntasks=2 ")
    assert sruns[1].endswith(f"env SEARCHR1_FIRST_TASK=2 OMP_NUM_THREADS=3 MKL_NUM_THREADS=3 {cmd} &")
    assert "wait $trainers; rc=$?" in lines and "export MASTER_PORT" in lines
    assert lines[-1] == f"exec {sys.executable} -m searchr1.cluster.batch finish {run_dir} $rc"
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0

    joining = jobs.joining(replace(cfg, join=str(run_dir)))
    text = batch_script(cfg, tmp_path / "join", joining)
    lines = text.splitlines()
    sruns = [line for line in lines if line.startswith("srun ")]
    assert "hetjob" not in text and "--het-group" not in text and "MASTER_PORT" not in text
    assert len(sruns) == 1 and sruns[0].startswith("srun --kill-on-bad-exit=0 --nodes=1 --ntasks=2 ")
    assert "SEARCHR1_FIRST_TASK=0" in sruns[0] and not sruns[0].endswith("&")
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0


def test_worker_env_finds_the_store(tmp_path):
    from dataclasses import replace

    from searchr1.cluster import job as jobs
    from searchr1.cluster.task import worker_env

    cfg = make_cfg(tmp_path, cpus_per_task=3)
    cfg.cluster.elastic.enabled = True
    env = worker_env(het_env(1), cfg.cluster, jobs.training(cfg), 1, tmp_path)
    assert env == {"MASTER_ADDR": "node3", "MASTER_PORT": "20077", "SEARCHR1_WORKER_SLOT": "1",
                   "SLURM_CPUS_PER_TASK": "3", "CUDA_VISIBLE_DEVICES": "1"}
    joining = jobs.joining(replace(cfg, join=str(tmp_path)))
    with pytest.raises(RuntimeError, match="no rendezvous.json"):
        worker_env(het_env(0), cfg.cluster, joining, 0, tmp_path)
    (tmp_path / "rendezvous.json").write_text(json.dumps({"host": "node0", "port": 20123}))
    assert worker_env(het_env(0), cfg.cluster, joining, 0, tmp_path)["MASTER_ADDR"] == "node0"


def test_task_binding_and_no_gpus(tmp_path):
    cfg = make_cfg(tmp_path, gpu_binding="task")
    group0, group1, _ = _split(batch_script(cfg, tmp_path / "run", toy_job("toy_join", cfg)))
    assert "#SBATCH --gpus-per-task=1" in group0 and not any("gpus-per-node" in x for x in group0 + group1)
    cfg.cluster.gpus = 0
    assert "--gpus" not in batch_script(cfg, tmp_path / "run", toy_job("toy_join", cfg))


def test_site_example_extends_the_slurm_option(tmp_path):
    from hydra import compose, initialize_config_dir

    import launch

    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    shutil.copy(REPO / "slurm" / "site.example.yaml", conf / "cluster" / "mysite.yaml")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = launch.validate(compose("config", overrides=["+experiment=search_r1", "cluster=mysite"]))
    assert cfg.cluster.backend == "slurm" and cfg.cluster.slurm.partition == "gpu"
    assert cfg.cluster.slurm.nccl.socket_ifname == "ib0"
    assert cfg.cluster.slurm.port_range == [20000, 32000]  # the rest comes from conf/cluster/slurm.yaml


README_RUN = "/shared/runs/2026-01-01_00-00-00_search_r1"
README_PYTHON = "/shared/envs/searchr1/bin/python"


def production_script() -> str:
    from hydra import compose, initialize_config_dir

    import launch
    from searchr1.cluster import job

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = launch.validate(compose("config", overrides=["+experiment=search_r1",
                                                           f"cluster.slurm.python={README_PYTHON}"]))
    return batch_script(cfg, Path(README_RUN), job.training(cfg))


def test_the_production_script_is_the_one_the_readme_shows():
    """`python launch.py +experiment=search_r1 cluster.slurm.submit=false`: 2 trainer ranks on one node, 14
    rollout ranks on two, 8 CPUs and threads per rank, every GPU of a node reachable from its ranks."""
    text = production_script()
    group0, group1, lines = _split(text)
    assert "#SBATCH --ntasks=2" in group0 and "#SBATCH --nodes=1" in group0 and "#SBATCH --gpus-per-node=2" in group0
    assert "#SBATCH --ntasks=14" in group1 and "#SBATCH --nodes=2" in group1 and "#SBATCH --ntasks-per-node=7" in group1
    assert "#SBATCH --gpus-per-node=7" in group1 and "#SBATCH --cpus-per-task=8" in group1
    readme = (REPO / "slurm" / "README.md").read_text()
    shown = re.search(r"<!-- production script -->\n```bash\n(.*?)```", readme, re.S)
    assert shown, "slurm/README.md lost its production script block"
    assert shown[1] == text, "slurm/README.md shows another script than searchr1 renders: paste the new one"


@pytest.mark.parametrize("fields, needle", [
    (dict(gpu_binding="socket"), "cluster.slurm.gpu_binding='socket'"),
    (dict(signal_delay_s=1800, time_min=30), "cluster.slurm.signal_delay_s=1800"),
    (dict(port_range=[20000, 20000]), "cluster.slurm.port_range"),
])
def test_slurm_settings_are_checked(tmp_path, fields, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        make_cfg(tmp_path, **fields)


def test_nccl_settings_are_checked_and_exported():
    from searchr1.cluster.config import NcclConfig

    assert NcclConfig().variables() == {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    assert NcclConfig(ib_disable=True, env={"NCCL_P2P_LEVEL": "NVL"}).variables()["NCCL_P2P_LEVEL"] == "NVL"
    for bad, needle in ((dict(debug="LOUD"), "nccl.debug"), (dict(ib_timeout=40), "nccl.ib_timeout"),
                        (dict(env={"CUDA_LAUNCH_BLOCKING": "1"}), "NCCL_* and TORCH_NCCL_*"),
                        (dict(env={"NCCL_DEBUG": "INFO"}), "nccl.env.NCCL_DEBUG")):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            NcclConfig(**bad)


def test_each_node_of_a_group_runs_as_many_ranks():
    with pytest.raises(ConfigError, match=r"rollout_ranks=13: must be a multiple of cluster.slurm.rollout_nodes=2"):
        ClusterConfig(backend="slurm", rollout_ranks=13, slurm=SlurmConfig(rollout_nodes=2))
    ClusterConfig(backend="local", rollout_ranks=13)  # the local backend has no nodes


def test_partition_limits_are_read():
    assert slurm._minutes("UNLIMITED") == float("inf") and slurm._minutes("1-02:03:00") == 1563
    assert slurm._minutes("00:01:00") == 1 and slurm._minutes("30") == 30
    assert slurm._gpus("gpu:8") == 8 and slurm._gpus("gpu:h100:4(S:0-1),gpu:a100:2") == 6
    assert slurm._gpus("(null)") == 0


def test_the_snapshot_copies_what_git_knows_and_records_the_commit(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "run" / "code"
    src.mkdir()
    (tmp_path / "run").mkdir()
    git(src, "init", "-q")
    (src / ".gitignore").write_text("*.log\n")
    (src / "a.py").write_text("A = 1\n")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "a")
    (src / "a.py").write_text("A = 2\n")  # modified, not committed
    (src / "new.py").write_text("B = 1\n")  # untracked
    (src / "noise.log").write_text("x\n")  # ignored
    info = snapshot.take(src, dest, tmp_path / "run")
    assert (dest / "a.py").read_text() == "A = 2\n" and (dest / "new.py").exists() and not (dest / "noise.log").exists()
    record = json.loads((tmp_path / "run" / "code.json").read_text())
    assert record["commit"] == git(src, "rev-parse", "HEAD").strip() == info["commit"]
    assert record["dirty"] and record["untracked"] == ["new.py"] and "torch" in record["packages"]
    assert "+A = 2" in (tmp_path / "run" / "code.diff").read_text()
    assert snapshot.changed_packages(tmp_path / "run") == []
    with pytest.raises(snapshot.SnapshotError, match="not a git repository"):
        snapshot.take(tmp_path / "run", tmp_path / "x", tmp_path)


def test_a_refused_run_folder_is_removed_unless_it_holds_work(tmp_path):
    cfg = make_cfg(tmp_path)
    fresh, worked = rundir.create(cfg), rundir.create(cfg)
    (worked / "metrics.jsonl").write_text("")
    assert slurm._discard(fresh, "no") == "run folder removed" and not fresh.exists()
    assert "status.json" in slurm._discard(worked, "sbatch said no")
    status = json.loads((worked / "status.json").read_text())
    assert (status["state"], status["reason"]) == ("REJECTED", "sbatch said no") and (worked / "metrics.jsonl").exists()


def test_a_reader_polling_a_file_written_atomically_never_sees_half_of_it(tmp_path):
    """What the batch script, the ranks and a joining worker poll (status.json, exit records, rendezvous.json)
    is written by rundir.write_atomic: each read is a whole version, and no temporary file stays behind."""
    import threading

    path, done, seen = tmp_path / "status.json", threading.Event(), []

    def poll():
        while not done.is_set():
            try:
                seen.append(json.loads(path.read_text())["n"])
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for n in range(300):
            rundir.write_atomic(path, json.dumps({"n": n, "pad": "x" * 100_000}))
    finally:
        done.set()
        reader.join()
    assert seen and seen == sorted(seen) and json.loads(path.read_text())["n"] == 299
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def _ended_run(tmp_path: Path, ends: list[dict]) -> Path:
    cfg = make_cfg(tmp_path)
    run_dir = rundir.create(cfg)
    slurm.record(run_dir, job={"entry": "x:y", "prepare": "", "groups": [
        {"role": "trainer", "tasks": 2, "nodes": 1}, {"role": "rollout", "tasks": 2, "nodes": 1}]})
    folder = run_dir / "logs" / "exits" / "9.0"
    folder.mkdir(parents=True)
    for e in ends:
        e = {"role": "trainer" if e["rank"] < 2 else "rollout", "node": f"node{e['rank'] // 2}",
             "stop_signals": [], "signal": None, "exit_code": None, **e}
        (folder / f"rank{e['rank']}.json").write_text(json.dumps(e))
        log = run_dir / "logs" / f"rank{e['rank']}.log"
        log.write_text(f"rank {e['rank']} says\nRuntimeError: boom {e['rank']}\n")
    return run_dir


STOPPED_THEN_LOST = [{"rank": 1, "exit_code": 75, "at": 1.0, "stop_signals": ["SIGTERM"]},
                     {"rank": 3, "exit_code": 1, "at": 2.0}]


KILLED = [{"rank": 3, "signal": "SIGKILL", "at": 2.0}]


@pytest.mark.parametrize("ends, cause, job_state, signalled", [
    # the rank killed by a signal is the cause, though a peer noticed its loss first
    ([{"rank": 1, "exit_code": 1, "at": 1.0}, {"rank": 3, "signal": "SIGKILL", "at": 2.0}], 3, "RUNNING", None),
    # otherwise the first to end
    ([{"rank": 2, "exit_code": 1, "at": 5.0}, {"rank": 0, "exit_code": 3, "at": 4.0}], 0, "RUNNING", None),
    # a peer that exits with an error after a rank stopped has only seen it leave: a requeue, not a failure
    (STOPPED_THEN_LOST, "requeue", "RUNNING", None),
    # but not when Slurm is ending the job (scancel): a requeue would undo the cancel
    (STOPPED_THEN_LOST, "no requeue", "COMPLETING", None),
    # the batch shell's SIGTERM reached srun too, which SIGKILLed the step: a task that outlived its child by a
    # moment recorded the SIGKILL, the stop's (the suite, under load, saw it called a failure)
    (KILLED, "requeue", "RUNNING", "SIGTERM"),
    ([], "requeue", "RUNNING", "SIGTERM"),
    # a rank's own error is a failure even while the job is being stopped
    (KILLED + [{"rank": 0, "exit_code": 1, "at": 1.0}], 0, "RUNNING", "SIGTERM"),
])
def test_finish_names_the_failed_rank(tmp_path, monkeypatch, capsys, ends, cause, job_state, signalled):
    run_dir = _ended_run(tmp_path, ends)
    if signalled:
        monkeypatch.setenv(batch.BATCH_SIGNAL, signalled)
    else:
        monkeypatch.delenv(batch.BATCH_SIGNAL, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    requeued = []
    monkeypatch.setattr(batch, "_job_state", lambda job_id: job_state)
    monkeypatch.setattr(batch.subprocess, "run", lambda cmd, **kw: requeued.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    code = batch.finish(run_dir, 137)
    status = json.loads((run_dir / "status.json").read_text())
    if cause == "requeue":
        assert status["state"] == "REQUEUED" and requeued == [["scontrol", "requeue", "9"]] and code == 75
        assert status["requeues"][0]["signal"] == "SIGTERM"
        assert ("reached srun" in capsys.readouterr().err) == bool(signalled)
        return
    if cause == "no requeue":
        assert status["state"] == "STOPPED" and not requeued and "JobState=COMPLETING" in status["reason"]
        return
    e = next(e for e in ends if e["rank"] == cause)
    assert status["state"] == "FAILED" and status["failed_rank"] == cause and not requeued
    assert status["failed_role"] == ("trainer" if cause < 2 else "rollout") and status["node"] == f"node{cause // 2}"
    assert (status["signal"], status["exit_code"]) == (e.get("signal"), e.get("exit_code"))
    assert status["reason"] == f"RuntimeError: boom {cause}"
    assert f"rank {cause} ({status['failed_role']}) on node{cause // 2}" in capsys.readouterr().err
