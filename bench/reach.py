"""How much of the dev split one search puts within the agent's reach, per passage count and length: the share of
questions whose information block from one search with the question holds a gold answer (`curriculum.informs`,
the test `curriculum.rl=retrievable` applies), and the tokens that block costs. Retrieval only: no model runs.
Then, for committed runs, what the policy made of its reach: of the questions whose information (every block its
trajectory read) held a gold answer, how many it answered right, where RL starts and at the end.

    python bench/reach.py                                    # search_r1_cpu's index, top_k 2-3 x 64-128 tokens
    python bench/reach.py retriever=hybrid bench.out=/tmp/reach.json
    python bench/reach.py bench.questions=20                  # the first 20 of each split
    python bench/reach.py bench.runs='results/cpu_main_*_s*'  # the committed runs to read (a glob)

Why: a policy can only be right when the answer is in what it reads, so this bounds what a longer or a third
passage could add before any run pays for the longer contexts (README, "Tuning"). The training pool's questions
only (the dev split and the rest of the pool), never the held-out ones. Writes results/bench/reach.json (`bench.out`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import split_args  # noqa: E402
from launch import compose_config  # noqa: E402

BENCH_DEFAULTS = ["+experiment=search_r1_cpu", "data.dev_size=150", "data.eval_on=dev"]
BENCH_KEYS = {"bench.out": str, "bench.questions": int, "bench.runs": str}
TOP_K, LENGTHS = (2, 3), (64, 96, 128)
# the study's runs and the dev split's 15-step runs at 1.0 (whose first evaluation is where RL starts)
RUNS = "results/cpu_main_*_s*,results/tuning/cpu_dev_t1.0_bfloat16_s*"


def read_information(response: str) -> str:
    """Every information block a trajectory's response holds (the agent inserts each as INFO_HEAD...INFO_TAIL)."""
    from searchr1.agent import INFO_HEAD, INFO_TAIL

    return " ".join(part.split(INFO_TAIL, 1)[0] for part in response.split(INFO_HEAD)[1:] if INFO_TAIL in part)


def what_was_read(predictions: list[dict]) -> dict:
    """EM, and how the right answers split between questions whose information held a gold answer and the rest;
    how many wrong answers are a span of the question itself (a copy, not a reading), and how many questions hold
    their gold answer in their own words (comparisons: where a copy is right)."""
    from searchr1.curriculum import holds_answer

    reach = [holds_answer(read_information(p["response"]), p["answers"]) for p in predictions]
    right = [bool(p["em"]) for p in predictions]
    in_reach = sum(reach)
    right_in = sum(r and e for r, e in zip(reach, right))
    question = [p.get("question", "") for p in predictions]
    copied = sum(not e and bool(p.get("prediction")) and holds_answer(q, [p["prediction"]])
                 for p, q, e in zip(predictions, question, right))
    return {"questions": len(predictions), "em": sum(right), "in_reach": in_reach, "right_in_reach": right_in,
            "read_rate": round(right_in / max(in_reach, 1), 3), "right_out_of_reach": sum(right) - right_in,
            "wrong_from_question": copied, "copyable": sum(holds_answer(q, p["answers"])
                                                           for p, q in zip(predictions, question))}


def read_runs(globs: str) -> list[dict]:
    """what_was_read for each run's first and last held-out (or dev) evaluation."""
    from searchr1.evaluation import read_predictions

    rows = []
    for run in sorted(p for g in globs.split(",") for p in ROOT.glob(g) if (p / "predictions").is_dir()):
        files = sorted((run / "predictions").glob("step_*.jsonl"))
        for f in (files[0], files[-1]) if len(files) > 1 else files:
            row = what_was_read(read_predictions(f))
            rows.append({"run": str(run.relative_to(ROOT)), "step": int(f.stem.split("_")[1]), **row})
            print(f"{rows[-1]['run']} step {rows[-1]['step']}: EM {row['em']}/{row['questions']}; answer read in "
                  f"{row['in_reach']}, {row['right_in_reach']} of them right ({row['read_rate']:.0%}); "
                  f"{row['right_out_of_reach']} right without it; {row['wrong_from_question']} wrong answers "
                  f"copied from the question")
    return rows


def main(argv: list[str]) -> dict:
    own, overrides = split_args(argv, BENCH_KEYS, "bench/reach.py")
    cfg = compose_config(BENCH_DEFAULTS + overrides)
    from searchr1 import curriculum
    from searchr1.datasets import load_all
    from searchr1.models import load_tokenizer
    from searchr1.retrieval import format_passages, load_or_build
    from searchr1.rundir import REPO_ROOT

    splits = load_all(cfg.data, REPO_ROOT)
    tok, index = load_tokenizer(cfg.model), load_or_build(splits.corpus, cfg.retriever)
    rows = []
    for split in ("dev", "train"):
        qs = getattr(splits, split)[:own.get("bench.questions")]  # all of them by default
        for k in TOP_K:
            found = index.search([q.question for q in qs], k)  # once per k: a length only cuts the same passages
            for n in LENGTHS:
                blocks = [format_passages(hits, tok, n) for hits in found]
                reach = sum(curriculum.informs(b, q, cfg.curriculum.yes_no) for q, b in zip(qs, blocks))
                tokens = sum(len(tok(b, add_special_tokens=False)["input_ids"]) for b in blocks) / len(blocks)
                rows.append({"split": split, "top_k": k, "passage_max_tokens": n, "questions": len(qs),
                             "in_reach": reach, "share": round(reach / len(qs), 3), "info_tokens": round(tokens, 1)})
                print(f"{split:5s} top_k {k} x {n:3d} tokens: {reach}/{len(qs)} in reach ({reach / len(qs):.1%}), "
                      f"{tokens:.0f} information tokens")
    out = {"what": "dev-split questions whose answer one search with the question brings, per top_k and passage "
                   "length (retrieval only); then, per committed run, the questions whose information held a gold "
                   "answer and how many of those the policy answered right", "retriever": cfg.retriever.name,
           "rows": rows, "runs": read_runs(own.get("bench.runs", RUNS))}
    path = Path(own.get("bench.out", ROOT / "results/bench/reach.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
