"""End to end on local processes: the tiny model, 2 trainer + 2 rollout ranks, delta sync; slow, dead, silent
and stopped ranks."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1 import metrics as K
from searchr1.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
# Liveness for tests: a rank silent for 4 s is dead (it beats every 0.5 s). The slow-rank test sleeps 3x that.
FAST_LIVENESS = ("cluster.heartbeat_period_s=0.5", "cluster.heartbeat_timeout_s=4")


def launch(run_root: Path, *overrides, faults: str = "", timeout=900) -> tuple[subprocess.CompletedProcess, Path]:
    env = dict(os.environ, SEARCHR1_FAULTS=faults) if faults else None
    r = subprocess.run([sys.executable, "launch.py", "+experiment=smoke", f"run_root={run_root}", *overrides],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    runs = sorted(p for p in run_root.iterdir() if p.is_dir())
    return r, runs[-1]


def train_steps(run: Path) -> list[int]:
    return [x[K.STEP] for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.TRAIN]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone, only not yet reaped
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_every_rank_finished_and_every_step_was_recorded(smoke_run):
    r, run = smoke_run
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["exit_codes"] == [0, 0, 0, 0]
    assert status["roles"] == ["trainer", "trainer", "rollout", "rollout"] and len(status["cores"]) == 4
    for rank in range(4):
        assert (run / "logs" / f"rank{rank}.log").stat().st_size > 0
    assert train_steps(run) == [1, 2, 3]
    for x in read_metrics(run / "metrics.jsonl"):
        if x[K.KIND] != K.TRAIN:
            continue
        # every publication was verified on every rollout rank, with nothing to repair
        assert x["sync/verified"] == 1.0 and x["sync/mismatched"] == 0.0
        assert 0.0 < x[K.SYNC_CHANGED_FRAC] and x[K.SYNC_BYTES] < x[K.SYNC_FULL_BYTES]
        assert x[K.TRAJECTORIES] == 4 and 0.0 < x[K.USEFUL_FRACTION] <= 1.0
        assert x["time/trainer/train_s"] > 0 and x["time/rollout/rollout_s"] > 0
        assert x[K.LAG_MAX] == 0 and x[K.VERSION_OLDEST] == x[K.STEP] - 1  # synchronous: on-policy, honestly
    evals = [x for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.EVAL]
    assert [x[K.STEP] for x in evals] == [0, 3] and all(x[K.EVAL_N] == 4 for x in evals)
    assert (run / "predictions" / "step_000000.jsonl").is_file()
    # the console: one line per step, evaluation progress, the summary; library progress bars stay in the logs
    assert "held-out EM before (step 0)" in r.stdout and str(run) in r.stdout and "exact McNemar p = " in r.stdout
    assert [line.split(" | ")[0].split()[-1] for line in r.stdout.splitlines() if " | reward " in line] == \
        ["1/3", "2/3", "3/3"]
    assert "held-out eval of version 0: rank 2" in r.stdout and "Loading weights" not in r.stdout


def test_run_folder_holds_config_git_and_checkpoints(smoke_run):
    _, run = smoke_run
    assert (run / "config.yaml").is_file() and json.loads((run / "git.json").read_text())["commit"]
    data = json.loads((run / "data.json").read_text())
    assert data["corpus_scope"] == "train+eval" and data["heldout_questions"] == 4
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000003" and (run / "checkpoints" / latest / "trainer.pt").is_file()
    # the run's record names its seed and what each role computed in (compute_dtype=auto decides per machine)
    import torch

    from searchr1.placement import compute_dtype

    summary = json.loads((run / "summary.json").read_text())
    native = str(compute_dtype("auto", torch.device("cpu"))[0]).removeprefix("torch.")
    assert summary["seed"] == 0 and summary["compute_dtype"] == {"trainer": native, "engine": native}


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


def test_ask_puts_a_question_to_the_runs_checkpoint_as_evaluation_does(smoke_run, tmp_path):
    """mode=ask on the run folder takes its newest checkpoint and runs the evaluation's loop: greedy, the same
    engine, prompt and index, so on a held-out question it ends as the run's last evaluation did."""
    _, run = smoke_run
    last = [json.loads(line) for line in (run / "predictions" / "step_000003.jsonl").read_text().splitlines()]
    qfile = tmp_path / "questions.txt"
    qfile.write_text("\n".join(p["question"] for p in last[:2]) + "\n")
    r = subprocess.run([sys.executable, "launch.py", "+experiment=smoke", "mode=ask", f"checkpoint={run}",
                        f"question={last[0]['question']}", f"questions_file={qfile}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert out[0].startswith(f"model {run}/checkpoints/step_000003/model on ")
    answers = [line for line in out if line.startswith("answer: ")]
    assert [line.removeprefix("question: ") for line in out if line.startswith("question: ")] == \
        [last[0]["question"], last[0]["question"], last[1]["question"]]
    for line, p in zip(answers, [last[0], last[0], last[1]]):
        shown = p["prediction"] if p["prediction"] is not None else f"(none: {p['stop_reason']})"
        assert line.startswith(f"answer: {shown} | searches spent: {p['searches']} | {p['turns']} turns"), line
        assert line.endswith(f"EM {int(p['em'])}")
    assert sum(line.startswith("  turn ") for line in out) >= 3


def test_a_second_run_gets_a_new_folder(tmp_path):
    from searchr1 import rundir
    from searchr1.config import Config

    cfg = Config(run_root=str(tmp_path), run_name="same")
    a, b = rundir.create(cfg), rundir.create(cfg)
    assert a != b and a.name == "same" and b.name == "same-1"


def test_a_slow_rank_is_waited_for(tmp_path):
    """A rollout rank busy three times longer than the heartbeat timeout, in generation and in evaluation,
    is alive (its heartbeat thread beats): the others wait for it, and the run completes."""
    slow = "rank=3,point=rollout,step=0,do=sleep:12;rank=2,point=eval,step=0,do=sleep:12"
    r, run = launch(tmp_path, "steps=1", *FAST_LIVENESS, faults=slow)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert train_steps(run) == [1]
    assert "do=sleep:12" not in r.stdout and "[faults] rank 3 at rollout step 0" in (run / "logs/rank3.log").read_text()


def test_a_silent_rank_is_taken_for_dead_and_named(tmp_path):
    """A rank that stops (SIGSTOP: alive to the OS, silent to the job) is declared dead after the heartbeat
    timeout, and the failure names it."""
    r, run = launch(tmp_path, "steps=2", *FAST_LIVENESS, faults="rank=3,point=rollout,step=1,do=stop")
    assert r.returncode != 0
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED"
    assert "rank 3 (rollout) has shown no sign of life" in status["reason"], status
    assert not any(alive(p) for p in status["pids"])




# (overrides, steps, the rollout unit whose start kills rank 3): in the asynchronous schedules (lag 1) unit 4 is
# generated from version 3, which is published only after step 2's line and checkpoint were written. The sync
# schedule's requeue in place, each step recorded once, is test_slurm_cluster.py's (the smoke run preempted on
# the real cluster); a rank's death is the launcher's to notice, whatever the schedule.
KILLS = [(["schedule=pipelined"], 5, 4), (["schedule=streaming", "schedule.max_lag=1"], 5, 4)]


@pytest.mark.parametrize("overrides,steps,unit", KILLS, ids=["pipelined", "streaming"])
def test_a_killed_rank_ends_the_job_and_a_requeue_records_each_step_once(tmp_path, overrides, steps, unit):
    """SIGKILL of a rollout rank mid-run ends the job within seconds, names the rank, keeps every line
    written; running the job again in the same folder (what a Slurm requeue does) resumes from the checkpoint
    and metrics.jsonl then holds each step exactly once, in the lagged schedules."""
    r, run = launch(tmp_path, *overrides, f"steps={steps}", "checkpoint_every=2",
                    faults=f"rank=3,point=rollout,step={unit},do=kill")
    assert r.returncode != 0
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED" and status["failed_rank"] == 3 and status["failed_role"] == "rollout"
    assert status["exit_codes"][3] == -signal.SIGKILL
    # steps 1-2 at least were logged before rank 3 died (step 3 also, unless its line was being written as the
    # job was ended); every line written is intact
    assert train_steps(run) in ([1, 2], [1, 2, 3])
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert not any(alive(p) for p in status["pids"])
    again = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; from searchr1.rundir import load_config; "
         "from searchr1.cluster import job, local; run = Path(sys.argv[1]); cfg = load_config(run); "
         "sys.exit(local.launch(cfg, run, job.training(cfg)))", str(run)],
        cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert train_steps(run) == list(range(1, steps + 1))
    assert "resumed from" in (run / "logs" / "rank0.log").read_text()


def test_sigterm_to_the_launcher_ends_every_rank(tmp_path):
    proc = subprocess.Popen([sys.executable, "launch.py", "+experiment=smoke", f"run_root={tmp_path}", "steps=500"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    status_file = None
    for line in proc.stdout:  # progress lines arrive as the run goes: wait for the first step
        if line.startswith("run folder: "):
            status_file = Path(line.split(": ", 1)[1].strip()) / "status.json"
        if " | reward " in line:
            break
    status = json.loads(status_file.read_text())
    pids = status["pids"]
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=120)
    assert rc == 128 + signal.SIGTERM
    status = json.loads(status_file.read_text())
    assert status["state"] == "CANCELLED" and status["signal"] == "SIGTERM"
    assert not any(alive(p) for p in pids)
    leftovers = subprocess.run(["pgrep", "-f", str(status_file.parent)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", leftovers


@pytest.mark.parametrize("k", [1])  # k=2 and more: the in-process schedule tests (test_protocol.py)
def test_a_pipelined_run_lags_exactly_and_repeats_itself(tmp_path, k):
    """Pipelined: step s trains on data of version max(s - k, 0), recorded from the versions the trajectories
    carry; a deliberately slowed rollout rank makes the trainer wait, never train past the bound; the same
    seed gives the same run."""
    slow = "rank=3,point=rollout,step=2,do=sleep:3"
    r, run = launch(tmp_path / "a", "schedule=pipelined", f"schedule.max_lag={k}", "steps=4", faults=slow)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [x for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.TRAIN]
    assert [x[K.LAG_MAX] for x in train] == [min(s, k) for s in range(4)]
    assert [x[K.VERSION_OLDEST] for x in train] == [max(s - k, 0) for s in range(4)]
    from golden import differences, signature

    r2, again = launch(tmp_path / "b", "schedule=pipelined", f"schedule.max_lag={k}", "steps=4")
    assert r2.returncode == 0 and differences(signature(run), signature(again)) == []


def test_streaming_stays_within_its_bound(tmp_path):
    """With partial rollouts at a budget of one token: a step may set unfinished groups aside (the tiny model's
    episodes may end in one turn, and then nothing is), but every group is trained exactly once, within the bound."""
    r, run = launch(tmp_path, "schedule=streaming", "schedule.max_lag=1", "schedule.partial_tokens=1", "steps=4",
                    faults="rank=2,point=rollout,step=1,do=sleep:3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [x for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.TRAIN]
    assert len(train) == 4 and all(x[K.LAG_MAX] <= 1 for x in train)
    assert sum(x[K.TRAJECTORIES] for x in train) == 4 * 4 and all(x[K.TRAJECTORIES] >= 2 for x in train)
    carried_in = sum(x[K.GROUPS_CARRIED_IN] for x in train)
    assert carried_in == sum(x[K.GROUPS_CARRIED_OUT] for x in train) and train[-1][K.GROUPS_CARRIED_OUT] == 0
