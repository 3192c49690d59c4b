"""HotpotQA: loading both real formats, validation, the fixed splits and the BM25 corpus.

Formats (detected per record, files may be a JSON list or JSON lines):
- official: `_id`, `question`, `answer`, `type`, `level`, `supporting_facts` = [[title, sent_id], ...],
  `context` = [[title, [sentence, ...]], ...]. AMOR's copies extend each supporting fact to
  [title, [sent_ids], [sentences], {...}]; that is unpacked to the official pairs.
- Hugging Face: `id`, `supporting_facts` = {title: [...], sent_id: [...]}, `context` = {title: [...],
  sentences: [[...], ...]}.
Both give the same `Question` for the same question (tested on ids present in both).

Every malformed record raises `DataError` naming the file, the record (and line) and the field: nothing is
dropped silently. `python -m searchr1.data stats FILE...` and `python -m searchr1.data split` are the CLI.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.config import DataConfig


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    answers: tuple[str, ...]  # gold aliases; HotpotQA has one
    type: str
    level: str
    supporting_facts: tuple[tuple[str, int], ...]
    context: tuple[tuple[str, tuple[str, ...]], ...]  # (title, sentences)
    source: str = field(default="", compare=False)  # "file:record" for error messages and predictions
    dataset: str = field(default="hotpotqa", compare=False)  # the training set it came from (data.train_mix)


@dataclass
class Splits:
    train: list[Question]
    heldout: list[Question]
    corpus: list[dict]  # {"title", "text"}, deduplicated by title, in first-seen order
    corpus_scope: str
    dev: list[Question] = field(default_factory=list)  # training questions kept out of training (data.dev_size)
    eval_on: str = "heldout"
    pools: dict = field(default_factory=dict)  # stage (sft | rl) -> its training questions (searchr1/curriculum.py)
    eval_sets: dict = field(default_factory=dict)  # name -> searchr1.datasets.EvalSet: the other held-out sets
    mix: tuple = ()  # the training sets after HotpotQA (data.train_mix), in the order the pools hold them

    def pool(self, stage: str) -> list[Question]:
        """The training questions `stage` draws from: its curriculum's pool, else the whole training pool."""
        return self.pools.get(stage, self.train)

    def sizes(self, stage: str) -> int | tuple[int, ...]:
        """What a step draws `stage`'s questions from: the pool's size, or with a training mix the size of each
        set's contiguous run of it (HotpotQA's first, then data.train_mix's order)."""
        pool = self.pool(stage)
        if not self.mix:
            return len(pool)
        order = ("hotpotqa",) + tuple(self.mix)
        rank = [order.index(q.dataset) for q in pool]
        if rank != sorted(rank):
            raise ValueError(f"the {stage} pool does not hold its training sets in the order {order}")
        return tuple(rank.count(j) for j in range(len(order)))

    @property
    def evaluation(self) -> list[Question]:
        """The questions evaluations run on: the held-out set, or the dev set when tuning (data.eval_on)."""
        return self.dev if self.eval_on == "dev" else self.heldout


