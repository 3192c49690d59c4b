"""Where the CPU experiment's time goes, on one core: the operators of a warm-start step, an RL training step,
greedy agent episodes and answer turns on the rollout engine, split into matrix products, attention and the
rest, and the matrix products' rate against one matmul of the model's MLP shape in the same run and in the
dtype the phase computes in (the baseline): bf16 where the CPU computes it natively, else fp32 (placement.py).

    taskset -c 1 python bench/cpu_profile.py                  # search_r1_cpu settings; any Hydra override of conf/
    taskset -c 1 python bench/cpu_profile.py bench.out=/tmp/p.json
    taskset -c 1 python bench/cpu_profile.py trainer.compute_dtype=fp32 engine.compute_dtype=fp32 \
        bench.out=results/bench/cpu_profile_fp32.json      # the fp32 path, as an AVX2 CPU takes it

Why: the demo is compute-bound on every core in every phase, so what it can still win is what runs below the
matmul rate. The trajectories are real: the warm start's scripted ones for training questions (this project's
index and passage budget), one trainer rank's share of a step. The RL step trains the same tokens, as groups of
`algo.group_size` with one success each, so that no row is skipped for a zero advantage. The episodes are the
base model's on training questions; the answer turns are the scripted trajectories' last turns, generated
greedily after prefilling their whole context. Writes results/bench/cpu_profile.json (`bench.out`).
"""
from __future__ import annotations

import gc
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import split_args  # noqa: E402
from launch import compose_config  # noqa: E402

BENCH_DEFAULTS = ["+experiment=search_r1_cpu"]
BENCH_KEYS = {"bench.rows": int, "bench.episodes": int, "bench.out": str}
ROWS, EPISODES = 8, 32  # 16 warm-start questions over 2 trainer ranks; 32 greedy episodes, a rollout rank's batch


def kind(name: str) -> str:
    """The operator's class: matmul (linear layers, lm_head), attention (kernels and KV-cache writes), other."""
    if "attention" in name or "attn" in name:
        return "attention"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "_C::onednn_mm"):
        return "matmul"
    return "other"


def split(prof) -> dict:
    """Self CPU seconds per class, their shares, the largest operators of `other`, and the matmul rate when the
    profiler counts FLOPs for all of the matmul time (it does for aten's, not for vLLM's oneDNN op)."""
    secs, flops, counted_s, other = {"matmul": 0.0, "attention": 0.0, "other": 0.0}, 0, 0.0, []
    for e in prof.key_averages():
        k, s = kind(e.key), e.self_cpu_time_total / 1e6
        secs[k] += s
        if k == "matmul" and e.flops:
            flops, counted_s = flops + e.flops, counted_s + s
        if k == "other":
            other.append((round(s, 3), e.key))
    total = sum(secs.values())
    out = {"op_seconds": {k: round(v, 3) for k, v in secs.items()},
           "op_shares": {k: round(v / total, 3) for k, v in secs.items()},
           "largest_other": [{"op": name, "seconds": s} for s, name in sorted(other, reverse=True)[:6]]}
    if counted_s >= 0.99 * secs["matmul"] > 0:
        out["matmul_gflops"] = round(flops / counted_s / 1e9, 1)
    return out


def last_turn(mask: list[int]) -> int:
    """Where a response's last model turn starts (the first generated token after its last information block)."""
    return max((i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]), default=0)


def peak_gflops(dtype, rows=2048, k=576, n=1536, reps=20) -> float:
    import torch
    import torch.nn.functional as F

    a, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    for _ in range(3):
        F.linear(a, w)
    t = time.perf_counter()
    for _ in range(reps):
        F.linear(a, w)
    return 2 * rows * k * n * reps / (time.perf_counter() - t) / 1e9


