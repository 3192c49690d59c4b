"""End to end on local processes: the tiny model, 2 trainer + 2 rollout ranks, delta sync."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent


def launch(run_root: Path, *overrides, timeout=600) -> tuple[subprocess.CompletedProcess, Path]:
    r = subprocess.run([sys.executable, "launch.py", "+experiment=smoke", f"run_root={run_root}", *overrides],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    runs = sorted(p for p in run_root.iterdir() if p.is_dir())
    return r, runs[-1]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    r, run = launch(tmp_path_factory.mktemp("runs"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, run


def test_every_rank_finished_and_every_step_was_recorded(smoke_run):
    r, run = smoke_run
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["exit_codes"] == [0, 0, 0, 0]
    for rank in range(4):
        assert (run / "logs" / f"rank{rank}.log").stat().st_size > 0
    records = read_metrics(run / "metrics.jsonl")
    train = [x for x in records if x["kind"] == "train"]
    assert [x["step"] for x in train] == [1, 2, 3]
    for x in train:
        # every publication was verified on every rollout rank, with nothing to repair
        assert x["sync/verified"] == 1.0 and x["sync/mismatched"] == 0.0
        assert 0.0 < x["sync/changed_frac"] and x["sync/bytes"] < x["sync/full_bytes"]
        assert x["trajectories"] == 4 and 0.0 < x["useful_work_fraction"] <= 1.0
        assert x["time/trainer/train_s"] > 0 and x["time/rollout/rollout_s"] > 0
    evals = [x for x in records if x["kind"] == "eval"]
    assert [x["step"] for x in evals] == [0, 3] and all(x["eval/n"] == 4 for x in evals)
    assert (run / "predictions" / "step_000000.jsonl").is_file()
    assert "held-out EM before (step 0)" in r.stdout and str(run) in r.stdout


def test_run_folder_holds_config_git_and_checkpoints(smoke_run):
    _, run = smoke_run
    assert (run / "config.yaml").is_file() and json.loads((run / "git.json").read_text())["commit"]
    data = json.loads((run / "data.json").read_text())
    assert data["corpus_scope"] == "train+eval" and data["heldout_questions"] == 4
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000003" and (run / "checkpoints" / latest / "trainer.pt").is_file()


def test_notebook_executes_on_the_run_folder(smoke_run, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    _, run = smoke_run
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    os.environ["SEARCHR1_RUNS"] = str(run)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        del os.environ["SEARCHR1_RUNS"]
    text = json.dumps(nb)
    assert "image/png" in text and "Error" not in "".join(
        o.get("ename", "") for c in nb.cells for o in c.get("outputs", []))


def test_a_second_run_gets_a_new_folder(tmp_path):
    from searchr1 import rundir
    from searchr1.config import Config

    cfg = Config(run_root=str(tmp_path), run_name="same")
    a, b = rundir.create(cfg), rundir.create(cfg)
    assert a != b and a.name == "same" and b.name == "same-1"


def test_killing_one_rank_ends_the_job_and_keeps_what_was_written(tmp_path):
    proc = subprocess.Popen([sys.executable, "launch.py", "+experiment=smoke", f"run_root={tmp_path}", "steps=200",
                             "checkpoint_every=1", "eval_before=false"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    run = None
    while time.monotonic() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        run = runs[0] if runs else None
        metrics = run / "metrics.jsonl" if run else None
        if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    pids = json.loads((run / "status.json").read_text())["pids"]
    os.kill(pids[3], signal.SIGKILL)  # a rollout rank dies mid-run
    killed = time.monotonic()
    rc = proc.wait(timeout=180)
    assert rc != 0 and time.monotonic() - killed < 120
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED" and status["failed_rank"] == 3
    records = read_metrics(run / "metrics.jsonl")  # every line intact
    assert len(records) >= 2
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert (run / "checkpoints" / latest / "trainer.pt").is_file()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_resume_continues_the_step_counter(tmp_path):
    first_root, second_root = tmp_path / "a", tmp_path / "b"
    first_root.mkdir(), second_root.mkdir()
    r, first = launch(first_root, "steps=2", "eval_before=false")
    assert r.returncode == 0, r.stdout[-2000:]
    r, second = launch(second_root, "steps=3", "eval_before=false", f"resume={first}")
    assert r.returncode == 0, r.stdout[-2000:]
    train = [x for x in read_metrics(second / "metrics.jsonl") if x["kind"] == "train"]
    assert [x["step"] for x in train] == [3]
    assert "resumed from" in (second / "logs" / "rank0.log").read_text()
