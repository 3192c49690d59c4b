"""Held-out evaluation: greedy Search-R1 episodes, one per question, scored by HotpotQA EM and F1, or by the
official EM and F1 of the set the questions come from (searchr1/datasets/scoring.py).

`evaluate` is what the rollout role runs during training and what `mode=eval` runs (searchr1/apps/evaluate.py);
one prediction line per question, and a summary with counts.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Callable

from searchr1.agent import run_episodes, sampling_for
from searchr1.config import AgentConfig, SamplingConfig
from searchr1.reward import Score, normalize_answer

log = logging.getLogger(__name__)


def evaluate(engine, questions: list, retrieve: Callable[[list[str]], list[str]], agent: AgentConfig,
             sampling: SamplingConfig, score: Score, batch_size: int,
             progress: Callable[[int, int], None] = lambda done, total: None,
             scorer: tuple[Callable, Callable] | None = None) -> tuple[list[dict], dict]:
    """Greedy episodes over `questions` in batches of `batch_size`: (prediction lines, summary).
    `progress(done, total)` is called after each batch; `scorer`: the set's (em, f1) when not HotpotQA's."""
    predictions, timing = [], {"rollout/generation_s": 0.0, "rollout/retrieval_s": 0.0, "rollout/total_s": 0.0}
    greedy = sampling_for(agent, sampling, greedy=True)
    for start in range(0, len(questions), batch_size):
        batch = questions[start:start + batch_size]
        got, metrics = run_episodes(engine, batch, 1, retrieve, agent, greedy, score)
        for key in timing:
            timing[key] += metrics[key]
        for q, t in zip(batch, got):
            predictions.append({"id": q.qid, "question": q.question, "answers": list(q.answers),
                                "response": t.response_text, "prediction": t.prediction, "em": t.em, "f1": t.f1,
                                "searches": t.searches, "turns": t.turns, "stop_reason": t.stop_reason,
                                "malformed": t.malformed})
            if scorer is not None:
                predictions[-1].update(em=scorer[0](t.prediction, q.answers), f1=scorer[1](t.prediction, q.answers))
        progress(len(predictions), len(questions))
    return predictions, summarize(predictions, timing)


def summarize(predictions: list[dict], timing: dict | None = None) -> dict:
    n = len(predictions)
    em = int(sum(p["em"] for p in predictions))
    answered = sum(p["prediction"] is not None for p in predictions)
    pct = (lambda k: round(100.0 * k / n, 2)) if n else (lambda k: 0.0)
    summary = {
        "n": n,
        "em": f"{em}/{n}", "em_count": em, "em_pct": pct(em),
        "f1_pct": round(100.0 * sum(p["f1"] for p in predictions) / n, 2) if n else 0.0,
        "answered": f"{answered}/{n}", "answered_pct": pct(answered),
        "searches_per_question": sum(p["searches"] for p in predictions) / n if n else 0.0,
        "searched": f"{sum(p['searches'] > 0 for p in predictions)}/{n}",
        # EM split by whether the agent searched: what the index contributes
        "em_when_searched": _fraction([p["em"] for p in predictions if p["searches"] > 0]),
        "em_when_not_searched": _fraction([p["em"] for p in predictions if p["searches"] == 0]),
        "stop_reasons": _counts(p["stop_reason"] for p in predictions),
        "malformed": _counts(rule for p in predictions for rule in p["malformed"]),
        # A diagnostic, not a score: the gold appears somewhere in the response (tags or not), i.e. how much a
        # model knows that the protocol's strict <answer> rule does not credit.
        "gold_in_response": f"{sum(_gold_in(p) for p in predictions)}/{n}",
    }
    if timing:
        summary["seconds"] = {k.split("/")[-1]: round(v, 2) for k, v in timing.items()}
    return summary


def _fraction(ems: list[float]) -> str:
    return f"{int(sum(ems))}/{len(ems)}"


def _gold_in(p: dict) -> bool:
    text = f" {normalize_answer(re.sub(r'<[^<>]*>', ' ', p['response']))} "
    return any(f" {g} " in text for g in map(normalize_answer, p["answers"]) if g)


def _counts(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


def write_predictions(path: str | Path, predictions: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in predictions:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")


def read_predictions(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
