"""`mode=pass_rate`: offline difficulty filtering's measurement. Each question of RL's pool (as the config's
curriculum draws it) is sampled `curriculum.pass_rate_samples` times by a checkpoint, at the sampling temperature,
and the count of exact-match answers goes to `pass_rates.jsonl`, which `curriculum.rl=pass_rate` reads
(searchr1/curriculum.py). Run by the cluster backend as a job of one task, as mode=eval is.

    python launch.py +experiment=search_r1_cpu steps=0 run_name=ws          # the warm start alone, checkpointed
    python launch.py +experiment=search_r1_cpu mode=pass_rate checkpoint=runs/ws/checkpoints/step_000006
    python launch.py +experiment=search_r1_cpu curriculum.rl=pass_rate curriculum.pass_rates=RUN/pass_rates.jsonl

Questions are sampled in batches of `engine.eval_batch_size` trajectories, each batch seeded by the run's seed
and its position, so a measurement repeats.
"""
from __future__ import annotations

import json
from pathlib import Path

from searchr1.agent import run_episodes, sampling_for
from searchr1.apps.evaluate import evaluator_device, model_to_evaluate
from searchr1.config import Config
from searchr1.rundir import write_atomic, progress


def main(cfg: Config, run_dir: Path) -> dict:
    from searchr1.roles import rank_splits, setup_logging
    from searchr1.roles.worker import Worker

    setup_logging("evaluator")
    run_dir = Path(run_dir)
    model = model_to_evaluate(cfg)
    splits = rank_splits(cfg)
    questions, k = splits.pool("rl"), cfg.curriculum.pass_rate_samples
    worker = Worker(cfg, splits, evaluator_device(cfg), model=model)
    per_batch = max(1, cfg.engine.eval_batch_size // k)
    records = []
    for b, start in enumerate(range(0, len(questions), per_batch)):
        batch = questions[start:start + per_batch]
        sampling = sampling_for(cfg.agent, cfg.sampling, seed=cfg.seed * 100_003 + b)
        trajs, _ = run_episodes(worker.engine, batch, k, worker.retrieve, cfg.agent, sampling, worker.score)
        for i, q in enumerate(batch):
            group = trajs[i * k:(i + 1) * k]
            records.append({"id": q.qid, "samples": k, "correct": int(sum(t.em >= 1.0 for t in group)),
                            "answered": sum(t.prediction is not None for t in group),
                            "searches": sum(t.searches for t in group) / k})
        progress(run_dir, f"pass rates: {len(records)}/{len(questions)} questions")
    write_atomic(run_dir / "pass_rates.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    rates = [r["correct"] / k for r in records]
    summary = {"model": model.path or model.name, "checkpoint": cfg.checkpoint or None, "seed": cfg.seed,
               "compute_dtype": worker.compute_dtype, "temperature": cfg.sampling.temperature, "samples": k,
               "pool": cfg.curriculum.rl, "questions": len(records),
               "mean_rate": sum(rates) / max(len(rates), 1),
               "none_right": sum(r == 0 for r in rates), "all_right": sum(r == 1 for r in rates),
               "mixed": sum(0 < r < 1 for r in rates)}
    write_atomic(run_dir / "pass_rate_summary.json", json.dumps(summary, indent=1) + "\n")
    progress(run_dir, f"pass rates of {len(records)} questions, {k} samples each: mean {summary['mean_rate']:.3f}; "
                      f"none right {summary['none_right']}, mixed {summary['mixed']}, all right "
                      f"{summary['all_right']} -> {run_dir / 'pass_rates.jsonl'}")
    return summary
