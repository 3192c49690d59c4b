"""Evaluation sets beyond HotpotQA, behind one interface: `data.eval_sets` names them (searchr1.registry.DATASETS).

A set is a `Dataset`: its reader (searchr1/datasets/readers.py, the official record format, validated as
strictly as HotpotQA's), the file its held-out questions are read from, the ids of its fixed held-out sample
(drawn once by a seeded rule: `python -m searchr1.datasets prepare`), how its corpus is built, and its official
EM and F1 (searchr1/datasets/scoring.py). HotpotQA stays the training set's own held-out evaluation
(searchr1.data.load_splits); `load_eval_sets` adds the others to the splits, as `Splits.eval_sets`.

Each set is searched in its own corpus (its own index, cached by corpus hash like HotpotQA's): the passages of
its questions, deduplicated by (title, text). Not by title alone: MuSiQue's and NQ's titles name Wikipedia
articles of which different questions hold different paragraphs, and a title key would drop supporting ones.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from searchr1.data import DataError, Question, Splits, read_ids
from searchr1.datasets.scoring import Metric
from searchr1.reward import normalize_answer


@dataclass(frozen=True)
class Dataset:
    name: str
    title: str  # what the console and the README call it
    file: str  # the questions the held-out ids are drawn from, relative to the repository root
    ids_file: str
    read: Callable[[Path], list[Question]]
    em: Metric
    f1: Metric
    corpus_from: str = "heldout"  # heldout: the held-out questions' passages; file: every question's in `file`
    licence: str = ""


@dataclass
class EvalSet:
    """One set as a run evaluates it: its held-out questions, its corpus, its metrics."""

    name: str
    questions: list[Question]
    corpus: list[dict]
    em: Metric
    f1: Metric


def spec(name: str) -> Dataset:
    from searchr1.registry import DATASETS, resolve

    return resolve(DATASETS, name, "data.eval_sets")


def build_corpus(questions: list[Question]) -> list[dict]:
    """The questions' passages, deduplicated by (title, text), in first-seen order."""
    corpus, seen = [], set()
    for q in questions:
        for title, sents in q.context:
            text = "".join(sents).strip()
            if (title, text) not in seen:
                seen.add((title, text))
                corpus.append({"title": title, "text": text})
    return corpus


def load_set(ds: Dataset, root: Path, size: int) -> EvalSet:
    """The first `size` ids of the set's held-out sample (fewer when the sample is smaller), checked against
    its file: every id must be there."""
    path, ids_path = root / ds.file, root / ds.ids_file
    pool = {q.qid: q for q in ds.read(path)}
    if not ids_path.is_file():
        raise DataError(f"{ids_path}: no such file (python -m searchr1.datasets prepare writes it)")
    ids = read_ids(ids_path)
    missing = [i for i in ids if i not in pool]
    if missing:
        raise DataError(f"{ids_path}: {len(missing)} ids are not in {ds.file}, e.g. {missing[0]!r}")
    heldout = [pool[i] for i in ids[:size]]
    corpus = build_corpus(heldout if ds.corpus_from == "heldout" else list(pool.values()))
    return EvalSet(ds.name, heldout, corpus, ds.em, ds.f1)


def check_disjoint(name: str, heldout: list[Question], training: list[Question]) -> None:
    """A held-out question must never be a training question: by id, and by question text (sets have their own
    id schemes, so the same question taken into two sets would not share an id)."""
    ids = {q.qid for q in training}
    texts = {normalize_answer(q.question): q.qid for q in training}
    for q in heldout:
        if q.qid in ids:
            raise DataError(f"data.eval_sets: {name} held-out id {q.qid!r} is a training question")
        other = texts.get(normalize_answer(q.question))
        if other is not None:
            raise DataError(f"data.eval_sets: {name} held-out question {q.qid!r} is training question {other!r} "
                            f"({q.question!r})")


def load_eval_sets(splits: Splits, names: list[str], size: int, root: str | Path = ".") -> Splits:
    """`splits` with every set of `names` other than hotpotqa (the splits' own held-out set) loaded, each checked
    against every training question (dev questions are training questions kept aside: they count too)."""
    root, sets = Path(root), {}
    training = splits.train + splits.dev
    for name in names:
        if name == "hotpotqa":
            continue
        s = load_set(spec(name), root, size)
        check_disjoint(name, s.questions, training)
        sets[name] = s
    return dataclasses.replace(splits, eval_sets=sets)


def add_training_sets(splits: Splits, mix: dict, root: str | Path = ".") -> Splits:
    """`splits` with each set of `mix` (data.train_mix) appended to the training pool, in order: its questions
    outside its whole held-out sample (by id and by question text: NQ-open repeats some questions under other
    line numbers), tagged with the set; their passages join the index, added by (title, text). The dev split stays
    HotpotQA's (it is drawn before)."""
    root, train, corpus = Path(root), list(splits.train), list(splits.corpus)
    seen = {(p["title"], p["text"]) for p in corpus}
    for name in mix:
        ds = spec(name)
        questions = ds.read(root / ds.file)
        held = set(read_ids(root / ds.ids_file))
        held_texts = {normalize_answer(q.question) for q in questions if q.qid in held}
        added = [dataclasses.replace(q, dataset=name) for q in questions
                 if q.qid not in held and normalize_answer(q.question) not in held_texts]
        if not added:
            raise DataError(f"data.train_mix: {name} has no question outside its held-out sample ({ds.ids_file})")
        for p in build_corpus(added):
            if (p["title"], p["text"]) not in seen:
                seen.add((p["title"], p["text"]))
                corpus.append(p)
        train += added
    return dataclasses.replace(splits, train=train, corpus=corpus, mix=tuple(mix))


def load_all(cfg, root: str | Path = ".") -> Splits:
    """The training splits of `cfg` (a DataConfig), its training mix and its evaluation sets."""
    from searchr1.data import load_splits

    splits = add_training_sets(load_splits(cfg, root), dict(cfg.train_mix), root) if cfg.train_mix else \
        load_splits(cfg, root)
    return load_eval_sets(splits, list(cfg.eval_sets), cfg.eval_size, root)


def draw_ids(ids: list[str], n: int, seed: int) -> list[str]:
    """The held-out rule of every set (HotpotQA's too): random.Random(seed).sample(sorted ids, n); all ids, in
    that seeded order, when the pool holds n or fewer."""
    ids = sorted(ids)
    return random.Random(seed).sample(ids, min(n, len(ids)))
