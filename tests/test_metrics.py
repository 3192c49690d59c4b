"""The metrics owner: step records by declared rules, lag statistics, and a resumed run's log."""
import json
from pathlib import Path

import pytest

from searchr1 import metrics as K
from searchr1.config import Config, WandbConfig
from searchr1.trajectory import Trajectory


def traj(reward, versions, searches=0, group=0):
    return Trajectory(qid="q", group=group, prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1],
                      logprobs=[0.0, 0.0], reward=reward, searches=searches, turn_versions=versions)


def test_step_record_takes_batch_statistics_from_all_trajectories_and_sums_unit_seconds():
    trajs = [traj(1.0, [4], searches=1), traj(0.0, [4]), traj(0.0, [3, 4], searches=2)]
    units = [{"rollout/generation_s": 2.0, "rollout/retrieval_s": 0.5, "rollout/reward": 0.5},
             {"rollout/generation_s": 3.0, "rollout/retrieval_s": 0.5, "rollout/reward": 0.0}]
    times = [{"train": 3.0, "wait": 1.0, "wall": 4.0}, {"train": 3.5, "wait": 0.5, "wall": 4.0},
             {"rollout": 2.0, "wait": 2.0, "wall": 4.0}, {"rollout": 3.0, "wait": 1.0, "wall": 4.0}]
    rec = K.step_record(4, trajs, units, {"train/loss": 0.5}, {"sync/bytes": 10.0}, times, n_trainer=2)
    assert rec[K.STEP] == 5 and rec[K.KIND] == K.TRAIN
    assert rec[K.REWARD] == pytest.approx(1 / 3) and rec[K.SEARCHES] == pytest.approx(1.0)
    assert rec[K.TRAJECTORIES] == 3 and rec["rollout/generated_tokens_total"] == 6
    assert rec["rollout/generation_s"] == 5.0 and rec["rollout/retrieval_to_generation"] == pytest.approx(0.2)
    assert rec["time/trainer/train_s"] == 3.25 and rec["time/rollout/rollout_s"] == 2.5
    assert rec[K.USEFUL_FRACTION] == pytest.approx((3 + 3.5 + 2 + 3) / 16) and rec[K.STEP_S] == 4.0
    # a trajectory's lag is counted from its oldest turn
    assert (rec[K.LAG_MAX], rec[K.VERSION_OLDEST], rec["lag/count/0"], rec["lag/count/1"]) == (1, 3, 2, 1)
    assert rec["train/loss"] == 0.5 and rec["sync/bytes"] == 10.0


def test_eval_record_counts_and_splits_by_search():
    preds = [{"em": 1.0, "f1": 1.0, "searches": 1, "prediction": "a"},
             {"em": 0.0, "f1": 0.5, "searches": 0, "prediction": "b"},
             {"em": 1.0, "f1": 1.0, "searches": 0, "prediction": "c"}, {"em": 0.0, "f1": 0.0, "searches": 2,
                                                                      "prediction": None}]
    rec = K.eval_record(10, preds, 3.0)
    assert (rec[K.EVAL_N], rec[K.EVAL_EM_COUNT], rec["eval/n_searched"], rec["eval/em_count_searched"]) == (4, 2, 2, 1)
    assert rec[K.EVAL_ANSWER_RATE] == 0.75 and rec[K.EVAL_SEARCHED_RATE] == 0.5


def test_a_resumed_run_drops_the_lines_past_its_checkpoint(tmp_path):
    cfg = Config(wandb=WandbConfig(mode="disabled"))
    w = K.MetricsWriter(cfg, tmp_path)
    for rec in ({"kind": "eval", "step": 0}, {"kind": "train", "step": 1}, {"kind": "train", "step": 2},
                {"kind": "eval", "step": 2}, {"kind": "train", "step": 3}):
        w.log(rec)
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # the line being written when the job died
    w = K.MetricsWriter(cfg, tmp_path, resume_step=2)  # resumed from the step-2 checkpoint
    w.log({"kind": "train", "step": 3})
    w.close()
    got = [(r["kind"], r["step"]) for r in K.read_metrics(tmp_path / "metrics.jsonl")]
    assert got == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("train", 3)]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_a_bad_line_in_the_middle_is_an_error_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        K.read_metrics(tmp_path / "metrics.jsonl")


