"""`python -m searchr1.datasets prepare --source DIR`: the files under data/<set>/ from the copies in DIR
(../shared/data: MULTIHOP_README.md gives their sources and checksums), and each set's held-out ids by the seeded
rule (searchr1.datasets.draw_ids). `python -m searchr1.datasets stats` counts what the sets load to.

- 2wiki: the 164 records of MIGRES's wikihop.json that carry `context` (official dev questions with their own 10
  paragraphs), without MIGRES's own fields `top_rank_questions` and `final_res`; all 164 are held out.
- musique: the 292 distinct MuSiQue-Ans dev questions of MIGRES's and KAG's copies (official format, identical
  where they overlap; question, answer, aliases and supporting paragraphs checked against the official dev file
  by id); 200 drawn, and only those 200 records stored. Not swarmbot's copy: it drops `answerable`, empties
  `answer_aliases`, marks no paragraph supporting and renumbers the paragraphs, so its 90 questions of its own
  cannot be checked.
- nq: nq-open-oracle.jsonl.gz copied byte for byte (all 2,655 gold passages make the corpus); 200 drawn.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from searchr1.data import DataError, _records
from searchr1.datasets import draw_ids, load_set, spec
from searchr1.datasets.readers import parse_2wiki, parse_musique, read_nq

MIGRES_ONLY = ("top_rank_questions", "final_res")
MUSIQUE_COPIES = ("musique.json", "musique_qa_100.json")


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def _write_ids(path: Path, ids: list[str], rule: str) -> None:
    path.write_text(f"# {rule}\n# Regenerate: python -m searchr1.datasets prepare --source ../shared/data\n"
                    + "\n".join(ids) + "\n")


def prepare_2wiki(src: Path, root: Path, n: int, seed: int) -> None:
    path = src / "2wikimultihopqa" / "wikihop.json"
    kept = [{k: v for k, v in rec.items() if k not in MIGRES_ONLY} for _, _, rec in _records(path) if "context" in rec]
    for i, rec in enumerate(kept):
        parse_2wiki(rec, f"{path}: record with context {i}")
    ds = spec("2wiki")
    _write_jsonl(root / ds.file, kept)
    ids = draw_ids([r["_id"] for r in kept], n, seed)
    _write_ids(root / ds.ids_file, ids, f"{len(ids)} held-out 2WikiMultihopQA ids: random.Random({seed}).sample("
                                        f"sorted ids of {ds.file}, min({n}, {len(kept)}))")


def prepare_musique(src: Path, root: Path, n: int, seed: int) -> None:
    official = {r["id"]: r for _, _, r in _records(src / "musique" / "dev.json")}
    merged: dict[str, dict] = {}
    for name in MUSIQUE_COPIES:
        for _, _, rec in _records(src / "musique" / name):
            if rec["id"] not in official:
                raise DataError(f"{src / 'musique' / name}: id {rec['id']!r} is not a MuSiQue-Ans dev id")
            if merged.setdefault(rec["id"], rec) != rec:
                raise DataError(f"{src / 'musique' / name}: {rec['id']}: differs from the first copy's record")
    out = {}
    for qid, rec in merged.items():
        gold = official[qid]
        support = {d["paragraph_support_idx"] for d in gold["question_decomposition"]}
        same = all(rec[k] == gold[k] for k in ("question", "answer", "answer_aliases", "answerable")) and \
            support == {p["idx"] for p in rec["paragraphs"] if p["is_supporting"]}
        if not same:
            raise DataError(f"musique: {qid}: differs from the official dev file")
        parse_musique(rec, f"musique {qid}")
        out[qid] = rec
    ds = spec("musique")
    ids = draw_ids(list(out), n, seed)
    _write_jsonl(root / ds.file, [out[i] for i in ids])
    _write_ids(root / ds.ids_file, ids, f"{len(ids)} held-out MuSiQue-Ans ids: random.Random({seed}).sample(sorted "
                                        f"ids of the {len(out)} questions of {', '.join(MUSIQUE_COPIES)}, {n})")


def prepare_nq(src: Path, root: Path, n: int, seed: int) -> None:
    ds = spec("nq")
    (root / ds.file).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "nq" / "nq-open-oracle.jsonl.gz", root / ds.file)
    qs = read_nq(root / ds.file)
    ids = draw_ids([q.qid for q in qs], n, seed)
    _write_ids(root / ds.ids_file, ids, f"{len(ids)} held-out NQ-open ids: random.Random({seed}).sample(sorted "
                                        f"ids of {ds.file}, {n}); nq_<i> is its 0-based line i")


PREPARE = {"2wiki": prepare_2wiki, "musique": prepare_musique, "nq": prepare_nq}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.datasets")
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="write data/<set>/ and its held-out ids from the shared copies")
    pr.add_argument("--source", default="../shared/data")
    pr.add_argument("--sets", nargs="+", default=sorted(PREPARE))
    pr.add_argument("--n", type=int, default=200)
    pr.add_argument("--seed", type=int, default=0)
    st = sub.add_parser("stats", help="questions, corpus passages and file checksum of each set")
    st.add_argument("--sets", nargs="+", default=sorted(PREPARE))
    args = ap.parse_args(argv)
    root = Path(".")
    try:
        for name in args.sets:
            if args.cmd == "prepare":
                PREPARE[name](Path(args.source), root, args.n, args.seed)
            ds = spec(name)
            s = load_set(ds, root, 10**9)
            digest = hashlib.sha256((root / ds.file).read_bytes()).hexdigest()
            print(json.dumps({"set": name, "heldout": len(s.questions), "corpus_passages": len(s.corpus),
                              "file": ds.file, "sha256": digest}))
        return 0
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
