"""mode=pass_rate: each question of RL's pool sampled k times by a checkpoint, the exact matches counted per
question into the file curriculum.rl=pass_rate reads; a measurement repeats."""
import json
from pathlib import Path

from searchr1 import curriculum
from searchr1.apps import pass_rate
from searchr1.config import AgentConfig, Config, DataConfig, ModelConfig
from searchr1.curriculum import CurriculumConfig
from searchr1.data import load_splits
from searchr1.trajectory import Trajectory

ROOT = Path(__file__).resolve().parent.parent


def _cfg(**kw):
    return Config(mode="pass_rate", model=ModelConfig(name="tiny", source="tiny"),
                  data=DataConfig(train_size=5, eval_size=2),
                  agent=AgentConfig(max_new_tokens=6, max_searches=1, max_context_tokens=1024), **kw)


def test_a_measurement_writes_each_pool_question_once_and_repeats_exactly(tmp_path):
    cfg = _cfg(curriculum=CurriculumConfig(pass_rate_samples=3))
    runs = [tmp_path / "a", tmp_path / "b"]
    for r in runs:
        r.mkdir()
        summary = pass_rate.main(cfg, r)
    text = [(r / "pass_rates.jsonl").read_text() for r in runs]
    assert text[0] == text[1]  # seeded by the run's seed and the batch
    records = [json.loads(line) for line in text[0].splitlines()]
    train = load_splits(cfg.data, ROOT).train
    assert [r["id"] for r in records] == [q.qid for q in train]
    assert all(r["samples"] == 3 and 0 <= r["correct"] <= 3 for r in records)
    assert summary["questions"] == 5 and summary["none_right"] + summary["mixed"] + summary["all_right"] == 5
    assert curriculum.read_pass_rates(runs[0] / "pass_rates.jsonl", train)  # the file the curriculum reads
    assert "pass rates of 5 questions, 3 samples each" in (runs[0] / "progress.log").read_text()


def test_each_question_counts_its_own_samples_exact_matches(tmp_path, monkeypatch):
    """Trajectory i*k + j is sample j of question i (agent.run_episodes): the counts follow that layout across
    batches of engine.eval_batch_size trajectories, each batch with its own seed."""
    em = {0: [1, 0, 1], 1: [0, 0, 0], 2: [1, 1, 1], 3: [0.5, 1, 0], 4: [0, 1, 0]}  # per question of the pool
    seeds = []

    def fake(engine, questions, k, retrieve, agent, sampling, score, *a, **kw):
        seeds.append(sampling.seed)
        return [Trajectory(qid=q.qid, group=i, prompt_ids=[0], response_ids=[], loss_mask=[], logprobs=[],
                           em=float(em[order.index(q.qid)][j]), prediction="x" if j else None)
                for i, q in enumerate(questions) for j in range(k)], {}

    monkeypatch.setattr(pass_rate, "run_episodes", fake)
    cfg = _cfg(curriculum=CurriculumConfig(pass_rate_samples=3))
    cfg.engine.eval_batch_size = 6  # two questions a batch: three batches
    order = [q.qid for q in load_splits(cfg.data, ROOT).train]
    summary = pass_rate.main(cfg, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "pass_rates.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in records] == [2, 0, 3, 1, 1]
    assert [r["answered"] for r in records] == [2] * 5
    assert len(seeds) == 3 and len(set(seeds)) == 3
    assert (summary["none_right"], summary["mixed"], summary["all_right"]) == (1, 3, 1)


def test_a_run_keeps_the_pass_rates_it_read_and_exports_them(tmp_path):
    from launch import compose_config
    from searchr1 import rundir

    cfg = _cfg(curriculum=CurriculumConfig(pass_rate_samples=2))
    measured = tmp_path / "rates"
    measured.mkdir()
    pass_rate.main(cfg, measured)
    (measured / "logs").mkdir()
    (measured / "logs" / "rank0.log").write_text("")
    out = rundir.export(measured, tmp_path / "exported")
    assert (out / "pass_rates.jsonl").read_text() == (measured / "pass_rates.jsonl").read_text()
    assert "Pass rates (`mode=pass_rate`)" in (out / "README.md").read_text()
    train = compose_config(["+experiment=smoke", "data.train_size=5", "curriculum.rl=pass_rate",
                            f"curriculum.pass_rates={measured / 'pass_rates.jsonl'}", f"run_root={tmp_path / 'runs'}"])
    run = rundir.create(train)
    assert (run / "pass_rates.jsonl").read_text() == (measured / "pass_rates.jsonl").read_text()
    assert (run / "pass_rate_summary.json").read_text() == (measured / "pass_rate_summary.json").read_text()
    assert "pass_rates.jsonl" in rundir.LIGHT  # exported with the run's other small files
