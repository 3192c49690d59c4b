"""`mode=ask`: put a question of one's own to a trained checkpoint and watch the agent work.

    python launch.py +experiment=search_r1_cpu mode=ask checkpoint=runs/reference/main_float32_s0 question="..."
    python launch.py +experiment=search_r1_cpu mode=ask checkpoint=RUN/checkpoints/step_000021 questions_file=q.txt

The agent loop, engine, index and prompt are those of `mode=eval` (the same Worker, the same greedy sampling
through `evaluation.evaluate`), run here in this process: no run folder, no job. Each turn is printed as it
comes: what the model wrote (think / search / answer apart), the titles the search brought back, and at the end
the answer and the searches it spent. `checkpoint` is a trainer checkpoint, an HF model directory or a run
folder (its newest complete checkpoint); empty asks the configured base model. `questions_file` holds one
question per line (or JSONL lines with a "question" field). A question that is one of the data set's is shown
with its gold answer and EM.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

from searchr1 import checkpoint
from searchr1.apps.evaluate import evaluator_device, model_to_evaluate
from searchr1.config import Config
from searchr1.data import Question, load_splits
from searchr1.report import turns
from searchr1.rundir import REPO_ROOT

NO_GOLD = "\x00no gold answer\x00"
TITLE = re.compile(r"^Doc \d+\(Title: (.*?)\) ", re.M)


def resolve(cfg: Config) -> Config:
    """cfg with `checkpoint` naming a model directory evaluate's loader takes; a run folder becomes its newest
    complete checkpoint. One-line SystemExit when it names nothing usable."""
    if not cfg.checkpoint:
        return cfg
    path = Path(cfg.checkpoint).expanduser()
    if not path.exists():
        raise SystemExit(f"ask: checkpoint={cfg.checkpoint!r}: no such file or directory")
    try:
        if (path / "checkpoints").is_dir():
            newest = checkpoint.latest(path)
            if newest is None:
                raise FileNotFoundError(f"checkpoint={cfg.checkpoint!r}: a run folder with no complete checkpoint")
            path = newest
        checkpoint.model_path(path)
    except FileNotFoundError as err:
        raise SystemExit(f"ask: {err}")
    cfg.checkpoint = str(path)
    return cfg


def read_questions(cfg: Config) -> list[str]:
    qs = [cfg.question.strip()] if cfg.question.strip() else []
    if cfg.questions_file:
        path = Path(cfg.questions_file).expanduser()
        if not path.is_file():
            raise SystemExit(f"ask: questions_file={cfg.questions_file!r}: no such file")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            line = line.strip()
            if line.startswith("{"):
                try:
                    line = str(json.loads(line)["question"]).strip()
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise SystemExit(f"ask: {path}:{n}: a JSON line without a \"question\" field")
            if line:
                qs.append(line)
    if not qs:
        raise SystemExit('ask: no question (question="..." non-empty, or questions_file=FILE with questions)')
    return qs


class _Shown:
    """The engine, printing each turn it generates (one question at a time, so one generation per call)."""

    def __init__(self, engine, out):
        self._engine, self._out, self.turn = engine, out, 0
        self.tokenizer, self.compute_dtype = engine.tokenizer, engine.compute_dtype

    def generate(self, prompts, sampling):
        gens = self._engine.generate(prompts, sampling)
        for g in gens:
            self.turn += 1
            text = self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
            for kind, body in turns(text) or [["other", text.strip() or "(nothing)"]]:
                self._out(f"  turn {self.turn} {kind}: {body}")
        return gens

    def __getattr__(self, name):
        return getattr(self._engine, name)


def main(cfg: Config, out=print) -> int:
    from searchr1.evaluation import evaluate
    from searchr1.roles.worker import Worker

    questions = read_questions(cfg)  # errors before any model loads
    cfg = resolve(cfg)
    logging.basicConfig(level=logging.WARNING, force=True)  # the console is the agent's, not the libraries'
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is first imported (below, by the engine)
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
    except (ImportError, AttributeError):
        pass
    splits = load_splits(cfg.data, REPO_ROOT)
    known = {q.question: q for q in splits.train + splits.heldout + splits.dev}
    t0 = time.perf_counter()
    model = model_to_evaluate(cfg)
    worker = Worker(cfg, splits, evaluator_device(cfg), model=model)
    out(f"model {model.path or model.name} on {cfg.engine.name} ({worker.compute_dtype}), "
        f"{cfg.retriever.name} index of {len(splits.corpus)} passages, ready in {time.perf_counter() - t0:.1f}s")
    shown = _Shown(worker.engine, out)

    def retrieve(queries: list[str]) -> list[str]:
        infos = worker.retrieve(queries)
        for info in infos:
            out(f"  found: {'; '.join(TITLE.findall(info)) or info.strip()}")
        return infos

    for i, text in enumerate(questions):
        # the reward needs a gold to score against; a question of one's own gets one nothing matches (not shown)
        q = known.get(text) or Question(f"ask-{i}", text, (NO_GOLD,), "", "", (), ())
        out(f"question: {text}")
        shown.turn, t1 = 0, time.perf_counter()
        (p,), _ = evaluate(shown, [q], retrieve if worker.retrieve else None, cfg.agent, cfg.sampling,
                           worker.score, 1)
        gold = f" | gold: {' / '.join(q.answers)}, EM {int(p['em'])}" if text in known else ""
        out(f"answer: {p['prediction'] if p['prediction'] is not None else '(none: ' + p['stop_reason'] + ')'}"
            f" | searches spent: {p['searches']} | {p['turns']} turns, {time.perf_counter() - t1:.1f}s{gold}")
    return 0