def _records(path: Path):
    """Yield (record index, line number or None, parsed dict)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read: {err}") from err
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") from err
        for i, rec in enumerate(items):
            yield i, None, rec
        return
    i = 0
    for ln, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: record {i} (line {ln}): not valid JSON: {err.msg}") from err
        yield i, ln, rec
        i += 1


def _field(rec: dict, name: str, types, where: str):
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if name not in rec:
        raise DataError(f"{where}: missing field '{name}'")
    value = rec[name]
    if not isinstance(value, types):
        raise DataError(f"{where}: field '{name}' has type {type(value).__name__}")
    return value


def _hf_columns(value: dict, name: str, second: str, where: str) -> list[tuple]:
    """Hugging Face stores a list of pairs as two parallel lists: {"title": [...], second: [...]}."""
    titles, other = value.get("title"), value.get(second)
    if not isinstance(titles, list) or not isinstance(other, list) or len(titles) != len(other):
        raise DataError(f"{where}: field '{name}' needs lists 'title' and '{second}' of equal length")
    return list(zip(titles, other))


def _context(rec: dict, where: str) -> tuple:
    ctx = _field(rec, "context", (list, dict), where)
    pairs = _hf_columns(ctx, "context", "sentences", where) if isinstance(ctx, dict) else ctx
    out = []
    for j, pair in enumerate(pairs):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str) \
            and isinstance(pair[1], list) and all(isinstance(s, str) for s in pair[1])
        if not ok:
            raise DataError(f"{where}: field 'context' paragraph {j} is not [title, [sentence, ...]]")
        out.append((pair[0], tuple(pair[1])))
    return tuple(out)


def _supporting(rec: dict, where: str) -> tuple:
    sf = _field(rec, "supporting_facts", (list, dict), where)
    if isinstance(sf, dict):
        return tuple((t, int(i)) for t, i in _hf_columns(sf, "supporting_facts", "sent_id", where))
    out = []
    for j, fact in enumerate(sf):
        if not isinstance(fact, list) or len(fact) < 2 or not isinstance(fact[0], str):
            raise DataError(f"{where}: field 'supporting_facts' entry {j} is not [title, sent_id]")
        ids = fact[1] if isinstance(fact[1], list) else [fact[1]]  # AMOR: [title, [ids], [sents], {...}]
        if not all(isinstance(i, int) for i in ids):
            raise DataError(f"{where}: field 'supporting_facts' entry {j} has a non-integer sentence id")
        out.extend((fact[0], i) for i in ids)
    return tuple(out)


def parse_record(rec: dict, where: str) -> Question:
    key = "_id" if isinstance(rec, dict) and "_id" in rec else "id"
    qid = _field(rec, key, str, where)
    question = _field(rec, "question", str, where)
    answer = _field(rec, "answer", str, where)
    if not question.strip():
        raise DataError(f"{where}: field 'question' is empty")
    return Question(
        qid=qid, question=question, answers=(answer,),
        type=_field(rec, "type", str, where), level=_field(rec, "level", str, where),
        supporting_facts=_supporting(rec, where), context=_context(rec, where), source=where)


def load_file(path: str | Path) -> list[Question]:
    return read_records(Path(path), lambda rec, where, i: parse_record(rec, where))


def read_records(path: Path, parse) -> list[Question]:
    """Every record of `path` (a JSON list or JSON lines) through `parse(rec, where, index)`; ids unique. Every
    dataset's reader goes through here (searchr1/datasets/readers.py)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    out, seen = [], {}
    for i, ln, rec in _records(path):
        where = f"{path}: record {i}" + (f" (line {ln})" if ln else "")
        q = parse(rec, where, i)
        if q.qid in seen:
            raise DataError(f"{where}: duplicate id {q.qid!r} (first at record {seen[q.qid]})")
        seen[q.qid] = i
        out.append(q)
    if not out:
        raise DataError(f"{path}: holds no records")
    return out


def load_questions(paths: list[str | Path]) -> list[Question]:
    """Several files in order; a question id found in two files is kept once (first file wins)."""
    out, seen = [], set()
    for p in paths:
        for q in load_file(p):
            if q.qid not in seen:
                seen.add(q.qid)
                out.append(q)
    return out


def build_corpus(questions: list[Question]) -> list[dict]:
    """Context paragraphs, deduplicated by title (HotpotQA titles are Wikipedia article titles)."""
    corpus, seen = [], set()
    for q in questions:
        for title, sents in q.context:
            if title not in seen:
                seen.add(title)
                corpus.append({"title": title, "text": "".join(sents).strip()})
    return corpus


def read_ids(path: str | Path) -> list[str]:
    lines = Path(path).read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.startswith("#")]


