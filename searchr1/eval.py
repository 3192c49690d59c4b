"""Held-out evaluation: greedy Search-R1 episodes, one per question, scored by HotpotQA EM and F1.

`evaluate` is what the rollout role calls during training; `main` is the single-process `mode=eval` entry
(`python launch.py +experiment=search_r1_cpu mode=eval [checkpoint=DIR] [rollout.search=false]`), which writes
`predictions.jsonl` (one line per question) and `eval_summary.json` into the run folder.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Callable

import torch

from searchr1.agent import run_episodes, sampling_for
from searchr1.config import Config, ModelConfig, RolloutConfig
from searchr1.reward import normalize_answer
from searchr1.rundir import REPO_ROOT

log = logging.getLogger(__name__)


def evaluate(engine, questions: list, retrieve: Callable[[list[str]], list[str]], cfg: RolloutConfig
             ) -> tuple[list[dict], dict]:
    """Greedy episodes over `questions` in batches of `cfg.eval_batch_size`: (prediction lines, summary)."""
    predictions, trajs, timing = [], [], {"rollout/generation_s": 0.0, "rollout/retrieval_s": 0.0,
                                          "rollout/total_s": 0.0}
    sampling = sampling_for(cfg, greedy=True)
    for start in range(0, len(questions), cfg.eval_batch_size):
        batch = questions[start:start + cfg.eval_batch_size]
        got, metrics = run_episodes(engine, batch, 1, retrieve, cfg, sampling, policy_version=0)
        for key in timing:
            timing[key] += metrics[key]
        trajs += got
        for q, t in zip(batch, got):
            predictions.append({"id": q.qid, "question": q.question, "answers": list(q.answers),
                                "response": t.response_text, "prediction": t.prediction, "em": t.em, "f1": t.f1,
                                "searches": t.searches, "turns": t.turns, "stop_reason": t.stop_reason,
                                "malformed": t.malformed})
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
        "stop_reasons": _counts(p["stop_reason"] for p in predictions),
        "malformed": _counts(rule for p in predictions for rule in p["malformed"]),
        # A diagnostic, not a score: the gold appears somewhere in the response (tags or not), i.e. how much a
        # model knows that the protocol's strict <answer> rule does not credit.
        "gold_in_response": f"{sum(_gold_in(p) for p in predictions)}/{n}",
    }
    if timing:
        summary["seconds"] = {k.split("/")[-1]: round(v, 2) for k, v in timing.items()}
    return summary


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


def resolve_model(cfg: Config) -> ModelConfig:
    """The model to evaluate: `cfg.checkpoint` (a trainer checkpoint folder, whose `model/` is an HF directory,
    or an HF directory itself) when set, else `cfg.model`."""
    if not cfg.checkpoint:
        return cfg.model
    path = Path(cfg.checkpoint).expanduser()
    for candidate in (path / "model", path):
        if (candidate / "config.json").is_file():
            return ModelConfig(name=f"checkpoint:{path.name}", source="hub", path=str(candidate),
                               dtype=cfg.model.dtype, cache_dir=cfg.model.cache_dir)
    raise FileNotFoundError(f"checkpoint={cfg.checkpoint!r}: neither a trainer checkpoint (model/config.json) "
                            "nor an HF model directory (config.json)")


def main(cfg: Config, run_dir: Path) -> dict:
    """Evaluate the held-out questions; write predictions.jsonl and eval_summary.json into `run_dir`."""
    from searchr1.data import load_splits
    from searchr1.engines import make_engine
    from searchr1.retrieval import load_or_build
    from searchr1.rollout import make_retrieve

    run_dir = Path(run_dir)
    model_cfg = resolve_model(cfg)
    splits = load_splits(cfg.data, root=REPO_ROOT)
    index = load_or_build(splits.corpus, cfg.retriever, cfg.retriever.cache_dir) if cfg.rollout.search else None
    device = "cuda" if cfg.cluster.gpus > 0 and torch.cuda.is_available() else "cpu"
    engine = make_engine(model_cfg, cfg.rollout, device)

    retrieve = make_retrieve(index, engine.tokenizer, cfg.retriever) if index is not None else None

    predictions, summary = evaluate(engine, splits.heldout, retrieve, cfg.rollout)
    summary = {"model": model_cfg.path or model_cfg.name, "checkpoint": cfg.checkpoint or None,
               "engine": cfg.rollout.engine, "search": cfg.rollout.search, "max_searches": cfg.rollout.max_searches,
               "eval_file": cfg.data.eval_file, **summary}
    write_predictions(run_dir / "predictions.jsonl", predictions)
    (run_dir / "eval_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"held-out EM {summary['em']} ({summary['em_pct']}%), F1 {summary['f1_pct']}%, answered "
          f"{summary['answered']}, searches/question {summary['searches_per_question']:.2f} -> {run_dir}",
          flush=True)
    return summary
