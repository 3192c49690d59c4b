import json
from dataclasses import dataclass

import pytest

from searchr1.apps.evaluate import main, model_to_evaluate
from searchr1.config import AgentConfig, Config, DataConfig, ModelConfig, SamplingConfig
from searchr1.engines.base import Generation
from searchr1.evaluation import evaluate, read_predictions, summarize, write_predictions
from searchr1.models import load_tokenizer
from searchr1.reward import make_score


@dataclass
class Q:
    qid: str
    question: str
    answers: tuple


class AnswerEngine:
    """Answers each question from a table, in one turn, and records the sampling it was asked for."""

    def __init__(self, tokenizer, table):
        self.tokenizer, self.table, self.calls = tokenizer, table, []

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling.temperature))
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            question = text.split("Question: ")[1].split("\n")[0]
            ids = self.tokenizer(self.table[question], add_special_tokens=False).input_ids
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(name="tiny", source="tiny"))


def test_evaluate_greedy_batches_lines_and_summary(tok, tmp_path):
    qs = [Q("1", "Capital of France?", ("Paris",)), Q("2", "Is it?", ("yes",)), Q("3", "Who?", ("Zoë Saldaña",)),
          Q("4", "Where?", ("Rome",)), Q("5", "When?", ("1990",))]
    table = {"Capital of France?": "<answer> paris </answer>", "Is it?": "<answer> yes it is </answer>",
             "Who?": "<answer> Zoë Saldaña </answer>", "Where?": "I do not know.", "When?": "<answer>1990</answer>"}
    engine = AnswerEngine(tok, table)
    seen = []
    preds, summary = evaluate(engine, qs, lambda q: ["x"] * len(q), AgentConfig(), SamplingConfig(),
                              make_score("em", 0.0), batch_size=2, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(2, 5), (4, 5), (5, 5)]
    assert engine.calls == [(2, 0.0), (2, 0.0), (1, 0.0)]  # greedy, in batches
    assert [p["id"] for p in preds] == ["1", "2", "3", "4", "5"]
    assert [p["em"] for p in preds] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert preds[1]["f1"] == 0.0 and preds[3]["prediction"] is None
    assert set(preds[0]) >= {"id", "question", "answers", "response", "prediction", "em", "f1", "searches"}
    assert summary["em"] == "3/5" and summary["em_pct"] == 60.0 and summary["answered"] == "4/5"
    assert summary["malformed"] == {"no_tags": 1}
    assert summary["gold_in_response"] == "4/5"  # "yes it is" holds "yes"; "I do not know." holds no "Rome"
    assert summary["em_when_searched"] == "0/0" and summary["em_when_not_searched"] == "3/5"
    write_predictions(tmp_path / "p.jsonl", preds)
    lines = read_predictions(tmp_path / "p.jsonl")
    assert lines == preds and lines[2]["prediction"] == "Zoë Saldaña"


def test_summary_of_nothing():
    assert summarize([])["em"] == "0/0"


def test_model_to_evaluate_checkpoint_and_errors(tmp_path):
    assert model_to_evaluate(Config()).source == "smollm2_gguf"
    ckpt = tmp_path / "step_000002"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    got = model_to_evaluate(Config(checkpoint=str(ckpt)))
    assert got.source == "hub" and got.path == str(ckpt / "model")
    with pytest.raises(FileNotFoundError, match="checkpoint="):
        model_to_evaluate(Config(checkpoint=str(tmp_path / "nothing")))


def test_main_writes_predictions_and_summary(tmp_path):
    cfg = Config(mode="eval", model=ModelConfig(name="tiny", source="tiny"), data=DataConfig(eval_size=3),
                 agent=AgentConfig(max_new_tokens=6, max_searches=1, max_context_tokens=1024))
    summary = main(cfg, tmp_path)
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 3 and summary["n"] == 3 and summary["em"].endswith("/3")
    assert json.loads((tmp_path / "eval_summary.json").read_text())["em"] == summary["em"]

    assert "held-out EM" in (tmp_path / "progress.log").read_text()


def test_evaluate_scores_by_the_set_s_own_metrics(tok):
    """Another set's questions are scored by its official EM and F1 (here NQ's SQuAD 1.1 F1, which has no
    yes/no rule), not HotpotQA's."""
    from searchr1.datasets.scoring import EM, squad1_f1

    qs = [Q("1", "Is it?", ("yes",)), Q("2", "Who?", ("Raymond Unwin", "Barry Parker"))]
    table = {"Is it?": "<answer> yes it is </answer>", "Who?": "<answer> Barry Parker </answer>"}
    args = (AnswerEngine(tok, table), qs, lambda q: ["x"] * len(q), AgentConfig(), SamplingConfig(),
            make_score("em", 0.0))
    hotpot, _ = evaluate(*args, batch_size=2)
    nq, summary = evaluate(*args, batch_size=2, scorer=(EM, squad1_f1))
    assert [p["f1"] for p in hotpot] == [0.0, 1.0] and [p["em"] for p in hotpot] == [0.0, 1.0]
    assert [p["f1"] for p in nq] == [0.5, 1.0] and summary["f1_pct"] == 75.0


def test_main_evaluates_every_set_of_data_eval_sets(tmp_path):
    """mode=eval with data.eval_sets: each other set gets its own prediction file and summary."""
    cfg = Config(mode="eval", model=ModelConfig(name="tiny", source="tiny"),
                 data=DataConfig(eval_size=2, eval_sets=["hotpotqa", "2wiki", "nq"]),
                 agent=AgentConfig(max_new_tokens=6, max_searches=1, max_context_tokens=1024))
    summary = main(cfg, tmp_path)
    assert summary["n"] == 2 and list(summary["eval_sets"]) == ["2wiki", "nq"]
    ids = {name: [json.loads(line)["id"] for line in (tmp_path / f"predictions_{name}.jsonl").read_text().splitlines()]
           for name in ("2wiki", "nq")}
    assert ids["nq"] == ["nq_2417", "nq_2548"]  # the first two of data/nq/heldout.ids
    assert len(ids["2wiki"]) == 2 and all(s["n"] == 2 for s in summary["eval_sets"].values())
    saved = json.loads((tmp_path / "eval_summary.json").read_text())
    assert saved["eval_sets"]["nq"]["em"] == summary["eval_sets"]["nq"]["em"]
    log = (tmp_path / "progress.log").read_text()
    assert "2wiki held-out EM" in log and "nq held-out EM" in log
