"""Retrieval quality and cost of every backend on the shipped corpus, in one run: recall of the gold paragraphs
(HotpotQA's supporting-fact titles) at 1/3/10 for the held-out and the training questions, the share of questions
whose top 3 hold a gold answer string (what the agent can read off), build time and size of each index, encode
rates of the dense encoder, query rates (one batch of every question, as a turn sends them, and one at a time),
and HNSW's overlap with the exact flat index.

    nice python bench/retrieval_recall.py                 # full: every backend, passages up to 256 tokens
    python bench/retrieval_recall.py --quick              # 300 passages' questions only, for the suite

Writes results/bench/retrieval_recall[_quick].json. Indexes are built into a fresh temporary cache, so build times
include the dense encoder's pass over the corpus; hybrid's parts come from that same cache (its build is a lookup).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from searchr1.config import RetrieverConfig  # noqa: E402
from searchr1.curriculum import holds_answer  # noqa: E402
from searchr1.data import DataConfig, load_splits  # noqa: E402
from searchr1.retrieval import load_or_build  # noqa: E402
from searchr1.retrieval.schema import DenseConfig, HybridConfig  # noqa: E402

KS = (1, 3, 10)


def backends(max_length: int) -> dict[str, RetrieverConfig]:
    dense = DenseConfig(max_length=max_length)
    return {
        "bm25s": RetrieverConfig(name="bm25s"),
        "dense": RetrieverConfig(name="dense", dense=dense),
        "dense_hnsw": RetrieverConfig(name="dense", dense=dataclasses.replace(dense, index="hnsw")),
        "hybrid_rrf": RetrieverConfig(name="hybrid", dense=dense),
        "hybrid_weighted": RetrieverConfig(name="hybrid", dense=dense, hybrid=HybridConfig(fusion="weighted")),
    }


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def recall(index, questions, gold: list[set[str]]) -> dict:
    """Mean share of each question's gold titles in its top k; share of questions with all of them; share whose
    top 3 hold a gold answer (the curriculum's `retrievable` rule on the passages' texts)."""
    hits = index.search([q.question for q in questions], max(KS))
    out = {"questions": len(questions)}
    for k in KS:
        found = [len(g & {p.title for p in h[:k]}) / len(g) for h, g in zip(hits, gold)]
        out[f"recall@{k}"] = sum(found) / len(found)
        out[f"all_gold@{k}"] = sum(f == 1 for f in found) / len(found)
    out["answer_in_top3"] = sum(holds_answer(" ".join(p.text for p in h[:3]), list(q.answers))
                                for h, q in zip(hits, questions)) / len(questions)
    return out, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the questions of the first 300 passages' HotpotQA records")
    ap.add_argument("--max-length", type=int, default=256, help="retriever.dense.max_length (encoder tokens)")
    ap.add_argument("--out", help="output JSON (default: results/bench/retrieval_recall[_quick].json)")
    args = ap.parse_args()
    splits = load_splits(DataConfig(), root=ROOT)
    passages = splits.corpus
    sets = {"heldout": splits.heldout, "train": splits.train}
    if args.quick:  # a corpus of a few records' paragraphs, with the questions whose gold titles are all in it
        titles = {t for q in splits.train[:30] for t, _ in q.context}
        passages = [p for p in passages if p["title"] in titles]
        sets = {"train": splits.train[:30]}
    gold = {name: [{t for t, _ in q.supporting_facts} for q in qs] for name, qs in sets.items()}
    out = {"passages": len(passages), "dense_max_length": args.max_length, "load_avg_at_start": os.getloadavg(),
           "cpus": len(os.sched_getaffinity(0)), "backends": {}}
    cache = Path(tempfile.mkdtemp(prefix="bench-recall-"))
    top10 = {}
    try:
        for name, cfg in backends(args.max_length).items():
            cfg = dataclasses.replace(cfg, cache_dir=str(cache))
            before = {p.name for p in cache.iterdir()}
            t0 = time.perf_counter()
            index = load_or_build(passages, cfg)
            row = {"build_s": time.perf_counter() - t0,
                   "index_bytes": sum(dir_bytes(cache / p) for p in {p.name for p in cache.iterdir()} - before
                                      if (cache / p).is_dir())}
            if hasattr(index, "embed_queries"):
                row["passages_per_s_encode"] = len(passages) / row["build_s"] if name == "dense" else None
            for set_name, qs in sets.items():
                row[set_name], hits = recall(index, qs, gold[set_name])
                top10[(name, set_name)] = [[p.pid for p in h] for h in hits]
            qs = [q.question for q in next(iter(sets.values()))][:200]
            t0 = time.perf_counter()
            index.search(qs)
            row["queries_per_s_batch"] = len(qs) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for q in qs[:50]:
                index.search([q])
            row["queries_per_s_single"] = 50 / (time.perf_counter() - t0)
            out["backends"][name] = row
            print(name, json.dumps(row), flush=True)
        for set_name in sets:  # HNSW against the exact index it approximates: shared ids in the top 10
            exact, approx = top10[("dense", set_name)], top10[("dense_hnsw", set_name)]
            out["backends"]["dense_hnsw"][set_name]["overlap@10_with_flat"] = sum(
                len(set(a) & set(b)) / max(len(a), 1) for a, b in zip(exact, approx)) / len(exact)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    path = Path(args.out or ROOT / "results" / "bench" / f"retrieval_recall{'_quick' if args.quick else ''}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
