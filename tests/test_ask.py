"""`mode=ask` (searchr1/apps/ask.py): the agent's turns printed as they come, and one-line refusals. The run on a
real checkpoint (the smoke model) is in tests/test_loop.py, beside the smoke run it uses."""
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.apps import ask
from searchr1.config import Config, ModelConfig
from searchr1.models import load_tokenizer
from searchr1.reward import make_score
from tests.test_agent import ScriptedEngine

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = "What country is both Thornton–Cleveleys railway station and Poulton-le-Fylde railway station located?"
MINE = "Who wrote the report, and why?"


class FakeWorker:
    """The Worker's surface ask uses: a scripted engine (search once, then answer) and a retrieve that records
    what had been printed when it was called."""
    printed: list[str] = []

    def __init__(self, cfg, splits, device, model=None):
        tok = load_tokenizer(ModelConfig(name="tiny", source="tiny"))
        script = ["<think> look it up </think>\n<search> railway stations Lancashire </search>",
                  "<answer> England </answer>"]
        self.engine = ScriptedEngine(tok, {HELDOUT: script, MINE: script})
        self.engine.compute_dtype = "float32"
        self.compute_dtype, self.score = "float32", make_score("em", 0.0)
        self.seen_at_retrieval = []

    def retrieve(self, queries):
        self.seen_at_retrieval.append(list(FakeWorker.printed))
        return ["Doc 1(Title: Poulton-le-Fylde railway station) In Lancashire, England.\n"
                "Doc 2(Title: Thornton–Cleveleys railway station) A station." for _ in queries]


@pytest.fixture
def fake(monkeypatch):
    import searchr1.roles.worker as worker

    made = []
    monkeypatch.setattr(worker, "Worker", lambda *a, **k: made.append(FakeWorker(*a, **k)) or made[-1])
    FakeWorker.printed = []
    return made


def test_each_turn_is_printed_as_it_comes(fake, tmp_path):
    qfile = tmp_path / "q.txt"
    qfile.write_text(f'{{"question": "{MINE}"}}\n\n')
    cfg = Config(mode="ask", question=HELDOUT, questions_file=str(qfile))
    assert ask.main(cfg, out=FakeWorker.printed.append) == 0
    lines = FakeWorker.printed
    start = lines.index(f"question: {HELDOUT}")
    assert lines[start:start + 6] == [
        f"question: {HELDOUT}",
        "  turn 1 think: look it up",
        "  turn 1 search: railway stations Lancashire",
        "  found: Poulton-le-Fylde railway station; Thornton–Cleveleys railway station",
        "  turn 2 answer: England"] + [lines[start + 5]]
    assert lines[start + 5].startswith("answer: England | searches spent: 1 | 2 turns")
    assert lines[start + 5].endswith("| gold: England, EM 1")  # a data set question shows its gold
    # the query was on the console before the search ran (printed as it came, not at the end)
    assert "  turn 1 search: railway stations Lancashire" in fake[0].seen_at_retrieval[0]
    mine = lines[lines.index(f"question: {MINE}"):]
    assert mine[-1].startswith("answer: England | searches spent: 1") and "gold" not in mine[-1]


def _launch(*overrides):
    return subprocess.run([sys.executable, "launch.py", "+experiment=smoke", "mode=ask", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("overrides, says", [
    (["question="], "ask: no question"),
    (["question=   "], "ask: no question"),
    (["checkpoint=/no/such/run", "question=Why?"], "ask: checkpoint='/no/such/run': no such file or directory"),
    (["checkpoint=results/cpu_main_float32_s0", "question=Why?"], "neither a trainer checkpoint"),
    (["questions_file=/no/such/file", "question=Why?"], "ask: questions_file='/no/such/file': no such file"),
])
def test_bad_input_is_a_one_line_error(overrides, says):
    r = _launch(*overrides)
    assert r.returncode != 0 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


def test_a_question_is_free_text_on_the_command_line():
    from launch import quote_free_text

    assert quote_free_text(["launch.py", "question=It's a: b, c?", "seed=1"]) == \
        ["launch.py", "question='It\\'s a: b, c?'", "seed=1"]