def profiled(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()  # first-call costs (allocator, oneDNN primitives, the engine's warm-up) stay out of the profile
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
    return {"wall_s": round(wall, 2), **split(prof)}


def main(argv: list[str]) -> dict:
    os.environ.setdefault("WANDB_MODE", "disabled")
    own, overrides = split_args(argv, BENCH_KEYS, "bench/cpu_profile.py")
    cfg = compose_config(BENCH_DEFAULTS + overrides)
    import torch

    from searchr1.data import load_splits
    from searchr1.engines.base import Sampling
    from searchr1.retrieval import load_or_build
    from searchr1.learner import Learner
    from searchr1.models import load_tokenizer
    from searchr1.retrieval import format_passages
    from searchr1.reward import make_score
    from searchr1.roles.worker import Worker
    from searchr1.schedule import make_schedule
    from searchr1.scripted import scripted_episodes

    torch.set_num_threads(1)
    rows, episodes = own.get("bench.rows", ROWS), own.get("bench.episodes", EPISODES)
    splits = load_splits(cfg.data, root=ROOT)
    index, r, tok = load_or_build(splits.corpus, cfg.retriever), cfg.retriever, load_tokenizer(cfg.model)
    score = make_score(cfg.reward.name, cfg.reward.format_score, cfg.reward.scale)
    trajs, _ = scripted_episodes(splits.train[:rows], tok, lambda qs: index.search(qs, r.top_k),
                                 lambda hits: format_passages(hits, tok, r.passage_max_tokens), cfg.agent, score)
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
    trained = sum(sum(t.loss_mask) for t in trajs)
    result = {"what": "operator time of the CPU experiment's phases on one core, by class; matmul rate vs a "
                      "matmul of the MLP shape in the phase's compute dtype, in the same run",
              "command": "python bench/cpu_profile.py " + " ".join(argv), "experiment": cfg.experiment,
              "model": cfg.model.name, "host": platform.node(), "threads": torch.get_num_threads(),
              "peak_gflops": {"bf16": round(peak_gflops(torch.bfloat16), 1),
                              "fp32": round(peak_gflops(torch.float32), 1)},
              "trajectories": {"rows": rows, "tokens": sum(lengths), "max_tokens": max(lengths),
                               "trained_tokens": trained}}
    schedule = make_schedule(cfg)
    phases = {"warm_start_step": 0, "rl_train_step": schedule.warm}
    for name, step in phases.items():
        algo, optim, top = schedule.stage_configs(step)
        batch = trajs
        if algo.name != "sft":  # groups of algo.group_size rows with one success each: no row has zero advantage
            batch = [replace(t, group=i // algo.group_size, reward=float(i % algo.group_size == 0))
                     for i, t in enumerate(trajs)]
        learner = Learner(cfg.model, algo, optim, cfg.trainer, "cpu", seed=cfg.seed,
                          temperature=cfg.sampling.temperature, train_top_layers=top)
        result[name] = {"train_top_layers": top or "all", "compute_dtype": learner.compute_dtype_name,
                        **profiled(lambda: learner.step(batch))}
        del learner
        gc.collect()
    worker = Worker(cfg, splits)
    engine_dtype = str(worker.engine.compute_dtype).removeprefix("torch.")
    questions = splits.train[rows:rows + episodes]
    result["greedy_episodes"] = {"episodes": len(questions), "compute_dtype": engine_dtype,
                                 **profiled(lambda: worker.evaluate(questions))}
    # The last turn of a searching episode, as after the warm start: its whole context prefilled (no prefix-cache
    # hit: the cache is reset before each call), then a greedy answer turn.
    contexts = [t.prompt_ids + t.response_ids[:last_turn(t.loss_mask)] for t in trajs]
    greedy = Sampling(temperature=0.0, max_new_tokens=cfg.agent.max_new_tokens)

    def answer_turns():
        if hasattr(worker.engine, "llm"):  # vLLM's prefix cache; the HF engine keeps nothing between calls
            worker.engine.llm.reset_prefix_cache()
        worker.engine.generate(contexts, greedy)
    result["answer_turns"] = {"contexts": len(contexts), "context_tokens": sum(map(len, contexts)),
                              "compute_dtype": engine_dtype, **profiled(answer_turns)}
    for name in list(phases) + ["greedy_episodes", "answer_turns"]:
        if "matmul_gflops" in result[name]:
            dt = "bf16" if "bf" in str(result[name]["compute_dtype"]) else "fp32"
            result[name][f"matmul_vs_peak_{dt}"] = round(result[name]["matmul_gflops"] / result["peak_gflops"][dt], 3)
    out = ROOT / own.get("bench.out", "results/bench/cpu_profile.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
