"""The collapse monitor: its rules on injected collapses (pure), and a smoke run whose learning rate a fault point
raises mid-run, flagged on the progress line, metrics.jsonl and status.json, and stopped by on_collapse=stop
with the last checkpoint before it named."""
import json

import pytest

from searchr1 import metrics as K
from searchr1.config import TrainerConfig
from searchr1.metrics import read_metrics
from searchr1.monitor import Monitor
from searchr1.monitor_config import MonitorConfig


def run(monitor, records):
    return [monitor.observe(i + 1, r) for i, r in enumerate(records)]


def healthy(n, reward=0.6):
    return [{K.REWARD: reward, K.ANSWER_RATE: 0.9, K.ENTROPY: 1.0, K.GRAD_NORM: 0.5} for _ in range(n)]


def test_a_reward_cliff_is_flagged_once_its_moving_average_halves():
    cfg = MonitorConfig(window=3, warmup_steps=3, patience=1)
    cliff = [{**r, K.REWARD: 0.0} for r in healthy(3)]
    out = run(Monitor(cfg), healthy(5) + cliff)
    flagged = [i + 1 for i, (m, why) in enumerate(out) if why]
    # moving averages after the cliff at step 6: 0.4, 0.2, 0.0; flagged once below 0.5 x 0.6
    assert flagged == [7, 8]
    m, why = out[6]
    assert m[K.REWARD_MA] == pytest.approx(0.2) and m[K.FLAG + "reward"] == 1.0 and m[K.COLLAPSE] == 1.0
    assert why == ["reward moving average 0.200 fell below 0.50 x its best 0.600"]
    assert all(m[K.FLAGS] == 0 and m[K.COLLAPSE] == 0 for m, _ in out[:6])


def test_entropy_collapse_grad_spike_kl_and_mismatch_rules():
    cfg = MonitorConfig(window=3, warmup_steps=2, max_kl=0.1, max_is_mismatch=0.2)
    bad = {K.REWARD: 0.6, K.ANSWER_RATE: 0.9, K.ENTROPY: 0.2, K.GRAD_NORM: 50.0, K.KL_REF: 0.5, K.IS_MEAN: 1.5}
    m, why = run(Monitor(cfg), healthy(3) + [bad])[-1]
    assert {k for k in m if k.startswith(K.FLAG)} == {K.FLAG + n for n in ("entropy", "grad_norm", "kl",
                                                                            "is_mismatch")}
    assert m[K.FLAGS] == 4 and len(why) == 4


def test_no_rule_applies_during_the_warmup_and_a_run_without_reward_cannot_lose_it():
    spike = {K.REWARD: 0.0, K.ANSWER_RATE: 0.0, K.ENTROPY: 0.01, K.GRAD_NORM: 1e3}
    assert not any(why for _, why in run(Monitor(MonitorConfig(warmup_steps=3)), healthy(2) + [spike]))
    zero = [{K.REWARD: 0.0, K.ANSWER_RATE: 0.0} for _ in range(10)]
    assert not any(why for _, why in run(Monitor(MonitorConfig()), zero))


