"""Where the study's held-out gain lies: questions whose first search (the question itself) brings a gold answer
(curriculum.retrievable, the rule that builds RL's pool) against the others, for every exported main run.

A diagnosis of the committed results, never a tuning signal (nothing in conf/ is chosen from it):

    .venv/bin/python notebooks/retrievable_split.py            # reads results/cpu_main_*/predictions
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch import compose_config  # noqa: E402
from searchr1 import curriculum  # noqa: E402
from searchr1.data import load_splits  # noqa: E402
from searchr1.evaluation import read_predictions  # noqa: E402
from searchr1.retrieval import load_or_build  # noqa: E402
from searchr1.models import load_tokenizer  # noqa: E402
from searchr1.retrieval import format_passages  # noqa: E402


def main() -> None:
    cfg = compose_config(["+experiment=search_r1_cpu"])
    splits = load_splits(cfg.data)
    r, tok = cfg.retriever, load_tokenizer(cfg.model)
    index = load_or_build(splits.corpus, r)
    flags = [curriculum.retrievable(qs, lambda q: index.search(q, r.top_k),
                                    lambda h: format_passages(h, tok, r.passage_max_tokens))
             for qs in (splits.train, splits.heldout)]
    print(f"retrievable: {sum(flags[0])}/{len(flags[0])} training questions, {sum(flags[1])}/{len(flags[1])} held-out")
    ok = {q.qid: f for q, f in zip(splits.heldout, flags[1])}
    for run in sorted(Path("results").glob("cpu_main_*")):
        files = sorted((run / "predictions").glob("*.jsonl"))  # where RL starts, then the last evaluation
        first, last = ({p["id"]: p for p in read_predictions(f)} for f in (files[0], files[-1]))
        for kind in (True, False):
            ids = [i for i in ok if ok[i] is kind]
            em = [sum(bool(p[i]["em"]) for i in ids) for p in (first, last)]
            print(f"{run.name}: {'retrievable' if kind else 'other'} {len(ids)}: EM {em[0]} -> {em[1]}")


if __name__ == "__main__":
    main()