def _resolve(root: Path, p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else root / p


def load_splits(cfg: DataConfig, root: str | Path = ".") -> Splits:
    root = Path(root)
    train = load_questions([_resolve(root, p) for p in cfg.train_files])
    if cfg.train_size:
        train = train[: cfg.train_size]
    pool = {q.qid: q for q in load_file(_resolve(root, cfg.eval_file))}
    ids_path = _resolve(root, cfg.eval_ids_file)
    ids = read_ids(ids_path)
    missing = [i for i in ids if i not in pool]
    if missing:
        raise DataError(f"{ids_path}: {len(missing)} ids are not in {cfg.eval_file}, e.g. {missing[0]!r}")
    if cfg.eval_size > len(ids):
        raise DataError(f"data.eval_size={cfg.eval_size}: {ids_path} lists only {len(ids)} ids")
    heldout = [pool[i] for i in ids[: cfg.eval_size]]
    overlap = {q.qid for q in train} & {q.qid for q in heldout}
    if overlap:
        raise DataError(f"training and held-out questions overlap on {len(overlap)} ids, e.g. {sorted(overlap)[0]}")
    scope = train + heldout if cfg.corpus_scope == "train+eval" else train
    corpus = build_corpus(scope)  # dev questions are training questions: their paragraphs stay indexed
    dev = []
    if cfg.dev_size:
        if cfg.dev_size >= len(train):
            raise DataError(f"data.dev_size={cfg.dev_size}: the training pool has only {len(train)} questions")
        chosen = set(random.Random(0).sample(sorted(q.qid for q in train), cfg.dev_size))
        dev, train = [q for q in train if q.qid in chosen], [q for q in train if q.qid not in chosen]
    return Splits(train=train, heldout=heldout, corpus=corpus, corpus_scope=cfg.corpus_scope, dev=dev,
                  eval_on=cfg.eval_on)


def step_questions(n_pool: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices into the training pool for `step`: consecutive slices of per-epoch seeded permutations, so the
    data position is just `step` (a resumed run draws exactly what the uninterrupted run would have)."""
    out, pos = [], step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(pos, n_pool)
        perm = list(range(n_pool))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        take = perm[offset: offset + per_step - len(out)]
        out.extend(take)
        pos += len(take)
    return out


def mix_counts(per_step: int, shares: tuple[float, ...]) -> list[int]:
    """Each training set's questions of a step: per_step x its share, rounded by largest remainder (ties to the
    earlier set), so the counts sum to per_step and are the same every step."""
    exact = [per_step * w for w in shares]
    counts = [int(x) for x in exact]
    by_rest = sorted(range(len(shares)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in by_rest[: per_step - sum(counts)]:
        counts[j] += 1
    return counts


def mixed_step_questions(sizes: tuple[int, ...], shares: tuple[float, ...], step: int, per_step: int,
                         seed: int) -> list[int]:
    """step_questions over a pool made of contiguous runs, one per training set (`sizes`): each set gives its
    mix_counts share of the step from its own seeded stream, so each set's data position is also just `step`."""
    out, start = [], 0
    for j, (n, k) in enumerate(zip(sizes, mix_counts(per_step, shares))):
        if k and not n:
            raise ValueError(f"training set {j} of the mix has no question in this stage's pool")
        if k:
            out += [start + i for i in step_questions(n, step, k, seed + 104_729 * j)]
        start += n
    return out


def stats(questions: list[Question]) -> dict:
    paragraphs = [t for q in questions for t, _ in q.context]
    return {"questions": len(questions), "types": dict(Counter(q.type for q in questions)),
            "levels": dict(Counter(q.level for q in questions)), "paragraphs": len(paragraphs),
            "unique_titles": len(set(paragraphs))}


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.data")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="per-file counts; non-zero exit on a malformed file")
    st.add_argument("files", nargs="+")
    sp = sub.add_parser("split", help="draw the held-out ids with a seeded, recorded rule")
    sp.add_argument("--eval-file", default=DataConfig.eval_file)
    sp.add_argument("--n", type=int, default=200)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--out", default=DataConfig.eval_ids_file)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "stats":
            for f in args.files:
                print(json.dumps({"file": f, **stats(load_file(f))}))
            return 0
        ids = sorted(q.qid for q in load_file(args.eval_file))
        chosen = random.Random(args.seed).sample(ids, args.n)
        header = (f"# {args.n} held-out HotpotQA ids: random.Random({args.seed}).sample(sorted ids of "
                  f"{args.eval_file}, {args.n}).\n# Regenerate: python -m searchr1.data split --n {args.n} "
                  f"--seed {args.seed}\n")
        Path(args.out).write_text(header + "\n".join(chosen) + "\n")
        print(f"wrote {args.n} ids to {args.out}")
        return 0
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_cli())