def test_patience_and_a_resumed_monitor_judges_as_the_uninterrupted_one():
    cfg = MonitorConfig(window=2, warmup_steps=2, patience=2)
    records = healthy(4) + [{**r, K.REWARD: 0.0} for r in healthy(4)]
    whole = Monitor(cfg)
    verdicts = [(m[K.COLLAPSE], why) for m, why in run(whole, records)]
    # the moving average is 0.3 at step 5 (not below 0.5 x 0.6), 0 from step 6: flagged there, 2 in a row at 7
    assert [v for v, _ in verdicts] == [0, 0, 0, 0, 0, 0, 1, 1] and whole.first_flagged == 6
    first = Monitor(cfg)
    run(first, records[:5])
    resumed = Monitor(cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as a checkpoint's extra carries it
    assert [(m[K.COLLAPSE], why) for m, why in (resumed.observe(i + 6, r) for i, r in enumerate(records[5:]))] \
        == verdicts[5:]


def test_bad_keys_are_named():
    with pytest.raises(ValueError, match="trainer.on_collapse"):
        TrainerConfig(on_collapse="restart")
    with pytest.raises(ValueError, match="trainer.rollback_lr_factor"):
        TrainerConfig(on_collapse="rollback", rollback_lr_factor=0.0)
    with pytest.raises(ValueError, match="monitor.reward_drop"):
        MonitorConfig(reward_drop=1.0)
    with pytest.raises(ValueError, match="monitor.window"):
        MonitorConfig(window=0)


def test_an_injected_collapse_stops_the_run_naming_the_last_good_checkpoint(tmp_path):
    """The smoke run (a random model: no reward to lose) with its learning rate raised 1e5-fold at step 3 on both
    trainer replicas: the gradient norm jumps (0.0006 against a moving average of 4e-5, measured) and step 4 is
    flagged; on_collapse=stop ends the job before step 4's checkpoint, naming step 2's."""
    from tests.test_loop import launch

    faults = ";".join(f"rank={r},point=train,step=2,do=lr:1e5" for r in (0, 1))
    r, run_dir = launch(tmp_path, "steps=6", "checkpoint_every=2", "monitor.warmup_steps=2",
                        "trainer.on_collapse=stop", "monitor.patience=1", faults=faults)
    assert r.returncode != 0
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "FAILED" and status["failed_rank"] == 0
    collapse = status["collapse"]
    assert collapse["first_flagged_step"] == 4 and collapse["last_good_checkpoint"].endswith("step_000002")
    assert "gradient norm" in collapse["reasons"][0]
    steps = [x for x in read_metrics(run_dir / "metrics.jsonl") if x[K.KIND] == K.TRAIN]
    assert [x[K.COLLAPSE] for x in steps] == [0.0, 0.0, 0.0, 1.0] and steps[-1][K.FLAG + "grad_norm"] == 1.0
    lines = (run_dir / "progress.log").read_text()
    assert "step 4 COLLAPSE? gradient norm" in lines and "the last checkpoint before it" in lines
    assert "Collapsed: collapse: steps 4-4" in (run_dir / "logs" / "rank0.log").read_text()
    assert not (run_dir / "checkpoints" / "step_000004").exists()


def test_an_injected_collapse_is_rolled_back_with_a_lower_learning_rate(tmp_path):
    """The same injected collapse with on_collapse=rollback: after step 4 is flagged every replica restores step
    2's checkpoint (which holds the learning rate before the 1e5-fold fault) at half its learning rate, and the
    run completes: steps 5 and 6 are not flagged (with the fault's rate still in force, every later gradient
    norm would be the spike's), and the run's record says where it rolled back to."""
    from tests.test_loop import launch

    faults = ";".join(f"rank={r},point=train,step=2,do=lr:1e5" for r in (0, 1))
    r, run_dir = launch(tmp_path, "steps=6", "checkpoint_every=2", "monitor.warmup_steps=2",
                        "trainer.on_collapse=rollback", "monitor.patience=1", faults=faults)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["rollbacks"] == 1
    back = status["last_rollback"]
    assert back["first_flagged_step"] == 4 and back["restored"].endswith("step_000002") and back["lr_factor"] == 0.5
    steps = [x for x in read_metrics(run_dir / "metrics.jsonl") if x[K.KIND] == K.TRAIN]
    assert [x[K.STEP] for x in steps] == [1, 2, 3, 4, 5, 6]
    assert [x.get(K.ROLLBACK, 0.0) for x in steps] == [0, 0, 0, 1, 0, 0]
    assert [x[K.FLAGS] for x in steps[4:]] == [0, 0]
    assert "rolled back to" in (run_dir / "progress.log").read_text()


def test_a_step_that_trained_no_token_is_not_an_entropy_collapse():
    """Seen in the main job (GRPO, groups of 8): a step whose groups all scored alike trains nothing, and its
    train/entropy and grad norm are 0 by construction; flagging it was a false alarm."""
    idle = {K.REWARD: 0.6, K.ANSWER_RATE: 0.9, K.ENTROPY: 0.0, K.GRAD_NORM: 0.0, K.TOKENS_TRAINED: 0}
    out = run(Monitor(MonitorConfig(warmup_steps=2)), healthy(4) + [idle] + healthy(1))
    assert not any(why for _, why in out)
    real = {**idle, K.TOKENS_TRAINED: 100}
    assert run(Monitor(MonitorConfig(warmup_steps=2)), healthy(4) + [real])[-1][1][0].startswith("entropy 0")


def test_the_defaults_call_every_flipped_control_a_collapse_and_no_other_committed_run_one():
    """Replayed on every committed run's records (results/: both studies, the tuning runs, the benches' runs): the
    flipped-sign controls (held-out EM 15 -> 0/200 at temperatures 0.5 and 1.0, fp32; 13 -> 0/200 in bf16 on the
    avx512_bf16 EPYC) are collapses by their last step
    (their answer rates fall by half), and nothing else is one, though several dev-split runs' reward moving
    averages halve on a draw of hard questions (a flag on one step is only a warning)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "results"

    def verdicts(path):
        m = Monitor(MonitorConfig())
        recs = [x for x in read_metrics(path) if x[K.KIND] == K.TRAIN and x.get("stage") == "rl"]
        return [m.observe(x[K.STEP], x)[0][K.COLLAPSE] for x in recs]

    runs = {str(p.parent.relative_to(root)): verdicts(p) for p in sorted(root.glob("**/metrics.jsonl"))}
    runs = {name: v for name, v in runs.items() if v}
    assert len(runs) >= 80 and "tuning/cpu_dev_base_bfloat16_s1" in runs
    # the controls are the runs whose reward was flipped (as searchr1.study tells them)
    from omegaconf import OmegaConf

    controls = {name for name in runs if OmegaConf.load(root / name / "config.yaml").reward.scale < 0}
    assert {"cpu_flipped_float32_s0", "t0.5/cpu_flipped_float32_s0",
            "cpus/x86_64-avx2-avx512_bf16-avx512f/cpu_flipped_bfloat16_s0"} <= controls
    assert {name for name, v in runs.items() if any(v)} == controls
    for name in controls:
        assert runs[name][-1] == 1.0, name
    for name in ("cpu_flipped_float32_s0", "t0.5/cpu_flipped_float32_s0"):  # these two only at their end
        assert not any(runs[name][:-2]), name


def test_a_reward_fall_within_the_noise_of_its_questions_is_not_flagged():
    """Seen on the dev split (cpu_dev_base_bfloat16_s1, 4 questions a step): the reward's moving average went from
    0.369 to 0.150 while dev EM rose; over 20 questions a window, that is within two standard errors. The same fall
    over 20 times the questions, or a fall to nothing, is flagged."""
    def steps(rewards, groups):
        return [{K.REWARD: r, K.ANSWER_RATE: 0.9, K.GROUPS: groups} for r in rewards]

    noisy = [0.3, 0.4, 0.45, 0.35, 0.35, 0.2, 0.0, 0.1, 0.25, 0.2, 0.2]
    cfg = MonitorConfig(window=5, warmup_steps=3, patience=2)
    assert not any(why for _, why in run(Monitor(cfg), steps(noisy, 4)))
    assert any(why for _, why in run(Monitor(cfg), steps(noisy, 80)))
    assert run(Monitor(cfg), steps([0.35] * 5 + [0.0] * 5, 4))[-1][0][K.COLLAPSE] == 1.0
    assert any(why for _, why in run(Monitor(MonitorConfig(reward_z=0)), steps(noisy, 4)))
    whole, first, resumed = Monitor(cfg), Monitor(cfg), Monitor(cfg)  # the noise test's counts resume too
    recs = steps(noisy, 80)
    verdicts = run(whole, recs)
    run(first, recs[:7])
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [resumed.observe(i + 8, r) for i, r in enumerate(recs[7:])] == verdicts[7:]