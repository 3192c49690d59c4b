"""The local backend's supervision of workers outside the world: one that dies while the run goes on is started
again; one that dies as the run ends is not (a new one could only wait for a store that is going away)."""
import json
import os
import time
from pathlib import Path

from searchr1.cluster import local
from searchr1.cluster.job import Group, Job
from searchr1.config import ClusterConfig, Config
from searchr1.rundir import config_yaml

HANG_S = 600  # only stops a test that would otherwise hang: every wait below is on the other side's progress


def _gone(pid: int) -> bool:
    """Exited: reaped, or a zombie waiting for the launcher's poll."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_for(path: Path) -> str:
    deadline = time.monotonic() + HANG_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def toy_trainer(cfg: Config, run_dir: Path) -> None:
    """Leaves as soon as the worker has started `want` times, saying its pid first."""
    (run_dir / "trainer.pid").write_text(str(os.getpid()))
    _wait_for(run_dir / f"worker.start{os.environ['TOY_WANT']}")


def toy_worker(cfg: Config, run_dir: Path) -> None:
    """Start n (counted in files): the first dies at once with exit 3 while the trainer runs; the second waits
    for the trainer to have exited, then dies with exit 3 too."""
    n = sum(1 for _ in run_dir.glob("worker.start*"))
    (run_dir / f"worker.start{n}").write_text(str(os.getpid()))
    if n == 1:
        pid = int(_wait_for(run_dir / "trainer.pid"))
        deadline = time.monotonic() + HANG_S
        while not _gone(pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    raise SystemExit(3)


def test_a_worker_is_restarted_while_the_run_goes_on_and_not_once_it_ends(tmp_path, monkeypatch):
    cfg = Config(experiment="local_test", run_root=str(tmp_path),
                 cluster=ClusterConfig(trainer_ranks=1, rollout_ranks=1))
    (tmp_path / "config.yaml").write_text(config_yaml(cfg))
    monkeypatch.setenv("TOY_WANT", "1")  # the trainer leaves once the worker's restart has started
    # The worker's second death follows the trainer's exit within its own 0.05 s poll: with the launcher polling
    # every 2 s, both exits are seen together, the case where a restart used to slip in as the run ended.
    monkeypatch.setattr(local, "POLL_S", 2.0)
    job = Job("tests.test_local_backend:toy_trainer",
              (Group("trainer", 1), Group("rollout", 1, entry="tests.test_local_backend:toy_worker", in_world=False,
                                          restarts=5)))
    assert local.launch(cfg, tmp_path, job, echo=False) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    # start 0 died while the trainer ran: restarted; start 1 died after the trainer had exited: not restarted
    assert status["state"] == "COMPLETED" and status["restarts"] == [0, 1]
    assert sorted(p.name for p in tmp_path.glob("worker.start*")) == ["worker.start0", "worker.start1"]
    assert status["exit_codes"] == [0, 3]


def toy_rank(cfg: Config, run_dir: Path) -> None:
    """Says what a forked rank was given: its environment, cores, threads, session; prints to its log."""
    import torch

    rank = os.environ["RANK"]
    print(f"rank {rank} says hello")
    (run_dir / f"rank{rank}.json").write_text(json.dumps({
        "world": os.environ["WORLD_SIZE"], "omp": os.environ["OMP_NUM_THREADS"], "threads": torch.get_num_threads(),
        "cores": sorted(os.sched_getaffinity(0)), "session_leader": os.getsid(0) == os.getpid(),
        "cwd": os.getcwd()}))
    if rank == "1":
        raise SystemExit(0 if os.environ.get("TOY_FAIL") is None else 7)


def test_forked_ranks_get_their_environment_cores_threads_session_and_log(tmp_path, monkeypatch):
    cfg = Config(experiment="local_test", run_root=str(tmp_path), cluster=ClusterConfig(trainer_ranks=1, rollout_ranks=1))
    (tmp_path / "config.yaml").write_text(config_yaml(cfg))
    job = Job("tests.test_local_backend:toy_rank", (Group("trainer", 1), Group("rollout", 1)))
    assert local.launch(cfg, tmp_path, job, echo=False) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        cores = status["cores"][rank]
        assert got["world"] == "2" and got["cores"] == cores and got["omp"] == str(len(cores))
        assert got["threads"] == len(cores) and got["session_leader"] and got["cwd"] == str(local.REPO_ROOT)
        assert f"rank {rank} says hello" in (tmp_path / "logs" / f"rank{rank}.log").read_text()
    monkeypatch.setenv("TOY_FAIL", "1")  # an exit code reaches the launcher, and names the rank
    assert local.launch(cfg, tmp_path, job, echo=False) == 7
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "FAILED" and status["failed_rank"] == 1 and status["exit_codes"][1] == 7


def toy_sleeper(cfg: Config, run_dir: Path) -> None:
    (run_dir / f"sleeper{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(HANG_S)


def test_an_error_in_the_launcher_leaves_no_rank_behind(tmp_path, monkeypatch):
    cfg = Config(experiment="local_test", run_root=str(tmp_path), cluster=ClusterConfig(trainer_ranks=1, rollout_ranks=1))
    (tmp_path / "config.yaml").write_text(config_yaml(cfg))

    def broken_watch(tasks, run_dir, echo):
        for rank in (0, 1):
            _wait_for(run_dir / f"sleeper{rank}.pid")
        raise RuntimeError("the launcher's own bug")

    monkeypatch.setattr(local, "_watch", broken_watch)
    job = Job("tests.test_local_backend:toy_sleeper", (Group("trainer", 1), Group("rollout", 1)))
    try:
        local.launch(cfg, tmp_path, job, echo=False)
        raise AssertionError("the launcher's error was swallowed")
    except RuntimeError as e:
        assert "own bug" in str(e)
    assert all(_gone(int((tmp_path / f"sleeper{r}.pid").read_text())) for r in (0, 1))
