"""`mode=eval`: held-out evaluation of the base model or a checkpoint, run by the cluster backend as a job of
one task (a local process, or a one-GPU Slurm job), never on the submitting host.

    python launch.py +experiment=search_r1_cpu mode=eval [checkpoint=RUN/checkpoints/step_000020]
    python launch.py +experiment=search_r1_cpu mode=eval agent.max_searches=0   # the same prompt, no search

Writes `predictions.jsonl` (one line per question) and `eval_summary.json` (counts, EM split by whether the
agent searched) into the run folder; each other set of `data.eval_sets` its own `predictions_<set>.jsonl` and
its summary under `eval_sets` (searched in its own corpus, scored by its official metrics).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from searchr1 import checkpoint
from searchr1.config import Config, ModelConfig
from searchr1.datasets import load_all
from searchr1.evaluation import write_predictions
from searchr1.roles import setup_logging
from searchr1.roles.worker import Worker
from searchr1.rundir import REPO_ROOT, progress


def model_to_evaluate(cfg: Config) -> ModelConfig:
    """`cfg.checkpoint` (a trainer checkpoint folder or an HF directory) when set, else `cfg.model`."""
    if not cfg.checkpoint:
        return cfg.model
    path = checkpoint.model_path(cfg.checkpoint)
    return ModelConfig(name=f"checkpoint:{Path(cfg.checkpoint).name}", source="hub", path=str(path),
                       cache_dir=cfg.model.cache_dir)


def evaluator_device(cfg: Config) -> str:
    """The device a one-process job (mode=eval, ask, pass_rate) runs its engine on."""
    return "cuda" if cfg.cluster.gpus > 0 and torch.cuda.is_available() else "cpu"


def main(cfg: Config, run_dir: Path) -> dict:
    setup_logging("evaluator")
    run_dir = Path(run_dir)
    model = model_to_evaluate(cfg)
    splits = load_all(cfg.data, REPO_ROOT)
    worker = Worker(cfg, splits, evaluator_device(cfg), model=model)
    predictions, summary = worker.evaluate(
        splits.evaluation, lambda done, total: progress(run_dir, f"{splits.eval_on} eval: {done}/{total}"))
    summary = {"model": model.path or model.name, "checkpoint": cfg.checkpoint or None, "engine": cfg.engine.name,
               "compute_dtype": worker.compute_dtype, "seed": cfg.seed,
               "search": cfg.agent.search, "max_searches": cfg.agent.max_searches, "eval_file": cfg.data.eval_file,
               **summary}
    write_predictions(run_dir / "predictions.jsonl", predictions)
    progress(run_dir, f"held-out EM {summary['em']} ({summary['em_pct']}%), F1 {summary['f1_pct']}%, answered "
                      f"{summary['answered']}, searched {summary['searched']} (EM {summary['em_when_searched']} when "
                      f"searching, {summary['em_when_not_searched']} when not), "
                      f"{summary['searches_per_question']:.2f} searches/question")
    if splits.eval_sets:
        summary["eval_sets"] = {}
    for name, s in splits.eval_sets.items():
        preds, summary["eval_sets"][name] = worker.evaluate(
            s.questions, lambda done, total: progress(run_dir, f"{name} eval: {done}/{total}"), dataset=name)
        write_predictions(run_dir / f"predictions_{name}.jsonl", preds)
        got = summary["eval_sets"][name]
        progress(run_dir, f"{name} held-out EM {got['em']} ({got['em_pct']}%), F1 {got['f1_pct']}%, answered "
                          f"{got['answered']}, searched {got['searched']}")
    (run_dir / "eval_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
