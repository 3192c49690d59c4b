"""Rollout throughput: the agent loop (generation + parsing + batched BM25 + information blocks) against the
engine's raw generation on the same prompts, in one process, on one warm engine.

    python bench/rollout.py                                   # search_r1_cpu settings, vLLM engine
    python bench/rollout.py engine=hf bench.questions=4      # any Hydra override of conf/
    python bench/rollout.py bench.rounds=1 bench.out=results/bench/rollout_quick.json    # make bench's variant

The raw pass is one `generate` call over the same chat-templated prompts (same sampling and per-turn token cap,
no stop strings), i.e. what the engine does with no protocol at all. It runs before
and after every rollout round, since the machine is shared and its speed drifts.
Ratio: rollout trajectory tokens/s (generated + inserted) over raw generated tokens/s, per round against the
raw passes either side (the median is the headline); and the share of the rollout's wall time spent inside the
engine (what the loop, parsing and retrieval cost is the rest). Writes results/bench/rollout.json (`bench.out`).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import split_args  # noqa: E402
from launch import compose_config  # noqa: E402

BENCH_DEFAULTS = ["+experiment=search_r1_cpu"]  # its engine is vLLM
QUESTIONS, GROUP, ROUNDS, SEED = 16, 2, 3, 0  # 32 trajectories: one GRPO step of one rollout rank at search_r1_cpu scale
BENCH_KEYS = {"bench.questions": int, "bench.group": int, "bench.rounds": int, "bench.out": str}


def main(argv: list[str]) -> dict:
    os.environ.setdefault("WANDB_MODE", "disabled")
    bench_args, overrides = split_args(argv, BENCH_KEYS, "bench/rollout.py")
    cfg = compose_config(BENCH_DEFAULTS + overrides)
    n_q = bench_args.get("bench.questions", QUESTIONS)
    group = bench_args.get("bench.group", GROUP)
    rounds = bench_args.get("bench.rounds", ROUNDS)

    from searchr1 import metrics as keys
    from searchr1.agent import build_prompt, run_episodes, sampling_for
    from searchr1.data import load_splits
    from searchr1.engines.base import Sampling
    from searchr1.roles.worker import Worker

    splits = load_splits(cfg.data, root=ROOT)
    t0 = time.perf_counter()
    worker = Worker(cfg, splits)  # the rollout ranks' own stack: engine, index, search tool, reward
    start_s = time.perf_counter() - t0
    engine, retrieve, tok = worker.engine, worker.retrieve, worker.engine.tokenizer

    questions = splits.train[:n_q]
    prompts = [build_prompt(tok, q.question, cfg.agent.search, cfg.agent.prompt) for q in questions
               for _ in range(group)]
    sampling = sampling_for(cfg.agent, cfg.sampling, seed=SEED)
    raw_sampling = Sampling(temperature=sampling.temperature, top_p=sampling.top_p, seed=SEED,
                            max_new_tokens=cfg.agent.max_new_tokens)
    engine.generate(prompts[:2], Sampling(max_new_tokens=4))  # warm-up

    def raw_pass() -> dict:
        t = time.perf_counter()
        gens = engine.generate(prompts, raw_sampling)
        secs = time.perf_counter() - t
        n = sum(len(g.token_ids) for g in gens)
        return {"seconds": secs, "generated_tokens": n, "tokens_per_s": n / secs}

    # Alternate raw and rollout passes; each rollout is compared with the raw passes either side of it, since the
    # shared machine's speed drifts by several times within minutes.
    raws, rollouts = [raw_pass()], []
    for _ in range(rounds):
        trajs, m = run_episodes(engine, questions, group, retrieve, cfg.agent, sampling, worker.score)
        rollouts.append((trajs, m))
        raws.append(raw_pass())
    ratios = []
    for i, (trajs, m) in enumerate(rollouts):
        around = raws[i:i + 2]
        raw_tps_i = sum(r["generated_tokens"] for r in around) / sum(r["seconds"] for r in around)
        ratios.append(sum(len(t.response_ids) for t in trajs) / m["rollout/total_s"] / raw_tps_i)
    raw_tps = sum(r["generated_tokens"] for r in raws) / sum(r["seconds"] for r in raws)
    trajs, m = rollouts[-1]
    generated = sum(t.generated_tokens for t in trajs)
    response = sum(len(t.response_ids) for t in trajs)
    total = m["rollout/total_s"]
    engine_s = sum(r[1]["rollout/generation_s"] for r in rollouts)
    loop_s = sum(r[1]["rollout/total_s"] for r in rollouts)
    # SmolLM2 rarely searches before training, so also time what a turn where every trajectory searches adds:
    # one batched BM25 call over all their queries plus tokenising the information blocks.
    t = time.perf_counter()
    infos = retrieve([q.question for q in questions for _ in range(group)])
    tok(infos, add_special_tokens=False)
    search_turn_s = time.perf_counter() - t
    engine_calls = sum(max(t.turns for t in r[0]) for r in rollouts)  # one engine call per turn of a round
    engine_turn_s = engine_s / engine_calls
    result = {
        "what": "agent-loop rollout vs raw engine generation on the same prompts (same process, warm engine)",
        "command": "python bench/rollout.py " + " ".join(argv),
        "engine": cfg.engine.name, "model": cfg.model.name, "experiment": cfg.experiment,
        "trajectories": len(trajs), "questions": n_q, "group_size": group,
        "engine_start_s": round(start_s, 2), "host": platform.node(), "cpus": os.cpu_count(),
        "rounds": rounds, "raw_passes": raws, "raw_generated_tokens_per_s": raw_tps,
        "last_rollout": {"seconds": total, "generation_s": m["rollout/generation_s"],
                         "retrieval_s": m["rollout/retrieval_s"], "generated_tokens": generated,
                         "trajectory_tokens": response, "searches_per_traj": m[keys.SEARCHES],
                         "turns_per_traj": m["rollout/turns"], "answer_rate": m[keys.ANSWER_RATE],
                         "stop": {k.split("/")[-1]: v for k, v in m.items() if k.startswith("rollout/stop/")}},
        "rollout_trajectory_tokens_per_s": response / total,
        "rollout_generated_tokens_per_s": generated / total,
        "ratio_trajectory_tokens_per_round": ratios,
        "ratio_trajectory_tokens": sorted(ratios)[len(ratios) // 2],
        "engine_share_of_rollout_time": engine_s / loop_s,
        "loop_and_retrieval_share": 1 - engine_s / loop_s,
        "all_search_turn": {"queries": len(infos), "retrieve_and_tokenize_s": search_turn_s,
                            "engine_s_per_turn": engine_turn_s,
                            "projected_loop_share": search_turn_s / (search_turn_s + engine_turn_s)},
        "goal": "ratio_trajectory_tokens (median over rounds) >= 0.8",
    }
    out = ROOT / bench_args.get("bench.out", "results/bench/rollout.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if "ratio" in k or "share" in k or "per_s" in k}, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