def test_phase_timer_books_the_rest_as_wait():
    t = K.PhaseTimer()
    t.add("train", 0.0)
    out = t.close()
    assert set(out) == {"train", "wait", "wall"} and out["wait"] <= out["wall"]
    assert json.dumps(out)


def test_wandb_runs_group_by_experiment_and_are_tagged(monkeypatch, tmp_path):
    from searchr1.config import AlgoConfig, ScheduleConfig

    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = Config(experiment="search_r1_cpu", seed=2, schedule=ScheduleConfig(name="pipelined", max_lag=1),
                 algo=AlgoConfig(name="grpo"), wandb=WandbConfig(mode="offline", tags=["study"]))
    args = K.wandb_init_args(cfg, tmp_path / "main_s2")
    assert args["group"] == "search_r1_cpu" and args["name"] == "main_s2" and args["job_type"] == "train"
    assert {"seed:2", "schedule:pipelined", "algo:grpo", "study"} <= set(args["tags"])
    cfg.wandb.group = "mine"
    assert K.wandb_init_args(cfg, tmp_path)["group"] == "mine"
    monkeypatch.setenv("WANDB_MODE", "online")  # a cluster's environment wins, nothing else changes
    assert K.wandb_init_args(cfg, tmp_path)["mode"] == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert K.wandb_init_args(cfg, tmp_path) is None


def test_an_offline_run_holds_the_predictions_table_and_the_tags(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = K.MetricsWriter(Config(experiment="smoke", seed=3, wandb=WandbConfig(mode="offline")), tmp_path)
    preds = [{"id": "q1", "question": "Where?", "answers": ["Paris"], "prediction": "Paris", "em": 1.0, "f1": 1.0,
              "searches": 1, "turns": 2, "stop_reason": "answer", "response": "<search> x </search> <answer> Paris </answer>"},
             {"id": "q2", "question": "Who?", "answers": ["Ann"], "prediction": None, "em": 0.0, "f1": 0.0,
              "searches": 0, "turns": 1, "stop_reason": "eos", "response": ""}]
    w.log(K.eval_record(4, preds, 1.0))
    w.log_predictions(4, preds)
    # The tags as the run holds them. Not read back from the .wandb record: wandb-core writes that file from its
    # own process and may still be flushing it when finish() returns (CI read it with no tags in it).
    run = w._wandb
    assert {"seed:3", "schedule:sync", "algo:grpo", "experiment:smoke"} <= set(run.tags)
    assert run.group == "smoke" and run.job_type == "train"
    w.close()
    (table,) = (tmp_path / "wandb").glob("offline-run-*/files/media/table/eval/predictions_4_*.table.json")
    got = json.loads(table.read_text())
    assert got["columns"] == list(K.PREDICTION_COLUMNS)
    assert got["data"][0][:6] == [4, "q1", "Where?", "Paris", "Paris", 1.0] and got["data"][1][4] is None


def test_a_sweep_is_one_wandb_group(tmp_path):
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "launch.py", "-m", "+experiment=smoke", "seed=0,1", "cluster.backend=slurm",
                        "cluster.slurm.submit=false", f"run_root={tmp_path}"], cwd=root, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    groups = {yaml.safe_load(c.read_text())["wandb"]["group"] for c in tmp_path.glob("*/config.yaml")}
    assert len(list(tmp_path.glob("*/config.yaml"))) == 2 and len(groups) == 1
    assert groups.pop().startswith("smoke/sweep-")
